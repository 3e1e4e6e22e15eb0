#!/usr/bin/env bash
# Installs the Debian packages some tests and tools need, once per machine.
#
# Why a script: CI and fresh machines start bare; each package is named with the binary it
# provides, and apt runs only when one of those binaries is missing, so a second run is a
# no-op (no apt-get update, no network).
set -euo pipefail

# binary path -> Debian package
declare -A wanted=(
  [/usr/bin/chromium]=chromium # headless rendering check of `dsv4ctl probe --html` pages
  [/usr/bin/promtool]=prometheus # `promtool check rules` / `test rules` on the PrometheusRule
  # The server itself, from the same package: `dsv4ctl cluster up --monitoring` runs it.
  [/usr/bin/prometheus]=prometheus
  # The local runtime makes its pods' network (198.18.0.0/15) local: `ip route`.
  [/usr/bin/ip]=iproute2
  [/usr/bin/openssl]=openssl # signs the local cluster's LeaderWorkerSet webhook certificate
  # `make images` and the image tests: podman on runc (crun fails on hybrid cgroups here),
  # mmdebstrap for the local Debian base (no container registry is reachable).
  [/usr/bin/podman]=podman
  [/usr/sbin/runc]=runc
  [/usr/bin/mmdebstrap]=mmdebstrap
)

missing=()
for binary in "${!wanted[@]}"; do
  [[ -x "$binary" ]] || missing+=("${wanted[$binary]}")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  sudo=(sudo)
fi
echo "system-deps: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

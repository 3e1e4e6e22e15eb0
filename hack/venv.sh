#!/usr/bin/env bash
# Prints the path of the project's virtualenv, creating it first when needed.
#
# Why outside the checkout: torch with its CUDA libraries is ~5 GiB.  The venv lives in
# $DSV4_CACHE_DIR/venv/<hash of requirements/*.txt>, so a clean clone (CI included) reuses
# it, and a change of any pin builds a fresh one (bump LAYOUT when this script changes how
# a venv is built).  The project distributions (dsv4-engine, dsv4-operator, and the
# development tooling dsv4-dev, which no image installs) are installed editable into it
# whenever the checkout path or their pyproject.toml changes (a few seconds); older venvs
# are pruned.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
PYTHON="${PYTHON:-python3}"
LAYOUT=2
hash=$( (echo "layout $LAYOUT"; cat "$root"/requirements/*.txt) | sha256sum | cut -c1-12)
venv="$CACHE_DIR/venv/$hash"

log() { echo "venv: $*" >&2; }

mkdir -p "$CACHE_DIR/venv"
# One builder at a time: concurrent callers (parallel make, several shells) wait here.
exec 9>"$CACHE_DIR/venv/.lock"
flock 9
if [[ ! -x "$venv/bin/python" || ! -f "$venv/.complete" ]]; then
  start=$(date +%s)
  # Built in place: the .complete marker is written last, so an interrupted build is redone.
  rm -rf "$venv"
  mkdir -p "$CACHE_DIR/venv"
  log "creating $venv (first run on this machine: torch is large, expect a few minutes)"
  "$PYTHON" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" --upgrade pip setuptools wheel
  log "installing base requirements ($(( $(date +%s) - start ))s)"
  "${pip[@]}" -r "$root/requirements/base.txt"
  log "installing the engine runtime ($(( $(date +%s) - start ))s)"
  "$root/requirements/install-runtime.sh" "$venv/bin/python" -q
  touch "$venv/.complete"
  log "ready in $(( $(date +%s) - start ))s"
  # Keep this venv and the one built before it; each is several GiB.
  ls -1dt "$CACHE_DIR"/venv/*/ | tail -n +3 | xargs -r rm -rf
fi

stamp="$venv/.project-root"
want="$root $(cat "$root"/{engine,operator,dev}/pyproject.toml | sha256sum | cut -c1-12)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  log "installing dsv4-engine, dsv4-operator and dsv4-dev (editable) from $root"
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps \
      --no-build-isolation -e "$root/engine" -e "$root/operator" -e "$root/dev" \
      >"$venv/.install.log" 2>&1; then
    cat "$venv/.install.log" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
fi
echo "$venv"

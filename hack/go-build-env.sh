# Sourced by the hack/build-*.sh scripts: how this project compiles the Go tools it needs.
#
# Static binaries (no cgo); no VCS stamping (module builds have no repository). The linker's
# -s -w (each script's ldflags) drop the symbol table and DWARF from the binaries; with
# -dwarf=false the compiler does not generate that DWARF in the first place: the same code,
# ~10% less compile CPU on a cold machine (kwok: 197 CPU-s against 218).  The compiler
# collects its garbage a quarter as often (GOGC=400), each compile kept under about 3 GiB
# (GOMEMLIMIT: two run at once on two cores): the same binaries, byte for byte, another ~11%
# less CPU (kwok: 176 CPU-s).
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false -gcflags=all=-dwarf=false}"
export GOGC="${GOGC:-400}" GOMEMLIMIT="${GOMEMLIMIT:-3GiB}"

# The module that pins the control plane's and the LWS controller's versions (its go.mod says
# why they share one).  A cache folder is named for the versions it holds and for a digest of
# go.sum, so a changed pin builds anew rather than reuse binaries of the old one.
GO_TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")/go-tools" && pwd)"
GO_TOOLS_DIGEST="$(sha256sum "$GO_TOOLS/go.sum" | cut -c1-12)"
go_tools_version() { # go_tools_version MODULE — the version hack/go-tools/go.mod requires
  sed -n "s#^[[:space:]]*$1 \(v[^ ]*\)\$#\1#p" "$GO_TOOLS/go.mod"
}

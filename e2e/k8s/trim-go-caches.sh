#!/usr/bin/env bash
# Removes the Go build and module caches (<cache>/go/build and <cache>/go/mod, ~9 GB together)
# that the Go-built test tools (e2e/k8s, e2e/node, e2e/helm, e2e/ocm build.sh) fill. Once those
# tools are built and stamped nothing reads the caches again: the binaries, kwok's stages and
# OCM's CRDs are copied out of them. test.sh runs this after the builds, so a machine keeps only
# what the tests use and target/ has the disk. A rebuild (a version bump, --force) downloads and
# compiles again: cold times. FLOWER_ADDON_KEEP_GO_CACHES=1 keeps them (for working on the builds).
#
# Usage: trim-go-caches.sh
set -euo pipefail
# shellcheck source=common.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
if [[ -n "${FLOWER_ADDON_KEEP_GO_CACHES:-}" ]]; then
  log "==> keeping the Go caches (FLOWER_ADDON_KEEP_GO_CACHES is set)"
  exit 0
fi
# Total size in MB of the paths of these that exist (0 when none does).
size_mb() {
  local p total=0
  for p in "$@"; do
    [[ -e "${p}" ]] && total=$(( total + $(du -sm "${p}" | cut -f1) ))
  done
  echo "${total}"
}
before="$(size_mb "${GOCACHE}" "${GOMODCACHE}")"
if (( before < 10 )); then
  log "==> no Go caches to trim (${before} MB)"
  exit 0
fi
command -v go >/dev/null || die "go is required to clean its caches"
# `go clean` itself: module cache files are read-only, and it knows both layouts. The machine's
# toolchain is enough for cleaning (no go.mod here asks for a newer one).
(cd / && GOTOOLCHAIN=local go clean -cache && GOTOOLCHAIN=local go clean -modcache)
log "==> trimmed the Go build and module caches: ${before} MB freed"

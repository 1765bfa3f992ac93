# Shared environment for build.sh and regen-wrapper.sh (sourced, not executed).
# shellcheck shell=bash
K8S_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WRAPPER_DIR="${K8S_DIR}/wrapper"
# shellcheck source=versions.env
. "${K8S_DIR}/versions.env"
K8S_VERSION="${FLOWER_ADDON_K8S_VERSION:-${K8S_VERSION}}"
KWOK_VERSION="${FLOWER_ADDON_KWOK_VERSION:-${KWOK_VERSION}}"

CACHE_ROOT="${FLOWER_ADDON_CACHE:-${HOME}/.cache/flower-addon}"
OUT_DIR="${CACHE_ROOT}/k8s/${K8S_VERSION}"
BIN_DIR="${OUT_DIR}/bin"
STAGES_DIR="${OUT_DIR}/kwok-stages"

export GOMODCACHE="${CACHE_ROOT}/go/mod"
export GOCACHE="${CACHE_ROOT}/go/build"
export GOWORK=off
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Pick a Go toolchain new enough for the `go` line of a go.mod ($1).
# The machine's go is kept when it suffices; otherwise GOTOOLCHAIN=go<required>
# is exported (fetched through the module proxy). FLOWER_ADDON_GOTOOLCHAIN overrides.
select_toolchain() {
  local gomod="$1" need have
  need="$(awk '$1=="go"{print $2; exit}' "${gomod}")"
  [[ -n "${need}" ]] || return 0
  have="$(GOTOOLCHAIN=local go env GOVERSION)"; have="${have#go}"
  if [[ -n "${FLOWER_ADDON_GOTOOLCHAIN:-}" ]]; then
    export GOTOOLCHAIN="${FLOWER_ADDON_GOTOOLCHAIN}"
  elif [[ "$(printf '%s\n%s\n' "${need}" "${have}" | sort -V | tail -n1)" != "${have}" ]]; then
    [[ "${need}" == *.*.* ]] || need="${need}.0"
    export GOTOOLCHAIN="go${need}"
    log "==> go ${have} is older than the required go ${need}: using GOTOOLCHAIN=${GOTOOLCHAIN}"
  else
    export GOTOOLCHAIN=local
  fi
}

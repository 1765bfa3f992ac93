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

# The -X ldflags that stamp K8S_VERSION into a Kubernetes binary (else /version and --version
# say v0.0.0); run inside the wrapper module. buildDate = the release's publication time from the
# module proxy, so rebuilds are reproducible. Prints the flags (without -s -w).
k8s_version_ldflags() {
  local git_major git_minor build_date flags="" pkg
  [[ "${K8S_VERSION}" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "K8S_VERSION ${K8S_VERSION} is not vX.Y.Z"
  git_major="${BASH_REMATCH[1]}" git_minor="${BASH_REMATCH[2]}"
  build_date="$(go list -m -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -n "${build_date}" ]] || build_date="1970-01-01T00:00:00Z"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
    flags+=" -X ${pkg}.gitMajor=${git_major}"
    flags+=" -X ${pkg}.gitMinor=${git_minor}"
    flags+=" -X ${pkg}.gitTreeState=clean"
    flags+=" -X ${pkg}.gitCommit="  # unknown from the module zip; else /version says $Format:%H$
    flags+=" -X ${pkg}.buildDate=${build_date}"
  done
  printf '%s\n' "${flags}"
}

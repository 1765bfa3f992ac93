#!/usr/bin/env bash
# Build (once) the `helm` binary the chart tests use, from its Go module (helm.sh/helm/v3 at
# HELM_VERSION), with the module and build caches of e2e/k8s/build.sh.
#
# Output: ${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}/helm/<version>/helm
# Stdout gets exactly one line, that binary's path; progress goes to stderr (lines start with ==>).
# Cold: ~3-5 min on 2 cores (Go modules shared with the Kubernetes build); warm: instant.
#
# Usage: build.sh [--force]
set -euo pipefail
HELM_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "${HELM_DIR}/../k8s/common.sh"
HELM_VERSION="${FLOWER_ADDON_HELM_VERSION:-v3.22.0}"
OUT="${CACHE_ROOT}/helm/${HELM_VERSION}"
BIN="${OUT}/helm"

force=0
for arg in "$@"; do
  case "${arg}" in
    --force) force=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
flock 9
if [[ "${force}" == 0 && -x "${BIN}" ]] && "${BIN}" version --short 2>/dev/null | grep -q "^${HELM_VERSION}"; then
  printf '%s\n' "${BIN}"
  exit 0
fi
command -v go >/dev/null || die "go is required to build helm"
t0=${SECONDS}
log "==> building helm ${HELM_VERSION} from helm.sh/helm/v3 (cold ~3-5 min, then cached)"
export GOTOOLCHAIN="${FLOWER_ADDON_GOTOOLCHAIN:-auto}"
GOBIN="${OUT}" go install \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
  "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
"${BIN}" version --short >&2 || die "the built helm does not run"
log "    helm ${HELM_VERSION} done in $((SECONDS - t0))s"
printf '%s\n' "${BIN}"

#!/usr/bin/env bash
# Build (once) Open Cluster Management's own controllers and agents, from the Go module
# open-cluster-management.io/ocm at OCM_VERSION (v1.2.0: it resolves on the module proxy; v1.3.x
# does not), with the module and build caches of e2e/k8s/build.sh:
#   registration           `controller` (hub: ManagedClusters, CSRs, leases) and `agent` (spoke)
#   placement              `controller` (hub: Placements -> PlacementDecisions)
#   work                   `manager` (hub) and `agent` (spoke: ManifestWorks)
#   addon                  `manager` (hub: ClusterManagementAddOns, AddOnTemplates, signers)
#   registration-operator  `agent` (the klusterlet agent: registration + work in one, singleton mode)
# The CRDs come from the module open-cluster-management.io/api of the same version (a requirement
# of the wrapper module) and the bootstrap RBAC from OCM's cluster-manager chart: both are copied
# beside the binaries (modules/), so the harness needs no Go cache once this has run, and
# test.sh can trim the Go caches (~9 GB).
#
# Output: ${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}/ocm/<version>/bin/ and .../modules/
# Stdout gets exactly one line, that directory; progress goes to stderr (lines start with ==>).
# A stamp written after full success makes later runs instant.
#
# Usage: build.sh [--force] [--print-bin-dir]
set -euo pipefail
OCM_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "${OCM_DIR}/../k8s/common.sh"
# The version is the one e2e/ocm/wrapper/go.mod requires.
OCM_VERSION="v1.2.0"
OUT="${CACHE_ROOT}/ocm/${OCM_VERSION}"
BIN="${OUT}/bin"
STAMP="${OUT}/.build-complete"
CMDS=(registration placement work addon registration-operator)

force=0
for arg in "$@"; do
  case "${arg}" in
    --force) force=1 ;;
    --print-bin-dir) printf '%s\n' "${BIN}"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

MODULES="${OUT}/modules"
MODULES_STAMP="${MODULES}/.copy-complete"

# Copies what the harness reads from OCM's modules (every CRD of the API module, the
# cluster-manager chart's templates) to ${MODULES}, downloading the modules if the Go module
# cache was trimmed. Runs in the wrapper module's directory.
copy_module_files() {
  local api ocm
  [[ -f "${MODULES_STAMP}" ]] && return 0
  log "==> copying OCM's CRDs and bootstrap RBAC to ${MODULES}"
  api="$(go mod download -json open-cluster-management.io/api | awk -F'"' '$2=="Dir"{print $4}')"
  ocm="$(go mod download -json open-cluster-management.io/ocm | awk -F'"' '$2=="Dir"{print $4}')"
  [[ -d "${api}" && -d "${ocm}" ]] || die "go mod download gave no directory for OCM's modules"
  rm -rf "${MODULES}"
  mkdir -p "${MODULES}/api" "${MODULES}/ocm"
  (cd "${api}" && find . -name '*.crd.yaml' -exec cp --parents -t "${MODULES}/api" {} +)
  (cd "${ocm}" && cp -r --parents deploy/cluster-manager/chart/cluster-manager/templates "${MODULES}/ocm")
  chmod -R u+w "${MODULES}"
  date -u +%FT%TZ > "${MODULES_STAMP}"
}

mkdir -p "${BIN}"
exec 9>"${OUT}/.lock"
flock 9
if [[ "${force}" == 0 && -f "${STAMP}" && -f "${MODULES_STAMP}" ]]; then
  log "==> OCM ${OCM_VERSION} binaries already built"
  printf '%s\n' "${BIN}"
  exit 0
fi
command -v go >/dev/null || die "go is required to build OCM"
export GOTOOLCHAIN="${FLOWER_ADDON_GOTOOLCHAIN:-auto}"
t_all=${SECONDS}
# The committed wrapper module pins OCM and every dependency (go.sum seeded from OCM's own:
# `go install pkg@version` cannot be used, the module proxy refuses OCM's version list, and the
# checksum database does not know some of its pseudo-versions).
cd "${OCM_DIR}/wrapper"
select_toolchain go.mod
if [[ "${force}" == 0 && -f "${STAMP}" ]]; then
  copy_module_files
  printf '%s\n' "${BIN}"
  exit 0
fi
[[ "${force}" == 0 ]] || rm -f "${MODULES_STAMP}"
copy_module_files
for cmd in "${CMDS[@]}"; do
  t0=${SECONDS}
  log "==> building ${cmd} ${OCM_VERSION} (cold: minutes; shares Kubernetes' module and build caches)"
  go build -trimpath -ldflags "-s -w" -o "${BIN}/${cmd}" "open-cluster-management.io/ocm/cmd/${cmd}" >&2
  "${BIN}/${cmd}" --help >/dev/null 2>&1 || die "the built ${cmd} does not run"
  log "    ${cmd} done in $((SECONDS - t0))s"
done
date -u +%FT%TZ > "${STAMP}"
log "==> OCM ${OCM_VERSION} done in $((SECONDS - t_all))s: ${CMDS[*]}"
printf '%s\n' "${BIN}"

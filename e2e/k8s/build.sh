#!/usr/bin/env bash
# Build (once) a real Kubernetes test control plane from Go modules:
#   kube-apiserver, kube-controller-manager, kube-scheduler, etcd  (from the committed wrapper/ module)
#   kwok                                                            (go install sigs.k8s.io/kwok/cmd/kwok@KWOK_VERSION)
# plus kwok's Stage configs (kwok >= v0.8.0 has none built in; pass them with --config).
#
# Output: ${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}/k8s/<k8s-version>/{bin,kwok-stages}/
# Go caches: the same root, go/mod and go/build, so a rerun is warm.
# Idempotent: a stamp file written after full success makes later runs skip everything.
# Progress goes to stderr; stdout gets exactly one line, the bin dir, so callers can do
#   BIN_DIR="$(e2e/k8s/build.sh)"
#
# Usage: build.sh [--print-bin-dir] [--regen] [--force]
#   --print-bin-dir  print the bin dir and exit (no build, no check)
#   --regen          re-derive wrapper/go.mod,go.sum from versions.env (for version bumps) first
#   --force          rebuild even if the stamp is present
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

regen=0 force=0
for arg in "$@"; do
  case "${arg}" in
    --print-bin-dir) printf '%s\n' "${BIN_DIR}"; exit 0 ;;
    --regen) regen=1 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

if (( regen )); then
  "${K8S_DIR}/regen-wrapper.sh"
fi

K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler)
ALL_BINS=("${K8S_BINS[@]}" etcd kwok)
STAGE_FILES=(
  node/fast/node-initialize.yaml
  node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml
  pod/fast/pod-complete.yaml
  pod/fast/pod-delete.yaml
)
STAMP="${OUT_DIR}/.build-complete"

grep -q "^require.*k8s.io/kubernetes ${K8S_VERSION}\b\|^[[:space:]]k8s.io/kubernetes ${K8S_VERSION}\b" "${WRAPPER_DIR}/go.mod" \
  || die "wrapper/go.mod is not for k8s.io/kubernetes ${K8S_VERSION}: run ${K8S_DIR}/build.sh --regen"

# The stamp records what was built; any change (versions, wrapper deps) triggers a (warm) rebuild.
# (build.sh and common.sh are hashed in too, so a change of build flags rebuilds, warm.)
wrapper_sum="$(cat "${WRAPPER_DIR}/go.mod" "${WRAPPER_DIR}/go.sum" "${K8S_DIR}/build.sh" "${K8S_DIR}/common.sh" | sha256sum | cut -d' ' -f1)"
stamp_want="k8s=${K8S_VERSION} kwok=${KWOK_VERSION} inputs=${wrapper_sum}"

complete() {
  [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${stamp_want}" ]] || return 1
  local b f
  for b in "${ALL_BINS[@]}"; do [[ -x "${BIN_DIR}/${b}" ]] || return 1; done
  for f in "${STAGE_FILES[@]}"; do [[ -f "${STAGES_DIR}/$(basename "${f}")" ]] || return 1; done
  [[ -f "${STAGES_DIR}/all.yaml" ]]
}

if (( ! force )) && complete; then
  log "==> Kubernetes ${K8S_VERSION} test binaries already built (kwok ${KWOK_VERSION})"
  printf '%s\n' "${BIN_DIR}"
  exit 0
fi

# One build at a time per version (parallel test processes may all call build.sh).
mkdir -p "${OUT_DIR}"
exec 9> "${OUT_DIR}/.build.lock"
if ! flock -n 9; then
  log "==> another build.sh is building ${K8S_VERSION}; waiting for it"
  flock 9
fi
if (( ! force )) && complete; then
  log "==> Kubernetes ${K8S_VERSION} test binaries already built (kwok ${KWOK_VERSION})"
  printf '%s\n' "${BIN_DIR}"
  exit 0
fi

start=${SECONDS}
rm -f "${STAMP}"
mkdir -p "${BIN_DIR}" "${STAGES_DIR}"
tmp_bin="$(mktemp -d "${OUT_DIR}/.tmp-bin.XXXXXX")"
trap 'rm -rf "${tmp_bin}"' EXIT

# ---- kube-apiserver, kube-controller-manager, kube-scheduler, etcd from the wrapper ----
select_toolchain "${WRAPPER_DIR}/go.mod"
cd "${WRAPPER_DIR}"

version_ldflags="$(k8s_version_ldflags)"

etcd_version="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"

hint() { printf 'cold build ~%s, warm <1 min' "$1"; }

log "==> downloading Go modules for the wrapper (first time: ~1 min)"
go mod download

step() {  # step <name> <eta> <go build args...>
  local name="$1" eta="$2"; shift 2
  local t0=${SECONDS}
  log "==> building ${name} ($(hint "${eta}"))"
  go build -mod=readonly -trimpath "$@"
  log "    ${name} done in $(( SECONDS - t0 ))s"
}

# apiserver first: it compiles most of what the other two share.
step "kube-apiserver ${K8S_VERSION}" "12 min" \
  -ldflags "-s -w${version_ldflags}" -o "${tmp_bin}/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
step "kube-controller-manager ${K8S_VERSION}" "5 min" \
  -ldflags "-s -w${version_ldflags}" -o "${tmp_bin}/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
step "kube-scheduler ${K8S_VERSION}" "1 min" \
  -ldflags "-s -w${version_ldflags}" -o "${tmp_bin}/kube-scheduler" k8s.io/kubernetes/cmd/kube-scheduler
step "etcd ${etcd_version}" "1 min" \
  -ldflags "-s -w" -o "${tmp_bin}/etcd" go.etcd.io/etcd/server/v3

# ---- kwok: its own module, no replace directives at release tags ----
cd "${OUT_DIR}"
kwok_mod_dir="${GOMODCACHE}/sigs.k8s.io/kwok@${KWOK_VERSION}"
( cd "${tmp_bin}" && GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" >/dev/null )
select_toolchain "${kwok_mod_dir}/go.mod"
t0=${SECONDS}
log "==> building kwok ${KWOK_VERSION} ($(hint "4 min"))"
GOBIN="${tmp_bin}" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
log "    kwok done in $(( SECONDS - t0 ))s"

# ---- kwok Stage configs (node-fast + heartbeat-with-lease + pod-fast = kwokctl's default "fast" set) ----
: > "${tmp_bin}/all.yaml"
for f in "${STAGE_FILES[@]}"; do
  install -m 0644 "${kwok_mod_dir}/kustomize/stage/${f}" "${STAGES_DIR}/$(basename "${f}")"
  { echo "---"; grep -v '^---[[:space:]]*$' "${kwok_mod_dir}/kustomize/stage/${f}"; } >> "${tmp_bin}/all.yaml"
done
install -m 0644 "${tmp_bin}/all.yaml" "${STAGES_DIR}/all.yaml"
rm -f "${tmp_bin}/all.yaml"

# ---- publish ----
for b in "${ALL_BINS[@]}"; do
  [[ -x "${tmp_bin}/${b}" ]] || die "missing ${b} after build"
  mv -f "${tmp_bin}/${b}" "${BIN_DIR}/${b}"
done
printf '%s\n' "${stamp_want}" > "${STAMP}"
log "==> done in $(( SECONDS - start ))s: kube-* ${K8S_VERSION}, etcd ${etcd_version}, kwok ${KWOK_VERSION}"
log "    kwok stage configs: ${STAGES_DIR}/all.yaml (or the separate files beside it)"
printf '%s\n' "${BIN_DIR}"

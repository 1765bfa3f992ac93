#!/usr/bin/env bash
# Build (once) what a real e2e node runs besides the control plane:
#   kubelet, kube-proxy   from the same wrapper module as the control plane (e2e/k8s/wrapper)
# and install the Debian packages a node needs when missing:
#   containerd, runc, containernetworking-plugins (bridge, host-local, portmap, loopback),
#   iptables, iproute2, conntrack.
#
# Output: ${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}/k8s/<k8s-version>/node-bin/{kubelet,kube-proxy}
# Stdout gets exactly one line, that directory; progress goes to stderr (lines start with ==>).
# A stamp (.build-complete) hashes the wrapper's go.mod/go.sum and this script; flock serializes
# parallel callers. Go caches are shared with e2e/k8s/build.sh, so after it this build is warm.
#
# Usage: build.sh [--print-bin-dir] [--force]
set -euo pipefail
NODE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "${NODE_DIR}/../k8s/common.sh"

NODE_BIN_DIR="${OUT_DIR}/node-bin"
STAMP="${NODE_BIN_DIR}/.build-complete"
BINS=(kubelet kube-proxy)
DEBS=(containerd runc containernetworking-plugins iptables iproute2 conntrack util-linux)

force=0
for arg in "$@"; do
  case "${arg}" in
    --print-bin-dir) printf '%s\n' "${NODE_BIN_DIR}"; exit 0 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

# ---- Debian packages ----------------------------------------------------------------------------
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' || missing+=("${p}")
done
if (( ${#missing[@]} )); then
  [[ "$(id -u)" == 0 ]] || die "missing Debian packages (${missing[*]}); install them as root"
  t0=${SECONDS}
  log "==> installing Debian packages: ${missing[*]} (apt-get update first)"
  exec 8> /var/lib/apt/.flower-addon-apt.lock
  flock 8
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  apt_log="$(mktemp)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > "${apt_log}" 2>&1 \
    || { cat "${apt_log}" >&2; rm -f "${apt_log}"; die "apt-get install ${missing[*]} failed"; }
  rm -f "${apt_log}"
  exec 8>&-
  log "    packages installed in $(( SECONDS - t0 ))s"
fi
# The Debian package starts containerd as a system service; the e2e nodes run their own (one per
# node, own root, state and socket), so the system one is not needed. Leave it alone if it runs.
for plugin in bridge host-local portmap loopback; do
  [[ -x "/usr/lib/cni/${plugin}" ]] || die "CNI plugin /usr/lib/cni/${plugin} missing (containernetworking-plugins)"
done

# ---- kubelet, kube-proxy --------------------------------------------------------------------------
for tool in kubelet kube-proxy; do
  grep -q "k8s.io/kubernetes/cmd/${tool}\$" "${WRAPPER_DIR}/go.mod" \
    || die "wrapper/go.mod has no tool k8s.io/kubernetes/cmd/${tool}: run e2e/k8s/regen-wrapper.sh"
done
inputs="$(cat "${WRAPPER_DIR}/go.mod" "${WRAPPER_DIR}/go.sum" "${BASH_SOURCE[0]}" "${K8S_DIR}/common.sh" | sha256sum | cut -d' ' -f1)"
stamp_want="k8s=${K8S_VERSION} inputs=${inputs}"
complete() {
  [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${stamp_want}" ]] || return 1
  local b; for b in "${BINS[@]}"; do [[ -x "${NODE_BIN_DIR}/${b}" ]] || return 1; done
}
if (( ! force )) && complete; then
  log "==> kubelet and kube-proxy ${K8S_VERSION} already built"
  printf '%s\n' "${NODE_BIN_DIR}"; exit 0
fi
mkdir -p "${NODE_BIN_DIR}"
exec 9> "${NODE_BIN_DIR}/.build.lock"
if ! flock -n 9; then log "==> another node build is running; waiting for it"; flock 9; fi
if (( ! force )) && complete; then
  log "==> kubelet and kube-proxy ${K8S_VERSION} already built"
  printf '%s\n' "${NODE_BIN_DIR}"; exit 0
fi

start=${SECONDS}
rm -f "${STAMP}"
tmp_bin="$(mktemp -d "${NODE_BIN_DIR}/.tmp.XXXXXX")"
trap 'rm -rf "${tmp_bin}"' EXIT
select_toolchain "${WRAPPER_DIR}/go.mod"
cd "${WRAPPER_DIR}"
ldflags="-s -w$(k8s_version_ldflags)"
log "==> downloading Go modules for kubelet and kube-proxy (first time: ~1 min)"
go mod download
for b in "${BINS[@]}"; do
  t0=${SECONDS}
  log "==> building ${b} ${K8S_VERSION} (cold ~1 min after the control plane, warm <10 s)"
  go build -mod=readonly -trimpath -ldflags "${ldflags}" -o "${tmp_bin}/${b}" "k8s.io/kubernetes/cmd/${b}"
  log "    ${b} done in $(( SECONDS - t0 ))s"
done
for b in "${BINS[@]}"; do mv -f "${tmp_bin}/${b}" "${NODE_BIN_DIR}/${b}"; done
printf '%s\n' "${stamp_want}" > "${STAMP}"
log "==> node binaries done in $(( SECONDS - start ))s: kubelet, kube-proxy ${K8S_VERSION}"
printf '%s\n' "${NODE_BIN_DIR}"

#!/usr/bin/env bash
# Smoke test of the cached control plane (builds it first if needed, see build.sh):
# starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on loopback,
# registers a kwok node, runs a 2-replica Deployment until both pods are Ready, deletes it and
# waits until the pods are really gone. Every process is ended by its pid on exit.
# Needs only curl, openssl, python3 (free ports). KEEP_WORKDIR=1 keeps the temp dir and logs.
set -euo pipefail
K8S_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN_DIR="$("${K8S_DIR}/build.sh")"
STAGES_DIR="$(dirname "${BIN_DIR}")/kwok-stages"
. "${K8S_DIR}/versions.env"

WORK="$(mktemp -d /tmp/flower-k8s-smoke.XXXXXX)"
PIDS=()
ok=0
stop() {  # stop <pid>: SIGTERM, then SIGKILL after 10 s
  local p="$1" i
  kill "${p}" 2>/dev/null || return 0
  for (( i = 0; i < 100; i++ )); do kill -0 "${p}" 2>/dev/null || break; sleep 0.1; done
  kill -9 "${p}" 2>/dev/null || true
  wait "${p}" 2>/dev/null || true
}
cleanup() {
  # Reverse start order: clients first, etcd last (an apiserver whose etcd is gone takes minutes to exit).
  local i
  for (( i = ${#PIDS[@]} - 1; i >= 0; i-- )); do stop "${PIDS[i]}"; done
  if (( ! ok )); then
    for f in "${WORK}"/*.log; do [[ -f "$f" ]] && { echo "--- tail of $f" >&2; tail -n 25 "$f" >&2; }; done
  fi
  if [[ "${KEEP_WORKDIR:-0}" == 1 ]]; then echo "work dir kept: ${WORK}" >&2; else rm -rf "${WORK}"; fi
}
trap cleanup EXIT

log() { printf '%s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() {  # wait_for <what> <seconds> <command...>; also fails as soon as a started process died
  local what="$1" secs="$2"; shift 2
  local t0=${SECONDS} p
  until "$@" >/dev/null 2>&1; do
    (( SECONDS - t0 < secs )) || { log "TIMEOUT waiting for ${what}"; return 1; }
    for p in "${PIDS[@]}"; do kill -0 "${p}" 2>/dev/null || { log "process ${p} exited while waiting for ${what}"; return 1; }; done
    sleep 0.5
  done
  log "ok: ${what} ($(( SECONDS - t0 ))s)"
}

ETCD_PORT="$(free_port)"; ETCD_PEER_PORT="$(free_port)"; API_PORT="$(free_port)"
CM_PORT="$(free_port)"; SCHED_PORT="$(free_port)"; KWOK_PORT="$(free_port)"
TOKEN="$(openssl rand -hex 16)"
mkdir -p "${WORK}/etcd" "${WORK}/certs" "${WORK}/cm-certs" "${WORK}/sched-certs"
openssl genrsa -out "${WORK}/sa.key" 2048 2>/dev/null
echo "${TOKEN},admin,admin,system:masters" > "${WORK}/tokens.csv"

# --- etcd -------------------------------------------------------------------------------------
"${BIN_DIR}/etcd" \
  --name=e2e --data-dir="${WORK}/etcd" \
  --listen-client-urls="http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls="http://127.0.0.1:${ETCD_PORT}" \
  --listen-peer-urls="http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls="http://127.0.0.1:${ETCD_PEER_PORT}" \
  --initial-cluster="e2e=http://127.0.0.1:${ETCD_PEER_PORT}" \
  --unsafe-no-fsync=true --log-level=warn \
  > "${WORK}/etcd.log" 2>&1 &
PIDS+=($!)
wait_for "etcd /health" 30 bash -c "curl -sf http://127.0.0.1:${ETCD_PORT}/health | grep -q '\"health\":\"true\"'"

# --- kube-apiserver ---------------------------------------------------------------------------
"${BIN_DIR}/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:${ETCD_PORT}" --etcd-prefix=/cluster1 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --secure-port="${API_PORT}" \
  --cert-dir="${WORK}/certs" \
  --service-cluster-ip-range=198.19.240.0/20 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="${WORK}/sa.key" --service-account-signing-key-file="${WORK}/sa.key" \
  --token-auth-file="${WORK}/tokens.csv" \
  --authorization-mode=RBAC --allow-privileged=true \
  > "${WORK}/kube-apiserver.log" 2>&1 &
PIDS+=($!)
# apiserver.crt = self-signed leaf + its CA; the CA alone (2nd PEM block) is the root CA for clients.
extract_ca() {
  awk '/BEGIN CERTIFICATE/{n++} n==2' "${WORK}/certs/apiserver.crt" > "${WORK}/ca.crt" 2>/dev/null &&
    grep -q 'END CERTIFICATE' "${WORK}/ca.crt"
}
wait_for "apiserver self-signed CA in --cert-dir" 30 extract_ca
CA="${WORK}/ca.crt"
api() { curl -sS --fail --cacert "${CA}" -H "Authorization: Bearer ${TOKEN}" "$@"; }
URL="https://127.0.0.1:${API_PORT}"
wait_for "kube-apiserver /readyz" 90 api "${URL}/readyz"
api "${URL}/version" > "${WORK}/version.json"
grep -q "\"gitVersion\": \"${K8S_VERSION}\"" "${WORK}/version.json" || { cat "${WORK}/version.json" >&2; log "wrong /version"; exit 1; }
log "ok: /version says ${K8S_VERSION}"

cat > "${WORK}/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: ${URL}
    certificate-authority: ${CA}
users:
- name: admin
  user:
    token: ${TOKEN}
contexts:
- name: e2e
  context:
    cluster: e2e
    user: admin
current-context: e2e
KC
KC="${WORK}/kubeconfig"

# --- kube-controller-manager ------------------------------------------------------------------
"${BIN_DIR}/kube-controller-manager" \
  --kubeconfig="${KC}" \
  --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port="${CM_PORT}" --cert-dir="${WORK}/cm-certs" \
  --service-account-private-key-file="${WORK}/sa.key" --root-ca-file="${CA}" \
  --use-service-account-credentials=false \
  > "${WORK}/kube-controller-manager.log" 2>&1 &
PIDS+=($!)

# --- kube-scheduler ---------------------------------------------------------------------------
"${BIN_DIR}/kube-scheduler" \
  --kubeconfig="${KC}" \
  --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port="${SCHED_PORT}" --cert-dir="${WORK}/sched-certs" \
  > "${WORK}/kube-scheduler.log" 2>&1 &
PIDS+=($!)

# --- kwok -------------------------------------------------------------------------------------
"${BIN_DIR}/kwok" \
  --kubeconfig="${KC}" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --config="${STAGES_DIR}/all.yaml" \
  --node-lease-duration-seconds=40 \
  --server-address="127.0.0.1:${KWOK_PORT}" \
  > "${WORK}/kwok.log" 2>&1 &
PIDS+=($!)

wait_for "kube-controller-manager /healthz" 60 curl -sfk "https://127.0.0.1:${CM_PORT}/healthz"
wait_for "kube-scheduler /healthz" 60 curl -sfk "https://127.0.0.1:${SCHED_PORT}/healthz"
wait_for "kwok /healthz (plain http)" 60 curl -sf "http://127.0.0.1:${KWOK_PORT}/healthz"
wait_for "default ServiceAccount (controller-manager works)" 60 api "${URL}/api/v1/namespaces/default/serviceaccounts/default"

# --- a kwok node --------------------------------------------------------------------------------
api -X POST -H 'Content-Type: application/json' "${URL}/api/v1/nodes" -d '{
  "apiVersion": "v1", "kind": "Node",
  "metadata": {"name": "kwok-node-0",
    "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
    "labels": {"kubernetes.io/hostname": "kwok-node-0", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}},
  "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
             "capacity":    {"cpu": "32", "memory": "256Gi", "pods": "110"}}
}' > /dev/null
node_ready() { api "${URL}/api/v1/nodes/kwok-node-0" | python3 -c '
import json,sys; n=json.load(sys.stdin)
sys.exit(0 if any(c["type"]=="Ready" and c["status"]=="True" for c in n["status"].get("conditions",[])) else 1)'; }
wait_for "kwok node Ready" 60 node_ready

# --- a Deployment: controller-manager makes pods, scheduler binds them, kwok runs them ----------
api -X POST -H 'Content-Type: application/json' "${URL}/apis/apps/v1/namespaces/default/deployments" -d '{
  "apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {"name": "smoke"},
  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "smoke"}},
    "template": {"metadata": {"labels": {"app": "smoke"}},
      "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]}}}
}' > /dev/null
deploy_ready() { api "${URL}/apis/apps/v1/namespaces/default/deployments/smoke" | python3 -c '
import json,sys; d=json.load(sys.stdin); sys.exit(0 if d.get("status",{}).get("readyReplicas",0)==2 else 1)'; }
wait_for "Deployment 2/2 Ready" 90 deploy_ready
api "${URL}/api/v1/namespaces/default/pods?labelSelector=app%3Dsmoke" | python3 -c '
import json,sys
for p in json.load(sys.stdin)["items"]:
    print("   pod", p["metadata"]["name"], p["spec"].get("nodeName"), p["status"]["phase"], p["status"].get("podIP"))' >&2

api -X DELETE -H 'Content-Type: application/json' "${URL}/apis/apps/v1/namespaces/default/deployments/smoke" \
  -d '{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}' > /dev/null
no_pods() { api "${URL}/api/v1/namespaces/default/pods?labelSelector=app%3Dsmoke" | python3 -c '
import json,sys; sys.exit(0 if not json.load(sys.stdin)["items"] else 1)'; }
wait_for "pods deleted for real (garbage collector + kwok pod-delete stage)" 90 no_pods

ok=1
log "==> smoke test passed"

#!/usr/bin/env bash
# End-to-end smoke test of a real Flower federation on loopback, for one Flower version:
#   CA + SuperLink cert (openssl), SuperLink with TLS + SuperNode auth + SQLite database,
#   two SuperNodes with OpenSSH EC P-384 keys registered through `flwr supernode register`,
#   negative checks (unregistered key refused, wrong CA refused), `flwr run` of
#   examples/fedavg for 3 rounds, judged by `flwr ls --run-id ID --format json` ==
#   finished:completed.
#
# Usage: e2e/flower/smoke.sh VERSION            (e.g. 1.42.0, 1.25.0)
# Env:   FLOWER_ADDON_CACHE   venv cache (see venv.sh)
#        SMOKE_KEEP=1         keep the work directory (logs) after exit
#        SMOKE_NEGATIVE=0     skip the unregistered-key / wrong-CA checks
#        SMOKE_ROUNDS=3       num-server-rounds
#        SMOKE_APPIO_TLS=1    1.35-1.36 only: also pass --appio-ssl-certfile/-keyfile/-ca-certfile (same
#                             server cert + CA) so the --port Runtime HTTP API is HTTPS as in >= 1.37
# Exits non-zero on any failure; everything it starts is stopped by pid (trap).
#
# Dialects (see NOTES.md):
#   daemons:  <= 1.34   classic  (--serverappio/--fleet/--control-api-address, --clientappio-api-address)
#             1.35-1.39 transitional: Fleet gRPC on --fleet-api-address, Runtime HTTP API on --host/--port,
#                       Control gRPC on --control-api-address (1.35-1.36) or HTTPS on --port (1.37-1.39)
#             >= 1.40.0 unified  (--host/--port; one HTTPS server with GET /health)
#   flwr CLI: < 1.26.0  pyproject `[tool.flwr.federations.NAME]` in the app dir: flwr CMD APP NAME
#             >= 1.26.0 $FLWR_HOME/config.toml `[superlink.NAME]`: flwr CMD [APP] NAME
set -euo pipefail

VERSION="${1:?usage: smoke.sh FLWR_VERSION}"
ROUNDS="${SMOKE_ROUNDS:-3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
APP_SRC="$REPO/examples/fedavg"

T0=$(date +%s.%N)
ts() { printf '%6.1fs' "$(echo "$(date +%s.%N) - $T0" | bc)"; }
say() { echo "[smoke $VERSION $(ts)] $*"; }
die() { echo "[smoke $VERSION $(ts)] FAIL: $*" >&2; exit 1; }

vercmp_ge() { # vercmp_ge A B  -> true if A >= B
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]
}

CONTROL_PROTO=grpc
if vercmp_ge "$VERSION" 1.40.0; then DAEMONS=unified; CONTROL_PROTO=https
elif vercmp_ge "$VERSION" 1.35.0; then
  # 1.35-1.36: Runtime API on --host/--port (plain HTTP) but Fleet + Control still gRPC on
  # --fleet-api-address/--control-api-address; 1.37-1.39: Control on HTTPS --port, Fleet still gRPC.
  DAEMONS=transitional
  if vercmp_ge "$VERSION" 1.37.0; then CONTROL_PROTO=https; fi
else DAEMONS=classic; fi
if vercmp_ge "$VERSION" 1.26.0; then CLI=configtoml; else CLI=pyproject; fi

VENV="$("$HERE/venv.sh" "$VERSION" | tail -1)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/flower-smoke-$VERSION.XXXXXX")"
PIDS=()

cleanup() {
  local rc=$?
  set +e
  local all=()
  for p in "${PIDS[@]}"; do
    all+=("$p")
    # helpers (flower-superexec, flwr-serverapp/clientapp) started by our processes
    for c in $(pgrep -P "$p" 2>/dev/null); do all+=("$c"); for g in $(pgrep -P "$c" 2>/dev/null); do all+=("$g"); done; done
  done
  for p in "${all[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 1 50); do
    local alive=0
    for p in "${all[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.2
  done
  for p in "${all[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if [[ $rc != 0 ]]; then
    echo "---- logs in $WORK (last lines) ----" >&2
    for f in "$WORK"/*.log; do [[ -f $f ]] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
  fi
  if [[ "${SMOKE_KEEP:-0}" != 1 && $rc == 0 ]]; then rm -rf "$WORK"; else echo "work dir kept: $WORK" >&2; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export PATH="$VENV/bin:$PATH"          # Flower starts its helpers by bare name
export FLWR_HOME="$WORK/flwr-home"       # flwr CLI config (config.toml) + installed apps
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
mkdir -p "$FLWR_HOME"
say "venv $VENV; daemons=$DAEMONS control=$CONTROL_PROTO cli=$CLI; work $WORK"

# ---- free loopback ports -------------------------------------------------------------
read -r -a PORTS <<<"$(python3 - <<'EOF'
import socket
socks=[socket.socket() for _ in range(8)]
for s in socks: s.bind(("127.0.0.1",0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks: s.close()
EOF
)"

# ---- PKI: CA + SuperLink server cert (SANs IP:127.0.0.1, DNS:localhost), node keys ------
PKI="$WORK/pki"; mkdir -p "$PKI"
mkca() { # mkca DIR
  openssl ecparam -name prime256v1 -genkey -noout -out "$1/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$1/ca.key" -sha256 -days 2 -subj "/CN=flower-addon smoke CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1/ca.crt" 2>/dev/null
}
mkca "$PKI"
openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/server.key" 2>/dev/null
openssl req -new -key "$PKI/server.key" -subj "/CN=localhost" -out "$PKI/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >"$PKI/server.ext"
openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
  -days 2 -sha256 -extfile "$PKI/server.ext" -out "$PKI/server.crt" 2>/dev/null
mkdir -p "$PKI/other" && mkca "$PKI/other"                     # unrelated CA for the wrong-CA check
for n in node0 node1 rogue; do ssh-keygen -q -t ecdsa -b 384 -N '' -C "$n" -f "$PKI/$n.key"; done
say "PKI ready (openssl CA + server cert, ssh-keygen ecdsa-384 node keys)"

# ---- SuperLink ---------------------------------------------------------------------------
SL_TLS=(--ssl-ca-certfile "$PKI/ca.crt" --ssl-certfile "$PKI/server.crt" --ssl-keyfile "$PKI/server.key")
if [[ $DAEMONS == unified ]]; then
  SL_PORT=${PORTS[0]}
  CONTROL_ADDR="127.0.0.1:$SL_PORT"; FLEET_ADDR="127.0.0.1:$SL_PORT"
  SL_NET=(--host 127.0.0.1 --port "$SL_PORT")
elif [[ $DAEMONS == transitional ]]; then
  # Every listener explicit on loopback: Fleet (default 0.0.0.0:9092) and, in 1.35-1.36,
  # Control (default 0.0.0.0:9093) would otherwise bind all interfaces.
  SL_PORT=${PORTS[0]}; FLEET=${PORTS[1]}; CONTROL=${PORTS[2]}; SL_HEALTH=${PORTS[3]}
  FLEET_ADDR="127.0.0.1:$FLEET"
  SL_NET=(--host 127.0.0.1 --port "$SL_PORT" --fleet-api-address "$FLEET_ADDR"
          --health-server-address "127.0.0.1:$SL_HEALTH")
  if [[ $CONTROL_PROTO == grpc ]]; then
    CONTROL_ADDR="127.0.0.1:$CONTROL"; SL_NET+=(--control-api-address "$CONTROL_ADDR")
    if [[ "${SMOKE_APPIO_TLS:-0}" == 1 ]]; then
      SL_NET+=(--appio-ssl-certfile "$PKI/server.crt" --appio-ssl-keyfile "$PKI/server.key"
               --appio-ssl-ca-certfile "$PKI/ca.crt")
    fi
  else
    CONTROL_ADDR="127.0.0.1:$SL_PORT"   # --control-api-address is deprecated (warning only) in 1.37-1.39
  fi
else
  SAPPIO=${PORTS[0]}; FLEET=${PORTS[1]}; CONTROL=${PORTS[2]}; SL_HEALTH=${PORTS[3]}
  CONTROL_ADDR="127.0.0.1:$CONTROL"; FLEET_ADDR="127.0.0.1:$FLEET"
  SL_NET=(--serverappio-api-address "127.0.0.1:$SAPPIO" --fleet-api-address "$FLEET_ADDR"
          --control-api-address "$CONTROL_ADDR" --health-server-address "127.0.0.1:$SL_HEALTH")
fi
SL_DEPS=()
if flower-superlink --help 2>/dev/null | grep -q -- --disable-runtime-dependency-installation; then
  SL_DEPS=(--disable-runtime-dependency-installation)   # >= 1.32; earlier versions never `uv sync` by default
fi
SL_ARGV=(flower-superlink "${SL_TLS[@]}" --enable-supernode-auth --database "$WORK/superlink.db"
         "${SL_DEPS[@]}" --isolation subprocess "${SL_NET[@]}")
echo "${SL_ARGV[*]}" >"$WORK/superlink.argv"
"${SL_ARGV[@]}" >"$WORK/superlink.log" 2>&1 &
SL_PID=$!; PIDS+=("$SL_PID")

grpc_health() { # grpc_health HOST:PORT -> 0 if SERVING (grpc.health.v1, plaintext)
  "$VENV/bin/python" - "$1" <<'EOF' >/dev/null 2>&1
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
ch = grpc.insecure_channel(sys.argv[1])
r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
sys.exit(0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1)
EOF
}
superlink_ready() {
  if [[ $DAEMONS == unified || ( $DAEMONS == transitional && ( $CONTROL_PROTO == https || "${SMOKE_APPIO_TLS:-0}" == 1 ) ) ]]; then
    [[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$PKI/ca.crt" "https://127.0.0.1:$SL_PORT/health")" == 200 ]]
  elif [[ $DAEMONS == transitional ]]; then
    # 1.35-1.36: the Runtime HTTP API is plain HTTP (TLS only with --appio-ssl-*). /health answers
    # only after the lifespan started the Fleet and Control gRPC servers.
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$SL_PORT/health")" == 200 ]]
  else
    grpc_health "127.0.0.1:$SL_HEALTH"
  fi
}
t=$(date +%s.%N)
for _ in $(seq 1 300); do
  kill -0 "$SL_PID" 2>/dev/null || die "SuperLink exited: $(tail -5 "$WORK/superlink.log")"
  superlink_ready && break
  sleep 0.1
done
superlink_ready || die "SuperLink not ready after 30 s"
T_SL=$(echo "$(date +%s.%N) - $t" | bc)
if [[ $DAEMONS == transitional ]]; then
  grpc_health "127.0.0.1:$SL_HEALTH" || die "SuperLink gRPC health not SERVING"
  # nothing may listen on all interfaces
  if ss -Hltnp 2>/dev/null | grep "pid=$SL_PID," | awk '{print $4}' | grep -qvE '^(127\.0\.0\.1|\[::ffff:127\.0\.0\.1\]):'; then
    die "SuperLink listens beyond loopback: $(ss -Hltnp | grep "pid=$SL_PID,")"
  fi
fi
say "SuperLink ready in ${T_SL}s: ${SL_ARGV[*]}"

# ---- flwr CLI connection -----------------------------------------------------------------
APP="$WORK/app"; cp -r "$APP_SRC" "$APP"; rm -rf "$APP/.flwr"
FED=smoke
if [[ $CLI == configtoml ]]; then
  cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "$FED"

[superlink.$FED]
address = "$CONTROL_ADDR"
root-certificates = "$PKI/ca.crt"
EOF
  FLWR_CONN_ARGS=("$FED")                   # flwr supernode register KEY FED ; flwr run APP FED
else
  # 1.25: the connection lives in the app's pyproject.toml; use a copy (never the committed app).
  cat >>"$APP/pyproject.toml" <<EOF

[tool.flwr.federations]
default = "$FED"

[tool.flwr.federations.$FED]
address = "$CONTROL_ADDR"
root-certificates = "$PKI/ca.crt"
EOF
  FLWR_CONN_ARGS=("$APP" "$FED")            # flwr supernode register KEY APP FED ; flwr run APP FED
fi

register() { # register PUBKEY -> prints node id
  local out
  out="$(flwr supernode register "$1" "${FLWR_CONN_ARGS[@]}" --format json 2>&1)" || die "register failed: $out"
  echo "$out" | python3 -c '
import json, sys
raw = sys.stdin.read(); d = json.loads(raw[raw.index("{"):])
if not d.get("success"): sys.exit("register: " + d.get("error-message", raw))
print(d["node-id"])'
}
t=$(date +%s.%N)
NID0=$(register "$PKI/node0.key.pub") || die "register node0"
NID1=$(register "$PKI/node1.key.pub") || die "register node1"
say "registered node0=$NID0 node1=$NID1 in $(echo "$(date +%s.%N) - $t" | bc)s: flwr supernode register KEY.pub ${FLWR_CONN_ARGS[*]} --format json"
# Registering the same key again is refused ("already in use"); automation must treat it as done.
dup="$(flwr supernode register "$PKI/node0.key.pub" "${FLWR_CONN_ARGS[@]}" --format json 2>&1 || true)"
echo "$dup" | grep -qi "already in use" || die "re-register did not say 'already in use': $dup"

# ---- SuperNodes --------------------------------------------------------------------------
supernode_argv() { # supernode_argv IDX KEY CA PORT_A PORT_B
  local a=(flower-supernode --superlink "$FLEET_ADDR" --root-certificates "$3"
           --auth-supernode-private-key "$2" --isolation subprocess)
  if [[ $DAEMONS == unified ]]; then
    a+=(--host 127.0.0.1 --port "$4")
  elif [[ $DAEMONS == transitional ]]; then
    a+=(--host 127.0.0.1 --port "$4" --health-server-address "127.0.0.1:$5")
  else
    a+=(--clientappio-api-address "127.0.0.1:$4" --health-server-address "127.0.0.1:$5")
  fi
  a+=(--node-config "partition-id=$1 num-partitions=2")
  printf '%s\0' "${a[@]}"
}
SN_PIDS=(); SN_PORTS=()
t=$(date +%s.%N)
for i in 0 1; do
  pa=${PORTS[$((4 + 2 * i))]}; pb=${PORTS[$((5 + 2 * i))]}; SN_PORTS+=("$pa:$pb")
  mapfile -d '' argv < <(supernode_argv "$i" "$PKI/node$i.key" "$PKI/ca.crt" "$pa" "$pb")
  echo "${argv[*]}" >"$WORK/supernode$i.argv"
  "${argv[@]}" >"$WORK/supernode$i.log" 2>&1 &
  SN_PIDS+=($!); PIDS+=($!)
done
supernode_health() { # supernode_health IDX
  local pa=${SN_PORTS[$1]%%:*} pb=${SN_PORTS[$1]##*:}
  if [[ $DAEMONS == unified ]]; then
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pa/health")" == 200 ]]
  elif [[ $DAEMONS == transitional ]]; then
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pa/health")" == 200 ]] && grpc_health "127.0.0.1:$pb"
  else
    grpc_health "127.0.0.1:$pb"
  fi
}
for _ in $(seq 1 600); do
  ok=0
  for i in 0 1; do
    kill -0 "${SN_PIDS[$i]}" 2>/dev/null || die "SuperNode $i exited: $(tail -5 "$WORK/supernode$i.log")"
    grep -q "SuperNode ID: " "$WORK/supernode$i.log" && ok=$((ok + 1))
  done
  [[ $ok == 2 ]] && break
  sleep 0.1
done
[[ $ok == 2 ]] || die "SuperNodes not connected after 60 s"
T_SN=$(echo "$(date +%s.%N) - $t" | bc)
for i in 0 1; do supernode_health "$i" || die "SuperNode $i health check failed"; done
say "2 SuperNodes connected ('SuperNode ID: <id>' logged, health OK) in ${T_SN}s: $(cat "$WORK/supernode0.argv")"
status="$(flwr supernode ls "${FLWR_CONN_ARGS[@]}" --format json 2>&1)"
[[ "$(echo "$status" | grep -c '"status": "online"')" -ge 2 ]] || die "flwr supernode ls does not show 2 online: $status"

# ---- negative checks ---------------------------------------------------------------------
if [[ "${SMOKE_NEGATIVE:-1}" == 1 ]]; then
  neg() { # neg NAME KEY CA EXPECT_REGEX
    local pa pb
    read -r pa pb <<<"$(python3 -c 'import socket;a=socket.socket();b=socket.socket();a.bind(("127.0.0.1",0));b.bind(("127.0.0.1",0));print(a.getsockname()[1],b.getsockname()[1])')"
    mapfile -d '' argv < <(supernode_argv 0 "$2" "$3" "$pa" "$pb")
    # classic SuperNodes retry a TLS failure forever: bound them with --max-retries
    [[ $DAEMONS != unified ]] && argv+=(--max-retries 2)
    local t1 rc="" how="exited"; t1=$(date +%s.%N)
    "${argv[@]}" >"$WORK/$1.log" 2>&1 &
    local pid=$!; PIDS+=("$pid")
    for _ in $(seq 1 600); do
      if ! kill -0 "$pid" 2>/dev/null; then wait "$pid" && rc=0 || rc=$?; break; fi
      # 1.35-1.37: the failed connection is logged (traceback ending in "generator didn't yield")
      # but the process keeps running (its Runtime HTTP API thread is not a daemon): stop it.
      if [[ $DAEMONS == transitional ]] && ! vercmp_ge "$VERSION" 1.38.0 \
          && grep -q "generator didn't yield" "$WORK/$1.log" && grep -qE "$4" "$WORK/$1.log"; then
        how="logged the failure but kept running (1.35-1.37), SIGTERM"
        kill -TERM "$pid"; wait "$pid" || true; rc=hung; break
      fi
      sleep 0.1
    done
    [[ -n $rc ]] || die "$1: still running after 60 s"
    [[ $rc != 0 ]] || die "$1: expected a quick non-zero exit, got rc=$rc"
    grep -qE "$4" "$WORK/$1.log" || die "$1: log lacks /$4/"
    say "$1 refused: rc=$rc ($how) after $(echo "$(date +%s.%N) - $t1" | bc)s, log: $(grep -oE "$4" "$WORK/$1.log" | head -1)"
  }
  neg unregistered-key "$PKI/rogue.key" "$PKI/ca.crt" "No SuperNode found with the given public key|Failed to activate SuperNode"
  neg wrong-ca "$PKI/node0.key" "$PKI/other/ca.crt" "CERTIFICATE_VERIFY_FAILED"
fi

# ---- flwr run ----------------------------------------------------------------------------
t=$(date +%s.%N)
timeout 600 flwr run "$APP" "$FED" --run-config "num-server-rounds=$ROUNDS" --stream \
  >"$WORK/run.log" 2>&1 || die "flwr run failed (rc=$?)"
RUN_ID=$(grep -oE "started run [0-9]+" "$WORK/run.log" | grep -oE "[0-9]+$" | head -1)
[[ -n "$RUN_ID" ]] || die "no run id in flwr run output"
final=""
for _ in $(seq 1 60); do
  final=$(flwr ls "${FLWR_CONN_ARGS[@]}" --run-id "$RUN_ID" --format json 2>&1 | python3 -c '
import json, sys
raw = sys.stdin.read(); d = json.loads(raw[raw.index("{"):])
print(d["runs"][0]["status"] if d.get("success") else "error: " + str(d))') || true
  [[ "$final" == finished:* ]] && break
  sleep 1
done
T_RUN=$(echo "$(date +%s.%N) - $t" | bc)
[[ "$final" == "finished:completed" ]] || die "run $RUN_ID status: $final"
grep -E "^round " "$WORK/run.log" | sed "s/^/    /"
metric=$(grep -E "^final: " "$WORK/run.log" || true)
[[ -n "$metric" ]] || die "no 'final:' line in run output"
say "run $RUN_ID finished:completed in ${T_RUN}s (flwr run + flwr ls): $metric"

rss() { awk '/VmRSS/ {printf "%d MB", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }
say "RSS superlink $(rss "$SL_PID"), supernode0 $(rss "${SN_PIDS[0]}"), supernode1 $(rss "${SN_PIDS[1]}")"
# SIGTERM the SuperLink while both SuperNodes are still connected (cleanup stops the rest).
t=$(date +%s.%N); kill -TERM "$SL_PID"
for _ in $(seq 1 300); do kill -0 "$SL_PID" 2>/dev/null || break; sleep 0.05; done
kill -0 "$SL_PID" 2>/dev/null && die "SuperLink still running 15 s after SIGTERM"
T_STOP=$(echo "$(date +%s.%N) - $t" | bc)
say "OK: superlink_ready=${T_SL}s nodes_connected=${T_SN}s run_${ROUNDS}_rounds=${T_RUN}s superlink_sigterm=${T_STOP}s"

#!/usr/bin/env bash
# The local demo: a standalone flower-addon hub, two agents joined with a bootstrap token and
# accepted, a Federation + Placement (2 pools x 2 replicas over both agents, TLS + SuperNode
# authentication), and a real `flwr run` of the example FedAvg app to completion.
#
# Usage: ./demo.sh [--keep]
#   --keep   leave the federation running and print the flwr connection for your own app
# Environment:
#   FLOWER_VERSION     Flower release to use, 1.25.0 to 1.42.x (default 1.42.0; 1.39.0 and 1.35.0
#                      exercise the transitional dialects, 1.30.0 and 1.25.0 the classic one)
#   FLOWER_ADDON_CACHE cache root (default ~/.cache/flower-addon): venvs live there
#   DEMO_ROUNDS        FedAvg rounds (default 3)
#   DEMO_WORK          work directory (default: a new temp dir)
#   FLOWER_ADDON_BIN_DIR  use the flower-hub and flower-agent in this directory instead of
#                      building them (test.sh passes the ones its tests ran)
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$PWD"
KEEP=0
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done
FLOWER_VERSION="${FLOWER_VERSION:-1.42.0}"
ROUNDS="${DEMO_ROUNDS:-3}"
T0=$(date +%s.%N)
elapsed() { awk -v now="$(date +%s.%N)" -v t0="$T0" 'BEGIN { printf "%.1f", now - t0 }'; }
step() { printf '==> [%6ss] %s\n' "$(elapsed)" "$*"; }
die() { echo "demo.sh: FAILED: $*" >&2; exit 1; }

step "Python venv with flwr==$FLOWER_VERSION (cached under ${FLOWER_ADDON_CACHE:-~/.cache/flower-addon})"
VENV="$(e2e/flower/venv.sh "$FLOWER_VERSION" | tail -n 1)"
[[ -x "$VENV/bin/flower-superlink" ]] || die "no flower-superlink in $VENV"

if [[ -n "${FLOWER_ADDON_BIN_DIR:-}" ]]; then
  BIN_DIR="$FLOWER_ADDON_BIN_DIR"
  [[ "$BIN_DIR" == /* ]] || BIN_DIR="$ROOT/$BIN_DIR"
  step "using flower-hub and flower-agent from $BIN_DIR (FLOWER_ADDON_BIN_DIR)"
else
  step "building flower-hub and flower-agent (cargo build)"
  cargo build --quiet --bin flower-hub --bin flower-agent
  # Where cargo put them: CARGO_TARGET_DIR when set (relative to the repository, as cargo reads it).
  BIN_DIR="${CARGO_TARGET_DIR:-target}/debug"
  [[ "$BIN_DIR" == /* ]] || BIN_DIR="$ROOT/$BIN_DIR"
fi
HUB="$BIN_DIR/flower-hub"
AGENT="$BIN_DIR/flower-agent"
[[ -x "$HUB" && -x "$AGENT" ]] || die "no flower-hub and flower-agent in $BIN_DIR"

WORK="${DEMO_WORK:-$(mktemp -d /tmp/flower-addon-demo.XXXXXX)}"
mkdir -p "$WORK/manifests" "$WORK/flwr-home"
PIDS=()
cleanup() {
  local rc=$?
  if (( KEEP == 0 || rc != 0 )); then
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
      for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$p" 2>/dev/null || true
    done
    if (( rc != 0 )); then
      echo "--- logs in $WORK (last lines):" >&2
      for f in "$WORK"/*.log "$WORK"/hub/logs/*.log "$WORK"/agent-*/logs/*/*.log; do
        [[ -f "$f" ]] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
      done
    fi
  fi
  exit $rc
}
trap cleanup EXIT INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HUB_PORT="$(free_port)"
# /metrics and /healthz + /readyz of the hub and each agent on ports of their own (the defaults,
# :8080 and :8081, would be shared by the three processes on this machine).
HUB_METRICS="$(free_port)"; HUB_HEALTH="$(free_port)"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1

step "starting the hub: flower-hub serve --standalone (work channel on 127.0.0.1:$HUB_PORT)"
"$HUB" serve --standalone --state-dir "$WORK/hub" --manifests "$WORK/manifests" \
  --listen "127.0.0.1:$HUB_PORT" --advertise-address 127.0.0.1 --flower-bin "$VENV/bin" \
  --metrics-bind-address "127.0.0.1:$HUB_METRICS" --health-probe-bind-address "127.0.0.1:$HUB_HEALTH" \
  >"$WORK/hub.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -f "$WORK/hub/hub-address" ]] && break; sleep 0.1; done
[[ -f "$WORK/hub/hub-address" ]] || die "the hub did not start (see $WORK/hub.log)"

step "creating a bootstrap token: flower-hub token create --ttl 1h --output json"
TOKEN_JSON="$("$HUB" token create --state-dir "$WORK/hub" --ttl 1h --output json)"
TOKEN="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])' <<<"$TOKEN_JSON")"
CA_HASH="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["caHash"])' <<<"$TOKEN_JSON")"
echo "    CA hash $CA_HASH"

JOIN_PIDS=()
for i in 1 2; do
  step "agent edge-$i joins: flower-agent join --cluster-name edge-$i"
  # The token on standard input: an argument would show in `ps` to every user.
  printf '%s\n' "$TOKEN" | "$AGENT" join --token-file - --hub "127.0.0.1:$HUB_PORT" \
    --ca-hash "$CA_HASH" --cluster-name "edge-$i" --state-dir "$WORK/agent-$i" \
    >"$WORK/join-$i.log" 2>&1 &
  JOIN_PIDS+=($!)
done
for i in 1 2; do
  for _ in $(seq 1 100); do grep -q "waiting for the hub to accept" "$WORK/join-$i.log" 2>/dev/null && break; sleep 0.1; done
  site=$([[ $i == 1 ]] && echo a || echo b)
  step "the admin labels and accepts it: flower-hub accept edge-$i --label site=$site --label demo=quickstart"
  "$HUB" accept "edge-$i" --label "site=$site" --label demo=quickstart --state-dir "$WORK/hub" | sed 's/^/    /'
done
for i in 1 2; do wait "${JOIN_PIDS[$((i-1))]}" || die "join of edge-$i failed: $(tail -3 "$WORK/join-$i.log")"; done
step "both agents hold hub-issued client certificates"

for i in 1 2; do
  step "starting agent edge-$i: flower-agent run --runtime process"
  "$AGENT" run --state-dir "$WORK/agent-$i" --runtime process --flower-bin "$VENV/bin" \
    --port-base "$((19100 + 100 * i))" \
    --metrics-bind-address "127.0.0.1:$(free_port)" --health-probe-bind-address "127.0.0.1:$(free_port)" \
    >"$WORK/agent-$i.log" 2>&1 &
  PIDS+=($!)
done

step "applying examples/quickstart (Federation + Placement) to the hub's manifests directory"
# With spec.outputs: each FlowerRun's files (the trained model) are kept under the hub's state dir.
sed "s/\"1.42.0\"/\"$FLOWER_VERSION\"/; s/:1.42.0/:$FLOWER_VERSION/g; s/^spec:$/spec:\n  outputs: {}/" \
  examples/quickstart/federation.yaml >"$WORK/manifests/federation.yaml"
cp examples/quickstart/placement.yaml "$WORK/manifests/placement.yaml"

step "waiting until all 4 SuperNodes are connected (flower-hub status)"
for _ in $(seq 1 180); do
  if "$HUB" status --state-dir "$WORK/hub" -o json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
f = [x for x in s.get("federations", []) if x["name"] == "quickstart"]
sys.exit(0 if f and f[0]["ready"] and f[0]["readySupernodes"] == 4 else 1)'; then break; fi
  sleep 1
done
"$HUB" status --state-dir "$WORK/hub" | sed 's/^/    /'
step "the hub's /readyz and /metrics (curl 127.0.0.1:$HUB_METRICS/metrics)"
python3 - "$HUB_HEALTH" "$HUB_METRICS" <<'PY' || die "the hub's /readyz or /metrics did not answer"
import sys, urllib.request as u
health, metrics = sys.argv[1], sys.argv[2]
print("    /readyz:", u.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=5).read().decode().splitlines()[-1])
for line in u.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode().splitlines():
    if line.startswith(("flower_addon_hub_connected_agents", "flower_addon_hub_supernodes")):
        print("    " + line)
PY
"$HUB" status --state-dir "$WORK/hub" -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)
f = [x for x in s.get("federations", []) if x["name"] == "quickstart"]
sys.exit(0 if f and f[0]["ready"] and f[0]["readySupernodes"] == 4 else 1)' || die "SuperNodes not ready after 180 s"
T_READY=$(elapsed)

# flwr's connection to the hub SuperLink (Control API), over TLS with the hub CA.
CA="$WORK/hub/federations/default/quickstart/tls/ca.crt"
APP="$WORK/app"; cp -r examples/fedavg "$APP"; rm -rf "$APP/.flwr"
MINOR="$(cut -d. -f2 <<<"$FLOWER_VERSION")"
# Flower < 1.26 reads the connection from the app: the classic Control API port of the demo's hub.
CONTROL=19093
if (( MINOR >= 26 )); then
  # The hub writes the entry itself: Control address from its status, the SuperLink's CA.
  "$HUB" connect quickstart --state-dir "$WORK/hub" --flwr-home "$WORK/flwr-home" \
    --ca-file "$WORK/quickstart-ca.crt" >/dev/null || die "flower-hub connect failed"
  CONN=(quickstart)
  # What --keep prints is this file, the one every flwr call below uses.
  ENTRY_FILE="$WORK/flwr-home/config.toml"
else
  cat >"$WORK/connection.toml" <<EOF

[tool.flwr.federations]
default = "quickstart"

[tool.flwr.federations.quickstart]
address = "127.0.0.1:$CONTROL"
root-certificates = "$CA"
EOF
  cat "$WORK/connection.toml" >>"$APP/pyproject.toml"
  CONN=("$APP" quickstart)
  ENTRY_FILE="$WORK/connection.toml"
fi
export FLWR_HOME="$WORK/flwr-home" PATH="$VENV/bin:$PATH"

step "flwr run $APP quickstart ($ROUNDS rounds of FedAvg)"
flwr run "$APP" quickstart --run-config "num-server-rounds=$ROUNDS min-nodes=4 round-timeout=${ROUND_TIMEOUT:-120.0}" --stream \
  >"$WORK/run.log" 2>&1 &
RUN_PID=$!
T_FIRST=""
while kill -0 "$RUN_PID" 2>/dev/null; do
  if [[ -z "$T_FIRST" ]] && grep -q '^round 1/' "$WORK/run.log"; then
    T_FIRST=$(elapsed)
    step "first round completed"
  fi
  sleep 0.5
done
wait "$RUN_PID" || die "flwr run failed: $(tail -5 "$WORK/run.log")"
[[ -n "$T_FIRST" ]] || { grep -q '^round 1/' "$WORK/run.log" && T_FIRST=$(elapsed); }
RUN_ID="$(grep -oE 'started run [0-9]+' "$WORK/run.log" | grep -oE '[0-9]+$' | head -n 1)"
[[ -n "$RUN_ID" ]] || die "no run id in the flwr run output (see $WORK/run.log)"
STATUS=""
for _ in $(seq 1 120); do
  STATUS="$(flwr ls "${CONN[@]}" --run-id "$RUN_ID" --format json 2>/dev/null | python3 -c '
import json, sys
raw = sys.stdin.read(); d = json.loads(raw[raw.index("{"):])
print(d["runs"][0]["status"] if d.get("success") else "error")' || true)"
  [[ "$STATUS" == finished:* ]] && break
  sleep 1
done
T_DONE=$(elapsed)
grep -E '^round ' "$WORK/run.log" | sed 's/^/    /' || true
METRIC="$(grep -E '^final: ' "$WORK/run.log" || true)"
step "run $RUN_ID: $STATUS — $METRIC"
[[ "$STATUS" == "finished:completed" ]] || die "run $RUN_ID ended $STATUS (see $WORK/run.log)"
[[ -n "$METRIC" ]] || die "no final metric in the run output"
# The same app again, declaratively: a FlowerRun the hub submits and follows (no flwr involved).
step "the same app as a FlowerRun: flower-hub run submit examples/fedavg --federation quickstart --follow"
"$HUB" run submit examples/fedavg --federation quickstart --state-dir "$WORK/hub" --name demo-run \
  --run-config "num-server-rounds=1 min-nodes=4" --follow >"$WORK/flowerrun.log" 2>&1 \
  || die "flower-hub run submit failed: $(tail -5 "$WORK/flowerrun.log")"
grep -E '^round |Complete' "$WORK/flowerrun.log" | sed 's/^/    /' || true
"$HUB" run list --state-dir "$WORK/hub" | sed 's/^/    /'
step "the trained model: flower-hub run fetch demo-run -o $WORK/model"
for _ in $(seq 1 20); do
  "$HUB" run fetch demo-run --state-dir "$WORK/hub" -o "$WORK/model" >"$WORK/fetch.log" 2>&1 && break
  sleep 0.5
done
sed 's/^/    /' "$WORK/fetch.log"
[[ -s "$WORK/model/model.npz" ]] || die "run fetch gave no model.npz (see $WORK/fetch.log)"
rss() { awk '/VmRSS/ {printf "%d MB", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }
# RSS of the debug binaries built above: most of it is their unoptimised code pages (a release
# agent holds ~12 MiB here; `cargo run --release -p e2e --bin agent_rss` measures it).
printf 'demo: ready=%.1fs first_round=%.1fs all_rounds=%.1fs rss_hub=%s rss_agent1=%s rss_agent2=%s (debug build)\n' \
  "$T_READY" "${T_FIRST:-0}" "$T_DONE" "$(rss "${PIDS[0]}")" "$(rss "${PIDS[1]}")" "$(rss "${PIDS[2]}")"

if (( MINOR >= 26 )); then
  # The entry printed below, checked on its own: flwr with a FLWR_HOME that holds only it.
  mkdir -p "$WORK/entry-check"
  cp "$ENTRY_FILE" "$WORK/entry-check/config.toml"
  FLWR_HOME="$WORK/entry-check" flwr ls quickstart --format json >"$WORK/entry-check.log" 2>&1 \
    && grep -q '"success": true' "$WORK/entry-check.log" \
    || die "flwr ls with the connection entry alone failed (see $WORK/entry-check.log)"
fi

if (( KEEP )); then
  if (( MINOR >= 26 )); then
    cat <<EOF

The federation keeps running (hub pid ${PIDS[0]}, agents ${PIDS[1]} ${PIDS[2]}; state in $WORK).
flower-hub connect wrote this flwr connection to $ENTRY_FILE:

$(cat "$ENTRY_FILE")

Use it with FLWR_HOME=$WORK/flwr-home, or let the hub write it into your own flwr home:
    $HUB connect quickstart --state-dir $WORK/hub --flwr-home ~/.flwr
then run your own app:
    flwr run ./your-app quickstart --stream
Stop everything with: kill ${PIDS[*]}
EOF
  else
    cat <<EOF

The federation keeps running (hub pid ${PIDS[0]}, agents ${PIDS[1]} ${PIDS[2]}; state in $WORK).
Flower $FLOWER_VERSION reads connections from the app's pyproject.toml: add this (the entry the
run above used) to your app's pyproject.toml:
$(cat "$ENTRY_FILE")

then run it:
    flwr run ./your-app quickstart --stream
Stop everything with: kill ${PIDS[*]}
EOF
  fi
  trap - EXIT INT TERM
else
  step "stopping everything the demo started"
fi

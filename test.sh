#!/usr/bin/env bash
# Runs the whole flower-addon test suite: formatting, lints, unit and golden tests, tests on real
# kube-apiservers (built from Go modules), the work channel over real TLS, and the quickstart with
# real Flower from PyPI for every Flower argument dialect (1.42.0, 1.39.0, 1.35.0, 1.30.0, 1.25.0).
#
# Installs what it needs and caches the expensive parts in ${FLOWER_ADDON_CACHE:-~/.cache/flower-addon}:
# the Kubernetes binaries (first build ~17 min on 2 cores), the Flower venvs (~30-60 s each), the
# real-node binaries (kubelet, kube-proxy; ~2 min after the control plane), helm (~4 min, for the
# chart tests) and Debian packages
# (containerd, runc, CNI plugins, buildah, mmdebstrap, iptables), and the container images the
# real-node tests run (Debian base, pause, Flower 1.42.0/1.25.0, our Dockerfile; ~12 min cold).
# A warm run (cache present) takes ~35-42 min on 2 cores: the build ~5, then three lanes at once
# (real_node with its fault scenarios, the longest, ~30 of them); see docs/testing.md for the
# measured figures.
set -euo pipefail
cd "$(dirname "$0")"
export FLOWER_ADDON_CACHE="${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}"
# A whole-suite run gains nothing from incremental compilation state (~5 GB in target/).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
T0=$SECONDS
step() { printf '\n==> [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
LOG_DIR="$(mktemp -d /tmp/flower-addon-test.XXXXXX)"
PASSED=0
# Every retry a test allows itself (Flower 1.25's known bug, a port taken between choosing and
# binding it, a failed image import) is appended here, one "KIND<TAB>WHAT" line each, and
# counted in the summary: a count that rises from run to run is a problem to look at.
export FLOWER_ADDON_RETRY_LOG="$LOG_DIR/retries.log"
: > "$FLOWER_ADDON_RETRY_LOG"

step "checking the toolchain (cargo, go, python3)"
for tool in cargo go python3; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool is required but not on PATH" >&2; exit 1; }
done

# Steps that mostly wait on the network and the disk (Flower venvs from PyPI; the Debian, Flower
# and example images, whose builds download wheels and packages and copy layers) run in the
# background while the Go builds below keep both cores busy: on a fresh machine this saves
# ~10 minutes. Each writes its log to $LOG_DIR and is waited for before its first use.
FLOWER_MATRIX=(1.42.0 1.39.0 1.35.0 1.30.0 1.25.0)
step "background: Flower venvs (flwr ${FLOWER_MATRIX[*]}) and the base, pause, Flower and example images"
# Each in a session of its own, so that a failed run can end it with all its children.
setsid bash -c 'for v in "$@"; do e2e/flower/venv.sh "$v"; done' venvs "${FLOWER_MATRIX[@]}" \
  > "$LOG_DIR/venvs.log" 2>&1 &
VENVS_PID=$!
setsid e2e/images/build.sh --only base --only pause --only flwr --only app \
  > "$LOG_DIR/images-flower.log" 2>&1 &
IMAGES_PID=$!
trap 'kill -- "-$VENVS_PID" "-$IMAGES_PID" 2>/dev/null || true' EXIT
# await PID WHAT LOG: waits for a background step, failing with its log when it failed.
await() {
  local t=$SECONDS
  if ! wait "$1"; then
    echo "test.sh: $2 failed; what each failing test said (up to 60 lines each, backtraces left out), then the end of its log ($3):" >&2
    awk '/^---- .* stdout ----$|panicked at/ { p = 1; n = 0 } p && /^[Ss]tack backtrace:/ { p = 0 } p && n < 60 { print; n++ }' "$3" >&2
    echo "--- the end of $3:" >&2
    tail -n 30 "$3" >&2
    exit 1
  fi
  echo "    $2 done (waited $((SECONDS - t)) s)"
}

step "Kubernetes test control plane: e2e/k8s/build.sh (cold build 20-35 min, then cached)"
K8S_BIN="$(e2e/k8s/build.sh)"
export FLOWER_ADDON_K8S_BIN="$K8S_BIN"
echo "    $K8S_BIN"

step "real nodes: Debian packages (containerd, runc, CNI, iptables) + kubelet, kube-proxy: e2e/node/build.sh"
t_node=$SECONDS
NODE_BIN="$(e2e/node/build.sh)"
export FLOWER_ADDON_NODE_BIN="$NODE_BIN"
echo "    $NODE_BIN ($((SECONDS - t_node)) s)"

step "helm from its Go module for the chart tests: e2e/helm/build.sh (cold ~2-5 min, then cached)"
t_helm=$SECONDS
FLOWER_ADDON_HELM="$(e2e/helm/build.sh)"
export FLOWER_ADDON_HELM
echo "    $FLOWER_ADDON_HELM ($((SECONDS - t_helm)) s)"

step "Open Cluster Management v1.2.0 hub controllers and klusterlet from its Go module: e2e/ocm/build.sh (cold ~4-5 min, then cached)"
t_ocm=$SECONDS
FLOWER_ADDON_OCM_BIN="$(e2e/ocm/build.sh)"
export FLOWER_ADDON_OCM_BIN
echo "    $FLOWER_ADDON_OCM_BIN ($((SECONDS - t_ocm)) s)"

# Every Go-built tool is now cached with what it reads; the Go caches (~9 GB) would only serve
# a rebuild, and target/ needs the disk (a full run on a machine with ~25 GB free ran out of it).
step "trimming the Go build and module caches: e2e/k8s/trim-go-caches.sh (FLOWER_ADDON_KEEP_GO_CACHES=1 keeps them)"
e2e/k8s/trim-go-caches.sh 2>&1 | sed 's/^/    /'
# What the rest needs: target/ (10-18 GB from scratch) and the real nodes' containerd roots under
# /tmp (~2 GB at a time). Said up front, so that a full disk is not first seen as a failed import.
for dir in "${CARGO_TARGET_DIR:-.}" /tmp; do
  # A CARGO_TARGET_DIR that does not exist yet: the disk it will be made on.
  while [[ ! -e "$dir" ]]; do dir="$(dirname "$dir")"; done
  free_gb="$(df -P -BG "$dir" | awk 'NR==2 {sub("G", "", $4); print $4}')"
  if (( free_gb < 20 )); then
    echo "    warning: only ${free_gb} GB free for $dir; the suite needs ~20 GB (target/ and the nodes' images)"
  else
    echo "    ${free_gb} GB free for $dir"
  fi
done

# The quickstart runs once per Flower release of the matrix: the unified (1.42.0), transitional
# (1.39.0 with HTTPS Control, 1.35.0 with gRPC Control) and classic (1.30.0 with flwr's
# config.toml, 1.25.0 with the app's pyproject.toml) argument dialects. 1.42.0 and 1.25.0 run the
# full 3 rounds; the others one round, to keep the suite's time.
step "Flower venvs from PyPI: flwr ${FLOWER_MATRIX[*]} (started in the background; ~30-60 s each when new)"
await "$VENVS_PID" "the Flower venvs" "$LOG_DIR/venvs.log"
for version in "${FLOWER_MATRIX[@]}"; do
  e2e/flower/venv.sh "$version" | tail -n 1 | sed 's/^/    /'
done

step "cargo fmt --check"
cargo fmt --all -- --check

# `cargo test --no-run` rather than `cargo build --bins`: the tests' dev-dependencies enable more
# features of shared crates (tokio among them), so a plain build compiled ~95 crates a second time
# for the tests. This builds every test binary and flower-hub/flower-agent (into target/debug,
# what the image and the e2e tests use) with one feature set.
step "building flower-hub, flower-agent and every test binary (cargo test --no-run; cold: several minutes)"
cargo test --workspace --no-run --quiet

step "container images for the real nodes: e2e/images/build.sh (base, pause, Flower, ours from ./Dockerfile)"
t_img=$SECONDS
await "$IMAGES_PID" "the base, pause, Flower and example images" "$LOG_DIR/images-flower.log"
grep -E '^==> (images done|.*: cached)' "$LOG_DIR/images-flower.log" | sed 's/^/    /' || true
# The image is built from the repository Dockerfile with the debug binaries just built (BIN_DIR).
IMAGES="$(FLOWER_ADDON_BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" e2e/images/build.sh)"
export FLOWER_ADDON_IMAGES="$IMAGES"
echo "    $IMAGES ($((SECONDS - t_img)) s)"

# The rest runs in three lanes at once; most of it waits (on pods, leases, outages, Flower's
# rounds and session timeouts), so on 2 cores three lanes take about as long as the longest:
# - real_node (three clusters on real nodes, our image, Flower, OCM, and the fault scenarios: the
#   hub's control plane and etcd down, a node power-cycled, spokes cut off, a rolling upgrade),
#   the longest test by far, in the foreground (its output is what you see);
# - "checks": clippy (into $FLOWER_ADDON_CACHE/clippy-target: a target directory of its own, so
#   that it never holds the build lock the other lanes' `cargo test` take, and kept between runs,
#   so that a warm run compiles only the workspace's crates), then every other test but the ones
#   that run Flower as processes: unit, golden, CLI, loopback mTLS, real apiservers, OCM, the
#   soak, real Flower on a real node; then the quickstart demos one after the other;
# - "processes": the tests that run Flower as processes on loopback (standalone hubs, agents and
#   SuperNodes, the hub killed 20 times around submissions).
# Tests that run real nodes at once share the host's state through e2e/src/node/host.rs; every
# port is chosen free at the moment, control-plane boots take turns (a lock in the temp dir).
# A lane that fails ends the others at once.
REAL_NODE_TEST=pods_run_on_a_real_node
PROCESS_TESTS=(standalone_flower standalone_local standalone_runs)
process_targets=()
for t in "${PROCESS_TESTS[@]}"; do process_targets+=(--test "$t"); done
# Their test names, skipped (exactly) in the checks lane: each runs once.
process_skips=()
while IFS= read -r name; do
  process_skips+=(--skip "$name")
done < <(cargo test --workspace --quiet "${process_targets[@]}" -- --list --format terse 2>/dev/null | sed -n 's/: test$//p')
(( ${#process_skips[@]} > 0 )) || { echo "test.sh: no tests listed in ${PROCESS_TESTS[*]}" >&2; exit 1; }

# Flower 1.25.0's SuperLink sometimes fails a SuperNode's message pull with "Both bytes_sent and
# bytes_recv cannot be zero" (a bug inside Flower; that SuperNode then never replies and the round
# times out). Only for that exact signature the demo is run once more from scratch, saying so;
# any other failure fails at once. Each demo that passed appends its version to demos-passed.
FLOWER_125_BUG='Both bytes_sent and bytes_recv cannot be zero'
run_demos() {
  local version rounds attempt work
  for version in "${FLOWER_MATRIX[@]}"; do
    case "$version" in 1.42.0 | 1.25.0) rounds=3 ;; *) rounds=1 ;; esac
    for attempt in 1 2; do
      lane_step "quickstart end to end with Flower $version: ./demo.sh (hub + 2 agents + flwr run, $rounds rounds)"
      work="$LOG_DIR/demo-$version-$attempt"
      # The binaries the tests ran (a plain `cargo build` would compile ~95 crates again with the
      # feature set of a build without the tests' dev-dependencies).
      if FLOWER_ADDON_BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" FLOWER_VERSION="$version" DEMO_ROUNDS="$rounds" DEMO_WORK="$work" \
        ./demo.sh > "$LOG_DIR/demo-$version.log" 2>&1 \
        && grep -q 'finished:completed' "$LOG_DIR/demo-$version.log"; then
        echo "$version" >> "$LOG_DIR/demos-passed"
        break
      fi
      if (( attempt == 1 )) && grep -rqs "$FLOWER_125_BUG" "$work"; then
        echo "test.sh: Flower $version's SuperLink hit its known bug ($FLOWER_125_BUG); running the demo once more"
        printf 'flower-1.25-bug\tdemo.sh with Flower %s\n' "$version" >> "$FLOWER_ADDON_RETRY_LOG"
        continue
      fi
      echo "test.sh: the demo with Flower $version failed (logs in $work); its output:"
      cat "$LOG_DIR/demo-$version.log"
      return 1
    done
  done
}
# A lane's step lines go to its log and, prefixed with the lane, to the console (fd 3).
lane_step() {
  step "$@"
  printf '==> [%4ds] %s: %s\n' "$((SECONDS - T0))" "$LANE" "$*" >&3
}
# Each lane runs in a CPU cgroup of its own (LANE_CGROUP, made below), so that the kernel weighs
# lanes, not processes or sessions: the standalone hubs and agents start every program they
# supervise in a session of its own, and with the kernel's autogroup each session weighed as much
# as a whole real node (its pods are in the node's cgroup): the processes lane outweighed each
# spoke's node about fifteen to one. lane_weight sets this lane's weight (cgroup v1 cpu.shares;
# v2 cpu.weight, scaled).
lane_weight() {
  [[ -n "${LANE_CGROUP:-}" ]] || return 0
  if [[ -f "$LANE_CGROUP/cpu.weight" ]]; then
    echo $(( $1 * 100 / 1024 > 0 ? $1 * 100 / 1024 : 1 )) > "$LANE_CGROUP/cpu.weight" || true
  else
    echo "$1" > "$LANE_CGROUP/cpu.shares" || true
  fi
}
# Moves the calling shell (and all it starts from then on) into its lane's cgroup.
in_lane_cgroup() {
  [[ -z "${LANE_CGROUP:-}" ]] || echo "$BASHPID" > "$LANE_CGROUP/cgroup.procs"
}
checks_lane() {
  set -o pipefail
  lane_step "cargo clippy --workspace --all-targets -- -D warnings (into $CLIPPY_TARGET; cold: several minutes, on the CPU the other lanes leave)"
  # Clippy compiles the workspace from scratch: minutes of both cores. Beside it Flower's own
  # clocks run in the other lanes: Flower 1.42 gives a ClientApp or ServerApp process 30 s from
  # being claimed to its first heartbeat. A SuperNode whose `flwr-clientapp` took longer (on a
  # real node short of CPU) logs "Runtime task-token authentication failed", and the round
  # waits on it until the run is stopped. So clippy runs at the lowest weight (2), the tests
  # after it at the normal one.
  lane_weight 2
  CARGO_TARGET_DIR="$CLIPPY_TARGET" nice -n 19 cargo clippy --workspace --all-targets --quiet -- -D warnings || return 1
  lane_weight 1024
  lane_step "cargo test --workspace (all but real_node and ${PROCESS_TESTS_LIST})"
  # shellcheck disable=SC2086
  cargo test --workspace -- --exact --skip "$REAL_NODE_TEST" $PROCESS_SKIPS > "$LOG_DIR/cargo-test.log" 2>&1 || return 1
  lane_step "cargo test done: $(grep -cE '^test result: ok\.' "$LOG_DIR/cargo-test.log") test binaries passed"
  # The demos run Flower as the processes lane does, at its weight.
  lane_weight 2048
  run_demos
}
processes_lane() {
  set -o pipefail
  lane_step "cargo test ${PROCESS_TESTS_LIST}"
  # shellcheck disable=SC2086
  cargo test --workspace $PROCESS_TARGETS > "$LOG_DIR/process-tests.log" 2>&1 || return 1
  lane_step "cargo test ${PROCESS_TESTS_LIST} done"
}
: > "$LOG_DIR/demos-passed"
export -f run_demos lane_step lane_weight in_lane_cgroup checks_lane processes_lane step
# Clippy's own target directory, kept with the cache: only the workspace's crates compile again.
CLIPPY_TARGET="$FLOWER_ADDON_CACHE/clippy-target"
export LOG_DIR FLOWER_125_BUG T0 REAL_NODE_TEST CLIPPY_TARGET
export FLOWER_MATRIX_LIST="${FLOWER_MATRIX[*]}" PROCESS_TESTS_LIST="${PROCESS_TESTS[*]}" \
  PROCESS_TARGETS="${process_targets[*]}" PROCESS_SKIPS="${process_skips[*]}"
exec 3>&1
step "three lanes: real_node here; checks (clippy, cargo test of all but real_node and ${PROCESS_TESTS[*]}, then the quickstart demos of Flower ${FLOWER_MATRIX[*]}; log $LOG_DIR/checks.log) and processes (${PROCESS_TESTS[*]}; log $LOG_DIR/processes.log) beside it"
# The lanes' CPU cgroups (see lane_weight): under the cgroup v1 cpu hierarchy, or cgroup v2's
# root with the cpu controller enabled for its children; none where neither is writable (the
# lanes then share the CPU as the kernel decides). real_node's lane holds three clusters' control
# planes (their nodes' pods are in cgroups of their own, 1024 each: e2e::node::NODE_CPU_SHARES),
# the processes lane its hubs, SuperLinks, SuperNodes and their apps: each weighs 2048, the
# checks lane 1024 (2 while clippy compiles, 2048 for the demos).
CGROUP_PARENT=""
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  if [[ -w /sys/fs/cgroup ]] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    CGROUP_PARENT=/sys/fs/cgroup
  fi
elif [[ -w /sys/fs/cgroup/cpu ]]; then
  CGROUP_PARENT=/sys/fs/cgroup/cpu
fi
declare -A LANE_CGROUPS=()
for lane in checks processes real_node; do
  dir="$CGROUP_PARENT/flower-addon-test.$$.$lane"
  if [[ -n "$CGROUP_PARENT" ]] && mkdir "$dir" 2>/dev/null; then
    LANE_CGROUPS[$lane]="$dir"
  fi
done
for lane in processes real_node; do
  LANE_CGROUP="${LANE_CGROUPS[$lane]:-}" lane_weight 2048
done
# Ends whatever still runs in the lanes' cgroups (a failed lane's processes that left its
# session: the standalone hubs' and agents' own children) and removes the cgroups.
remove_lane_cgroups() {
  local dir pid _
  for dir in "${LANE_CGROUPS[@]}"; do
    for _ in $(seq 1 50); do
      for pid in $(cat "$dir/cgroup.procs" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null || true
      done
      rmdir "$dir" 2>/dev/null && break
      sleep 0.2
    done
  done
}
# Each lane in a session of its own (ended with all its children on failure); its step lines
# count from the suite's start (SECONDS is set to where it is now).
export LANE_START=$SECONDS
LANE=checks LANE_CGROUP="${LANE_CGROUPS[checks]:-}" setsid bash -c 'in_lane_cgroup; SECONDS=$LANE_START; FLOWER_MATRIX=($FLOWER_MATRIX_LIST); checks_lane' > "$LOG_DIR/checks.log" 2>&1 &
CHECKS_PID=$!
LANE=processes LANE_CGROUP="${LANE_CGROUPS[processes]:-}" setsid bash -c 'in_lane_cgroup; SECONDS=$LANE_START; processes_lane' \
  > "$LOG_DIR/processes.log" 2>&1 &
PROCESSES_PID=$!
# --workspace: the same feature resolution as the build above (with -p e2e alone cargo would
# compile the hub and agent libraries again for a smaller feature set).
LANE_CGROUP="${LANE_CGROUPS[real_node]:-}" setsid bash -c 'in_lane_cgroup; set -o pipefail; cargo test --workspace --test real_node -- --exact "$REAL_NODE_TEST" 2>&1 | tee "$LOG_DIR/real-node.log"' &
REAL_NODE_PID=$!
# A real node's containers live in cgroups of their own, not in its lane's: once the lanes'
# processes (kubelet and containerd among them) are ended, `e2e reap` removes what the nodes of a
# failed or killed real_node left (containers, mounts, namespaces, veths, bridges, cgroups).
reap_real_nodes() {
  local e2e="${CARGO_TARGET_DIR:-target}/debug/e2e"
  if [[ -x "$e2e" ]]; then
    "$e2e" reap || true
  fi
}
trap 'kill -- "-$VENVS_PID" "-$IMAGES_PID" "-$CHECKS_PID" "-$PROCESSES_PID" "-$REAL_NODE_PID" 2>/dev/null || true; remove_lane_cgroups; reap_real_nodes' EXIT
declare -A LANE_OF=([$CHECKS_PID]=checks [$PROCESSES_PID]=processes [$REAL_NODE_PID]=real_node)
# Each lane's log, then the log of the tests it ran.
declare -A LANE_LOGS=([checks]="$LOG_DIR/checks.log $LOG_DIR/cargo-test.log"
  [processes]="$LOG_DIR/processes.log $LOG_DIR/process-tests.log" [real_node]="$LOG_DIR/real-node.log")
while (( ${#LANE_OF[@]} > 0 )); do
  rc=0
  wait -n -p done_pid "${!LANE_OF[@]}" || rc=$?
  lane="${LANE_OF[$done_pid]}"
  unset "LANE_OF[$done_pid]"
  if (( rc != 0 )); then
    read -r -a logs <<< "${LANE_LOGS[$lane]}"
    # The lane's own step lines say which step failed; then what each failing test said.
    echo "test.sh: the $lane lane failed (rc $rc; the other lanes are stopped); its steps:" >&2
    grep -E '^==> \[' "${logs[0]}" >&2 || true
    for f in "${logs[@]}"; do
      [[ -s "$f" ]] || continue
      echo "--- failing tests in $f (up to 60 lines each, backtraces left out):" >&2
      awk '/^---- .* stdout ----$|panicked at/ { p = 1; n = 0 } p && /^[Ss]tack backtrace:/ { p = 0 } p && n < 60 { print; n++ }' "$f" >&2
      echo "--- the end of $f:" >&2
      tail -n 30 "$f" >&2
    done
    exit 1
  fi
  echo "==> [$(printf '%4d' $((SECONDS - T0)))s] lane $lane passed"
done
grep -E '^test result' "$LOG_DIR/cargo-test.log" "$LOG_DIR/process-tests.log" | sed 's/^/    /' || true
cargo_passed="$(cat "$LOG_DIR/cargo-test.log" "$LOG_DIR/real-node.log" "$LOG_DIR/process-tests.log" | grep -E '^test result: ok\.' | awk '{s += $4} END {print s + 0}')"
(( cargo_passed > 0 )) || { echo "test.sh: cargo test ran no test" >&2; exit 1; }
grep -qE '^test result: ok\. 1 passed' "$LOG_DIR/real-node.log" \
  || { echo "test.sh: real_node did not run its test" >&2; exit 1; }
process_ran="$(grep -cE '^test result: ok\. [1-9]' "$LOG_DIR/process-tests.log" || true)"
(( process_ran == ${#PROCESS_TESTS[@]} )) \
  || { echo "test.sh: $process_ran of ${#PROCESS_TESTS[@]} test binaries of the processes lane ran tests" >&2; exit 1; }
demos_passed="$(wc -l < "$LOG_DIR/demos-passed")"
(( demos_passed == ${#FLOWER_MATRIX[@]} )) \
  || { echo "test.sh: $demos_passed of ${#FLOWER_MATRIX[@]} demos passed" >&2; exit 1; }
PASSED=$((PASSED + cargo_passed + demos_passed))

retries="$(wc -l < "$FLOWER_ADDON_RETRY_LOG")"
if (( retries > 0 )); then
  step "retries: $retries ($(cut -f1 "$FLOWER_ADDON_RETRY_LOG" | sort | uniq -c | awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}'))"
  sed 's/^/    /' "$FLOWER_ADDON_RETRY_LOG"
else
  step "retries: 0"
fi
# Logs stay only after a failure (above), or when asked for: a passing run leaves nothing in /tmp.
if [[ "${FLOWER_ADDON_KEEP_LOGS:-0}" == 1 ]]; then
  step "done in $((SECONDS - T0)) s (logs kept in $LOG_DIR)"
else
  rm -rf "$LOG_DIR"
  step "done in $((SECONDS - T0)) s (FLOWER_ADDON_KEEP_LOGS=1 keeps the logs)"
fi
echo "test.sh: retries: $retries"
echo "test.sh: $PASSED passed, 0 failed"

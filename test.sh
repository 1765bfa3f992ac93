#!/usr/bin/env bash
# Runs the whole flower-addon test suite: formatting, lints, unit and golden tests, and the
# tests against real components (real kube-apiservers built from Go modules, real Flower from
# PyPI). Installs what it needs and caches the expensive parts in ~/.cache/flower-addon/.
set -euo pipefail
cd "$(dirname "$0")"
export FLOWER_ADDON_CACHE="${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}"
step() { printf '\n==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

step "checking the toolchain (cargo, go, python3)"
for tool in cargo go python3; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool is required but not on PATH" >&2; exit 1; }
done

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "unit, golden and loopback tests (cargo test --workspace)"
cargo test --workspace --quiet 2>&1 | tee "${TMPDIR:-/tmp}/flower-addon-cargo-test.log"

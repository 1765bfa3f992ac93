#!/usr/bin/env bash
# Create (once) a venv with flwr==VERSION + numpy and print its path as the last stdout line.
# Usage: e2e/flower/venv.sh 1.42.0
# Cache: ${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}/venv/flwr-VERSION
# Idempotent: a stamp file (.flower-addon-ok) is written only after a successful install and
# import check; a half-made venv (no stamp) is removed and rebuilt.
set -euo pipefail

VERSION="${1:?usage: venv.sh FLWR_VERSION (e.g. 1.42.0)}"
PYTHON="${PYTHON:-python3}"
# numpy pin: 2.x wheels work with flwr 1.25 and 1.42 on python 3.11 (flwr requires numpy>=1.26,<3).
NUMPY_SPEC="${NUMPY_SPEC:-numpy>=1.26,<3}"
CACHE="${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}"
VENV="$CACHE/venv/flwr-$VERSION"
STAMP="$VENV/.flower-addon-ok"

if [[ -f "$STAMP" && -x "$VENV/bin/flower-superlink" ]]; then
  echo "$VENV"
  exit 0
fi

mkdir -p "$CACHE/venv"
# Serialize concurrent callers for the same version.
exec 9>"$CACHE/venv/.lock-flwr-$VERSION"
if command -v flock >/dev/null 2>&1; then flock 9; fi
if [[ -f "$STAMP" && -x "$VENV/bin/flower-superlink" ]]; then
  echo "$VENV"
  exit 0
fi

rm -rf "$VENV"
echo "venv.sh: creating $VENV with flwr==$VERSION and numpy (takes ~15-60 s)..." >&2
start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "flwr==$VERSION" "$NUMPY_SPEC" >&2
"$VENV/bin/python" -c 'import flwr, numpy; print("venv.sh: flwr", flwr.__version__ if hasattr(flwr, "__version__") else "?", "numpy", numpy.__version__)' >&2
for bin in flwr flower-superlink flower-supernode; do
  [[ -x "$VENV/bin/$bin" ]] || { echo "venv.sh: missing $VENV/bin/$bin" >&2; exit 1; }
done
"$VENV/bin/python" -m pip freeze --disable-pip-version-check > "$VENV/requirements.lock"
date -u +%FT%TZ > "$STAMP"
echo "venv.sh: ready in $(( $(date +%s) - start )) s" >&2
echo "$VENV"

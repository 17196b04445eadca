# Sourced by scripts/demo.sh and scripts/test.sh: make (once) and activate the project virtualenv.
# Needs only Python 3.11 to 3.13 on a Debian machine; installs python3-venv with apt when venv is missing.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${PARCEL_VENV:-$ROOT/.venv}
PY=${PYTHON:-$(command -v python3.11 || command -v python3.12 || command -v python3.13 || command -v python3)}
# Python 3.11 to 3.13 (parcel_hpc.errors.PYTHON_RANGE): Hydra 1.3.8 fails on 3.14 (hydra issue 3121).
"$PY" -c 'import sys; assert (3, 11) <= sys.version_info[:2] < (3, 14), sys.version' 2>/dev/null \
  || { echo "parcel_hpc runs on Python 3.11 to 3.13, not $("$PY" --version 2>&1) (Hydra 1.3.8 fails on 3.14: hydra issue 3121); set PYTHON=python3.13 or older" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    # Debian ships venv separately; a fresh machine may lack it.
    echo "[setup] installing python3-venv" >&2
    rm -rf "$VENV"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv "$VENV"
  fi
fi
# Reinstall when pyproject.toml changed since the last install (cheap check, no network otherwise).
STAMP="$VENV/.parcel-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  echo "[setup] installing parcel_hpc and its dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" 2>&1 | grep -v "is ignored" >&2 || true
  "$VENV/bin/python" -c 'import parcel_hpc, submitit, hydra, h5py, xdist, xxhash, mypy' || { echo "[setup] install failed" >&2; exit 1; }
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# The project's own modules as bytecode, as pip leaves every installed package: an editable install
# compiles nothing, and where PYTHONDONTWRITEBYTECODE is set (CI shells may set it) every process, a
# launch's or a trial's, compiled them from source again (about 0.15 s of CPU each). Stale files are
# never read: each .pyc is checked against its source's size and time. A tree this user cannot write
# (a shared checkout) keeps compiling at import, as before: nothing to stop for.
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/parcel_hpc" "$ROOT/hydra_plugins" "$ROOT/examples" >/dev/null 2>&1 || true
# One BLAS thread per process: trials run side by side, and results stay bit-reproducible.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

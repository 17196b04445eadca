#!/usr/bin/env bash
# The whole test suite, as CI runs it: virtualenv, lint (ruff), dead code (vulture), types (mypy),
# two real 3-node SLURM clusters (started here unless SLURM is already configured and answering, then
# that one alone; stopped again at the end), then pytest; with no arguments, the core SLURM tests on
# Debian's Slurm 24.11 too, beside pytest (scripts/newer-slurm.sh; PARCEL_NEWER_SLURM picks the
# version, empty skips it).
#   scripts/test.sh [pytest args...]
#   scripts/test.sh --fast [pytest args...]   the fast tier: lint, dead code, types and the modules
#     tests/fast-tier.txt lists (unit tests, the fake SLURM's behaviour suite); no cluster
set -euo pipefail
source "$(dirname "$0")/_env.sh"
cd "$ROOT"
# torch for the PyTorch example's tests (examples/parcel_cnn), and in both tiers for mypy, which reads
# its types: the CPU build of the version they were measured with. PyPI's torch is the CUDA build,
# gigabytes more, for nothing a CPU uses.
TORCH_CPU=2.13.0
if ! python -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_CPU+cpu')" 2>/dev/null; then
  echo "[setup] installing torch $TORCH_CPU (CPU build) for the CNN example's tests" >&2
  python -m pip install -q "torch==$TORCH_CPU+cpu" 2>/dev/null \
    || python -m pip install -q "torch==$TORCH_CPU" --index-url https://download.pytorch.org/whl/cpu
fi
# Lightning and Hugging Face for the keep-your-loop examples' tests, installed under a constraint that
# holds torch at the CPU build (without it pip would swap in PyPI's CUDA torch, gigabytes more).
if ! python -c "import lightning, transformers, accelerate" 2>/dev/null; then
  echo "[setup] installing lightning and transformers beside the CPU torch" >&2
  python -m pip install -q -c <(echo "torch==$TORCH_CPU+cpu") \
    "lightning==2.6.6" "transformers==5.25.0" "accelerate==1.16.0" 2>&1 | grep -v "is ignored" >&2 || true
  python -c "import lightning, transformers, accelerate" || { echo "[setup] lightning/transformers install failed" >&2; exit 1; }
fi
if [ "${1:-}" = "--fast" ]; then
  shift
  ruff check .
  ruff format --check .
  vulture
  mypy
  mapfile -t fast < <(grep -v '^#' tests/fast-tier.txt | grep . | sed 's|^|tests/|')
  exec python -m pytest -n "${PARCEL_TEST_WORKERS:-2}" -m "fast and not slurm" "${fast[@]}" "$@"
fi
ruff check .
ruff format --check .
vulture  # paths and confidence in pyproject.toml; framework-called names in vulture_allowlist.py
# mypy (files and settings in pyproject.toml) checks while the clusters start: from a fresh clone its
# cache is cold (about 50 s of one core), and the clusters' start mostly waits on their daemons.
mypy_log=$(mktemp /tmp/parcel-mypy.XXXXXX)
mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
started=()  # the dev clusters this run started, and stops on every way out
stop_clusters() {
  local base
  for base in "${started[@]}"; do bash "$ROOT/scripts/dev-cluster-down.sh" "$base" >/dev/null 2>&1 || true; done
  started=()
}
stop_mypy() {
  [ -z "$mypy_pid" ] || kill "$mypy_pid" 2>/dev/null || true
  rm -f "$mypy_log"
}
newer_pid=""  # the newer Slurm's tests beside pytest (below), a session of their own
stop_newer() {
  # Interrupted, the run takes the newer Slurm's tests down with it (their process group: theirs alone).
  [ -z "$newer_pid" ] || kill -TERM -- "-$newer_pid" 2>/dev/null || true
}
trap 'stop_clusters; stop_mypy; stop_newer' EXIT
BASE=${PARCEL_SLURM_BASE:-/tmp/parcel-slurm}
# A SLURM_CONF left in the shell by another dev cluster is never the one to test on: the fault tests
# kill and restart the daemons of the cluster they run against. PARCEL_SLURM_BASE names this one's.
if [ -n "${PARCEL_SLURM_BASE:-}" ] && [ "${SLURM_CONF:-}" != "$BASE/etc/slurm.conf" ]; then unset SLURM_CONF; fi
if [ -z "${SLURM_CONF:-}" ] || ! scontrol ping >/dev/null 2>&1; then
  started+=("$BASE")
  bash scripts/dev-cluster-up.sh "$BASE"
  # shellcheck disable=SC1091
  source "$BASE/env.sh"
  # A second cluster on its own ports takes the cluster tests of the modules tests/second-cluster.txt
  # lists (tests/conftest.py): the cluster tests mostly wait on the scheduler, and one cluster made
  # them the suite's longest path. PARCEL_TEST_CLUSTERS=1 keeps one. Its ports: the first's (the
  # environment's PORT_BASE and DB_PORT, or the defaults) plus 3000 and 1.
  if [ "${PARCEL_TEST_CLUSTERS:-2}" = 2 ]; then
    started+=("$BASE-2")
    PORT_BASE=$((${PORT_BASE:-16817} + 3000)) DB_PORT=$((${DB_PORT:-13306} + 1)) bash scripts/dev-cluster-up.sh "$BASE-2"
    export PARCEL_SECOND_SLURM_CONF="$BASE-2/etc/slurm.conf"
  fi
fi
export PARCEL_REQUIRE_SLURM=1  # slurm-marked tests fail, not skip, when the cluster is missing
# Headless Chromium loads the HTML pages the tests write (the release packet): Debian's package, once.
if ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing chromium (the tests render HTML pages in it)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
fi
export PARCEL_REQUIRE_CHROMIUM=1  # the HTML checks fail, not skip, without it
# A C compiler builds the stand-in for the GPU driver's NVML library (tests/fakes/fake_nvml.c).
if ! command -v cc >/dev/null 2>&1; then
  echo "[setup] installing gcc (the tests build a fake NVML library)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; }
fi
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
mypy_pid=""
cat "$mypy_log"
[ "$mypy_rc" = 0 ] || exit "$mypy_rc"
# The whole suite (no arguments) runs the core SLURM tests on Debian's Slurm 24.11 too, in a
# debootstrapped root (docs/dev-cluster.md; about 5 minutes, a minute more to make the root), beside the
# rest: its cluster, in a root and on ports of its own, mostly waits on its scheduler. Clusters run
# 23.11 to 26.05, the host's Debian 12 has 22.05. PARCEL_NEWER_SLURM=26.05 picks sid's; set empty, or
# any pytest arguments, to skip it. A failed test fails the run; an unreachable archive (exit 75) is
# one loud line from the script, not a failure. Its output follows pytest's.
if [ "$#" = 0 ]; then PARCEL_NEWER_SLURM=${PARCEL_NEWER_SLURM-24.11}; fi
if [ -n "${PARCEL_NEWER_SLURM:-}" ]; then
  newer_log=$(mktemp /tmp/parcel-newer-slurm.XXXXXX)
  # A background job of a script starts with SIGINT and SIGQUIT ignored, and its processes would keep
  # them so (the tests interrupt a launch with SIGINT): env puts them back to their defaults.
  setsid env --default-signal=INT,QUIT bash scripts/newer-slurm.sh "$PARCEL_NEWER_SLURM" >"$newer_log" 2>&1 &
  newer_pid=$!
fi
# Four workers on two cores: the cluster tests mostly wait on the scheduler, so each cluster's tests run on
# one worker (their xdist_group, tests/conftest.py) while two take the local tests, which wait on their
# trials' processes part of the time too; a cluster's worker takes local tests once its own are done.
pytest_rc=0
python -m pytest -n "${PARCEL_TEST_WORKERS:-4}" --dist loadgroup "$@" || pytest_rc=$?
stop_clusters
# pytest catches Ctrl-C and exits 2; the newer Slurm's tests, in a session of their own, never saw it.
if [ "$pytest_rc" = 2 ]; then exit 2; fi
if [ -n "$newer_pid" ]; then
  newer_rc=0
  wait "$newer_pid" || newer_rc=$?
  newer_pid=""
  echo "==== the core SLURM tests on Debian's Slurm $PARCEL_NEWER_SLURM (scripts/newer-slurm.sh), run beside pytest above:"
  cat "$newer_log" && rm -f "$newer_log"
  [ "$newer_rc" = 75 ] || [ "$newer_rc" = 0 ] || exit "$newer_rc"
fi
exit "$pytest_rc"

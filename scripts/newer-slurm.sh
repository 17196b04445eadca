#!/usr/bin/env bash
# Run the dev cluster and the core SLURM tests on Debian's newer Slurm, in a debootstrapped root of
# its own (installing it on the host would replace the host's libc). Needs root and the Debian archive.
#
#   scripts/newer-slurm.sh VERSION [--record] [pytest args...]
#     VERSION   24.11 (Debian 13, trixie: Python 3.13) or 26.05 (sid: its Python 3.13, not its python3 3.14)
#     --record  also record sacct's text of a preemption and requeue into tests/fixtures/sacct/
#     pytest args replace the core test list (NEWER_SLURM_TESTS below)
#
# Knobs (environment): NEWER_SLURM_ROOT=/var/tmp/parcel-newer-slurm/SUITE (kept between runs: a second
#   run skips debootstrap and apt), PORT_BASE=18817 DB_PORT=18306 and BASE=/tmp/ps47n (inside the root:
#   it runs beside a host cluster on the defaults), NEWER_SLURM_TESTS (the core tests).
# Exit: 0 the tests passed; 1 a test (or the cluster) failed; 2 bad input; 75 the tier did not run
#   (the Debian archive or PyPI unreachable), said in one loud line.
# The checkout is copied into the root (ROOT/work/parcel) with its own virtualenv, so the host's
# .venv and BASE are untouched; /proc, /sys, /dev and /dev/pts are bind-mounted for the run and
# unmounted on every exit.
set -euo pipefail

say() { printf '[newer-slurm] %s\n' "$*"; }
usage() { echo "usage: scripts/newer-slurm.sh 24.11|26.05 [--record] [pytest args...]: $1" >&2; exit 2; }
did_not_run() { printf '[newer-slurm] *** THE NEWER-SLURM TIER DID NOT RUN: %s ***\n' "$1" >&2; exit 75; }

VERSION=${1:-}
case $VERSION in
  24.11) SUITE=trixie ;;
  26.05) SUITE=sid ;;
  *) usage "unknown VERSION '${VERSION}'; pick 24.11 (trixie) or 26.05 (sid)" ;;
esac
shift
RECORD=0
if [[ ${1:-} == --record ]]; then RECORD=1; shift; fi
[[ $(id -u) == 0 ]] || usage "needs root (debootstrap, chroot and bind mounts); rerun with sudo"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=${NEWER_SLURM_ROOT:-/var/tmp/parcel-newer-slurm/$SUITE}
PORT_BASE=${PORT_BASE:-18817}  # below gangs' master ports (21000-32766)
DB_PORT=${DB_PORT:-18306}
BASE=${BASE:-/tmp/ps47n}
MIRROR=http://deb.debian.org/debian
# The core: the cluster itself, a search preempted and requeued, accounting and reconcile against sacct,
# the real sacct's fields; their real-cluster tests only (`-m slurm`): the fake SLURM and sacct's parser
# on recorded text read no installed Slurm.
NEWER_SLURM_TESTS=${NEWER_SLURM_TESTS:--m slurm tests/slurm/test_dev_cluster.py tests/slurm/test_slurm_search.py tests/slurm/test_slurm_accounting.py tests/slurm/test_schedule_reconcile.py tests/test_sacct.py}
TESTS=("$@")
((${#TESTS[@]})) || read -ra TESTS <<<"$NEWER_SLURM_TESTS"
T0=$SECONDS

# ------------------------------------------------------------------ the root (once)
if [[ ! -f $ROOT/.parcel-root-ready ]]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null 2>&1; } || did_not_run "debootstrap could not be installed (apt unreachable?)"
  timeout 20 bash -c "exec 3<>/dev/tcp/deb.debian.org/80" 2>/dev/null || did_not_run "deb.debian.org:80 is unreachable"
  # Never delete through a bind mount left by a killed run: that would delete the host's /dev.
  if awk -v r="$ROOT/" 'index($2, r) == 1 {found = 1} END {exit !found}' /proc/mounts; then
    usage "something is still mounted under $ROOT (a killed run?); umount it (see /proc/mounts) and rerun"
  fi
  rm -rf --one-file-system "$ROOT" && mkdir -p "$ROOT"
  t=$SECONDS
  timeout 900 debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
    || did_not_run "debootstrap $SUITE failed (see $ROOT.debootstrap.log)"
  say "debootstrap $SUITE: $((SECONDS - t)) s"
fi
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" || true; done
}
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mountpoint -q "$ROOT/$m" || { mount --bind "/$m" "$ROOT/$m" && mounted+=("$ROOT/$m"); }
done
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
if [[ ! -f $ROOT/.parcel-root-ready ]]; then
  cp /etc/resolv.conf "$ROOT/etc/"
  cp -r /usr/local/share/ca-certificates "$ROOT/usr/local/share/" 2>/dev/null || true
  # The archive's Release files seen from here may have expired; no service starts by itself.
  echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99novalid"
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d" && chmod +x "$ROOT/usr/sbin/policy-rc.d"
  t=$SECONDS
  in_root apt-get update -qq >/dev/null 2>&1 || did_not_run "apt-get update in the $SUITE root failed"
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurmdbd \
    slurm-client munge mariadb-server mariadb-client python3-venv git ca-certificates procps hostname >"$ROOT.apt.log" 2>&1 \
    || did_not_run "apt-get install in the $SUITE root failed (see $ROOT.apt.log)"
  say "apt install in $SUITE: $((SECONDS - t)) s"
  touch "$ROOT/.parcel-root-ready"
fi
say "Slurm $(in_root slurmd -V | awk '{print $2}') in $ROOT"

# ------------------------------------------------------------------ the checkout and its virtualenv
rm -rf "$ROOT/work/parcel" && mkdir -p "$ROOT/work/parcel"
git -C "$REPO" ls-files -z --cached --others --exclude-standard | (cd "$REPO" && tar --null -T - -cf - 2>/dev/null) | tar -xf - -C "$ROOT/work/parcel"
# The root's Python if parcel_hpc runs on it (3.11 to 3.13), else Debian's 3.13 beside it: sid's
# python3 is 3.14, on which Hydra 1.3.8 fails (hydra issue 3121).
PY=python3
if ! in_root python3 -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))'; then
  PY=python3.13
  in_root test -x /usr/bin/python3.13 || in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.13-venv >>"$ROOT.apt.log" 2>&1 \
    || did_not_run "the $SUITE root has $(in_root python3 --version) and no python3.13 to install (see $ROOT.apt.log)"
fi
if [[ ! -x $ROOT/opt/parcel-venv/bin/python || $REPO/pyproject.toml -nt $ROOT/opt/parcel-venv/.installed ]]; then
  t=$SECONDS
  # The host's CA bundle: a site whose proxy re-signs TLS trusts its own CA there.
  cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/parcel-host-ca.crt"
  rm -rf "$ROOT/opt/parcel-venv" && in_root "$PY" -m venv /opt/parcel-venv
  # The core tests need the package, pytest (below 9, as pyproject's test extra says) and what the
  # examples' trainer and the samplers import.
  in_root env PIP_CERT=/etc/parcel-host-ca.crt /opt/parcel-venv/bin/pip install -q -e /work/parcel "pytest>=8,<9" "pytest-xdist>=3.5" "hypothesis>=6.100" \
    scikit-learn "optuna>=4.2,<6" >"$ROOT.pip.log" 2>&1 \
    || did_not_run "pip install in the $SUITE root failed (PyPI unreachable? see $ROOT.pip.log)"
  touch "$ROOT/opt/parcel-venv/.installed"
  say "virtualenv: $((SECONDS - t)) s"
fi
say "$(in_root /opt/parcel-venv/bin/python --version) in the root's virtualenv"
in_root /opt/parcel-venv/bin/pip install -q --no-deps --no-build-isolation -e /work/parcel >/dev/null 2>&1 || true

# ------------------------------------------------------------------ the cluster and the tests
record_cmd=true
((RECORD)) && record_cmd="python -m tests.slurm.record_sacct"
printf -v tests_q '%q ' "${TESTS[@]}"
set +e
in_root bash -c "
  set -e
  cd /work/parcel
  export PATH=/opt/parcel-venv/bin:\$PATH OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  trap 'bash scripts/dev-cluster-down.sh $BASE >/dev/null 2>&1' EXIT
  PORT_BASE=$PORT_BASE DB_PORT=$DB_PORT bash scripts/dev-cluster-up.sh $BASE
  source $BASE/env.sh
  $record_cmd
  # -vv: a failure's whole message in the summary at the end, the part of the output CI shows
  PARCEL_SLURM_BASE=$BASE PARCEL_REQUIRE_SLURM=1 python -m pytest -p no:cacheprovider -n 1 --dist loadgroup -vv $tests_q
"
rc=$?
set -e
if ((RECORD)); then
  mkdir -p "$REPO/tests/fixtures/sacct"
  cp -v "$ROOT"/work/parcel/tests/fixtures/sacct/preempt_requeue_*.txt "$REPO/tests/fixtures/sacct/" 2>/dev/null || true
fi
verdict=passed
((rc == 0)) || verdict=FAILED
say "Slurm $VERSION: tests $verdict (exit $rc) in $((SECONDS - T0)) s"
exit $((rc == 0 ? 0 : 1))

#!/usr/bin/env bash
# Stop the dev SLURM cluster that scripts/dev-cluster-up.sh started in BASE.
#
#   scripts/dev-cluster-down.sh [--purge] [BASE]     (BASE defaults to /tmp/parcel-slurm)
#
# Cancels the cluster's jobs, then stops only the daemons whose PIDs are recorded in
# BASE/run/pids/, each after checking that the PID still is that daemon (name, and
# BASE in its cmdline or environment): it never kills by name, so other clusters and
# a system Slurm are safe. Keeps BASE (database, job state, munge key) so the next
# dev-cluster-up.sh is a quick restart; --purge removes BASE afterwards.
# Idempotent: with nothing running it just says so.
set -euo pipefail

log() { printf '[dev-cluster-down] %s\n' "$*"; }
die() { printf '[dev-cluster-down] ERROR: %s\n' "$*" >&2; exit 1; }

PURGE=0
BASE=""
for arg in "$@"; do
  case $arg in
    --purge) PURGE=1 ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) die "unknown option '$arg'; usage: dev-cluster-down.sh [--purge] [BASE]" ;;
    *) [[ -z $BASE ]] || die "more than one BASE given; usage: dev-cluster-down.sh [--purge] [BASE]"; BASE=$arg ;;
  esac
done
BASE=${BASE:-/tmp/parcel-slurm}
[[ $BASE == /* ]] || BASE="$PWD/$BASE"
BASE=${BASE%/}
PIDS="$BASE/run/pids"
STOP_TIMEOUT=${STOP_TIMEOUT:-20}
export SLURM_CONF="$BASE/etc/slurm.conf"
T0=$EPOCHREALTIME

if [[ ! -d $BASE ]]; then
  log "nothing at $BASE; nothing to stop."
  exit 0
fi

# Serialise with dev-cluster-up.sh and other downs on this BASE (see the note there).
exec 9>"$BASE/.lock"
flock -w 120 9 || die "another dev-cluster-up/down on $BASE held the lock for 120 s; check with ps."

# Same test as dev-cluster-up.sh: alive (a zombie counts as stopped, it waits for PID 1
# to reap it), the expected name, and BASE in cmdline or environ (PIDs get reused).
pid_is_ours() {
  local pid=$1 comm=$2 state
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/stat ]] || return 1
  state=$(sed 2>/dev/null 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1) || return 1
  [[ $state != Z && $state != X ]] || return 1
  [[ $(cat 2>/dev/null "/proc/$pid/comm") == "$comm" ]] || return 1
  # Read whole files, no `| grep -q`: an early grep exit would SIGPIPE tr (pipefail).
  local text
  text=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") && [[ $text == *"$BASE/"* ]] && return 0
  text=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/environ") && [[ $text == *"$BASE/"* ]]
}
# Recorded name -> process name: slurmd-n2 -> slurmd.
comm_of() { printf '%s' "${1%%-*}"; }
pid_of() { [[ -s $PIDS/$1.pid ]] && cat "$PIDS/$1.pid"; }
is_running() { local pid; pid=$(pid_of "$1") && pid_is_ours "$pid" "$(comm_of "$1")"; }

# 1. Jobs first, while slurmctld and slurmd still run, so batch scripts get their
#    signals and accounting records their end; bounded, the cluster may be half up.
if is_running slurmctld && timeout 10 scontrol ping >/dev/null 2>&1; then
  jobs=$(timeout 10 squeue -h -o '%A' 2>/dev/null | sort -u | paste -sd' ' -) || jobs=""
  if [[ -n $jobs ]]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086  # one argument per job id
    timeout 10 scancel $jobs || true
    deadline=$((SECONDS + 15)) # KillWait=5 plus slack
    while [[ -n $(timeout 10 squeue -h -o '%A' 2>/dev/null) ]] && ((SECONDS < deadline)); do sleep 0.5; done
  fi
fi

# 2. Daemons in reverse start order: the slurmd (and their jobs' steps), slurmctld
#    (saves its state on SIGTERM), slurmdbd, mariadbd, munged last (the others need it
#    to say goodbye).
order=()
for f in "$PIDS"/slurmd-*.pid; do [[ -e $f ]] && order+=("$(basename "$f" .pid)"); done
order+=(slurmctld slurmdbd mariadbd munged)

stop_group() {
  local -a names=("$@") live=()
  local n pid
  for n in "${names[@]}"; do
    if is_running "$n"; then
      pid=$(pid_of "$n")
      kill -TERM "$pid" 2>/dev/null || true
      live+=("$n")
    else
      rm -f "$PIDS/$n.pid"
    fi
  done
  ((${#live[@]})) || return 0
  stopped_any=1
  log "stopping: ${live[*]}"
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while :; do
    local still=()
    for n in "${live[@]}"; do is_running "$n" && still+=("$n"); done
    ((${#still[@]})) || break
    if ((SECONDS >= deadline)); then
      log "still running after ${STOP_TIMEOUT}s, sending SIGKILL: ${still[*]}"
      for n in "${still[@]}"; do
        if pid=$(pid_of "$n") && pid_is_ours "$pid" "$(comm_of "$n")"; then kill -KILL "$pid" 2>/dev/null || true; fi
      done
      sleep 0.5
      break
    fi
    sleep 0.2
  done
  for n in "${live[@]}"; do is_running "$n" || rm -f "$PIDS/$n.pid"; done
}
stopped_any=0
# The slurmd stop together (independent); the rest one by one, in order.
slurmds=()
for n in "${order[@]}"; do [[ $n == slurmd-* ]] && slurmds+=("$n"); done
((${#slurmds[@]})) && stop_group "${slurmds[@]}"
for n in slurmctld slurmdbd mariadbd munged; do stop_group "$n"; done

left=()
for n in "${order[@]}"; do is_running "$n" && left+=("$n"); done
((${#left[@]})) && die "could not stop: ${left[*]} (PIDs in $PIDS)"

# Job steps (slurmstepd) are not ours to signal; report any that outlived slurmd.
strays=$(grep -lsF -- "$BASE/" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | while read -r p; do
  [[ $p != "$$" && $(cat "/proc/$p/comm" 2>/dev/null) == slurmstepd ]] && echo "$p"
done | paste -sd' ' -) || strays=""
[[ -z $strays ]] || log "warning: slurmstepd still running (PIDs $strays); they exit when their job step ends."

if ((PURGE)); then
  # Only remove a directory dev-cluster-up.sh created, never an arbitrary path.
  [[ -e $BASE/.parcel-dev-cluster ]] || die "$BASE has no .parcel-dev-cluster marker; refusing to delete it."
  rm -rf -- "$BASE"
  log "removed $BASE"
fi
((stopped_any)) || log "no daemon of $BASE was running."
log "done in $(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')s."

#!/usr/bin/env bash
# Bring up a real, private SLURM cluster on this one machine, for the project's slurm-marked
# tests and for trying the Slurm path on a laptop. Runs on Debian's Slurm 22.05 (Debian 12),
# 24.11 (Debian 13) and 26.05 (sid); scripts/newer-slurm.sh runs it on a newer one in a root of its own.
#
#   scripts/dev-cluster-up.sh [BASE]      (BASE defaults to /tmp/parcel-slurm)
#   source BASE/env.sh                    (exports SLURM_CONF for every client)
#
# What it starts, all as root, all state and logs under BASE, nothing system-wide:
#   munged (private socket), mariadbd (own datadir, 127.0.0.1:DB_PORT), slurmdbd,
#   slurmctld, and NODES slurmd (n1..nN, each Gres=gpu:GPUS_PER_NODE).
# Idempotent: daemons that already run (PIDs in BASE/run/pids/) are left alone,
# so a second call is a quick health check; data under BASE survives
# dev-cluster-down.sh, so a restart skips database initialisation, and the knobs
# it was started with (BASE/knobs.env) are its defaults next time.
#
# Knobs (environment): NODES=3 CPUS_PER_NODE=4 MEM_PER_NODE=4000 (MB)
#   GPUS_PER_NODE=4 PORT_BASE=16817 DB_PORT=13306 SKIP_APT=0 READY_TIMEOUT=60 (s)
# Ports: slurmctld PORT_BASE, slurmdbd PORT_BASE+2, slurmd PORT_BASE+101...; give a
# second cluster its own BASE, PORT_BASE and DB_PORT and both can run at once.
#
# Pitfalls referenced below (P1..P15) are the numbered gotchas in
# shared/notes/slurm-on-one-machine.md section 6.
set -euo pipefail

T0=$EPOCHREALTIME
T_PHASE=$T0
log() { printf '[dev-cluster-up] %s\n' "$*"; }
die() { printf '[dev-cluster-up] ERROR: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
phase_done() {
  local now=$EPOCHREALTIME
  printf '[dev-cluster-up] %-24s %6ss   (total %6ss)\n' "$1" "$(elapsed "$T_PHASE" "$now")" "$(elapsed "$T0" "$now")"
  T_PHASE=$now
}

# ---------------------------------------------------------------- knobs
BASE=${1:-/tmp/parcel-slurm}
[[ $BASE == /* ]] || BASE="$PWD/$BASE"
BASE=${BASE%/}
# Knobs the environment does not give are this BASE's own from its last start: a restart (the tests'
# restart_daemons) brings back this cluster on its own ports, never on the defaults another may use.
if [[ -f $BASE/knobs.env ]]; then
  while IFS='=' read -r knob value; do
    if [[ $knob =~ ^(NODES|CPUS_PER_NODE|MEM_PER_NODE|GPUS_PER_NODE|PORT_BASE|DB_PORT)$ && -z ${!knob:-} ]]; then printf -v "$knob" '%s' "$value"; fi
  done <"$BASE/knobs.env"
fi
NODES=${NODES:-3}
CPUS_PER_NODE=${CPUS_PER_NODE:-4}
MEM_PER_NODE=${MEM_PER_NODE:-4000}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
PORT_BASE=${PORT_BASE:-16817}
DB_PORT=${DB_PORT:-13306}
SKIP_APT=${SKIP_APT:-0}
READY_TIMEOUT=${READY_TIMEOUT:-60}
CLUSTER=parcel
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

for knob in NODES CPUS_PER_NODE MEM_PER_NODE GPUS_PER_NODE PORT_BASE DB_PORT READY_TIMEOUT; do
  [[ ${!knob} =~ ^[0-9]+$ ]] || die "$knob='${!knob}' is not a whole number; fix the environment variable."
done
((NODES >= 1)) || die "NODES=$NODES: need at least one node."
MUNGE_SOCKET="$BASE/run/munge.socket"
# P14: the munge socket lives in a sockaddr_un (108 bytes); keep BASE short.
((${#MUNGE_SOCKET} < 100)) || die "BASE '$BASE' is too long: the munge socket path must stay under 100 characters; pick a shorter BASE."
[[ $BASE != *[[:space:]]* ]] || die "BASE '$BASE' contains whitespace; slurm.conf cannot quote paths, pick another BASE."

HOST=$(hostname -s)
CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 2))
SLURMD_PORT0=$((PORT_BASE + 101))
SLURM_CONF="$BASE/etc/slurm.conf"
PIDS="$BASE/run/pids"
# Every client of this cluster must see our slurm.conf (P13: without it they try DNS SRV).
export SLURM_CONF
# Marks our daemons: the stop script checks cmdline/environ for BASE before signalling.
export PARCEL_DEV_CLUSTER="$BASE/"

# Test sessions may call up (and down) concurrently on one BASE: serialise them, or two
# callers both see "munged not running" and start two. BASE is node-local (/tmp), so
# flock is reliable here (the no-flock rule is for data on shared filesystems).
mkdir -p "$BASE"
exec 9>"$BASE/.lock"
flock -w 600 9 || die "another dev-cluster-up/down on $BASE held the lock for 600 s; check with ps."

# ------------------------------------------------------- process helpers
# A PID counts as ours only if it is alive (a zombie is stopped, P15), has the
# expected name and mentions BASE in its cmdline or environment: PIDs get reused.
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
# is_running NAME COMM: the daemon recorded as BASE/run/pids/NAME.pid is alive.
is_running() {
  local f="$PIDS/$1.pid"
  [[ -s $f ]] && pid_is_ours "$(<"$f")" "$2"
}
# start_daemon NAME LOGFILE CMD...: detach (setsid) and record the PID.
# The daemon is re-parented to PID 1 when this script exits (P15). It must not
# inherit fd 9: a daemon holding the lock file open would hold the lock forever.
start_daemon() {
  local name=$1 logfile=$2
  shift 2
  setsid "$@" >>"$logfile" 2>&1 </dev/null 9>&- &
  local pid=$! i
  echo "$pid" >"$PIDS/$name.pid"
  # setsid execs the daemon a moment after the fork; until then /proc names the shell, and a
  # readiness check would take the daemon for dead (seen with 24.11's slurmd in a chroot).
  for ((i = 0; i < 50; i++)); do
    [[ -d /proc/$pid && $(cat 2>/dev/null "/proc/$pid/comm") != "${1##*/}" ]] || break
    sleep 0.1
  done
}
tail_log() {
  if [[ -f $1 ]]; then { echo "----- last lines of $1:"; tail -n "${2:-25}" "$1"; echo "-----"; } >&2; fi
}
# wait_until WHAT TIMEOUT LOG NAME COMM CMD...: poll CMD; fail fast if the daemon died.
wait_until() {
  local what=$1 timeout=$2 logfile=$3 name=$4 comm=$5
  shift 5
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [[ -n $name ]] && ! is_running "$name" "$comm"; then
      tail_log "$logfile"
      die "$name exited while waiting for $what; see $logfile"
    fi
    if ((SECONDS >= deadline)); then
      tail_log "$logfile"
      die "timed out after ${timeout}s waiting for $what; see $logfile"
    fi
    sleep 0.2
  done
}

# ---------------------------------------------------------------- packages
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  [[ $SKIP_APT == 1 ]] && die "SKIP_APT=1 but these packages are missing: ${missing[*]}; install them or unset SKIP_APT."
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Package postinst scripts would start system-wide munge/mariadb/slurm daemons on
  # the default sockets and ports; a policy-rc.d that exits 101 vetoes that. Container
  # images usually ship one; if not, install a temporary one and remove it afterwards.
  temp_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    temp_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\n# temporary, from parcel_hpc scripts/dev-cluster-up.sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
  fi
  # Refresh the package lists only when apt knows no candidate, or when the install
  # fails (stale lists point at .debs the mirror no longer has).
  need_update=0
  for p in "${missing[@]}"; do
    [[ $(apt-cache policy "$p" 2>/dev/null) == *"Candidate: "[0-9]* ]] || need_update=1
  done
  ((need_update)) && apt-get update -qq
  apt_log=$(mktemp /tmp/dev-cluster-apt.XXXXXX)
  apt_install() { apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$apt_log" 2>&1; }
  if ! apt_install; then
    ((need_update)) && { tail_log "$apt_log"; die "apt-get install failed; see $apt_log"; }
    apt-get update -qq
    apt_install || { tail_log "$apt_log"; die "apt-get install failed; see $apt_log"; }
  fi
  rm -f "$apt_log"
  if ((temp_policy)); then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi
phase_done packages

# The installed Slurm's version, read once: the configs below differ by it.
SLURM_VERSION=$(slurmd -V | awk '{print $2}')
[[ $SLURM_VERSION =~ ^([0-9]+)\.([0-9]+) ]] || die "slurmd -V printed '$SLURM_VERSION', not a Slurm version; check the slurmd package."
SLURM_MAJOR=$((10#${BASH_REMATCH[1]}))

# ---------------------------------------------------------------- configs
mkdir -p "$BASE"/{etc,log,run,spool/ctld,dev,mysql} "$PIDS"
# slurmd creates its spool dir only after logging an error about its socket dir.
for ((i = 1; i <= NODES; i++)); do mkdir -p "$BASE/spool/d-n$i"; done
touch "$BASE/.parcel-dev-cluster"   # lets dev-cluster-down.sh --purge know BASE is ours
install -d -m 700 "$BASE/munge"
[[ -s $BASE/munge/munge.key ]] || { (umask 077 && head -c 1024 /dev/urandom >"$BASE/munge/munge.key"); }
[[ -s $BASE/mysql/slurm.pass ]] || { (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$BASE/mysql/slurm.pass"); }
DB_PASS=$(<"$BASE/mysql/slurm.pass")

# P1: a count-only gpu gres is silently dropped (node goes INVAL) and File= must be a
# char device; aliases of /dev/null (c 1 3) satisfy slurmd and let it set
# CUDA_VISIBLE_DEVICES. Never combine with ConstrainDevices=yes (it would block /dev/null).
for ((i = 0; i < GPUS_PER_NODE; i++)); do
  [[ -c $BASE/dev/gpu$i ]] || { rm -f "$BASE/dev/gpu$i"; mknod -m 666 "$BASE/dev/gpu$i" c 1 3; }
done

NODE_RANGE="n[1-$NODES]"
((NODES == 1)) && NODE_RANGE=n1
SLURMD_PORTS="$SLURMD_PORT0-$((SLURMD_PORT0 + NODES - 1))"
((NODES == 1)) && SLURMD_PORTS=$SLURMD_PORT0
GRES_NODE=""
((GPUS_PER_NODE > 0)) && GRES_NODE="Gres=gpu:$GPUS_PER_NODE"

render_slurm_conf() {
  cat <<EOF
# Generated by scripts/dev-cluster-up.sh; edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
# P2 (private munge): every daemon/client reads AuthInfo; cred_expire=10 makes a
# requeued job eligible again after 10 s instead of 120 s (P4).
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$BASE/spool/ctld
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdSpoolDir=$BASE/spool/d-%n
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# PMIx is not installed and no MTA exists: both are harmless noise otherwise.
MpiDefault=none
MailProg=/bin/true
# No cgroups: process tracking by /proc, memory limit by polling (a kill is FAILED 0:9, P8).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherParams=OverMemoryKill
JobAcctGatherFrequency=task=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# P5: without a default, a job with no --mem takes the whole node and one job preempts many.
DefMemPerCPU=256
GresTypes=gpu
# P4: a scheduler pass every 5 s keeps requeue-to-rerun near 13 s.
SchedulerParameters=sched_interval=5,bf_interval=5
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
# P6: with 2, an admin 'state=down' is undone in a second; 1 keeps it down until resumed.
ReturnToService=1
KillWait=5
SlurmdTimeout=20
# Several slurmd on a 2-core box advertise more CPUs/memory than exist.
SlurmdParameters=config_overrides
# P2: sacctmgr reaches slurmdbd with AccountingStoragePass, not AuthInfo.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations,limits
NodeName=$NODE_RANGE NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$SLURMD_PORTS CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE $GRES_NODE State=UNKNOWN
PartitionName=low  Nodes=ALL Default=YES PriorityTier=1  GraceTime=15 MaxTime=INFINITE State=UP TRESBillingWeights=CPU=1.0,GRES/gpu=10.0
PartitionName=high Nodes=ALL Default=NO  PriorityTier=10 GraceTime=0  MaxTime=INFINITE State=UP TRESBillingWeights=CPU=1.0,GRES/gpu=10.0
EOF
}
render_gres_conf() {
  echo "# Generated by scripts/dev-cluster-up.sh (P1: File= char devices, never Count= alone)."
  if ((GPUS_PER_NODE > 0)); then
    local files="$BASE/dev/gpu0"
    ((GPUS_PER_NODE > 1)) && files="$BASE/dev/gpu[0-$((GPUS_PER_NODE - 1))]"
    echo "NodeName=$NODE_RANGE Name=gpu File=$files"
  fi
}
# 23.02 and later stop slurmd when /sys/fs/cgroup is not mounted, even with proctrack/linuxproc and
# task/none, unless the cgroup plugin is disabled; 22.05 rejects "disabled" (no such plugin).
render_cgroup_conf() {
  echo "# Generated by scripts/dev-cluster-up.sh for Slurm $SLURM_VERSION."
  ((SLURM_MAJOR >= 23)) && echo "CgroupPlugin=disabled"
  return 0
}
render_slurmdbd_conf() {
  cat <<EOF
# Generated by scripts/dev-cluster-up.sh. Must stay mode 600 or slurmdbd refuses to start.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
}
any_running=0
for f in "$PIDS"/*.pid; do
  [[ -e $f ]] || continue
  n=$(basename "$f" .pid)
  is_running "$n" "${n%%-*}" && any_running=1
done
# write_conf FILE MODE RENDERER: rewrite only on change. Changing the config under a
# live cluster is refused: `scontrol reconfigure` after a node-count change kills
# slurmctld (P7), and a half-applied config is worse than a clear stop-and-start.
write_conf() {
  local file=$1 mode=$2 tmp
  tmp=$(mktemp "$file.XXXXXX")
  chmod "$mode" "$tmp"
  "$3" >"$tmp"
  if [[ -f $file ]] && cmp -s "$tmp" "$file"; then
    rm -f "$tmp"
    chmod "$mode" "$file"
    return 0
  fi
  if ((any_running)) && [[ -f $file ]]; then
    rm -f "$tmp"
    die "$file would change (different knobs?) while the cluster runs; run scripts/dev-cluster-down.sh $BASE first."
  fi
  mv -f "$tmp" "$file"
}
write_conf "$BASE/etc/slurm.conf" 644 render_slurm_conf
write_conf "$BASE/etc/gres.conf" 644 render_gres_conf
write_conf "$BASE/etc/slurmdbd.conf" 600 render_slurmdbd_conf
write_conf "$BASE/etc/cgroup.conf" 644 render_cgroup_conf
printf '%s\n' "NODES=$NODES" "CPUS_PER_NODE=$CPUS_PER_NODE" "MEM_PER_NODE=$MEM_PER_NODE" "GPUS_PER_NODE=$GPUS_PER_NODE" \
  "PORT_BASE=$PORT_BASE" "DB_PORT=$DB_PORT" >"$BASE/knobs.env"
cat >"$BASE/env.sh" <<EOF
# source me: points Slurm clients (sinfo, sbatch, sacct, submitit) at the dev cluster in $BASE
export SLURM_CONF=$SLURM_CONF
EOF
phase_done configs

# ---------------------------------------------------------------- munge
munge_ok() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
if ! is_running munged munged; then
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  start_daemon munged "$BASE/log/munged.out" munged -F \
    --key-file="$BASE/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$BASE/run/munged.pid" --seed-file="$BASE/munge/munged.seed" \
    --log-file="$BASE/log/munged.log" --num-threads=10
fi
wait_until "munged to answer on $MUNGE_SOCKET" 15 "$BASE/log/munged.out" munged munged munge_ok
phase_done munge

# ---------------------------------------------------------------- mariadb
DB_SOCKET="$BASE/run/mysqld.sock"
DATADIR="$BASE/mysql/data"
sql() { mariadb --no-defaults -S "$DB_SOCKET" -u root "$@"; }
if ! is_running mariadbd mariadbd; then
  if [[ ! -f $BASE/mysql/.initialised ]]; then
    rm -rf "$DATADIR"
    mariadb-install-db --no-defaults --datadir="$DATADIR" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$BASE/log/mariadb-install.log" 2>&1 \
      || { tail_log "$BASE/log/mariadb-install.log"; die "mariadb-install-db failed"; }
  fi
  # 1G buffer pool: smaller values make slurmdbd log "Database settings not recommended".
  # Only 127.0.0.1 and our own port, so a system MariaDB (if any) is untouched. MariaDB 11.8 turns
  # snapshot isolation on, under which slurmdbd 26.05 warns it can crash on a write conflict ("loose":
  # MariaDB 10.11 has no such option and ignores it).
  start_daemon mariadbd "$BASE/log/mariadbd.out" mariadbd --no-defaults \
    --datadir="$DATADIR" --user=root --socket="$DB_SOCKET" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$BASE/run/mariadbd.pid" \
    --log-error="$BASE/log/mariadbd.log" --innodb-buffer-pool-size=1G \
    --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
    --innodb-flush-log-at-trx-commit=2 --loose-innodb-snapshot-isolation=OFF
fi
wait_until "mariadbd on $DB_SOCKET" 60 "$BASE/log/mariadbd.log" mariadbd mariadbd sql -e 'SELECT 1'
if [[ ! -f $BASE/mysql/.initialised ]]; then
  # slurmdbd talks TCP to 127.0.0.1, where root's unix_socket auth does not apply.
  # The database exists before slurmdbd first connects: otherwise it reconnects on the same connection
  # after "Unknown database", and libmariadb 3.4 (MariaDB 11.8) then fails every query (error 5027).
  sql --batch <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
  touch "$BASE/mysql/.initialised"
fi
phase_done mariadb

# ---------------------------------------------------------------- slurmdbd + associations
if ! is_running slurmdbd slurmdbd; then
  # slurmdbd finds slurmdbd.conf next to $SLURM_CONF (exported above).
  start_daemon slurmdbd "$BASE/log/slurmdbd.out" slurmdbd -D
fi
wait_until "slurmdbd on port $DBD_PORT (first start creates its tables)" 90 \
  "$BASE/log/slurmdbd.log" slurmdbd slurmdbd sacctmgr -n -P show cluster format=cluster
sacct_q() { sacctmgr -n -P "$@"; }
sacct_do() { sacctmgr -i "$@" >/dev/null; }
# Each change runs only when missing, so a restart costs three read-only queries.
# Rows are cluster|account|user; `add cluster` also creates the cluster|root| row.
assocs=$(sacct_q show assoc format=cluster,account,user)
grep -q "^$CLUSTER|" <<<"$assocs" || sacct_do add cluster "$CLUSTER"
for acct in parcel other; do
  grep -qx "$CLUSTER|$acct|" <<<"$assocs" \
    || sacct_do add account "$acct" cluster="$CLUSTER" Description="$acct" Organization=parcel
  grep -qx "$CLUSTER|$acct|root" <<<"$assocs" || sacct_do add user root account="$acct" cluster="$CLUSTER"
done
[[ $(sacct_q show user root format=defaultaccount) == parcel ]] \
  || sacct_do modify user root set defaultaccount=parcel
# slurmdbd creates QOS normal with its tables; make sure nobody removed it.
sacct_q show qos format=name | grep -qx normal || sacct_do add qos normal
phase_done slurmdbd+sacctmgr

# ---------------------------------------------------------------- slurmctld
if ! is_running slurmctld slurmctld; then
  start_daemon slurmctld "$BASE/log/slurmctld.out" slurmctld -D -f "$SLURM_CONF"
fi
wait_until "slurmctld on port $CTLD_PORT" 30 "$BASE/log/slurmctld.log" slurmctld slurmctld \
  bash -c 'scontrol ping | grep -q "is UP"'
phase_done slurmctld

# ---------------------------------------------------------------- slurmd x NODES
started_slurmd=0
for ((i = 1; i <= NODES; i++)); do
  if ! is_running "slurmd-n$i" slurmd; then
    start_daemon "slurmd-n$i" "$BASE/log/slurmd-n$i.out" slurmd -D -N "n$i" -f "$SLURM_CONF"
    started_slurmd=1
  fi
done
# Ready = every configured node registered and responding: idle, or busy with jobs
# when this call only checks an already running cluster. A '*' means not responding.
node_states() { sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }
all_ready() {
  [[ $(wc -l <<<"$1") -eq $NODES ]] \
    && awk '$2 !~ /^(idle|mixed|allocated|completing)$/ {bad = 1} END {exit bad}' <<<"$1"
}
# Nodes an earlier session left DOWN/DRAINED by hand survive in slurmctld's saved state
# (ReturnToService=1 revives only nodes that stopped responding, P6): resume them, but
# only when this call (re)started slurmd, never under a session that is running.
resumed=0
deadline=$((SECONDS + READY_TIMEOUT))
while true; do
  states=$(node_states) || states=""
  all_ready "$states" && break
  stuck=$(awk '$2 ~ /^(down|drained|draining)$/ {print $1}' <<<"$states" | paste -sd, -)
  if ((started_slurmd && !resumed)) && [[ -n $stuck ]]; then
    log "resuming nodes left down/drained by an earlier run: $stuck"
    scontrol update nodename="$stuck" state=resume || true
    resumed=1
  fi
  for ((i = 1; i <= NODES; i++)); do
    is_running "slurmd-n$i" slurmd || { tail_log "$BASE/log/slurmd-n$i.log"; die "slurmd for n$i exited; see $BASE/log/slurmd-n$i.log"; }
  done
  if ((SECONDS >= deadline)); then
    sinfo -N -o '%N %T %G %E' >&2 || true
    tail_log "$BASE/log/slurmctld.log" 15
    for ((i = 1; i <= NODES; i++)); do tail_log "$BASE/log/slurmd-n$i.log" 10; done
    die "nodes not idle after ${READY_TIMEOUT}s (states above); see $BASE/log/"
  fi
  sleep 0.2
done
phase_done "slurmd+nodes ready"

log "cluster '$CLUSTER' ready in $(elapsed "$T0" "$EPOCHREALTIME")s: $NODES node(s) x gpu:$GPUS_PER_NODE, partitions low (default), high"
log "env: source $BASE/env.sh"
log "stop: scripts/dev-cluster-down.sh $BASE"

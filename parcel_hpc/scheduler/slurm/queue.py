"""Talking to SLURM outside submitit: is it reachable, which of our jobs are alive, what ended how.

Shell-outs build an argv (pure) and a separate pure function parses the text; the runners raise
SchedulerUnavailable with one line naming the problem and the fix, never a partial answer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from parcel_hpc.budget import AssociationLimit, LimitKind
from parcel_hpc.errors import AccountingError, SchedulerUnavailable, UsageError
from parcel_hpc.governance.validation import time_min  # SLURM's time forms, parsed in one place
from parcel_hpc.ledger import SearchDir
from parcel_hpc.scheduler.base import QueuedJob, QueueState
from parcel_hpc.scheduler.slurm import EXECUTOR
from parcel_hpc.scheduler.slurm.calls import count
from parcel_hpc.scheduler.states import JobState

# --Format, not --format: only it prints the restart count. A "|" suffix and no width: whole values.
SQUEUE_FIELDS = ("JobArrayID", "State", "RestartCnt", "Reason", "NodeList")
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"


def check_reachable(env: Mapping[str, str] | None = None, timeout: float = 15.0) -> None:
    """Raise SchedulerUnavailable unless a SLURM controller answers."""
    env = dict(os.environ if env is None else env)
    if shutil.which("sbatch", path=env.get("PATH")) is None:
        raise SchedulerUnavailable("sbatch is not on PATH: this machine has no SLURM client; install slurm-client, or use hydra/launcher=submitit_local")
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not os.path.exists(conf):
        raise SchedulerUnavailable(
            f"SLURM is not configured here ({'SLURM_CONF=' + env['SLURM_CONF'] if env.get('SLURM_CONF') else 'no SLURM_CONF and no /etc/slurm/slurm.conf'}); source the cluster's env file (scripts/dev-cluster-up.sh prints it) or use hydra/launcher=submitit_local"
        )
    try:
        count("scontrol")
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env, timeout=timeout)
        reply = (proc.stdout or proc.stderr).strip()
    except subprocess.TimeoutExpired:
        proc, reply = None, f"no reply within {timeout:.0f}s"
    if proc is None or proc.returncode != 0 or " is UP" not in reply:
        first = reply.splitlines()[0] if reply else "no reply"
        raise SchedulerUnavailable(f"slurmctld is not answering ({first}); start it (scripts/dev-cluster-up.sh for the dev cluster) or ask your admin")


@dataclass(frozen=True)
class ControllerLimits:
    """What the controller accepts, read from it (sites change both in slurm.conf)."""

    max_array_size: int  # tasks per array: indices 0..MaxArraySize-1
    max_job_count: int  # jobs the controller holds at once, every user's together
    cluster: str = ""  # ClusterName: whose associations apply
    accounting: bool = False  # AccountingStorageType is set (SLURM's default: none): associations and their limits exist


DEFAULT_LIMITS = ControllerLimits(1001, 10000)  # SLURM's defaults, where the configuration omits them


def parse_config(text: str) -> ControllerLimits:
    """``scontrol show config``'s ``Name = value`` lines -> the limits (pure)."""
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name.strip()] = value.strip()

    def whole(name: str, default: int) -> int:
        value = values.get(name, "")
        return int(value) if value.isdigit() and int(value) > 0 else default

    return ControllerLimits(
        whole("MaxArraySize", DEFAULT_LIMITS.max_array_size),
        whole("MaxJobCount", DEFAULT_LIMITS.max_job_count),
        values.get("ClusterName", ""),
        values.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none",
    )


def controller_limits(env: Mapping[str, str] | None = None) -> ControllerLimits:
    return parse_config(_run(["scontrol", "show", "config"], env, 30.0))


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_minutes: float | None  # None: UNLIMITED / INFINITE


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition``'s records -> name, Default and MaxTime (pure)."""

    out = []
    for record in text.split("PartitionName=")[1:]:
        fields = dict(token.split("=", 1) for token in record.split() if "=" in token)
        name = record.split()[0] if record.split() else ""
        max_time = fields.get("MaxTime", "UNLIMITED")
        try:
            minutes = None if max_time in ("UNLIMITED", "INFINITE", "NONE") else float(time_min("MaxTime", max_time))
        except UsageError:
            minutes = None
        out.append(Partition(name, fields.get("Default") == "YES", minutes))
    return out


def max_job_minutes(partition: str | None, env: Mapping[str, str] | None = None) -> float | None:
    """The longest --time the partition(s) accept (the default partition without one); None: no
    limit. A partition the controller does not have is bad input (UsageError, one line)."""
    parts = parse_partitions(_run(["scontrol", "--all", "show", "partition"], env, 30.0))  # hidden ones too
    names = partition.split(",") if partition else []
    if unknown := [name for name in names if name not in {p.name for p in parts}]:
        raise UsageError(f"resources.partition={unknown[0]} is not a partition of this cluster; give one of {', '.join(sorted(p.name for p in parts))}")
    wanted = [p for p in parts if (p.name in names if partition else p.default)]
    limits = [p.max_minutes for p in wanted if p.max_minutes is not None]
    return min(limits) if limits else None


# --- association limits (the account a search is charged to) -----------------------------------

ASSOC_FORMAT = "Cluster,Account,User,Partition,ParentName,GrpTRESMins,GrpTRESRunMins"
SHARE_FORMAT = "Account,User,GrpTRESRaw,TRESRunMins"
GPU_TRES = "gres/gpu"  # typed ones too (gres/gpu:a100): a job's GPUs may count against any of them


@dataclass(frozen=True)
class Association:
    account: str
    user: str  # "" for the account's own association
    partition: str  # "" for every partition
    parent: str  # the parent account of an account's association ("" for a user's: its account is the parent)
    grp_tres_mins: Mapping[str, float]
    grp_tres_run_mins: Mapping[str, float]


def associations_argv(cluster: str) -> list[str]:
    where = ["where", f"cluster={cluster}"] if cluster else []  # this cluster's rows, not the whole database's
    return ["sacctmgr", "--noheader", "--parsable2", "show", "associations", *where, f"format={ASSOC_FORMAT}"]


def shares_argv(accounts: Sequence[str]) -> list[str]:
    """The usage of these accounts and of their users' associations (the chain a job counts against)."""
    return ["sshare", "--noheader", "--parsable2", "--all", f"--accounts={','.join(accounts)}", f"--format={SHARE_FORMAT}"]


def default_account_argv(user: str) -> list[str]:
    return ["sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=DefaultAccount"]


def parse_tres(text: str) -> dict[str, float]:
    """``cpu=10,gres/gpu=600`` -> {"cpu": 10.0, "gres/gpu": 600.0} (pure)."""
    out = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if sep:
            try:
                out[name] = float(value)
            except ValueError:
                raise SchedulerUnavailable(f"unexpected TRES value {item!r} from SLURM; check that sacctmgr and sshare match SLURM 22.05+") from None
    return out


def _pipe_rows(text: str, width: int, tool: str) -> Iterator[list[str]]:
    """The ``|``-separated rows of a parsable listing, each exactly ``width`` fields wide."""
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != width:
            raise SchedulerUnavailable(f"{tool} printed an unexpected line {line[:80]!r}; check that it matches SLURM 22.05+")
        yield parts


def parse_associations(text: str, cluster: str, partition: str = "") -> dict[tuple[str, str], Association]:
    """``sacctmgr show associations`` (``ASSOC_FORMAT``) -> this cluster's, by (account, user), for
    a job on ``partition`` (pure): an association of that partition wins over a partition-less one,
    and associations of other partitions do not apply."""
    out: dict[tuple[str, str], Association] = {}
    for parts in _pipe_rows(text, 7, "sacctmgr"):
        if (cluster and parts[0] != cluster) or parts[3] not in ("", partition):
            continue
        assoc = Association(parts[1], parts[2], parts[3], parts[4], parse_tres(parts[5]), parse_tres(parts[6]))
        key = (assoc.account, assoc.user)
        if key not in out or assoc.partition:
            out[key] = assoc
    return out


def parse_shares(text: str) -> dict[tuple[str, str], tuple[dict[str, float], dict[str, float]]]:
    """``sshare`` (``SHARE_FORMAT``) -> (usage in TRES-minutes, running jobs' TRES-minutes) by (account, user) (pure)."""
    out = {}
    for parts in _pipe_rows(text, 4, "sshare"):
        out[(parts[0].strip(), parts[1])] = (parse_tres(parts[2]), parse_tres(parts[3]))  # sshare indents accounts by depth
    return out


def association_chain(account: str, user: str, assocs: Mapping[tuple[str, str], Association]) -> list[tuple[Association, str]]:
    """The associations a job of ``user`` charged to ``account`` counts against, with a label each:
    the user's in the account, the account's, and each parent account's up to the root (pure)."""
    chain = []
    if (account, user) in assocs:
        chain.append((assocs[(account, user)], f"user {user} in account {account}"))
    name, seen = account, set()
    while name and name not in seen and (name, "") in assocs:
        seen.add(name)
        chain.append((assocs[(name, "")], f"account {name}"))
        name = assocs[(name, "")].parent
    return chain


def limits_of(chain: Sequence[tuple[Association, str]], shares: Mapping) -> list[AssociationLimit]:
    """Every GrpTRESMins and GrpTRESRunMins on GPUs (typed or not) or CPUs in the chain, with each
    association's usage (pure). A limited association whose usage ``sshare`` does not show (its
    PrivateData hides it from this user) is an error, never read as unused."""
    out = []
    for assoc, label in chain:
        limited = [t for t in (*assoc.grp_tres_mins, *assoc.grp_tres_run_mins) if t == "cpu" or t.startswith(GPU_TRES)]
        if not limited:
            continue
        if (assoc.account, assoc.user) not in shares:
            raise SchedulerUnavailable(
                f"sshare shows no usage for {label}, which limits {', '.join(sorted(set(limited)))}, so the limit cannot be checked"
                " (PrivateData=usage?): ask the admin"
            )
        used, running = shares[(assoc.account, assoc.user)]
        for tres in sorted(set(limited)):
            if tres in assoc.grp_tres_mins:
                out.append(AssociationLimit(label, LimitKind.GRP_TRES_MINS, tres, assoc.grp_tres_mins[tres], used.get(tres, 0.0), running.get(tres, 0.0)))
            if tres in assoc.grp_tres_run_mins:
                out.append(AssociationLimit(label, LimitKind.GRP_TRES_RUN_MINS, tres, assoc.grp_tres_run_mins[tres], 0.0, running.get(tres, 0.0)))
    return out


def account_limits(account: str, user: str, cluster: str, partition: str = "", env: Mapping[str, str] | None = None) -> tuple[str, list[AssociationLimit]]:
    """(the account a job of ``user`` on ``partition`` is charged to, the limits it counts
    against); ``account`` "" is the user's default account."""
    if not account:
        lines = _run(default_account_argv(user), env, 30.0).split()
        account = lines[0] if lines else ""
        if not account:
            raise SchedulerUnavailable(
                f"SLURM knows no default account for user {user}: set resources.account, or ask your admin to add you (sacctmgr add user)"
            )
    assocs = parse_associations(_run(associations_argv(cluster), env, 30.0), cluster, partition)
    if (account, user) not in assocs and (account, "") not in assocs:
        raise SchedulerUnavailable(
            f"SLURM has no association for user {user} in account {account}: choose resources.account among yours (sacctmgr show assoc user={user})"
        )
    chain = association_chain(account, user, assocs)
    accounts = sorted({assoc.account for assoc, _ in chain})
    return account, limits_of(chain, parse_shares(_run(shares_argv(accounts), env, 30.0)))


def accounts_argv() -> list[str]:
    # withdeleted: an account removed since still has the jobs charged to it before
    return ["sacctmgr", "--noheader", "--parsable2", "show", "associations", "withdeleted", "format=Account"]


def known_accounts(env: Mapping[str, str] | None = None) -> list[str]:
    """Every account with an association in the accounting database, sorted (read-only)."""
    return sorted({line.strip() for line in _run(accounts_argv(), env, 30.0).splitlines() if line.strip()})


def squeue_argv(job_names: Iterable[str]) -> list[str]:
    return ["squeue", "--noheader", "--array", f"--name={','.join(job_names)}", f"--Format={SQUEUE_FORMAT}"]


def parse_squeue(text: str) -> dict[str, QueuedJob]:
    """``squeue --Format`` (``SQUEUE_FIELDS``) -> the jobs by id (pure)."""
    out = {}
    for job, state, restarts, reason, nodes in _pipe_rows(text, len(SQUEUE_FIELDS), "squeue"):
        if not restarts.strip().isdigit():
            raise SchedulerUnavailable(f"squeue printed a restart count {restarts!r} for job {job}; check that it matches SLURM 22.05+")
        out[job.strip()] = QueuedJob(job.strip(), queue_state(state.strip()), reason.strip(), nodes.strip(), int(restarts))
    return out


# What squeue's word for a job it lists says of it (the job is alive while listed, whatever the word).
_QUEUE_STATE = {
    JobState.PENDING: QueueState.PENDING,
    JobState.REQUEUE_HOLD: QueueState.PENDING,
    JobState.REQUEUE_FED: QueueState.PENDING,
    JobState.SPECIAL_EXIT: QueueState.PENDING,
    JobState.RESV_DEL_HOLD: QueueState.PENDING,
    JobState.POWER_UP_NODE: QueueState.PENDING,
    JobState.CONFIGURING: QueueState.RUNNING,
    JobState.RUNNING: QueueState.RUNNING,
    JobState.RESIZING: QueueState.RUNNING,
    JobState.SIGNALING: QueueState.RUNNING,
    JobState.UPDATE_DB: QueueState.RUNNING,
    JobState.SUSPENDED: QueueState.SUSPENDED,
    JobState.STOPPED: QueueState.SUSPENDED,
    JobState.REQUEUED: QueueState.REQUEUED,
}


def queue_state(word: str) -> QueueState:
    """squeue's state word -> QueueState (pure); an ended state still listed is a run ending."""
    try:
        state = JobState.parse(word)
    except AccountingError:
        raise SchedulerUnavailable(f"squeue printed an unknown job state {word!r}; check that it matches SLURM 22.05+") from None
    return _QUEUE_STATE.get(state, QueueState.ENDING)


def queued_jobs(*job_names: str, env: Mapping[str, str] | None = None) -> dict[str, QueuedJob]:
    """Jobs under any of these names that the controller still holds (pending, running, requeued),
    asked once."""
    return parse_squeue(_run(squeue_argv(job_names), env, 30.0)) if job_names else {}


def search_jobs(search: SearchDir, env: Mapping[str, str] | None = None, also: Iterable[str] = ()) -> dict[str, QueuedJob]:
    """The jobs of ``search`` the controller still holds, in one squeue: a SLURM job is alive while
    squeue lists it. Every name the search's launches used (a job_name changed between launches
    hides nothing), and ``also`` (a launch's own, before its first record)."""
    return queued_jobs(*sorted({*also, *search.job_names(EXECUTOR)}), env=env)


def node_address_argv(node: str) -> list[str]:
    return ["scontrol", "show", "node", "--oneliner", node]


def parse_node_address(text: str) -> str:
    """``NodeAddr`` of ``scontrol show node --oneliner``'s line ("" where it names none)."""
    return next((word.split("=", 1)[1] for word in text.split() if word.startswith("NodeAddr=")), "")


def node_names(node_list: str) -> list[str]:
    """SLURM's node list (``n[1-3,5],gpu[01-02],login``) as names, in its order; pure. A list it cannot
    read (``None assigned``) is one name: itself."""
    names: list[str] = []
    for group in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", node_list):
        prefix, _, ranges = group.partition("[")
        if not ranges:
            names.append(prefix)
            continue
        for part in ranges.rstrip("]").split(","):
            low, _, high = part.partition("-")
            if not (low.isdigit() and (not high or high.isdigit())):
                return [node_list]
            names += [f"{prefix}{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1)]
    return names or [node_list]


def node_address(node: str, env: Mapping[str, str] | None = None) -> str:
    """Where another node reaches ``node``: its NodeAddr, which the controller knows even where the
    node's name is no host name (several slurmd on one machine, a name only slurm.conf knows)."""
    return parse_node_address(_run(node_address_argv(node), env, 30.0)) or node


def release_argv(job_ids: Iterable[str]) -> list[str]:
    return ["scontrol", "release", ",".join(job_ids)]


def release(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(release_argv(ids), env, 30.0)


def cancel_argv(job_ids: Iterable[str]) -> list[str]:
    return ["scancel", *job_ids]


def cancel(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(cancel_argv(ids), env, 30.0)


def _run(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> str:
    count(argv[0])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ if env is None else env), timeout=timeout)
    except FileNotFoundError:
        raise SchedulerUnavailable(f"{argv[0]} is not installed; install slurm-client or use hydra/launcher=submitit_local") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailable(f"{argv[0]} did not answer within {timeout:.0f}s; slurmctld may be down: check `scontrol ping`") from None
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()
        raise SchedulerUnavailable(
            f"{' '.join(argv[:2])} failed: {first[0] if first else 'exit ' + str(proc.returncode)}; check `scontrol ping` and SLURM_CONF"
        )
    return proc.stdout

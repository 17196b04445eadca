"""The fake SLURM commands: sbatch, squeue, sacct, scancel, scontrol, sinfo and srun, each
``main(store, argv) -> exit status``, printing what SLURM prints for the command lines parcel_hpc
(and submitit) issue: 22.05's text, or 24.11's or 26.05's (``Config.version``: the exit statuses
above 128 stored whole from 25.11, sacct's per-run SLUID and Restarts columns from 26.05).

Owns: parsing each tool's options and printing its text (sacct's rows, one per run and step, as
``--duplicates`` lists them; squeue's ``--Format``/``-o`` fields). Must not: run or signal a job's
processes (the controller does; a tool writes what should happen under the state lock). An option
the fake does not know is refused as sbatch refuses it, so a new option in the real code shows up
here as a failing test, not as a silently ignored flag.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pwd
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from parcel_hpc.testing.fakeslurm.controller import ensure_running, expand
from parcel_hpc.testing.fakeslurm.state import Job, Run, State, Store, now

UNREACHABLE = "error: Unable to contact slurm controller (connect failure)"
DBD_DOWN = (
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:localhost:6819: Connection refused\n"
    "sacct: error: Sending PersistInit msg: Connection refused\n"
    "sacct: error: Problem talking to the database: Connection refused\n"
)  # the real 22.05 stderr (parcel_hpc/testing/samples/sacct_dbd_unreachable.stderr.txt)


class _Refused(Exception):
    """A tool's one-line refusal, printed on stderr with exit status 1 as SLURM's tools do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Refused(f"{self.prog}: error: {message}")


def main(tool: str, store: Store, argv: Sequence[str]) -> int:
    try:
        if tool != "srun" and tool != "sacct" and store.flag("down"):
            raise _Refused(f"{tool}: {UNREACHABLE}" if tool != "scontrol" or list(argv[:1]) != ["ping"] else "")
        return TOOLS[tool](store, list(argv))
    except _Refused as exc:
        if str(exc):
            print(exc, file=sys.stderr)
        if tool == "scontrol" and list(argv[:1]) == ["ping"]:
            print(f"Slurmctld(primary) at {store.config().cluster} is DOWN")
        return 1


# --- sbatch ---------------------------------------------------------------------------------------


def _sbatch_parser() -> _Parser:
    p = _Parser(prog="sbatch", add_help=False, allow_abbrev=False)
    for flags in (
        ("-J", "--job-name"), ("-p", "--partition"), ("-w", "--nodelist"), ("-x", "--exclude"),
        ("--gres",), ("-t", "--time"), ("-o", "--output"), ("-e", "--error"), ("-a", "--array"),
        ("--mem",), ("-c", "--cpus-per-task"), ("--comment",), ("--wckey",), ("--signal",),
        ("--open-mode",), ("-N", "--nodes"), ("-n", "--ntasks"), ("--ntasks-per-node",),
        ("-A", "--account"), ("-q", "--qos"), ("-D", "--chdir"), ("--export",), ("--wrap",),
        ("--gpus-per-node",), ("-d", "--dependency"), ("--begin",),
    ):  # fmt: skip
        p.add_argument(*flags)
    for flags in (("-H", "--hold"), ("--requeue",), ("--no-requeue",), ("--exclusive",), ("--parsable",)):
        p.add_argument(*flags, action="store_true")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def directives(text: str) -> list[str]:
    """The options of the ``#SBATCH`` lines before the first command, in order."""
    out: list[str] = []
    for line in text.splitlines()[1:] if text.startswith("#!") else text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            out += shlex.split(stripped[len("#SBATCH") :], comments=True)
        elif stripped and not stripped.startswith("#"):
            break
    return out


def parse_time(text: str) -> float:
    """sbatch --time forms -> minutes: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return 365 * 24 * 60.0
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
        return int(days) * 1440 + h * 60 + m + s / 60
    if len(parts) == 3:
        return parts[0] * 60 + parts[1] + parts[2] / 60
    return parts[0] + (parts[1] / 60 if len(parts) == 2 else 0)


def parse_array(spec: str) -> tuple[list[int], int]:
    """``0-9:2%3`` / ``1,3,5`` -> (indices, throttle)."""
    spec, _, throttle = spec.partition("%")
    out: list[int] = []
    for item in spec.split(","):
        rng, _, step = item.partition(":")
        lo, _, hi = rng.partition("-")
        out += range(int(lo), int(hi or lo) + 1, int(step or 1))
    return sorted(set(out)), int(throttle or 0)


def _mem_mb(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.upper())
    if not m:
        raise _Refused(f"sbatch: error: Invalid --mem specification {text!r}")
    return max(1, int(int(m[1]) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[m[2]]))


def sbatch(store: Store, argv: list[str]) -> int:
    cli = _sbatch_parser().parse_args(argv)
    if cli.wrap is not None:
        text = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cli.wrap}\n"
    elif cli.script:
        text = Path(cli.script).read_text()
    else:
        raise _Refused("sbatch: error: a batch script or --wrap is required")
    on_line = argv[: argv.index(cli.script)] if cli.script else argv  # the command line's options win over the script's
    opts = _sbatch_parser().parse_args([*directives(text), *on_line])
    config = store.config()
    partition = opts.partition or next(n for n, p in config.partitions.items() if p["default"])
    if partition not in config.partitions:
        raise _Refused("sbatch: error: Batch job submission failed: Invalid partition name specified")
    gres = re.fullmatch(r"gpu(?::[a-z0-9_]+)?:(\d+)", opts.gres or "gpu:0")
    if gres is None:
        raise _Refused("sbatch: error: Invalid generic resource (gres) specification")
    tasks, throttle = parse_array(opts.array) if opts.array else ([], 0)
    signal = None
    if opts.signal:
        to_batch = opts.signal.startswith("B:")
        name, _, secs = opts.signal.removeprefix("B:").partition("@")
        signal = (name.removeprefix("SIG"), float(secs or 60), to_batch)
    user = pwd.getpwuid(os.getuid()).pw_name
    t = now()
    with store.locked():
        ids = store.new_ids(max(1, len(tasks)))
        script = store.root / "scripts" / f"{ids[0]}.sh"
        script.write_text(text)
        common = dict(
            name=opts.job_name or (Path(cli.script).name if cli.script else "wrap"), script=str(script),
            workdir=os.path.abspath(opts.chdir or os.getcwd()), env=dict(os.environ), user=user, uid=os.getuid(), submit=t,
            throttle=throttle, time_min=parse_time(opts.time) if opts.time else 60.0, signal=signal,
            requeue=not opts.no_requeue, partition=partition, account=opts.account or "parcel", qos=opts.qos or "normal",
            gpus=int(gres[1]), cpus=int(opts.cpus_per_task or 1), mem_mb=_mem_mb(opts.mem) if opts.mem else 100,
            exclusive=opts.exclusive, nodelist=_names(opts.nodelist), exclude=_names(opts.exclude), output=opts.output or "",
            error=opts.error or "", open_mode=opts.open_mode or "truncate", comment=opts.comment or "", held=opts.hold,
            reason="JobHeldUser" if opts.hold else "None",
        )  # fmt: skip
        if tasks:
            # The last task carries the array's own id, as SLURM's master record does when it is split off last.
            raws = ids[1:] + ids[:1]
            for index, raw in zip(tasks, raws, strict=True):
                store.save(Job(raw=raw, array_id=ids[0], task=index, array_tasks=tasks, **common))
        else:
            store.save(Job(raw=ids[0], **common))
        ensure_running(store)
    print(ids[0] if opts.parsable else f"Submitted batch job {ids[0]}")
    return 0


def _names(text: str | None) -> list[str]:
    if not text:
        return []
    m = re.fullmatch(r"([a-z]+)\[(\d+)-(\d+)\]", text)
    return [f"{m[1]}{i}" for i in range(int(m[2]), int(m[3]) + 1)] if m else text.split(",")


# --- squeue ---------------------------------------------------------------------------------------


def _squeue_value(job: Job, field: str) -> str:
    field = field.lower()
    values = {
        "jobarrayid": job.job_id, "i": job.job_id, "jobid": str(job.raw), "a": str(job.raw), "name": job.name, "j": job.name,
        "state": job.state, "t": job.state, "reason": job.reason if job.status is State.PENDING else "None",
        "r": job.reason if job.status is State.PENDING else "None", "nodelist": job.node, "n": job.node,
        "restartcnt": str(job.restarts), "starttime": _time(job.start) if job.start else "N/A", "s": _time(job.start) if job.start else "N/A",
        "username": job.user, "u": job.user, "partition": job.partition, "p": job.partition,
    }  # fmt: skip
    if field not in values:
        raise _Refused(f"squeue: error: Invalid job format specification: {field}")
    return values[field]


def squeue(store: Store, argv: list[str]) -> int:
    p = _Parser(prog="squeue", add_help=False, allow_abbrev=False)
    for flags in (("-h", "--noheader"), ("-a", "--all"), ("-r", "--array")):
        p.add_argument(*flags, action="store_true")
    for flags in (("-n", "--name"), ("-j", "--jobs"), ("-u", "--user"), ("-o", "--format"), ("-O", "--Format"), ("-t", "--states"), ("-p", "--partition")):
        p.add_argument(*flags)
    cli = p.parse_args(argv)
    jobs = [j for j in store.active() if (not cli.name or j.name in cli.name.split(",")) and (not cli.jobs or any(j.matches(i) for i in cli.jobs.split(",")))]
    if cli.Format:
        columns = []
        for item in cli.Format.split(","):
            name, _, spec = item.partition(":")
            m = re.fullmatch(r"(\.?)(\d*)(.*)", spec)
            assert m is not None
            columns.append((name, m[1], int(m[2]) if m[2] else 0, m[3]))

        def line(job: Job) -> str:
            out = []
            for name, right, width, suffix in columns:
                value = _squeue_value(job, name)
                value = (value.rjust(width) if right else value.ljust(width))[:width] if width else value
                out.append(value + suffix)
            return "".join(out)

    else:
        fmt = cli.format or "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"

        def line(job: Job) -> str:
            return re.sub(r"%\.?\d*([a-zA-Z])", lambda m: _squeue_value(job, m[1]) if m[1] not in "MDR" else (job.node or job.reason), fmt)

    if not cli.noheader:
        print("JOBID|STATE")
    for job in sorted(jobs, key=lambda j: (j.array_id or j.raw, j.task or 0)):
        print(line(job))
    return 0


# --- sacct ----------------------------------------------------------------------------------------

SACCT_KNOWN = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "Elapsed",
    "AllocTRES",
    "NodeList",
    "Partition",
    "Account",
    "QOS",
    "User",
    "Reason",
)


def _time(t: float) -> str:
    # The caller's TZ and SLURM_TIME_FORMAT=standard, as sacct prints them (parcel_hpc asks for UTC).
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S") if t else "Unknown"


def _since(text: str) -> float:
    if text == "now":
        return now()
    m = re.fullmatch(r"now-(\d+)(hours?|minutes?|days?)?", text)
    if m:
        return now() - int(m[1]) * {"h": 3600, "m": 60, "d": 86400}[(m[2] or "m")[0]]
    return dt.datetime.fromisoformat(text).timestamp()


def _tres(job: Job, billing: bool) -> str:
    mem = f"{job.mem_mb // 1024}G" if job.mem_mb % 1024 == 0 else f"{job.mem_mb}M"
    gpu = f",gres/gpu={job.gpus}" if job.gpus else ""
    head = f"billing={job.cpus + 10 * job.gpus}," if billing else ""
    return f"{head}cpu={job.cpus}{gpu},mem={mem},node=1"


def _rows(job: Job, run: Run | None, t: float, steps: bool) -> list[dict[str, str]]:
    """sacct's rows for one run of ``job`` (None: its present pending or running state)."""
    restarts = next((i for i, r in enumerate(job.runs) if r is run), len(job.runs))  # requeues before this run
    if run is None:
        pending = job.status is State.PENDING
        run = Run(job.state, "0:0", job.submit, 0.0 if pending else job.start, 0.0, "" if pending else job.node, "RUNNING", "0:0", job.reason)
    started = bool(run.start)
    elapsed = int(((run.end or t) - run.start) if started else 0)
    base = {
        "JobID": job.job_id, "JobIDRaw": str(job.raw), "JobName": job.name, "State": run.state, "ExitCode": run.exit_code,
        "Submit": _time(run.submit), "Start": _time(run.start), "End": _time(run.end), "ElapsedRaw": str(elapsed),
        "Elapsed": str(dt.timedelta(seconds=elapsed)), "AllocTRES": _tres(job, True) if run.node else "",
        "NodeList": run.node or "None assigned", "Partition": job.partition, "Account": job.account, "QOS": job.qos,
        "User": job.user, "Reason": run.reason, "SLUID": f"sF{job.raw:08d}{restarts:04d}", "Restarts": str(restarts),
    }  # fmt: skip
    rows = [base]
    if steps and run.node and run.batch_state:
        for suffix, name in (("batch", "batch"), ("0", "python")) if run.stepped else (("batch", "batch"),):
            rows.append(
                {**base, "JobID": f"{job.job_id}.{suffix}", "JobIDRaw": f"{job.raw}.{suffix}", "JobName": name, "State": run.batch_state,
                 "ExitCode": run.batch_exit, "Submit": _time(run.start), "AllocTRES": _tres(job, False), "Partition": "", "QOS": "", "User": "", "Reason": "",
                 "Restarts": ""}
            )  # fmt: skip
    return rows


def sacct(store: Store, argv: list[str]) -> int:
    if argv == ["--version"]:  # answered without the database, as the real one does
        print(f"slurm {store.config().version}")
        return 0
    if store.flag("dbd-down"):
        sys.stderr.write(DBD_DOWN)
        return 1
    p = _Parser(prog="sacct", add_help=False, allow_abbrev=False)
    for flags in (("-P", "--parsable2"), ("-n", "--noheader"), ("-D", "--duplicates"), ("-a", "--allusers"), ("--truncate",), ("-X", "--allocations")):
        p.add_argument(*flags, action="store_true")
    for flags in (("-o", "--format"), ("-S", "--starttime"), ("-E", "--endtime"), ("--name",), ("-A", "--accounts")):
        p.add_argument(*flags)
    p.add_argument("-j", "--jobs", action="append", default=[])
    cli = p.parse_args(argv)
    fields = (cli.format or "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode").split(",")
    for name in fields:
        if name not in SACCT_KNOWN + store.config().per_run_fields:
            raise _Refused(f'sacct: error: Invalid field requested: "{name}"')
    ids = [i for group in cli.jobs for i in group.split(",")]
    t = now()
    since = _since(cli.starttime) if cli.starttime else (None if ids else dt.datetime.now().replace(hour=0, minute=0, second=0).timestamp())
    until = _since(cli.endtime) if cli.endtime else t
    rows = []
    for job in store.all_jobs():
        if ids and not any(job.matches(i) for i in ids) or cli.name and job.name not in cli.name.split(","):
            continue
        if cli.accounts and job.account not in cli.accounts.split(","):
            continue
        runs: list[Run | None] = [*job.runs, *([None] if job.status.is_active() else [])]
        for run in runs if cli.duplicates else runs[-1:]:
            submit, start, end = (run.submit, run.start, run.end) if run else (job.submit, job.start, 0.0)
            if since is not None and ((end or t) < since or submit > until):
                continue
            for row in _rows(job, run, t, not cli.allocations):
                if cli.truncate and since is not None and start and start < since:
                    row["Start"] = _time(since)
                    row["ElapsedRaw"] = str(int((end or t) - since))
                rows.append(((submit, job.task or 0, job.raw), row))
    sep = "|" if cli.parsable2 else " "
    if not cli.noheader:
        print(sep.join(fields))
    for _, row in sorted(rows, key=lambda r: r[0]):
        print(sep.join(row[f] for f in fields))
    return 0


# --- scancel, scontrol, sinfo ---------------------------------------------------------------------


def _find(store: Store, ids: Sequence[str], tool: str) -> list[Job]:
    found = []
    known = store.all_jobs()
    for ident in ids:
        hits = [j for j in known if j.matches(ident)]
        if not hits:
            raise _Refused(f"{tool}: error: Invalid job id {ident}")
        found += hits
    return found


def scancel(store: Store, argv: list[str]) -> int:
    p = _Parser(prog="scancel", add_help=False, allow_abbrev=False)
    p.add_argument("-n", "--name")
    p.add_argument("-u", "--user")
    p.add_argument("ids", nargs="*")
    cli = p.parse_args(argv)
    t = now()
    with store.locked():
        jobs = _find(store, cli.ids, "scancel") if cli.ids else [j for j in store.active() if not cli.name or j.name == cli.name]
        for job in jobs:
            if job.status is State.PENDING:
                job.runs.append(Run(f"CANCELLED by {job.uid}", "0:0", job.submit, t, t, "", "", "", job.reason))
                job.state, job.end = State.CANCELLED.value, t
                store.save(job)
            elif job.status is State.RUNNING and not job.ending:
                job.ending = State.CANCELLED.value
                store.save(job)
    return 0


def scontrol(store: Store, argv: list[str]) -> int:
    args = [a for a in argv if a not in ("--all", "-a")]
    config = store.config()
    if args == ["ping"]:
        print(f"Slurmctld(primary) at {config.cluster} is UP")
    elif args == ["show", "config"]:
        accounting = "accounting_storage/none"  # no associations to check: the fake has no sacctmgr
        for name, value in (
            ("AccountingStorageType", accounting),
            ("ClusterName", config.cluster),
            ("MaxArraySize", config.max_array_size),
            ("MaxJobCount", config.max_job_count),
        ):
            print(f"{name:<23}= {value}")
    elif args[:2] == ["show", "partition"]:
        for name, part in config.partitions.items():
            print(
                f"PartitionName={name}\n   AllowGroups=ALL Default={'YES' if part['default'] else 'NO'} MaxTime=UNLIMITED PriorityTier={part['tier']} GraceTime={int(part['grace_s'])}\n"
            )
    elif args[:2] == ["show", "job"] and len(args) == 3:
        for job in _find(store, args[2:], "scontrol"):
            preempt = _time(job.preempt_time) if job.preempt_time else "None"
            array = f" ArrayJobId={job.array_id} ArrayTaskId={job.task}" if job.array_id is not None else ""
            print(
                f"JobId={job.raw}{array} JobName={job.name}\n   UserId={job.user}({job.uid}) Account={job.account} QOS={job.qos}\n"
                f"   JobState={job.state} Reason={job.reason} Dependency=(null)\n   Requeue={int(job.requeue)} Restarts={job.restarts} ExitCode=0:0\n"
                f"   SubmitTime={_time(job.submit)} StartTime={_time(job.start)} EndTime={_time(job.end)}\n   PreemptTime={preempt}\n"
                f"   Partition={job.partition} NodeList={job.node or '(null)'}\n"
            )
    elif args[:1] in (["release"], ["hold"], ["requeue"]) and len(args) == 2:
        with store.locked():
            for job in _find(store, args[1].split(","), "scontrol"):
                if args[0] == "requeue" and job.status is State.RUNNING and job.ending in ("", State.PREEMPTED.value):
                    job.ending = State.REQUEUED.value
                elif args[0] in ("release", "hold") and job.status is State.PENDING:
                    job.held = args[0] == "hold"
                    job.reason = "JobHeldUser" if job.held else "None"
                store.save(job)
    elif args[:1] == ["update"]:
        return _update_node(store, dict(a.split("=", 1) for a in args[1:] if "=" in a))
    elif args[:2] in (["show", "node"], ["show", "nodes"]):
        for node in store.nodes():
            print(f"NodeName={node.name} State={node.state} Gres=gpu:{node.gpus} Reason={node.reason}\n")
    else:
        raise _Refused(f"scontrol: error: the fake does not know `scontrol {' '.join(argv)}`")
    return 0


def _update_node(store: Store, fields: dict[str, str]) -> int:
    """``scontrol update nodename=N state=down|drain|resume reason=...``: a node going down ends its
    jobs' runs NODE_FAIL (requeued unless --no-requeue)."""
    lower = {k.lower(): v for k, v in fields.items()}
    name, state = lower.get("nodename", ""), lower.get("state", "").upper()
    if state in ("DOWN", "DRAIN") and not lower.get("reason"):
        raise _Refused("You must specify a reason when DOWNING or DRAINING a node. Request denied")
    with store.locked():
        nodes = store.nodes()
        targets = [n for n in nodes if n.name in _names(name)]
        if not targets or state not in ("DOWN", "DRAIN", "RESUME", "IDLE"):
            raise _Refused(
                f"slurm_update error: Invalid node name specified ({name})" if not targets else f"scontrol: error: Invalid node state specified: {state}"
            )
        for node in targets:
            node.state, node.reason = ("IDLE", "") if state in ("RESUME", "IDLE") else (state, lower.get("reason", ""))
            if state == "DOWN":
                for job in store.active():
                    if job.status is State.RUNNING and job.node == node.name:
                        job.ending = State.NODE_FAIL.value
                        store.save(job)
        store.save_nodes(nodes)
    return 0


def sinfo(store: Store, argv: list[str]) -> int:
    fmt = argv[argv.index("-o") + 1] if "-o" in argv else "%N %T %E"
    for node in store.nodes():
        state = {"IDLE": "idle", "DOWN": "down", "DRAIN": "drained"}[node.state]
        print(fmt.replace("%N", node.name).replace("%T", state).replace("%E", node.reason or "none").replace("%G", f"gpu:{node.gpus}"))
    return 0


# --- srun (inside a job) --------------------------------------------------------------------------


def srun(store: Store, argv: list[str]) -> int:
    """Run the command as the job's step 0, in place: its stdout/stderr where --output/--error say,
    its pid recorded so the job's --signal reaches it, as slurmstepd delivers it."""
    with_value = {"--output", "-o", "--error", "-e", "-n", "--ntasks", "-N", "--nodes", "-c", "--cpus-per-task", "--cpu-bind", "--mpi", "-J", "--job-name"}
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name in with_value and not eq:
            value, i = argv[i + 1], i + 1
        opts[name] = value
        i += 1
    command = argv[i:]
    if not command or "SLURM_JOB_ID" not in os.environ:
        print("srun: error: the fake runs srun only inside a batch job", file=sys.stderr)
        return 1
    raw = int(os.environ["SLURM_JOB_ID"])
    job = next(j for j in store.all_jobs() if j.raw == raw)
    job.node = os.environ.get("SLURMD_NODENAME", "")
    steps = Path(os.environ["PARCEL_FAKE_SLURM_STEPS"])
    with open(steps, "a") as f:
        f.write(f"{os.getpid()}\n")
    os.environ.update(SLURM_STEP_ID="0", SLURM_STEPID="0", SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1", SLURM_NPROCS="1", SLURM_STEP_NODELIST=job.node)
    for names, fd in ((("--output", "-o"), 1), (("--error", "-e"), 2)):
        pattern = next((opts[n] for n in names if n in opts), None)
        if pattern:
            path = Path(expand(pattern, job))
            path.parent.mkdir(parents=True, exist_ok=True)
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, fd)
            os.close(out)
    os.execvp(command[0], command)
    return 1  # not reached


TOOLS = {"sbatch": sbatch, "squeue": squeue, "sacct": sacct, "scancel": scancel, "scontrol": scontrol, "sinfo": sinfo, "srun": srun}

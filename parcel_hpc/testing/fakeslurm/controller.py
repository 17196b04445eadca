"""The fake slurmctld and slurmd in one process: starts pending jobs, runs each batch script as a
local process group with the environment a SLURM job sees, and ends runs the way SLURM does.

Owns: every process a fake job runs and every signal sent to one. A tool (scancel, scontrol) only
writes what should happen (``Job.ending``); this loop carries it out: SIGTERM, then SIGKILL after
KillWait; for a preemption the job's ``--signal`` at once and SIGTERM at the end of the partition's
GraceTime; a run recorded in sacct's terms, and a requeue when SLURM would requeue. The job's ``--signal`` goes to its srun step (to the batch shell
too with ``B:``) that many seconds before the limit, and a job still running at its limit ends
TIMEOUT. Started by sbatch when none runs; exits once no job is left. Must not: print what a tool
prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from parcel_hpc.testing.fakeslurm.state import REQUEUES, Config, Job, Run, State, Store, now, place, preemptable, wait_reason

TICK_S = 0.1


@dataclass
class _Running:
    proc: subprocess.Popen
    signalled: bool = False  # the job's --signal was sent
    term_due: float = 0.0  # when SIGTERM is to go out (0: no end asked for yet)
    term_at: float = 0.0  # when it went out
    kill_at: float = 0.0  # when SIGKILL goes out
    acting_on: str = ""  # the ending the two times above were set for


def ensure_running(store: Store) -> None:
    """Start the controller unless one runs (called under the lock, after a job was added)."""
    pid_file = store.root / "ctld.pid"
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
        if b"fakeslurm" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
    log = open(store.root / "ctld.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "parcel_hpc.testing.fakeslurm", "slurmctld", str(store.root)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
    )  # fmt: skip
    pid_file.write_text(str(proc.pid))


def serve(store: Store) -> None:
    """The loop: until no job is active, every ``TICK_S``: end, signal, start."""
    config = store.config()
    running: dict[int, _Running] = {}
    while True:
        with store.locked():
            jobs = store.active()
            nodes = store.nodes()
            for job in jobs:
                if job.raw in running:
                    _watch(store, config, job, running)
            jobs = store.active()
            tiers = {name: int(p["tier"]) for name, p in config.partitions.items()}
            for job in sorted(jobs, key=lambda j: (-tiers.get(j.partition, 0), j.raw)):
                if job.status is State.PENDING:
                    _schedule(store, config, job, jobs, nodes, tiers, running)
            if not store.active() and not running:
                (store.root / "ctld.pid").unlink(missing_ok=True)
                return
        time.sleep(TICK_S)


def _schedule(store: Store, config: Config, job: Job, jobs: list[Job], nodes: list, tiers: dict[str, int], running: dict[int, _Running]) -> None:
    t = now()
    reason = wait_reason(job, jobs, nodes, t)
    if reason == "Resources":
        for victim in preemptable(job, jobs, nodes, tiers):
            victim.ending, victim.preempt_time = State.PREEMPTED.value, t
            store.save(victim)
    if reason:
        if reason != job.reason:
            job.reason = reason
            store.save(job)
        return
    job.node, job.start, job.state, job.ending = place(job, jobs, nodes), t, State.RUNNING.value, ""
    job.preempt_time = 0.0
    (store.root / "steps" / str(job.raw)).unlink(missing_ok=True)
    proc = subprocess.Popen(
        ["/bin/bash", job.script], cwd=job.workdir, env=job_env(job, config), start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=_out(job, job.output), stderr=_out(job, job.error or job.output),
    )  # fmt: skip
    running[job.raw] = _Running(proc)
    store.save(job)


def job_env(job: Job, config: Config) -> dict[str, str]:
    """The submitter's environment (sbatch --export=ALL) and the SLURM_* variables of this run."""
    env = dict(job.env)
    env.update(
        SLURM_JOB_ID=str(job.raw), SLURM_JOBID=str(job.raw), SLURM_JOB_NAME=job.name, SLURM_JOB_USER=job.user,
        SLURM_JOB_UID=str(job.uid), SLURM_JOB_PARTITION=job.partition, SLURM_JOB_ACCOUNT=job.account,
        SLURM_JOB_QOS=job.qos, SLURM_CLUSTER_NAME=config.cluster, SLURM_SUBMIT_DIR=job.workdir,
        SLURM_JOB_NODELIST=job.node, SLURM_NODELIST=job.node, SLURMD_NODENAME=job.node, SLURM_JOB_NUM_NODES="1",
        SLURM_NNODES="1", SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_TASKS_PER_NODE="1",
        SLURM_CPUS_PER_TASK=str(job.cpus), SLURM_CPUS_ON_NODE=str(job.cpus), SLURM_MEM_PER_NODE=str(job.mem_mb),
        SLURM_JOB_CPUS_PER_NODE=str(job.cpus),
    )  # fmt: skip
    if job.array_id is not None:
        env.update(
            SLURM_ARRAY_JOB_ID=str(job.array_id), SLURM_ARRAY_TASK_ID=str(job.task),
            SLURM_ARRAY_TASK_COUNT=str(len(job.array_tasks)), SLURM_ARRAY_TASK_MIN=str(min(job.array_tasks)),
            SLURM_ARRAY_TASK_MAX=str(max(job.array_tasks)),
        )  # fmt: skip
    if job.restarts:
        env["SLURM_RESTART_COUNT"] = str(job.restarts)  # SLURM sets it only on a run after a requeue
    if job.gpus:
        devices = ",".join(str(i) for i in range(job.gpus))
        env.update(SLURM_JOB_GPUS=devices, SLURM_GPUS_ON_NODE=str(job.gpus), CUDA_VISIBLE_DEVICES=devices)
    env["PARCEL_FAKE_SLURM_STEPS"] = str(Path(job.script).parent.parent / "steps" / str(job.raw))
    return env


def expand(pattern: str, job: Job, step: str = "") -> str:
    """sbatch's and srun's filename patterns: %j %A %a %x %u %N %t %%."""
    values = {
        "j": str(job.raw), "A": str(job.array_id if job.array_id is not None else job.raw),
        "a": str(job.task if job.task is not None else 4294967294), "x": job.name, "u": job.user,
        "N": job.node, "t": step or "0", "%": "%",
    }  # fmt: skip
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _out(job: Job, pattern: str):  # a file object the child inherits
    path = Path(expand(pattern or "slurm-%j.out", job))
    if not path.is_absolute():
        path = Path(job.workdir) / path
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "ab" if job.open_mode == "append" or job.restarts else "wb")


def _watch(store: Store, config: Config, job: Job, running: dict[int, _Running]) -> None:
    r = running[job.raw]
    t = now()
    limit_at = job.start + job.time_min * config.minute_s
    if job.signal and not r.signalled and not job.ending and t >= limit_at - job.signal[1] * config.minute_s / 60:
        _warn(store, job, r)
    if not job.ending and t >= limit_at:
        job.ending = State.TIMEOUT.value
        store.save(job)
    if job.ending and job.ending != r.acting_on:
        # A requeue asked for in a preemption's grace (submitit's own, on the --signal) ends the run REQUEUED.
        r.acting_on = job.ending
        if job.ending == State.NODE_FAIL.value:
            r.kill_at = t  # the node is gone: nothing is told
        elif job.ending == State.PREEMPTED.value:
            # PreemptMode=REQUEUE with GraceTime: the job's --signal at once (SIGTERM without one), then
            # at the end of the grace SIGTERM and, KillWait later, SIGKILL (the dev cluster's order).
            grace = float(config.partitions.get(job.partition, {}).get("grace_s", 0.0))
            if job.signal and not r.signalled:
                _warn(store, job, r)
                r.term_due, r.kill_at = t + grace, t + grace + config.kill_wait_s
            else:
                r.term_due, r.kill_at = t, t + grace
        else:
            r.term_due, r.kill_at = t, t + config.kill_wait_s
    if r.term_due and not r.term_at and t >= r.term_due:
        r.term_at = t
        _killpg(r.proc.pid, signal.SIGTERM)
    exited = r.proc.poll() is not None
    if (exited and not job.ending) or (r.kill_at and t >= r.kill_at):
        _killpg(r.proc.pid, signal.SIGKILL)  # a job's leftovers die with its batch script, as under slurmd
    if not exited or _group_alive(r.proc.pid):
        return
    del running[job.raw]
    _end_run(store, config, job, r.proc.returncode, t)


def _warn(store: Store, job: Job, r: _Running) -> None:
    """The job's ``--signal``: to its srun step, to the batch shell too with ``B:`` (or without a step)."""
    assert job.signal is not None
    r.signalled = True
    sig = signal.Signals[f"SIG{job.signal[0]}"]
    steps = _step_pids(store, job)
    for pid in steps + ([r.proc.pid] if job.signal[2] or not steps else []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _end_run(store: Store, config: Config, job: Job, rc: int, t: float) -> None:
    if rc == 0:
        batch = (State.COMPLETED.value, "0:0")
    elif rc > 0:
        batch = (State.FAILED.value, f"{rc % 128 if rc > 128 and not config.stores_whole_exit_status else rc}:0")
    else:
        batch = (State.CANCELLED.value, f"0:{-rc}")
    if job.ending == State.NODE_FAIL.value:
        batch = (State.CANCELLED.value, "0:15")
    if job.ending == State.CANCELLED.value:
        state, code = f"CANCELLED by {job.uid}", "0:0"
    elif job.ending:
        state, code = job.ending, "0:0"
    elif rc == 0:
        state, code = State.COMPLETED.value, "0:0"
    else:
        state, code = State.FAILED.value, batch[1] if rc > 0 else f"0:{-rc}"
    stepped = (store.root / "steps" / str(job.raw)).exists()
    job.runs.append(Run(state, code, job.submit, job.start, t, job.node, batch[0], batch[1], job.reason, stepped))
    requeue = job.ending and REQUEUES.get(State(job.ending), False) and (job.requeue or job.ending == State.REQUEUED.value)
    if requeue:
        job.restarts += 1
        job.state, job.submit, job.begin, job.reason = State.PENDING.value, t, t + config.requeue_delay_s, "BeginTime"
    else:
        job.state, job.end = (state.split()[0] if state.startswith("CANCELLED") else state), t
    job.ending, job.node = "", job.node if not requeue else ""
    store.save(job)


def _step_pids(store: Store, job: Job) -> list[int]:
    try:
        return [int(p) for p in (store.root / "steps" / str(job.raw)).read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGCONT)
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of the group (reparented, not yet reaped) count as gone.
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
    return False

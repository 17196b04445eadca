"""Run the real entry points in subprocesses, the way a user does, and capture what they print."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import AttemptEnd, Cause, Event, EventKind, SearchDir, Started, TrialRecord
from parcel_hpc.ledger.events import Resumed


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


def subprocess_env(data_dir: Path | None, extra: Mapping[str, str] | None) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if data_dir is not None:
        env["PARCEL_DATA_DIR"] = str(data_dir)
    env.update(extra or {})
    return env


# The suite's trials take steps of milliseconds and last seconds: at the default cadence (seconds of
# training, the launcher's signal delay) they would save only at their last step. Where a test names
# no cadence, they save every 10 steps, the step cadence the suite was written against.
SUITE_CADENCE = "checkpoint.every_steps=10"


def with_suite_cadence(overrides: Sequence[str]) -> list[str]:
    """``overrides``, with ``SUITE_CADENCE`` where they name no checkpoint cadence."""
    named = any(o.lstrip("+~").startswith(("checkpoint.every_steps", "checkpoint.every_s")) for o in overrides)
    return list(overrides) if named else [*overrides, SUITE_CADENCE]


def launch(
    overrides: Sequence[str], *, cwd: Path, data_dir: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 600, multirun: bool = True
) -> LaunchResult:
    argv = [sys.executable, "-m", "parcel_hpc.launch"] + (["-m"] if multirun else []) + with_suite_cadence(overrides)
    proc = subprocess.run(argv, cwd=cwd, env=subprocess_env(data_dir, env), capture_output=True, text=True, timeout=timeout)
    return LaunchResult(proc.returncode, proc.stdout, proc.stderr)


def start_launch(overrides: Sequence[str], *, cwd: Path, data_dir: Path | None = None, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """A launch running in the background (two launchers at once); ``finish`` waits for its result."""
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", *with_suite_cadence(overrides)]
    return subprocess.Popen(argv, cwd=cwd, env=subprocess_env(data_dir, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> LaunchResult:
    out, err = proc.communicate(timeout=timeout)
    return LaunchResult(proc.returncode, out, err)


def parcel_hpc(args: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 300) -> LaunchResult:
    proc = subprocess.run([sys.executable, "-m", "parcel_hpc", *args], cwd=cwd, env=subprocess_env(None, env), capture_output=True, text=True, timeout=timeout)
    return LaunchResult(proc.returncode, proc.stdout, proc.stderr)


def decide_every_hold(selected: LaunchResult, decide: Callable[[str], LaunchResult]) -> LaunchResult:
    """After ``select``: each hold a decision may lift (performance, slices), decided one at a time
    by ``decide(reason)``; the last command's result, whose first line is where the selection ends."""
    result = selected
    while result.stdout and _decidable(first := result.stdout.splitlines()[0]):
        result = decide(f"{first} accepted for the test")
        if result.returncode not in (0, 3) or result.stdout.splitlines()[:1] == [first]:
            raise AssertionError(f"decide did not lift {first}: {result.stdout}{result.stderr}")
    return result


def _decidable(line: str) -> bool:
    try:
        return Outcome.parse(line).is_decidable
    except ValueError:
        return False


def run_trial_directly(plan, *, env: Mapping[str, str] | None = None, timeout: float = 300) -> LaunchResult:
    """Run one worker attempt (or, given a list of plans, a packed task) in a fresh interpreter,
    outside any executor (for worker-check tests)."""
    plans = list(plan) if isinstance(plan, (list, tuple)) else [plan]
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(plans, f)
    code = f"import pickle,sys; from parcel_hpc.worker.task import TrialTask; plans=pickle.load(open({f.name!r},'rb')); print(TrialTask(plans)())"
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(None, env), capture_output=True, text=True, timeout=timeout)
    os.unlink(f.name)
    return LaunchResult(proc.returncode, proc.stdout, proc.stderr)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def signalled_once(
    overrides: Sequence[str],
    *,
    cwd: Path,
    data_dir: Path,
    env: Mapping[str, str],
    revision: str = "sig",
    timeout: float = 300,
    first_checkpoint_within: float = 120,
) -> TrialRecord:
    """A one-trial search (``search.root=cwd``, ``search.revision=revision``) launched in the background,
    its worker sent SIGUSR2 (what submitit's controller sends at the time limit) once its trial has a
    first checkpoint; the trial's record once the launch has ended with exit 0, its two attempts
    checked: the first interrupted (``timeout``), the second resumed from exactly the step the first
    reached (the signal waits for a step boundary, where the state is saved) and completed.
    ``first_checkpoint_within``: seconds for the launch's preflight and the worker's start (a trainer
    importing a large library takes longer on a busy machine)."""
    argv = [
        sys.executable,
        "-m",
        "parcel_hpc.launch",
        "-m",
        f"search.root={cwd}",
        f"search.revision={revision}",
        "search.n_trials=1",
        *with_suite_cadence(overrides),
    ]
    launcher = subprocess.Popen(argv, cwd=cwd, env=subprocess_env(data_dir, env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    search = SearchDir(cwd / revision)
    wait_for(
        lambda: launcher.poll() is not None or any((cwd / revision / "checkpoints" / "t0000").glob("ckpt-*.h5")), first_checkpoint_within, "a first checkpoint"
    )
    assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
    started = [e.data for e in search.events("t0000") if isinstance(e.data, Started)][-1]
    os.kill(started.pid, signal.SIGUSR2)
    _, err = launcher.communicate(timeout=timeout)
    assert launcher.returncode == 0, err
    record = search.record("t0000")
    first, second = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.TIMEOUT)
    assert second.resumed_from == first.step and second.how is AttemptEnd.COMPLETED
    return record


def resumed_within_tolerance(search: SearchDir, trial_id: str) -> TrialRecord:
    """A completed trial's record as it reads had its attempt resumed under a declared
    ``train.resume_tolerance``: a ``resumed(exact=False)`` event appended to that attempt's journal as
    its own writer would have (a real search of a drifting trainer costs a signal and a rerun)."""
    record = search.record(trial_id)
    last = record.attempts[-1]
    [journal] = search.trial_dir(trial_id).glob(f"journal-a{last.number}-*.jsonl")
    tail = Event.from_json(json.loads(journal.read_text().splitlines()[-1]))
    resumed = Event(EventKind.RESUMED, tail.t, tail.writer, tail.seq + 1, last.number, Resumed(step=1, exact=False))
    with journal.open("a") as f:
        f.write(json.dumps(resumed.to_json()) + "\n")
    return search.record(trial_id)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...), read from /proc: the
    processes a test started through ``pid``, found by parentage, never by name or command line."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat_text.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold spaces
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    pending = [pid]
    while pending:
        children = parents.get(pending.pop(), [])
        found.extend(children)
        pending.extend(children)
    return found


def own_daemon_pid(base: Path, name: str) -> int | None:
    """The live pid of the dev cluster daemon ``name`` (``slurmctld``, ``slurmd-n2``) that
    scripts/dev-cluster-up.sh started in ``base``: read from its pid file and checked as that script
    checks it (the process's name, and ``base`` in its command line or environment: pids are reused).
    None when it does not run."""
    try:
        pid = int((base / "run" / "pids" / f"{name}.pid").read_text().strip())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        marks = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError):
        return None
    if state in ("Z", "X") or comm != name.split("-", 1)[0] or f"{base}/".encode() not in marks:
        return None
    return pid

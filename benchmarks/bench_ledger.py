"""Ledger event append and fold against Optuna's JournalFileBackend at the same durability (one
fsync per event), with 1 and 2 processes writing at once.

    .venv/bin/python benchmarks/bench_ledger.py [--events 300] [--repeats 3]

Ours: each process is one trial's writer (``TrialWriter.milestone``: append one typed event, fsync),
then ``SearchDir.records`` folds every trial's journals. The peer (its own virtual environment,
``benchmarks/.peers``): each process creates a trial in one JournalStorage file and reports the
same number of intermediate values (one locked, fsync'd append each), then a fresh JournalStorage
replays the file. Per operation = the time over the events written. Targets: <= 1x for both.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, env, main, peer_python, ratio  # noqa: E402

from parcel_hpc.ledger import Executor, SearchDir, Started, TrialSpec  # noqa: E402


def _write(root: str, trial_id: str, n: int) -> None:
    search = SearchDir(Path(root))
    digest = "sha256:" + "0" * 64
    search.write_spec(TrialSpec(trial_id, int(trial_id[1:]), {"lr": 0.1}, 1, digest, digest, digest, {"gpus": 1, "cpus": 1}))
    writer = search.writer(trial_id, "bench")
    writer.started(1, Started(Executor.LOCAL, "1", "1", "host", "host", 1, 0, ""))
    for step in range(n):
        writer.milestone(1, step, 0.5 + step * 1e-4, False, {})


def ours(n: int, procs: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        workers = [multiprocessing.Process(target=_write, args=(root, f"t{i:04d}", n)) for i in range(procs)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        appended = time.perf_counter() - t0
        t0 = time.perf_counter()
        search = SearchDir(Path(root))
        steps = [search.record(f"t{i:04d}").step for i in range(procs)]
        folded = time.perf_counter() - t0
        assert steps == [n - 1] * procs, steps
    return appended, folded


def peer(n: int, procs: int, python: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as root:
        out = subprocess.run(
            [python, str(HERE / "peer_app" / "optuna_journal.py"), f"{root}/journal.log", str(n), str(procs)],
            env=env(),
            check=True,
            capture_output=True,
            text=True,
        )
    got = json.loads(out.stdout)
    return got["append_s"], got["fold_s"]


def run(repeats: int = 3, events: int = 300) -> list[Figure]:
    python = peer_python(extra=["optuna>=4,<5"])
    out = []
    for procs in (1, 2):
        mine, theirs = [], []
        for _ in range(repeats):
            theirs.append(peer(events, procs, python))
            mine.append(ours(events, procs))
        ops = events * procs
        for i, what in enumerate(("append", "fold")):
            a, b = [m[i] / ops for m in mine], [t[i] / ops for t in theirs]
            out.append(ratio(f"ledger {what} per event, {procs} process{'es' if procs > 1 else ''}", "Optuna JournalFileBackend", a, b, 1.0))
    return out


if __name__ == "__main__":
    main(run, __doc__)

"""Effective trials per hour with one attempt in five interrupted, against the same search without
faults and against restarting interrupted trials from scratch, on the local executor.

    .venv/bin/python benchmarks/bench_faults.py [--trials 40] [--step-seconds 0.02]

Three searches of the same seeds, ``pruner=none``, one trial a process (``pack_size=1``, so the
comparison is of the policies, not of packing), ``train.step_seconds`` so a trial trains ~1.6 s:
- fault-free;
- ours: a step hook sends SIGUSR2 (SLURM's checkpoint signal) to one first attempt in five at a
  step between 10 and 79; the worker checkpoints at the step boundary and is requeued, resuming;
- restart from scratch: the same attempts are killed (SIGKILL: no warning) and no cadence
  checkpoints are written (``checkpoint.every_steps`` past the last step), so a retried trial
  starts again at step 0.
Effective trials per hour = trials with a result over the launch's wall time. Targets: ours >= 0.9x
the fault-free rate and >= 2x the restart-from-scratch rate.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, launch, main  # noqa: E402

from parcel_hpc.ledger import SearchDir  # noqa: E402


def search(trials: int, step_seconds: float, fault: str) -> tuple[float, int]:
    """(effective trials per hour, interrupted attempts) of one search."""
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"checkpoint.dir={tmp}/ckpt",
            f"search.n_trials={trials}",
            "pruner=none",
            "hydra.launcher.pack_size=1",
            f"train.step_seconds={step_seconds}",
        ]
        extra = {}
        if fault:
            os.makedirs(f"{tmp}/faults")
            extra = {
                "PARCEL_HPC_STEP_HOOK": "interrupt_hook:hook",
                "BENCH_FAULT": fault,
                "BENCH_FAULT_DIR": f"{tmp}/faults",
                "PYTHONPATH": str(HERE / "peer_app"),
            }
            if fault == "kill":
                overrides.append("checkpoint.every_steps=1000")
        t0 = time.perf_counter()
        launch(tmp, *overrides, extra_env=extra)
        wall = time.perf_counter() - t0
        records = list(SearchDir(Path(tmp) / "runs" / "parcel-search-r1").records())
        effective = sum(1 for r in records if r.state.is_result())
        interrupted = sum(1 for r in records for a in r.attempts[:-1])
        return effective / (wall / 3600), interrupted


def run(repeats: int = 1, trials: int = 40, step_seconds: float = 0.02) -> list[Figure]:
    free, ours, scratch, counts = [], [], [], []
    for _ in range(repeats):
        free.append(search(trials, step_seconds, "")[0])
        rate, n_ours = search(trials, step_seconds, "usr2")
        ours.append(rate)
        rate, n_scratch = search(trials, step_seconds, "kill")
        scratch.append(rate)
        counts.append({"interrupted_ours": n_ours, "interrupted_scratch": n_scratch})
    samples = {"fault_free_per_h": free, "ours_per_h": ours, "scratch_per_h": scratch, "interruptions": counts}
    return [
        Figure(
            "effective trials/h, 20 % interrupted", "the same search without faults", [a / b for a, b in zip(ours, free)], 0.9, at_least=True, samples=samples
        ),
        Figure(
            "effective trials/h, 20 % interrupted ",
            "restarting interrupted trials from scratch",
            [a / b for a, b in zip(ours, scratch)],
            2.0,
            at_least=True,
            samples=samples,
        ),
    ]


if __name__ == "__main__":
    main(run, __doc__)

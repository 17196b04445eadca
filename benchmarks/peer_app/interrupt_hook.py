"""bench_faults' step hook: interrupts one attempt in five of the first ones, at a step drawn from
the trial's parameters, the way the scheduler does (``BENCH_FAULT=usr2``: the checkpoint signal, as
SLURM sends it before a preemption or the time limit; ``kill``: SIGKILL, a job that gets no
warning). Loaded by the worker through PARCEL_HPC_STEP_HOOK."""

import hashlib
import json
import os
import signal

_done: set[str] = set()


def hook(params, step: int) -> None:
    key = json.dumps(dict(params), sort_keys=True)
    draw = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    if draw % 5 or key in _done:
        return
    at = 10 + (draw // 5) % 70  # steps 10..79 of 82
    marker = os.path.join(os.environ["BENCH_FAULT_DIR"], hashlib.sha256(key.encode()).hexdigest()[:16])
    if step != at or os.path.exists(marker):
        return
    _done.add(key)
    open(marker, "w").close()  # once per trial: its retry runs undisturbed
    os.kill(os.getpid(), signal.SIGUSR2 if os.environ.get("BENCH_FAULT") == "usr2" else signal.SIGKILL)

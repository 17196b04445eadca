"""82 trials on the embedded local executor against hydra-submitit-launcher's ``submitit_local``
running 82 trivial jobs, same run, alternating.

    .venv/bin/python benchmarks/bench_local.py [--repeats 3] [--trials 82]

Ours: the README's main job (``python -m parcel_hpc.launch -m``, every default: the real parcel
model, pruning, checkpoints, the ledger) into a fresh search root each time. The peer: a Hydra app
whose task returns at once, swept over ``x=range(0,82)`` with ``hydra/launcher=submitit_local``,
from its own virtual environment (``benchmarks/.peers``, made on first use: its launcher plugin
registers the same ``submitit_local`` name as parcel_hpc's, so the two never share an environment).
Target: <= 0.25x.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, alternate, env, launch, main, peer_python, ratio  # noqa: E402

TARGET = 0.25


def ours(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        launch(tmp, f"checkpoint.dir={tmp}/ckpt", f"search.n_trials={n}")


def peer(n: int, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, str(HERE / "peer_app" / "app.py"), "-m", "hydra/launcher=submitit_local", f"+x=range(0,{n})", f"hydra.sweep.dir={tmp}/sweep"]
        subprocess.run(argv, cwd=tmp, env=env(), check=True, capture_output=True)


def run(repeats: int = 2, trials: int = 82) -> list[Figure]:
    python = peer_python()
    a, b = alternate(lambda: ours(trials), lambda: peer(trials, python), repeats)
    note = "ours: the real model, pruning, checkpoints and ledger; the peer's jobs return at once"
    return [ratio(f"local executor, {trials} trials", f"hydra-submitit-launcher submitit_local, {trials} trivial jobs", a, b, TARGET, note)]


if __name__ == "__main__":
    main(run, __doc__)

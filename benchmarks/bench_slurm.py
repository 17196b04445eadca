"""Trials on a real SLURM cluster against hydra-submitit-launcher's ``submitit_slurm`` and a raw
``sbatch --array`` of a process that only imports what the worker imports, same run, alternating.

    .venv/bin/python benchmarks/bench_slurm.py [--trials 82] [--parallelism 12] [--repeats 2]

Needs a cluster answering at $SLURM_CONF (``scripts/dev-cluster-up.sh``; for 1,000 trials a
50-node one: ``NODES=50 PORT_BASE=17817 DB_PORT=14306 scripts/dev-cluster-up.sh /tmp/ps50``).
Every side asks for one GPU, one CPU and 1 GiB a task, the same array parallelism, and is timed
from the command's start until its last task ended (``sbatch --wait`` for the raw array; the
launchers wait by default). Ours: the README's main job on ``hydra/launcher=submitit_slurm``
(the real model, pruning, checkpoints, the ledger; auto packing). The peer: a Hydra task that
returns at once, swept over ``+x=range(0,N)``. Targets: <= 0.5x the peer, <= 1.2x the raw array.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _suite import Figure, env, launch, main, peer_python, ratio  # noqa: E402

IMPORTS = "import numpy, h5py, submitit, hydra, xxhash, parcel_hpc.worker, parcel_hpc.trainer.numpy_mlp"


def ours(n: int, parallelism: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        budget = [f"budget.max_trials={max(n, 82)}", "budget.gpu_hours_cap=100000", "budget.cost_cap=1000000"]
        launch(
            tmp,
            "hydra/launcher=submitit_slurm",
            f"checkpoint.dir={tmp}/ckpt",
            f"search.n_trials={n}",
            *budget,
            f"hydra.launcher.array_parallelism={parallelism}",
            "resources.gpus=1",
        )


def peer(n: int, parallelism: int, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, str(HERE / "peer_app" / "app.py"), "-m", "hydra/launcher=submitit_slurm", f"+x=range(0,{n})", f"hydra.sweep.dir={tmp}/sweep"]
        argv += [f"hydra.launcher.array_parallelism={parallelism}", "hydra.launcher.gres=gpu:1", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10"]
        argv += ["hydra.launcher.cpus_per_task=1", "hydra.launcher.tasks_per_node=1"]
        subprocess.run(argv, cwd=tmp, env=env(), check=True, capture_output=True)


def raw(n: int, parallelism: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "sbatch",
            "--wait",
            f"--array=0-{n - 1}%{parallelism}",
            "--gres=gpu:1",
            "--cpus-per-task=1",
            "--mem=1G",
            "-t",
            "10",
            "-J",
            "bench-raw",
            "-o",
            f"{tmp}/%A_%a.out",
        ]
        subprocess.run([*argv, "--wrap", f"{sys.executable} -c '{IMPORTS}'"], cwd=ROOT, env=env(), check=True, capture_output=True)


def run(repeats: int = 2, trials: int = 82, parallelism: int = 12) -> list[Figure]:
    python = peer_python()
    mine, theirs, plain = [], [], []
    for _ in range(repeats):
        for fn, out in (
            (lambda: peer(trials, parallelism, python), theirs),
            (lambda: raw(trials, parallelism), plain),
            (lambda: ours(trials, parallelism), mine),
        ):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    note = f"{parallelism} tasks at once"
    return [
        ratio(f"SLURM, {trials} trials", f"hydra-submitit-launcher submitit_slurm, {trials} trivial jobs", mine, theirs, 0.5, note),
        ratio(f"SLURM, {trials} trials ", f"raw sbatch --array of {trials} processes importing the worker's modules", mine, plain, 1.2, note),
    ]


if __name__ == "__main__":
    main(run, __doc__)

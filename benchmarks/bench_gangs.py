"""A data-parallel trial of 2 nodes x 2 ranks under parcel_hpc against the same DDP loop started by
``srun`` alone, on a real SLURM cluster, same run, alternating.

    .venv/bin/python benchmarks/bench_gangs.py [--repeats 3] [--steps 240]

Needs a cluster answering at $SLURM_CONF with 2 nodes of 2 free CPUs (``scripts/dev-cluster-up.sh``).
The loop is examples/parcel_loop's ``train_ddp`` (DistributedDataParallel over gloo, CPU), validated
at steps 41, 82 and ``--steps``, timed from its validation at step 41 to its last (start-up, the
process group's rendezvous and the first steps excluded on both sides). Ours: one trial searched on
``hydra/launcher=submitit_slurm`` with ``resources.nodes=2 resources.tasks_per_node=2`` (the ledger,
the fence, rank 0's exchange with every rank at each step, a checkpoint across the ranks at the
default cadence), timed by the ledger's milestone timestamps. The baseline: ``srun -N 2
--ntasks-per-node 2`` of the same loop handed a bare run context (no exchange, no checkpoint, no
ledger), timed by rank 0's clock at the same validations. Target: <= 1.05x.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import ROOT, Figure, alternate, env, launch, main, ratio  # noqa: E402

TARGET = 1.05
EXAMPLES = ROOT / "examples"
PARAMS = {"lr": 0.03, "batch_size": 32, "width": 8}

BARE = """
import json, os, sys, time
os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK=os.environ["SLURM_LOCALID"],
                  MASTER_ADDR=sys.argv[3], MASTER_PORT=sys.argv[4])
from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.data import read_split
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.trainer import load_training_data
from parcel_hpc.trainer.data import Budget
from parcel_hpc.trainer.run import Run
from dataclasses import replace
from parcel_loop.ddp import train_ddp

params, steps = json.loads(sys.argv[1]), int(sys.argv[2])
data = load_training_data("data/parcels.h5", read_split("data/split-group_r8.json"), {"revision": "stats-r1", "pool": 4})
data = replace(data, budget=Budget(steps, (41, 82, steps), Cadence(every_steps=10**9)))
metric = MissCost("miss-cost-r3", 5.0, 1.0)
marks = {}

class Bare(Run):
    def _restore(self): return None
    def _stepped(self, step): return None
    def _save(self, step, state): pass
    def _validated(self, step, value, final, metrics):
        marks[step] = time.perf_counter()

train_ddp.function(Bare(params, 1234, data, lambda s: metric(s, data.validation.labels)))
if os.environ["RANK"] == "0":
    print(marks[steps] - marks[41])
"""


def ours(steps: int) -> float:
    from parcel_hpc.ledger import SearchDir

    with tempfile.TemporaryDirectory() as tmp:
        launch(
            tmp,
            "hydra/launcher=submitit_slurm",
            "search.revision=gang-bench",
            f"checkpoint.dir={tmp}/ckpt",
            "trainer.target=parcel_loop:train_ddp",
            "search.n_trials=1",
            "~space.params.hidden",
            "~space.params.l2",
            *(f"{k}=choice({v})" for k, v in PARAMS.items() if k != "width"),
            f"train.steps={steps}",
            "pruner=none",
            f"pruner.milestones=[41,82,{steps}]",
            "resources.gpus=0",
            "resources.nodes=2",
            "resources.tasks_per_node=2",
            extra_env={"PYTHONPATH": _path()},
        )
        at = {e.data.step: e.t for e in SearchDir(Path(tmp) / "runs" / "gang-bench").events("t0000") if e.kind.value == "milestone"}
    return at[steps] - at[41]


def bare(steps: int) -> float:
    import json

    argv = ["srun", "-N", "2", "--ntasks-per-node", "2", "-c", "1", "--mem=1G", "-t", "10", "-J", "bench-gang-bare", "--kill-on-bad-exit=1"]
    first = subprocess.run(["scontrol", "show", "node", "--oneliner", "n1"], capture_output=True, text=True, check=True).stdout
    addr = next((w.split("=", 1)[1] for w in first.split() if w.startswith("NodeAddr=")), "127.0.0.1")
    argv += [sys.executable, "-c", BARE, json.dumps(PARAMS), str(steps), addr, str(29000 + os.getpid() % 1000)]
    out = subprocess.run(argv, cwd=ROOT, env={**env(), "PYTHONPATH": _path()}, check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def _path() -> str:
    return os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))


def run(repeats: int = 3, steps: int = 240) -> list[Figure]:
    mine, theirs = alternate_timed(lambda: ours(steps), lambda: bare(steps), repeats)
    return [ratio("2-node x 2-rank DDP step (CPU, gloo)", "the same loop under srun alone", mine, theirs, TARGET)]


def alternate_timed(ours_fn, baseline_fn, repeats: int) -> tuple[list[float], list[float]]:
    """Each side's own measured span (not the wall time of its command), alternating."""
    a: list[float] = []
    b: list[float] = []
    alternate(lambda: a.append(ours_fn()), lambda: b.append(baseline_fn()), repeats)
    return a, b


if __name__ == "__main__":
    main(run, __doc__)

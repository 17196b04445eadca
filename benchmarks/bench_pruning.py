"""Milestone pruning against none, the same 82 seeds, on the local executor.

    .venv/bin/python benchmarks/bench_pruning.py [--step-seconds 0.01]

Both searches run the README's main job with ``train.step_seconds`` set so that training steps,
not the worker's fixed costs, dominate a trial (as on a real GPU model); one with the default
``pruner=asha_r1``, one with ``pruner=none``. GPU-hours are the ledger's: every attempt's own
start to end, times its GPUs. Targets: >= 50 % of the unpruned search's GPU-hours saved, and the
pruned search's winner within 1 % of the unpruned winner's validation miss-cost.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, launch, main  # noqa: E402

from parcel_hpc.ledger import SearchDir  # noqa: E402
from parcel_hpc.ledger.summary import best_completed  # noqa: E402


def search(root: str, pruner: str, step_seconds: float) -> tuple[float, float]:
    """(GPU-hours, the winner's validation miss-cost) of one 82-trial search."""
    launch(root, f"checkpoint.dir={root}/ckpt-{pruner}", f"search.revision=bench-{pruner}", f"pruner={pruner}", f"train.step_seconds={step_seconds}")
    records = list(SearchDir(Path(root) / "runs" / f"bench-{pruner}").records())
    hours = sum((a.ended - a.started) * int(r.spec.resources["gpus"]) / 3600 for r in records for a in r.attempts if a.started and a.ended)
    return hours, best_completed(records).metric


def run(repeats: int = 1, step_seconds: float = 0.01) -> list[Figure]:
    saved, gaps, samples = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as root:
            none_h, none_best = search(root, "none", step_seconds)
            asha_h, asha_best = search(root, "asha_r1", step_seconds)
        saved.append(100 * (1 - asha_h / none_h))
        gaps.append(100 * abs(asha_best - none_best) / none_best)
        samples.append({"none_gpu_h": none_h, "asha_gpu_h": asha_h, "none_best": none_best, "asha_best": asha_best})
    return [
        Figure("pruning: GPU-hours saved", "pruner=none, same 82 seeds", saved, 50.0, at_least=True, unit="%", samples={"runs": samples}),
        Figure("pruning: winner's miss-cost gap", "the unpruned winner", gaps, 1.0, unit="%", samples={"runs": samples}),
    ]


if __name__ == "__main__":
    main(run, __doc__)

"""Milestone pruning against none, the same 82 seeds, on the local executor.

    .venv/bin/python benchmarks/bench_pruning.py [--step-seconds 0.01]

Both searches run the README's main job with ``train.step_seconds`` set so that training steps,
not the worker's fixed costs, dominate a trial (as on a real GPU model); one with the default
``pruner=asha_r1``, one with ``pruner=none``. GPU-hours are the ledger's: every attempt's own
start to end, times its GPUs. Targets: >= 50 % of the unpruned search's GPU-hours saved, and the
pruned search's winner within 1 % of the unpruned winner's validation miss-cost.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _suite import Figure  # noqa: E402
from bench_local import env  # noqa: E402

from parcel_hpc.ledger import SearchDir  # noqa: E402
from parcel_hpc.report import best_completed  # noqa: E402


def search(root: str, pruner: str, step_seconds: float) -> tuple[float, float]:
    """(GPU-hours, the winner's validation miss-cost) of one 82-trial search."""
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={root}/runs", f"checkpoint.dir={root}/ckpt-{pruner}"]
    argv += [f"search.revision=bench-{pruner}", f"pruner={pruner}", f"train.step_seconds={step_seconds}"]
    subprocess.run(argv, cwd=ROOT, env=env(), check=True, capture_output=True)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--step-seconds", type=float, default=0.01)
    args = ap.parse_args()
    from run import print_table

    print_table(run(args.repeats, args.step_seconds))


if __name__ == "__main__":
    main()

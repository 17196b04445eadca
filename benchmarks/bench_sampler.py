"""A search that learns: TPE against random on the parcel problem, and against hydra-optuna-sweeper.

    .venv/bin/python benchmarks/bench_sampler.py [--repeats 4] [--trials 82]   # one repetition per search seed

For each search seed (0, 1, 2, ...), side by side in the same run:

- ours, random: the README's main job, ``sampler=random`` (every default: 82 trials, pruning);
- ours, TPE: the same with ``sampler=tpe`` (proposals made as each of the 2 local slots frees);
- ours, TPE without pruning (``pruner=none``): every trial trained to the end, as the peer does;
- the peer: hydra-optuna-sweeper 1.3.0 (Optuna 2.10's TPE, the same seed) with ``submitit_local``
  and ``n_jobs=2`` on the same space and objective (``peer_optuna.py``), from its own environment
  (``benchmarks/.peers-optuna``).

Best-so-far validation miss-cost is taken in the order trials ended, against the hours their
attempts held a GPU (each trial asks for one: on a GPU node these are its GPU-hours; this machine
has none, so the ledger charges them as CPU-hours). Targets: TPE's best after the budget no worse
than random's (<= 1x), and against the peer at least as good a best (<= 1x) in <= 0.7x its wall time.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import ROOT, Figure, env, main  # noqa: E402
from peer_optuna import peer_python_optuna, run_peer  # noqa: E402

from parcel_hpc.ledger import SearchDir, TrialState  # noqa: E402

TRIAL_GPUS = 1  # resources=small: what each trial asks for


def ours(root: Path, sampler: str, seed: int, trials: int, pruner: str = "asha_r1") -> dict:
    """One search of ours: wall time, and best-so-far against GPU-hours in the order trials ended."""
    rev = f"bench-{sampler}-{pruner}-s{seed}"
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={root}/runs", f"search.revision={rev}", f"checkpoint.dir={root}/ckpt-{rev}"]
    argv += [f"sampler={sampler}", f"pruner={pruner}", f"search.seed={seed}", f"search.n_trials={trials}", "hydra.launcher.parallelism=2"]
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env(), check=True, capture_output=True)
    wall = time.perf_counter() - t0
    records = list(SearchDir(root / "runs" / rev).records())
    ended = sorted((max(a.ended for a in r.attempts), r) for r in records if r.attempts and all(a.ended for a in r.attempts))
    hours, best, curve = 0.0, float("inf"), []
    for _, r in ended:
        hours += sum(a.ended - a.started for a in r.attempts) * TRIAL_GPUS / 3600
        if r.state is TrialState.COMPLETED:
            best = min(best, r.metric)
        curve.append((round(hours, 6), best if best != float("inf") else None))
    return {"wall_s": wall, "best": best, "gpu_hours": hours, "curve": curve, "trials": len(records)}


def best_at(curve: list, hours: float) -> float | None:
    """Best-so-far once ``hours`` were spent (None: nothing completed by then)."""
    seen = [b for h, b in curve if h <= hours and b is not None]
    return min(seen) if seen else None


def run(repeats: int = 4, trials: int = 82) -> list[Figure]:
    """One repetition per search seed: 0, 1, ..., repeats - 1."""
    python = peer_python_optuna()
    vs_random, half_budget, vs_peer_wall, vs_peer_best, runs = [], [], [], [], []
    for seed in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            peer = run_peer(python, root / "peer", seed, n_trials=trials, n_jobs=2)  # first: the machine is as cold for it as for ours
            random = ours(root, "random", seed, trials)
            tpe = ours(root, "tpe", seed, trials)
            unpruned = ours(root, "tpe", seed, trials, pruner="none")
        vs_random.append(tpe["best"] / random["best"])
        half = random["gpu_hours"] / 2
        tpe_half, random_half = best_at(tpe["curve"], half), best_at(random["curve"], half)
        if tpe_half is not None and random_half is not None:
            half_budget.append(tpe_half / random_half)
        vs_peer_wall.append(unpruned["wall_s"] / peer["wall_s"])
        vs_peer_best.append(unpruned["best"] / peer["best"])
        runs.append({"seed": seed, "random": random, "tpe": tpe, "tpe_unpruned": unpruned, "peer": {k: peer[k] for k in ("wall_s", "best")}})
        print(
            f"seed {seed}: best random {random['best']:.4f} tpe {tpe['best']:.4f} tpe-unpruned {unpruned['best']:.4f} peer {peer['best']:.4f}; "
            f"wall random {random['wall_s']:.0f}s tpe {tpe['wall_s']:.0f}s tpe-unpruned {unpruned['wall_s']:.0f}s peer {peer['wall_s']:.0f}s",
            file=sys.stderr,
            flush=True,
        )
    samples = {"runs": runs}
    note = "ours with pruner=none here: every trial trained to the end, as the peer's"
    figures = [
        Figure("TPE: best miss-cost after the budget", "sampler=random, same seed, both pruned (asha_r1)", vs_random, 1.0, samples=samples),
        Figure("TPE vs hydra-optuna-sweeper: wall time", "submitit_local, n_jobs=2, same seed", vs_peer_wall, 0.7, note=note, samples=samples),
        Figure("TPE vs hydra-optuna-sweeper: best miss-cost", "submitit_local, n_jobs=2, same seed", vs_peer_best, 1.0, note=note, samples=samples),
    ]
    if half_budget:
        figures.insert(1, Figure("TPE: best miss-cost at half random's GPU-hours", "sampler=random at the same hours", half_budget, 1.0, samples=samples))
    return figures


if __name__ == "__main__":
    main(run, __doc__)

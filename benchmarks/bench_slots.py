"""Slots (``hydra.launcher.dispatch=slots``) against job-per-dispatch, same run, alternating.

    .venv/bin/python benchmarks/bench_slots.py [--repeats 2] [--trials 82] [--slurm-slots 12]

- local, TPE: the main job with ``sampler=tpe`` in 2 slots against ``sampler=random`` with today's
  default dispatch (packed jobs), wall time. Target <= 1.5x (TPE one job a trial: ~9x).
- local, unequal trials: ``train.step_seconds_param=lr`` over ``lr`` log-uniform in 0.01..0.1 (a
  10x spread of trial lengths), ``pruner=none``, 12 slots; the makespan (first attempt's start to
  the last one's end, from the journals) against the lower bound max(longest trial, total work /
  slots) of the same run (<= 1.15x), and against static packing of the same trials (<= 0.8x).
- SLURM (only where ``scontrol ping`` answers): TPE in 12 slots against random (packed jobs), 1
  GPU a task; wall time and GPU-hours (``parcel-hpc status --json``). Target <= 1.2x each.
- SLURM: TPE in 12 slots with ``pruner=none`` (every trial trained to the end, as the peer's are)
  against hydra-optuna-sweeper's TPE asking 12 trials at a time over hydra-submitit-launcher's
  ``submitit_slurm`` with the same limits (``peer_optuna.py``); wall time, target <= 0.35x.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, env, launch, main  # noqa: E402
from peer_optuna import peer_python_optuna, run_peer  # noqa: E402

SLOTS = "hydra.launcher.dispatch=slots"
TPE = ("sampler=tpe",)
UNEQUAL = ("lr=tag(log,interval(0.01,0.1))", "train.step_seconds=0.6", "train.step_seconds_param=lr", "pruner=none")


def timed(root: str, rev: str, *overrides: str) -> tuple[float, dict]:
    """Wall seconds of one launch, and its search's ``status --json``."""
    t0 = time.perf_counter()
    launch(root, f"search.revision={rev}", f"checkpoint.dir={root}/ckpt-{rev}", *overrides)
    wall = time.perf_counter() - t0
    out = subprocess.run([sys.executable, "-m", "parcel_hpc", "status", f"{root}/runs/{rev}", "--json"], env=env(), capture_output=True, text=True, check=True)
    return wall, json.loads(out.stdout)


def attempt_spans(search: Path) -> list[tuple[float, float]]:
    from parcel_hpc.ledger import SearchDir

    return [(a.started, a.ended) for r in SearchDir(search).records() for a in r.attempts if a.started is not None and a.ended is not None]


def makespan(search: Path) -> tuple[float, float]:
    """The first attempt's start to the last one's end, and the attempts' summed wall time."""
    spans = attempt_spans(search)
    return max(e for _, e in spans) - min(s for s, _ in spans), sum(e - s for s, e in spans)


def slurm_answers() -> bool:
    try:
        return "UP" in subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def run(repeats: int = 2, trials: int = 82, slurm_slots: int = 12) -> list[Figure]:
    n = f"search.n_trials={trials}"
    tpe, random_ = [], []
    lower, static = [], []
    samples: dict[str, list] = {"tpe_slots_s": [], "random_jobs_s": [], "unequal_slots": [], "unequal_static": []}
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as root:
            r, _ = timed(root, f"random-{i}", n, f"search.seed={i}")
            t, _ = timed(root, f"tpe-{i}", n, f"search.seed={i}", *TPE, SLOTS)
            random_.append(r)
            tpe.append(t)
            samples["random_jobs_s"].append(r)
            samples["tpe_slots_s"].append(t)
            par = "hydra.launcher.parallelism=12"
            timed(root, f"static-{i}", n, f"search.seed={i}", *UNEQUAL, par)
            timed(root, f"slots-{i}", n, f"search.seed={i}", *UNEQUAL, par, SLOTS)
            span_static, _ = makespan(Path(root, "runs", f"static-{i}"))
            span_slots, work = makespan(Path(root, "runs", f"slots-{i}"))
            longest = max(e - s for s, e in attempt_spans(Path(root, "runs", f"slots-{i}")))
            bound = max(longest, work / 12)
            lower.append(span_slots / bound)
            static.append(span_slots / span_static)
            samples["unequal_slots"].append({"makespan_s": span_slots, "bound_s": bound, "longest_s": longest, "work_s": work})
            samples["unequal_static"].append({"makespan_s": span_static})
    figures = [
        Figure(
            f"local, {trials} trials, 2 slots: TPE wall",
            "sampler=random, packed jobs (the default dispatch)",
            [a / b for a, b in zip(tpe, random_)],
            1.5,
            samples=samples,
        ),
        Figure(f"local, {trials} unequal trials (10x spread), 12 slots: makespan", "max(longest trial, total work / 12) of the same run", lower, 1.15),
        Figure(f"local, {trials} unequal trials (10x spread), 12 slots: makespan ", "static packing (auto) of the same trials", static, 0.8),
    ]
    if slurm_answers():
        figures += slurm(repeats, trials, slurm_slots)
    return figures


def slurm(repeats: int, trials: int, slots: int) -> list[Figure]:
    common = ("hydra/launcher=submitit_slurm", f"search.n_trials={trials}", f"hydra.launcher.array_parallelism={slots}", "resources.gpus=1")
    # The peer's jobs ask what ours do: 1 GPU, 1 GB, a 10-minute limit, at most `slots` at once.
    peer_launcher = ("hydra/launcher=submitit_slurm", f"hydra.launcher.array_parallelism={slots}", "hydra.launcher.gres=gpu:1", "hydra.launcher.mem_gb=1")
    python = peer_python_optuna()
    walls, hours, against_peer, samples = [], [], [], []
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as root:
            r_wall, r_status = timed(root, f"random-{i}", *common, f"search.seed={i}")
            t_wall, t_status = timed(root, f"tpe-{i}", *common, f"search.seed={i}", *TPE, SLOTS)
            # Every trial trained to the end, as the peer's are (it does not prune).
            full_wall, _ = timed(root, f"tpe-full-{i}", *common, f"search.seed={i}", *TPE, SLOTS, "pruner=none")
            peer = run_peer(python, Path(root, "peer"), i, trials, slots, overrides=(*peer_launcher, "hydra.launcher.timeout_min=10"))
            walls.append(t_wall / r_wall)
            hours.append(t_status["spend"]["gpu_hours"] / r_status["spend"]["gpu_hours"])
            against_peer.append(full_wall / peer["wall_s"])
            samples.append(
                {
                    "random_s": r_wall,
                    "tpe_s": t_wall,
                    "tpe_no_pruning_s": full_wall,
                    "peer_s": peer["wall_s"],
                    "random_gpu_h": r_status["spend"]["gpu_hours"],
                    "tpe_gpu_h": t_status["spend"]["gpu_hours"],
                }
            )
    note = f"{slots} array tasks at once, 1 GPU each"
    peer_name = f"hydra-optuna-sweeper (TPE, n_jobs={slots}) on submitit_slurm, array_parallelism={slots}"
    return [
        Figure(f"SLURM, {trials} trials, {slots} slots: TPE wall", "sampler=random, packed array tasks", walls, 1.2, note=note, samples={"runs": samples}),
        Figure(f"SLURM, {trials} trials, {slots} slots: TPE GPU-hours", "sampler=random, packed array tasks", hours, 1.2, note=note),
        Figure(f"SLURM, {trials} trials, {slots} slots: TPE wall, no pruning", peer_name, against_peer, 0.35, note=note),
    ]


if __name__ == "__main__":
    main(run, __doc__)

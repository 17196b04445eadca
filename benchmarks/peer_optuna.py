"""The Optuna peer: hydra-optuna-sweeper's TPE over hydra-submitit-launcher's ``submitit_local``,
searching our space (conf/space/space_r4.yaml in Hydra's grammar) for our objective: each job trains
the built-in NumpyMLP exactly as our worker does (peer_app/optuna_app.py).

    run_peer(peer_python_optuna(), workdir, seed=0)  # {"wall_s", "values", "best", "params", ...}

The peer's sweeper asks ``n_jobs`` trials at a time and waits for the whole batch (submitit polls
each job once a second) before asking again.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
import venv
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _suite import env  # noqa: E402

# Its own environment: benchmarks/.peers holds optuna>=4 (bench_ledger), and hydra-optuna-sweeper 1.3.0
# needs optuna<3 (this list resolves optuna 2.10.1); a shared one would flip between the two.
PEERS_OPTUNA = HERE / ".peers-optuna"
PEER_OPTUNA_PACKAGES = [
    "hydra-optuna-sweeper==1.3.0",
    "hydra-submitit-launcher==1.2.0",
    "hydra-core>=1.3.2,<1.4",
    "submitit==1.5.4",
    "numpy>=1.26",  # the objective: parcel_hpc's trainer, loader and metric
    "h5py>=3.9",
]


def peer_python_optuna() -> str:
    """The Optuna peer's interpreter, with ``PEER_OPTUNA_PACKAGES`` installed (again when the list changes)."""
    python = PEERS_OPTUNA / "bin" / "python"
    if not python.exists():
        venv.create(PEERS_OPTUNA, with_pip=True)
        (PEERS_OPTUNA / ".gitignore").write_text("*\n")  # not in the repository's .gitignore, unlike benchmarks/.peers
    stamp = PEERS_OPTUNA / ("installed-" + hashlib.sha256("\n".join(sorted(PEER_OPTUNA_PACKAGES)).encode()).hexdigest()[:16])
    if not stamp.exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_OPTUNA_PACKAGES], check=True)
        stamp.touch()
    # parcel_hpc alone, by a link: not `pip install -e` (it would pull our Hydra pins and our hydra_plugins,
    # whose submitit_local shadows the peer's launcher), nor the repo root on sys.path (the same plugins).
    link = next(PEERS_OPTUNA.glob("lib/python*/site-packages")) / "parcel_hpc"
    if not link.is_symlink():
        link.symlink_to(ROOT / "parcel_hpc", target_is_directory=True)
    return str(python)


def default_snapshot() -> Path:
    """``data/`` of the checkout, as our launch reads it from the repository root; made if absent."""
    data = ROOT / "data"
    if not (data / "parcels.h5").exists():
        subprocess.run([sys.executable, "-m", "parcel_hpc", "make-snapshot", str(data)], cwd=ROOT, check=True, capture_output=True)
    return data


def run_peer(
    python: str, workdir: Path, seed: int, n_trials: int = 82, n_jobs: int = 2, snapshot_dir: Path | None = None, overrides: Sequence[str] = ()
) -> dict:
    """One peer search into ``workdir/sweep``: its wall time, and per trial (in trial-number order) the
    objective (nan for a failed trial), the params, the seconds its task function took, and when it ran.
    ``overrides``: Hydra's, after ours (e.g. ``hydra/launcher=submitit_slurm`` and its limits)."""
    workdir = Path(workdir).resolve()
    sweep = workdir / "sweep"
    if sweep.exists():  # results of an earlier search would be read as this one's
        raise FileExistsError(f"{sweep} exists; give run_peer a fresh workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        python,
        str(HERE / "peer_app" / "optuna_app.py"),
        "-m",
        f"snapshot_dir={Path(snapshot_dir or default_snapshot()).resolve()}",
        f"hydra.sweep.dir={sweep}",
        f"hydra.sweeper.sampler.seed={seed}",
        f"hydra.sweeper.n_trials={n_trials}",
        f"hydra.sweeper.n_jobs={n_jobs}",
        *overrides,
    ]
    t0, at = time.perf_counter(), time.time()
    done = subprocess.run(argv, cwd=workdir, env=env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"the peer exited {done.returncode}: {done.stderr[-3000:]}")
    records = sorted((json.loads(p.read_text()) for p in sweep.glob("*/result.json")), key=lambda r: r["trial"])
    if [r["trial"] for r in records] != list(range(n_trials)):
        raise RuntimeError(f"the peer left results for trials {[r['trial'] for r in records]}, not 0..{n_trials - 1}; see {sweep}")
    values = [math.nan if r["value"] is None else r["value"] for r in records]
    return {
        "wall_s": wall,
        "values": values,
        "best": min((v for v in values if not math.isnan(v)), default=math.nan),
        "params": [r["params"] for r in records],
        "task_s": [r["ended"] - r["started"] for r in records],
        "spans": [(r["started"] - at, r["ended"] - at) for r in records],  # seconds since the launch: where the batches wait
    }


if __name__ == "__main__":
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="one peer search; prints its figures as JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=82)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = run_peer(peer_python_optuna(), Path(tmp), args.seed, args.trials, args.jobs)
    print(json.dumps({k: v for k, v in out.items() if k != "spans"}, indent=1))

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

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _suite import Figure, alternate, ratio  # noqa: E402

PEERS = HERE / ".peers"
PEER_PACKAGES = ["hydra-submitit-launcher==1.2.0", "hydra-core>=1.3.2,<1.4", "submitit==1.5.4"]
TARGET = 0.25


def peer_python(extra: list[str] = ()) -> str:
    """The peers' interpreter, with ``PEER_PACKAGES`` and ``extra`` installed (once)."""
    python = PEERS / "bin" / "python"
    if not python.exists():
        venv.create(PEERS, with_pip=True)
    stamp = PEERS / ("installed-" + "-".join(sorted(p.split("=")[0].split(">")[0] for p in [*PEER_PACKAGES, *extra])))
    if not stamp.exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES, *extra], check=True)
        stamp.touch()
    return str(python)


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def ours(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={tmp}/runs", f"checkpoint.dir={tmp}/ckpt", f"search.n_trials={n}"]
        subprocess.run(argv, cwd=ROOT, env=env(), check=True, capture_output=True)


def peer(n: int, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, str(HERE / "peer_app" / "app.py"), "-m", "hydra/launcher=submitit_local", f"+x=range(0,{n})", f"hydra.sweep.dir={tmp}/sweep"]
        subprocess.run(argv, cwd=tmp, env=env(), check=True, capture_output=True)


def run(repeats: int = 3, trials: int = 82) -> list[Figure]:
    python = peer_python()
    a, b = alternate(lambda: ours(trials), lambda: peer(trials, python), repeats)
    note = "ours: the real model, pruning, checkpoints and ledger; the peer's jobs return at once"
    return [ratio(f"local executor, {trials} trials", f"hydra-submitit-launcher submitit_local, {trials} trivial jobs", a, b, TARGET, note)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trials", type=int, default=82)
    args = ap.parse_args()
    from run import print_table

    print_table(run(args.repeats, args.trials))


if __name__ == "__main__":
    main()

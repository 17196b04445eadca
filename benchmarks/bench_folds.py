"""A 5-fold search against five single-split searches of the same trials, same run, alternating.

    .venv/bin/python benchmarks/bench_folds.py [--repeats 2] [--trials 8]

Ours: one search on ``split=group_kfold_r1`` (each trial is its five fold runs), ``pruner=none`` so
every trial trains every fold. The baseline: five searches of the same trials (same search seed,
so the same params) on ``split=group_r8``, one after another, each its own launch: the work a team
would otherwise do to see five validation partitions. Both on the local executor with the same
parallelism, on a synthetic snapshot made once for the run. Target (issue 48): <= 1.1x.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, alternate, env, launch, main, ratio  # noqa: E402

TARGET = 1.1
FOLDS = 5


def run(repeats: int = 2, trials: int = 8) -> list[Figure]:
    with tempfile.TemporaryDirectory() as data:
        subprocess.run([sys.executable, "-m", "parcel_hpc", "make-snapshot", data], env=env(), check=True, capture_output=True)
        common = (f"search.n_trials={trials}", "pruner=none")
        data_env = {"PARCEL_DATA_DIR": data}

        def ours() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                launch(tmp, "search.revision=kfold", "split=group_kfold_r1", *common, extra_env=data_env)

        def five_searches() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                for k in range(FOLDS):
                    launch(tmp, f"search.revision=single{k}", "split=group_r8", *common, extra_env=data_env)

        a, b = alternate(ours, five_searches, repeats)
    note = "fold runs of a trial run in turn in its one job (parallel folds in slots not built)"
    return [ratio(f"{FOLDS}-fold search, {trials} trials", f"{FOLDS} single-split searches of the same trials", a, b, TARGET, note)]


if __name__ == "__main__":
    main(run, __doc__)

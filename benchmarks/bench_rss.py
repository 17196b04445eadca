"""Worker peak memory on the default snapshot against the training partition's own size.

    .venv/bin/python benchmarks/bench_rss.py [--repeats 3]

Freezes the README's search (a launch of no trials), then runs its first trial's worker attempt in
a fresh interpreter (``TrialTask``, the real one, pruning off) and reads that process's peak RSS
(VmHWM). The budget is 1.5x the training partition as the trainer receives it (raw images,
features, labels and slice columns) plus 150 MB (the interpreter, numpy, h5py, submitit, hydra).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _suite import Figure, env, launch, main  # noqa: E402

from parcel_hpc.data import read_split  # noqa: E402
from parcel_hpc.ledger import SearchDir  # noqa: E402
from parcel_hpc.propose.specs import history_free_specs, plan_for  # noqa: E402
from parcel_hpc.trainer import load_training_data  # noqa: E402

WORKER = "import pickle,sys; from parcel_hpc.worker import TrialTask; TrialTask([pickle.load(open(sys.argv[1],'rb'))])(); print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])"


def partition_mb(snapshot: str, split: str, preprocessing: dict) -> float:
    train = load_training_data(snapshot, read_split(split), preprocessing).train
    return sum(getattr(train, k).nbytes for k in ("images", "features", "labels", "damage_type", "camera_class", "shipment_id")) / 2**20


def run(repeats: int = 3) -> list[Figure]:
    peaks = []
    with tempfile.TemporaryDirectory() as tmp:
        launch(tmp, "search.n_trials=0", "pruner=none")
        search = SearchDir(Path(tmp) / "runs" / "parcel-search-r1")
        contract = search.contract()
        snapshot, split = str(ROOT / "data" / "parcels.h5"), str(ROOT / "data" / "split-group_r8.json")
        cfg = {
            "snapshot": {"path": snapshot},
            "split": {"path": split},
            "image": {"kind": "computed"},
            "checkpoint": {"dir": f"{tmp}/ckpt", "every_steps": 10, "keep_last": 2},
        }
        specs = history_free_specs(contract, 0, repeats)
        for spec in specs:
            search.write_spec(spec)
            plan = Path(tmp) / f"{spec.trial_id}.pkl"
            plan.write_bytes(pickle.dumps(plan_for(spec, cfg, contract, search.path)))
            out = subprocess.run([sys.executable, "-c", WORKER, str(plan)], cwd=ROOT, env=env(), check=True, capture_output=True, text=True)
            peaks.append(int(out.stdout.split()[-1]) / 1024)
        budget = 1.5 * partition_mb(snapshot, split, dict(contract["preprocessing"])) + 150
    return [Figure("worker peak RSS, default snapshot", "1.5x the training partition + 150 MB", peaks, round(budget, 1), unit=" MB")]


if __name__ == "__main__":
    main(run, __doc__)

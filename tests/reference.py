"""An examples/ trainer run uninterrupted in the test's own process: the metric a search's trials must
end with, bit for bit, however they were interrupted and resumed (the local and the SLURM tests)."""

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from parcel_hpc.data import read_split
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.trainer import build_params, load_training_data

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def reference_run(target: str, snapshot: Path, split: Path) -> Callable[..., float]:
    """``reference(params, steps, seed=1234)``: the validation miss-cost ``target`` (an examples/
    trainer) reaches in ``steps`` uninterrupted steps. Its class and the data are loaded once."""
    module, _, name = target.partition(":")
    sys.path.insert(0, str(EXAMPLES))
    try:
        cls = getattr(importlib.import_module(module), name)
    finally:
        sys.path.remove(str(EXAMPLES))
    data = load_training_data(snapshot, read_split(split), {"revision": "stats-r1", "pool": 4})
    torch = sys.modules.get("torch")
    if torch is not None:  # the jobs' thread count (the launch passes OMP_NUM_THREADS, 1 unless set): other threads round otherwise
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    metric = MissCost("miss-cost-r3", 5.0, 1.0)

    def reference(params: Mapping[str, Any], steps: int, seed: int = 1234) -> float:
        trainer = cls()
        trainer.build(build_params(trainer, params), seed, data)
        for _ in range(steps):
            trainer.step()
        return metric(trainer.predict("validation"), data.validation.labels)

    return reference

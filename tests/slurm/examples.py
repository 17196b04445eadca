"""What the example trainers' SLURM tests share: an uninterrupted reference run in this process,
a running trial to preempt, and the check that each preempted attempt's successor resumed where it
stopped."""

import importlib
import os
import sys
from pathlib import Path

from parcel_hpc.data import read_split
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.ledger import SearchDir
from parcel_hpc.trainer import build_params, load_training_data

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def uninterrupted_metric(target: str, artifacts_dir: Path, params, steps: int, seed: int = 1234) -> float:
    """The validation miss-cost ``target`` (an examples/ trainer) reaches in ``steps`` uninterrupted steps."""
    module, _, name = target.partition(":")
    sys.path.insert(0, str(EXAMPLES))
    try:
        cls = getattr(importlib.import_module(module), name)
    finally:
        sys.path.remove(str(EXAMPLES))
    data = load_training_data(artifacts_dir / "parcels.h5", read_split(artifacts_dir / "split-group_r8.json"), {"revision": "stats-r1", "pool": 4})
    torch = sys.modules.get("torch")
    if torch is not None:  # the jobs' thread count (the launch passes OMP_NUM_THREADS, 1 unless set): other threads round otherwise
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trainer = cls()
    trainer.build(build_params(trainer, params), seed, data)
    for _ in range(steps):
        trainer.step()
    return MissCost("miss-cost-r3", 5.0, 1.0)(trainer.predict("validation"), data.validation.labels)


def running_past(search: SearchDir, step: int) -> str | None:
    """The node of a running trial that has a checkpoint at ``step`` or later (None: none yet)."""
    for tid in search.trial_ids():
        rec = search.record(tid)
        ckpts = sorted((search.path / "checkpoints" / tid).glob("ckpt-*.h5"))
        started = [e for e in search.events(tid) if e.kind.value == "started"]
        if rec.state.value == "running" and ckpts and int(ckpts[-1].stem.split("-")[1]) >= step and started:
            return started[-1].data.node
    return None


def preempted_and_resumed(records) -> list:
    """The records with a preempted attempt, each checked to have resumed at the step it saved."""
    preempted = [r for r in records if any(a.cause is not None and a.cause.value == "preempted" for a in r.attempts)]
    assert preempted, [(r.trial_id, [(a.how, a.cause) for a in r.attempts]) for r in records]
    for r in preempted:
        interrupted = next(a for a in r.attempts if a.cause is not None and a.cause.value == "preempted")
        resumed = r.attempts[r.attempts.index(interrupted) + 1]
        assert resumed.resumed_from == interrupted.step > 0  # saved at the step boundary after the signal
    return preempted

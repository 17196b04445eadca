"""An examples/ trainer run uninterrupted in the test's own process: the metric a search's trials must
end with, bit for bit, however they were interrupted and resumed (the local and the SLURM tests)."""

import importlib
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.data import read_split
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch
from parcel_hpc.trainer import Budget, Run, build_params, load_training_data, run_loop

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# The suite's CNN searches train half the example's 240 steps (for the suite's CPU): the milestones
# that prune, 41 and 82, come before the end.
CNN_STEPS = 120
CNN_MILESTONES = f"pruner.milestones=[41,82,{CNN_STEPS}]"


def two_rank_trial(target: str, batch_size: int, lr: float, steps: int) -> list[str]:
    """The overrides of one trial of 2 ranks of ``target`` at one point of the space, unpruned."""
    fixed = [f"batch_size=choice({batch_size})", f"lr=choice({lr})", f"train.steps={steps}", "pruner=none", "resources.tasks_per_node=2"]
    return [f"trainer.target={target}", "~space.params.hidden", "~space.params.l2", *fixed]


def uninterrupted_gang(tmp_path_factory: Any, artifacts: Mapping[str, Any], revision: str, overrides: Sequence[str]) -> SearchDir:
    """``local_gang`` run once for a module (its fixture's factory), on its own copy of the test data."""
    root = tmp_path_factory.mktemp(revision)
    shutil.copytree(artifacts["dir"], root / "data")
    return local_gang(root, root / "data", revision, overrides)


def local_gang(root: Path, data_dir: Path, revision: str, overrides: Sequence[str], env: Mapping[str, str] | None = None) -> SearchDir:
    """One trial (``overrides``: its trainer and its gang's shape) launched on the local executor with
    examples/ importable; its search."""
    args = [f"search.root={root}", f"search.revision={revision}", "search.n_trials=1", *overrides]
    res = launch(args, cwd=root, data_dir=data_dir, env={"PYTHONPATH": str(EXAMPLES), **(env or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    return SearchDir(root / revision)


def lightning_weights(search: Path, step: int, rank: int) -> dict:
    """The model weights of rank ``rank``'s Lightning checkpoint, its part of trial t0000's checkpoint at ``step``."""
    from parcel_hpc.checkpoints import format as ckpt_format
    from parcel_hpc.integrations.lightning.callback import saved_checkpoint  # imports lightning: the tests that need it only

    saved = saved_checkpoint(ckpt_format.read(search / "checkpoints" / "t0000" / f"ckpt-{step:06d}.rank-{rank:04d}.h5").params)
    assert saved["global_step"] == step
    return saved["state_dict"]


def hf_checkpoint(search: Path, step: int, rank: int) -> dict[str, bytes]:
    """The files of rank ``rank``'s part of trial t0000's checkpoint at ``step``: what its Hugging Face
    Trainer wrote into ``checkpoint-N/`` (rank 0: the model, optimizer, scheduler, state and its generators;
    another rank: its generators), by name."""
    import numpy as np

    from parcel_hpc.checkpoints import format as ckpt_format
    from parcel_hpc.trainer.run import FILES

    params = ckpt_format.read(search / "checkpoints" / "t0000" / f"ckpt-{step:06d}.rank-{rank:04d}.h5").params
    prefix = f"{FILES}checkpoint/"
    return {name[len(prefix) :]: np.asarray(array, dtype=np.uint8).tobytes() for name, array in params.items() if name.startswith(prefix)}


def hf_weights(search: Path, step: int) -> dict:
    """The model weights in rank 0's part of trial t0000's Hugging Face checkpoint at ``step``."""
    from safetensors.torch import load

    return load(hf_checkpoint(search, step, 0)["model.safetensors"])


def same_tensors(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two state dicts equal bit for bit: the same names, every tensor ``torch.equal``."""
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Uninterrupted(Run):
    """A run with nothing behind it: no checkpoint to restore, no stop, saves kept nowhere; the value
    it reached at each validation kept in ``values`` (step to miss-cost)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.values: dict[int, float] = {}

    def _restore(self):
        return None

    def _stepped(self, step):
        return None

    def _save(self, step, state):
        pass

    def _validated(self, step, value, final, metrics):
        self.values[step] = value
        return None


def reference_run(target: str, snapshot: Path, split: Path) -> Callable[..., Any]:
    """``reference(params, steps, seed=1234)``: the validation miss-cost ``target`` (an examples/
    trainer, of either form) reaches in ``steps`` uninterrupted steps. Its class and the data are loaded once."""
    run = uninterrupted_run(target, snapshot, split)

    def reference(params: Mapping[str, Any], steps: int, seed: int = 1234, milestones: tuple[int, ...] = ()) -> Any:
        """With ``milestones``: the value at each of them and at the last step, by step."""
        done = run(params, steps, seed, milestones)
        return done.values if milestones else done.value

    return reference


def uninterrupted_run(target: str, snapshot: Path, split: Path) -> Callable[..., Uninterrupted]:
    """``run(params, steps, seed, milestones=())``: ``target`` run uninterrupted for ``steps``, validated
    at ``milestones`` and its last step."""
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

    def run(params: Mapping[str, Any], steps: int, seed: int, milestones: tuple[int, ...] = ()) -> Uninterrupted:
        trainer = cls()
        given = replace(data, budget=Budget(steps, milestones, Cadence(every_steps=steps), cls.unit))  # its length, as a trial's run gives it
        trainer.build(build_params(trainer, params), seed, given)
        done = Uninterrupted(build_params(trainer, params), seed, given, lambda scores: metric(scores, data.validation.labels))
        run_loop(trainer, done)  # the class form through the toolkit's loop, the function form through its own
        return done

    return run

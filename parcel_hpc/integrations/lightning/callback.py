"""Lightning's ``Trainer.fit`` kept as it is, governed: the callback a user adds and the resume it needs.

``Governed(run)`` is a Lightning ``Callback``. After every optimizer step (``on_train_batch_end`` where
``trainer.global_step`` moved, so never mid-accumulation) it tells the run (``run.stepped`` with the
step's returned loss and learning rate), saves Lightning's own checkpoint (``trainer.save_checkpoint``)
into ``run.checkpoint_dir()`` when a checkpoint is due (the cadence, or the scheduler's signal: the
toolkit's claimed, exclusive, digested checkpoint), hands the validation probabilities of the module's
``predict_step`` on the trial's validation frames to ``run.validate`` at a milestone (eval, no_grad,
the global generators isolated), and leaves ``fit`` by raising ``StopTraining`` when the run says
stop (after the save for a requeue; pruned or cancelled without one). ``governed.resume()`` gives
the ``ckpt_path`` of the trial's last checkpoint (None on a first attempt) and ends quietly when the
callback left ``fit``.

Exact resume mid-epoch needs what Lightning's checkpoint lacks: the global generators (kept in the
callback's own state, put back just before the first resumed step), and a stateful train loader
(``ResumableLoader``), whose state Lightning saves and hands back itself. ``max_epochs=-1`` is
required, which also keeps Lightning #20550 away (with a finite ``max_epochs``,
``estimated_stepping_batches`` sets the loader up before the restore and it never gets its state). A Trainer that cannot be governed is refused with ``Ungoverned`` at
``setup``/``on_train_start``: Lightning's own SLURM requeue on (or left to Lightning to choose),
``max_steps`` not the trial's steps, ``max_epochs`` not -1, processes that are not the trial's ranks, a
loader that cannot be resumed, ``fit`` run outside ``resume()`` or with another ``ckpt_path``.

A trial of several ranks (a gang, docs/gangs.md) runs the same script in every rank's process:
``Trainer(devices=1, num_nodes=run.world_size, plugins=[governed.environment()],
use_distributed_sampler=False)`` makes it Lightning's DDP over the processes parcel_hpc started
(``environment.py``), and a ``ResumableLoader`` of the run's rank and world size gives each rank its
share of every batch. Every rank's callback tells its run of each step (rank 0's decisions are the
gang's, so all save, validate and stop at one step) and saves its own Lightning checkpoint as its part
of the trial's checkpoint: the replicated model and optimizer, and its own generators and loader
position, which Lightning's rank-0 file would not hold.

Must not: save inside a signal handler; write anywhere but ``run.checkpoint_dir()``.
"""

from __future__ import annotations

import enum
import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.seed import isolate_rng

import parcel_hpc.trainer.torch  # noqa: F401  # registers torch's generators with rng.process_rngs, which the callback saves
from parcel_hpc.integrations.lightning.environment import RanksEnvironment
from parcel_hpc.integrations.lightning.loader import ResumableLoader
from parcel_hpc.trainer import rng
from parcel_hpc.trainer.base import TrainerState
from parcel_hpc.trainer.run import FILES, Run, StopTraining

CHECKPOINT = "last.ckpt"  # Lightning's checkpoint file inside the trial's checkpoint directory
PREDICT_BATCH = 256  # validation frames per predict_step call


class Ungoverned(ValueError):
    """A Trainer set up so the governance cannot hold it: the message names the setting and the fix."""


class Requeue(enum.Enum):
    """Who requeues a preempted job, as the Trainer's cluster environment says."""

    OFF = "off"  # a cluster environment that does not requeue (governed.environment(), LightningEnvironment, SLURMEnvironment(auto_requeue=False))
    LIGHTNING = "lightning"  # SLURMEnvironment(auto_requeue=True): Lightning saves in its signal handler and requeues itself
    UNSAID = "unsaid"  # no environment given: under SLURM, Lightning picks SLURMEnvironment(auto_requeue=True)


@dataclass(frozen=True)
class Setup:
    """What of a Trainer decides whether it can be governed."""

    max_steps: int
    max_epochs: int | None
    requeue: Requeue
    processes: int  # the processes the Trainer's flags make: num_nodes x devices
    gang: int = 1  # the trial's ranks (run.world_size): a gang's processes are the toolkit's, not Lightning's
    devices: int = 1  # devices per process (Trainer(devices=...)): each rank is one process on its own device
    ranks_environment: bool = False  # plugins=[governed.environment()]: Lightning sees the trial's ranks
    distributed_sampler: bool = False  # Lightning would replace the train loader's order (use_distributed_sampler on, several processes)


def refusal(setup: Setup, steps: int) -> str | None:
    """Why a Trainer set up so cannot be governed for a trial of ``steps`` steps, with the fix (None: it can)."""
    if setup.requeue is Requeue.LIGHTNING:
        return (
            "the Trainer's SLURMEnvironment requeues by itself (auto_requeue=True: it saves inside its signal handler and resumes from "
            "its own hpc checkpoint); pass plugins=[LightningEnvironment()] or plugins=[SLURMEnvironment(auto_requeue=False)]"
        )
    if setup.requeue is Requeue.UNSAID:
        return (
            "the Trainer names no cluster environment, so under SLURM Lightning requeues by itself behind parcel_hpc's back; "
            "pass plugins=[LightningEnvironment()] (or plugins=[SLURMEnvironment(auto_requeue=False)])"
        )
    if setup.max_steps != steps:
        return f"Trainer(max_steps={setup.max_steps}) but the trial trains run.budget.steps={steps}; pass max_steps=run.budget.steps, max_epochs=-1"
    if setup.max_epochs != -1:
        return f"Trainer(max_epochs={setup.max_epochs}) can end training before run.budget.steps; pass max_epochs=-1 (max_steps ends it)"
    if setup.gang > 1 and not setup.ranks_environment:
        return (
            f"the trial is a gang of {setup.gang} ranks that parcel_hpc starts, one process each, but the Trainer's cluster environment "
            "does not know them; pass plugins=[governed.environment()], devices=1, num_nodes=run.world_size"
        )
    if setup.devices != 1 or setup.processes != setup.gang:
        return (
            f"the Trainer's flags make {setup.processes} process(es) of {setup.devices} device(s) each, but the trial is {setup.gang} rank(s) "
            "that parcel_hpc starts, one process each; pass devices=1, num_nodes=run.world_size"
        )
    if setup.distributed_sampler:
        return (
            "use_distributed_sampler=True: Lightning would replace the train loader's order with a DistributedSampler, which cannot "
            "resume mid-epoch; pass use_distributed_sampler=False (ResumableLoader(..., rank=run.rank, world_size=run.world_size) shares each batch)"
        )
    return None


def setup_of(trainer: pl.Trainer) -> Setup:
    """The settings ``refusal`` reads. The cluster environment as given is Lightning's private
    ``_cluster_environment_flag`` (the one place it keeps whether a user chose one)."""
    connector = trainer._accelerator_connector
    given = connector._cluster_environment_flag
    if given is None:
        requeue = Requeue.UNSAID
    else:
        env = connector.cluster_environment
        requeue = Requeue.LIGHTNING if isinstance(env, SLURMEnvironment) and env.auto_requeue else Requeue.OFF
    processes = int(trainer.num_nodes) * int(trainer.num_devices)
    distributed_sampler = bool(connector.use_distributed_sampler) and processes > 1
    ranks = isinstance(connector.cluster_environment, RanksEnvironment)
    return Setup(
        int(trainer.max_steps),
        trainer.max_epochs,
        requeue,
        processes,
        devices=int(trainer.num_devices),
        ranks_environment=ranks,
        distributed_sampler=distributed_sampler,
    )


def _each_loader(loaders: Any) -> Iterator[Any]:
    """The train loaders Lightning was given: a loader, or a dict/list of them (nested)."""
    if isinstance(loaders, Mapping):
        for v in loaders.values():
            yield from _each_loader(v)
    elif isinstance(loaders, Sequence):
        for v in loaders:
            yield from _each_loader(v)
    else:
        yield loaders


def unshared(loaders: Any, rank: int, world_size: int) -> list[str]:
    """The train ``ResumableLoader``s whose share is not this rank's of the trial's ranks (each rank
    would train on other frames than the gang's batch assigns it)."""
    return [
        f"ResumableLoader(rank={loader.shares[0]}, world_size={loader.shares[1]})"
        for loader in _each_loader(loaders)
        if isinstance(loader, ResumableLoader) and loader.shares != (rank, world_size)
    ]


def save_own(trainer: pl.Trainer, path: Path) -> None:
    """Lightning's checkpoint of this process, written by it: ``trainer.save_checkpoint`` writes rank 0's
    alone, and every rank's file is its part of the trial's checkpoint (its generators, its loader's
    position). Under DDP, making the checkpoint is no collective (the replicas' states are local)."""
    checkpoint = trainer._checkpoint_connector.dump_checkpoint()
    trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, path)


def unresumable(loaders: Any) -> list[str]:
    """The train loaders (a loader, or a dict/list of them) without ``state_dict``/``load_state_dict``."""
    return [
        type(loader).__name__
        for loader in _each_loader(loaders)
        if not (callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None)))
    ]


# --- the global generators, in a form torch.load(weights_only=True) accepts (no numpy arrays) ---------


def encode_rngs(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> dict[str, Any]:
    """``rng.save()``'s arrays as bytes tensors with their dtype and shape; scalars as they are (JSON)."""
    return {
        "arrays": {
            k: {"bytes": torch.frombuffer(bytearray(a.tobytes()), dtype=torch.uint8), "dtype": a.dtype.str, "shape": list(a.shape)} for k, a in arrays.items()
        },
        "scalars": dict(scalars),
    }


def decode_rngs(encoded: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays = {k: np.frombuffer(v["bytes"].numpy().tobytes(), dtype=np.dtype(v["dtype"])).reshape(v["shape"]) for k, v in encoded["arrays"].items()}
    return arrays, dict(encoded["scalars"])


# --- prediction: the milestones' and the served model's ------------------------------------------


def probabilities(module: pl.LightningModule, frames: np.ndarray, context: Callable[[], AbstractContextManager[Any]] = nullcontext) -> np.ndarray:
    """``module.predict_step`` on raw frames (n, H, W), as float64 (n,): in eval mode, without gradients
    and with the global generators as they were (a milestone draws nothing the next step would)."""
    was_training = module.training
    module.eval()
    out = []
    try:
        with torch.no_grad(), isolate_rng():
            for i in range(0, len(frames), PREDICT_BATCH):
                batch = torch.as_tensor(np.asarray(frames[i : i + PREDICT_BATCH], dtype=np.float32), device=module.device)
                with context():
                    out.append(torch.as_tensor(module.predict_step(batch)).detach().float().cpu().reshape(-1))
    finally:
        module.train(was_training)
    return torch.cat(out).double().numpy() if out else np.zeros(0)


def saved_checkpoint(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The Lightning checkpoint a saved state's arrays hold (a rank's part of a gang's checkpoint
    included), loaded on the CPU."""
    return torch.load(io.BytesIO(np.asarray(arrays[FILES + CHECKPOINT], dtype=np.uint8).tobytes()), map_location="cpu", weights_only=True)


def predictor(module: pl.LightningModule, state: TrainerState) -> Callable[[np.ndarray], np.ndarray]:
    """The served model: ``module`` (built as for training) given the weights of the Lightning checkpoint
    ``state`` holds, raw frames (n, H, W) to probabilities (n,) through its ``predict_step``."""
    module.load_state_dict(saved_checkpoint(state.arrays)["state_dict"])
    module.eval()
    return lambda frames: probabilities(module, frames)


def step_metrics(outputs: Any, trainer: pl.Trainer) -> dict[str, float]:
    """The step's own numbers: the scalars ``training_step`` returned and the first optimizer's learning rate."""
    found = outputs if isinstance(outputs, Mapping) else {"loss": outputs}
    metrics = {str(k): float(v) for k, v in found.items() if isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.numel() == 1)}
    if trainer.optimizers:
        metrics["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
    return metrics


class Governed(pl.Callback):
    """The one callback a Lightning script adds: ``Trainer(callbacks=[Governed(run)], ...)``."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._environment = RanksEnvironment(run.rank, run.world_size)
        self._resumed_from: int | None = None  # the step resume() restored (0: a fresh start); None: resume() not entered
        self._ckpt_path: str | None = None
        self._told = 0  # the last global step told to the run
        self._pending_rngs: dict[str, Any] | None = None

    @contextmanager
    def resume(self) -> Iterator[str | None]:
        """``with governed.resume() as ckpt_path: trainer.fit(model, ckpt_path=ckpt_path)``: the trial's
        last checkpoint (None: a fresh start); the block ends quietly when the callback left ``fit``
        because the run said stop (code after it runs; ``run.should_stop`` tells why it ended)."""
        restored = self.run.restore()
        self._resumed_from = 0 if restored is None else restored.step
        self._told = self._resumed_from
        try:
            if restored is None:
                self._ckpt_path = None
                yield None
            else:
                with restored.files() as d:
                    self._ckpt_path = str(d / CHECKPOINT)
                    yield self._ckpt_path
        except StopTraining:
            if not self.run.should_stop:
                raise

    def environment(self) -> RanksEnvironment:
        """The Trainer's cluster environment: ``plugins=[governed.environment()]``. parcel_hpc starts and
        requeues the trial's ranks (one, or a gang's), so Lightning starts and requeues none."""
        return self._environment

    # --- checks -------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        why = refusal(replace(setup_of(trainer), gang=self.run.world_size), self.run.budget.steps)
        if why is not None:
            raise Ungoverned(why)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._resumed_from is None:
            raise Ungoverned("trainer.fit ran outside governed.resume(); write `with governed.resume() as ckpt_path: trainer.fit(model, ckpt_path=ckpt_path)`")
        if trainer.global_step != self._resumed_from or (trainer.ckpt_path is None) != (self._ckpt_path is None):
            raise Ungoverned(
                f"trainer.fit starts at step {trainer.global_step} but the trial's last checkpoint is at step {self._resumed_from}; "
                "pass trainer.fit(..., ckpt_path=ckpt_path) with the path governed.resume() gives"
            )
        if bad := unresumable(trainer.train_dataloader):
            raise Ungoverned(
                f"the train loader ({', '.join(bad)}) cannot be resumed mid-epoch: a preempted trial would train on other batches; "
                "use parcel_hpc.integrations.lightning.ResumableLoader(dataset, batch_size, seed=run.seed)"
            )
        if bad := unshared(trainer.train_dataloader, self.run.rank, self.run.world_size):
            raise Ungoverned(
                f"the train loader ({', '.join(bad)}) is not rank {self.run.rank}'s share of the trial's {self.run.world_size} rank(s); "
                "pass ResumableLoader(..., rank=run.rank, world_size=run.world_size)"
            )

    # --- the state Lightning's checkpoint carries for the callback -------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"rngs": encode_rngs(*rng.save())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_rngs = state_dict["rngs"]

    # --- every step ---------------------------------------------------------------------------
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._pending_rngs is not None:  # the first resumed batch: the generators as they were at the save
            rng.restore(*decode_rngs(self._pending_rngs))
            self._pending_rngs = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._told:  # mid-accumulation: no optimizer step yet
            return
        self._told = step
        run = self.run
        due = run.stepped(step, step_metrics(outputs, trainer))
        if due.checkpoint:
            with run.checkpoint_dir() as d:
                save_own(trainer, d / CHECKPOINT)
        if due.validate:
            run.validate(probabilities(pl_module, run.data.validation.images, trainer.precision_plugin.forward_context))
        if run.should_stop:
            raise StopTraining(run.stop)  # Lightning tears down and re-raises; resume() ends there

"""The model work of a selection, run as scheduler jobs (``parcel-hpc selection-job``), never on a login node.

``rerun``: check what this job opened against the contract, load the selected trial's final
checkpoint (the selected artifact) and rescore it, check the served model against its training
path on raw validation images (a trainer built without examples and given the artifact, as a
registry entry serves it: ``trainer.served``), measure what serving it costs, keep a few validation
frames as the released model's input example, rerun its configuration from the
pinned snapshot, retrain the approved baseline the same way (with its own trainer) or load the
released one (``selection.baseline``), and report both per slice. The rerun and a trained
baseline are recorded like trials (a spec and a typed journal each). A gang's winner (issue 50):
its selected artifact is rank 0's replica (``selected_artifact``), and the job runs as a gang of the
winner's own shape, its other tasks the rerun's peers (``_gang_rerun``); the rest is rank 0's.

``final``: the one evaluation on the protected final partition. It reads the final file through
``load_final_partition``, the one door, only under the revision's claim and plan, scores the
artifacts the rerun checked through their serving paths, and seals the result.

Each job reads the snapshot (and the final job the final partition) first, then fences its process
from those files (``parcel_hpc.fence``) before it imports any trainer's code, so trainer code runs
behind the fence in both from its import on; what it raises ends the job with one line naming whose
code raised what (``_Context.trainer_code``). Each job run works in a
directory of its own and writes its result once, last, so a requeued or duplicated job never
mixes files with another and one that finds the result written does nothing.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np

from parcel_hpc import anchor, fence, fsio
from parcel_hpc.checkpoints import claims
from parcel_hpc.checkpoints import store as ckpt
from parcel_hpc.checkpoints.format import Unusable
from parcel_hpc.checkpoints.format import read as read_checkpoint
from parcel_hpc.checkpoints.gang import Committed, GangCheckpoints, trainer_extra
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.data import Partition, load_final_partition, read_split
from parcel_hpc.errors import ParcelError, UsageError, one_line
from parcel_hpc.governance.admission import TrialIdentity, check_worker, config_hash
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.image import environment_digest, file_digest
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.ledger import Admitted, AttemptEnd, Cause, Ended, JobRole, SearchDir, TrialSpec, TrialWriter
from parcel_hpc.ledger.events import encode_payload
from parcel_hpc.ledger.selection import FinalOpened, JobSubmitted
from parcel_hpc.selection.baseline import BaselineKind, baseline_trainer
from parcel_hpc.selection.gangs import job_shape, unlike_ranks
from parcel_hpc.selection.gates import JudgedOn
from parcel_hpc.selection.policy import SelectionPolicy
from parcel_hpc.selection.slices import shipment_buckets, slice_report
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.trainer import FINAL_PARTITION_OUTCOME, Devices, Trainer, TrainerState, TrainingData, build_params, make_trainer, served
from parcel_hpc.trainer.base import checked_probabilities
from parcel_hpc.trainer.data import load_refit_data
from parcel_hpc.trainer.run import Restored, Stop
from parcel_hpc.worker import WorkerPlan
from parcel_hpc.worker.cache import WorkerCache
from parcel_hpc.worker.devices import running_on
from parcel_hpc.worker.gang import FINAL_PARTITION, GangEnv, Leader, LeaderSide, RankFailed, RankHung, RankLost, Watchdog
from parcel_hpc.worker.jobenv import enter_gang, facts_from_env
from parcel_hpc.worker.peer import PeerAttempt
from parcel_hpc.worker.training import LoopCallbacks, budget, scorer, train

SERVING_BATCH = 64  # images per serve() call when measuring latency and memory
EXAMPLE_FRAMES = 3  # validation frames recorded as the released model's input example
KEY_DISTRIBUTIONS = ("parcel-hpc", "numpy", "h5py", "submitit", "hydra-core", "omegaconf")


def run(search_dir: str | os.PathLike, role: JobRole, selection: int) -> dict[str, Any] | None:
    """The job's result (written once, last, by rank 0); None on a gang's other ranks, whose share is
    the rerun's training only."""
    store = SelectionStore(SearchDir(Path(search_dir)))
    existing = store.result(selection, role)
    if existing is not None:
        return existing  # a requeued job whose first run finished: nothing to do twice
    started = time.time()  # a gang's rank 0 holds every rank's resources from here, while its peers connect
    gang = _gang_of_job(store, role, selection)
    if gang is not None and gang.env.rank > 0:
        try:
            PeerAttempt(gang.plan, gang.env).execute()  # a trial's peer, told by rank 0 where to train: rank 0 records the rerun
        except Exception:
            # Told to rank 0, which ends the job naming this rank; its traceback goes to the job's log. This task
            # leaves without an error, so that srun's --kill-on-bad-exit does not end rank 0 before it says so.
            traceback.print_exc()
        return None  # rank 0 reports the job: the job's output ends with rank 0's words
    try:
        ctx = _Context(store, selection, role, gang)
        result = _rerun(ctx) if role is JobRole.RERUN else _final(ctx)
    finally:
        if gang is not None and gang.leader is not None:
            gang.leader.close()  # a peer still waiting on rank 0 sees it gone and exits
    # What the job itself used, for the packet's compute (a gang's: every rank's share).
    shape = job_shape(ctx.contract["resources"], gang.plan.shape if gang is not None else None)
    result["job"] = {
        "started_at": started,
        "ended_at": time.time(),
        "facts": encode_payload(facts_from_env(gang=gang.env if gang is not None else None), drop_empty=False),
        "resources": {"cpus": shape.cpus, "gpus": shape.gpus, "ranks": shape.ranks},
    }
    store.write_result(selection, role, result)
    return cast(dict[str, Any], store.result(selection, role))  # written just above


@dataclass
class _Gang:
    """This task's place in the gang a gang's winner reruns as: its plan, where it is in the gang, and
    (rank 0) the gang's channel, opened before rank 0 reads anything, while its peers connect."""

    plan: WorkerPlan
    env: GangEnv
    leader: Leader | None = None


def _gang_of_job(store: SelectionStore, role: JobRole, n: int) -> _Gang | None:
    """The job's gang (None: one task), its place set in the environment before any trainer code is
    imported; a job of another shape than its winner's is refused in one line."""
    trial = str(store.selection(n).get("trial_id") or "")
    plan = WorkerPlan.load(store.search, trial) if trial and role is JobRole.RERUN else None
    env = enter_gang(plan.gpus if plan is not None else 0)
    ranks = env.world_size if env is not None else 1
    if plan is None:
        if env is not None:
            raise UsageError(f"this {role.value} job runs {ranks} tasks; it runs as one")
        return None
    if ranks != plan.shape.ranks:
        raise UsageError(
            f"{trial} is a trial of {plan.shape.describe()}: its rerun runs as a gang of that shape, and this job runs {ranks} "
            f"task{'s' if ranks > 1 else ''}; run `parcel-hpc select`, which submits it so"
        )
    if env is None:
        return None
    gang = _Gang(plan, env)
    if env.rank == 0:
        gang.leader = Leader.open(env.channel_port, env.world_size, hang_s=plan.rank_wait_s, job=env.job_id)
    return gang


# --- shared ----------------------------------------------------------------------------------


class _Context:
    """The frozen facts every job starts from, with what this job itself observed checked first."""

    def __init__(self, store: SelectionStore, n: int, role: JobRole, gang: _Gang | None = None) -> None:
        self.store, self.n, self.gang = store, n, gang
        self.contract: Contract = store.search.contract()
        self.policy = SelectionPolicy.of(self.contract)
        self.frozen = store.selection(n)
        self.trial_id = str(self.frozen["trial_id"])
        if not self.trial_id:
            raise UsageError(f"selection {n} names no trial (no completed trial to select); nothing to rerun")
        self.plan = WorkerPlan.load(store.search, self.trial_id)
        self.split = read_split(self.plan.split_path)
        cache = WorkerCache()
        # Before the fence. A K-fold search's released model is the refit on all non-final data, so
        # that is the data it is built, served and scored with; the rerun also reads each fold's.
        k = self.split.fold_count
        data = (
            cache.training_data(self.plan.snapshot_path, self.split, self.plan.preprocessing)
            if k == 1
            else load_refit_data(self.plan.snapshot_path, self.split, self.plan.preprocessing)
        )
        # A retrained trial's steps, as its trials had them; the GPUs the job was granted, as a trial's worker sees them.
        facts = facts_from_env(gang=gang.env if gang is not None else None)
        steps, devices = budget(self.plan), Devices.from_env(facts.gpus, facts.cuda_visible_devices)
        self.data: TrainingData = replace(data, budget=steps, devices=devices)
        self.folds = tuple(
            replace(cache.training_data(self.plan.snapshot_path, self.split, self.plan.preprocessing, f), budget=steps, devices=devices)
            for f in range(k if k > 1 and role is JobRole.RERUN else 0)
        )
        self.final = _open_final(self) if role is JobRole.FINAL else None  # before the fence too: the one door, under its claim
        self.armed: fence.Armed | None = None
        observed, problem = cache.observe(self.plan.snapshot_path, self.split, self.plan.image, self.contract["trainer"], store.search.path, self._fence)
        self._stop_if_tripped("its module was imported")
        outcome = check_worker(observed, self.contract)
        if not outcome.is_admit:
            raise GovernanceRefusal(outcome, f"this selection job opened other data or code than the contract pins {problem}".strip())
        layer = self.armed.layer if self.armed is not None else None
        self.admitted = Admitted(observed.snapshot_digest, observed.split_digest, observed.image_digest, observed.trainer["source_digest"], layer)
        m = self.contract["metric"]
        self.metric = MissCost(m["revision"], float(m["miss_cost"]), float(m["review_cost"]))
        self.baseline = self.policy.baseline
        baseline_hash = config_hash({"params": dict(self.baseline.params), "seed": self.plan.seed, "contract_digest": self.contract.digest})
        self.baseline_identity = TrialIdentity(f"baseline-{self.baseline.name}", baseline_hash, self.contract.digest, self.contract["snapshot_digest"])
        self.winner_identity = TrialIdentity(self.trial_id, self.plan.config_hash, self.contract.digest, self.contract["snapshot_digest"])

    def _fence(self) -> None:
        """This process, fenced from the final partition's files before the first trainer code runs."""
        self.armed = fence.arm(fence.Protected.of(self.plan.split_path, self.plan.snapshot_path))

    def _stop_if_tripped(self, when: str) -> None:
        """Trainer code reached for the protected files, or asked for the final partition: the job
        stops (the worker's rule for trials). The process ran no other trainer code: every trip is this job's."""
        asked = fence.reaches(self.data.asked_for_final)
        if asked:
            raise GovernanceRefusal(FINAL_PARTITION_OUTCOME, f"{asked[0]} while {when} in a selection job; the job stops")

    @contextmanager
    def fenced(self) -> Iterator[None]:
        """Trainer code runs here (behind the fence, as everywhere in this process): what it reached
        for is checked when it returns, whether or not it caught the refusal."""
        try:
            yield
        finally:
            self._stop_if_tripped("it ran")

    @contextmanager
    def trainer_code(self, who: str) -> Iterator[None]:
        """Fenced trainer code; what it raises ends the job in one line that names whose code raised
        what (a user's trainer reading a parameter nobody gave is a KeyError here, not a traceback)."""
        try:
            with self.fenced():
                yield
        except ParcelError:
            raise
        except Exception as exc:
            raise UsageError(f"{who} raised {type(exc).__name__}: {one_line(str(exc)) or '(no message)'}") from exc

    def trainer(self, params: Mapping[str, Any], data: TrainingData | None = None) -> Trainer:
        """The search's trainer built with the selected trial's ``params`` on ``data`` (the job's own by default)."""
        trainer = make_trainer(self.contract["trainer"], self.store.search.path)
        return self._built(trainer, params, self.plan.seed, f"trainer {self.contract['trainer']['target']}", data or self.data)

    def baseline_trainer(self, seed: int, data: TrainingData | None = None) -> Trainer:
        """The baseline's own trainer, built with its params (``selection.baseline``)."""
        trainer, params = baseline_trainer(self.baseline, self.store.search.path)
        return self._built(trainer, params, seed, f"the baseline {self.baseline.name}'s trainer {self.baseline.target}", data or self.data)

    def _built(self, trainer: Trainer, params: Mapping[str, Any], seed: int, who: str, data: TrainingData) -> Trainer:
        with self.trainer_code(f"{who} build(params={dict(params)})"):
            trainer.build(build_params(trainer, params), seed, data)
        return trainer

    def columns(self, part) -> dict[str, np.ndarray]:
        available = {
            "damage_type": part.damage_type,
            "camera_class": part.camera_class,
            "shipment_bucket": shipment_buckets(part.shipment_id, self.policy.shipment_buckets),
        }
        return {c: available[c] for c in self.policy.columns}

    def scores(self, trainer: Trainer, split: str, n: int, step: int) -> np.ndarray:
        with self.trainer_code(f"{type(trainer).__name__}.predict({split!r})"):
            return checked_probabilities(trainer.predict(split), n, split, step)

    def served(self, trainer: Trainer, images: np.ndarray, step: int, split: str) -> np.ndarray:
        with self.trainer_code(f"{type(trainer).__name__}.serve({split} images)"):
            return checked_probabilities(trainer.serve(images), len(images), f"serving ({split})", step)


def _restored(ctx: _Context, make: Callable[[], Trainer], directory: Path, identity: TrialIdentity) -> tuple[Trainer, ckpt.Checkpoint]:
    found = ckpt.CheckpointStore(directory, identity, keep_last=1).load_latest()
    if found is None:
        raise UsageError(f"no intact checkpoint in {directory}; the artifact is missing")
    return _loaded(ctx, make, found, TrainerState(found.params, found.extra or {})), found


def _loaded(ctx: _Context, make: Callable[[], Trainer], found: ckpt.Checkpoint, state: TrainerState) -> Trainer:
    trainer = make()
    with ctx.trainer_code(f"{type(trainer).__name__}.load_state({found.path.name})"):
        trainer.load_state(state)
    return trainer


def selected_artifact(ctx: _Context) -> tuple[Trainer, ckpt.Checkpoint]:
    """The selected trial's final checkpoint loaded into its trainer. A gang's is rank 0's part of its
    newest complete step: rank 0's replica, the model whose validation on rank 0 the trial was
    selected by, once every other rank's part, loaded alone the same way, is shown to predict the
    same validation frames bit for bit (``gangs.unlike_ranks``); parts that do not (a sharded model) are
    refused in one line, since rank 0's alone would serve something the gang never was."""
    make, directory, shape = (lambda: ctx.trainer(ctx.plan.params)), _final_chain(ctx, ""), ctx.plan.shape
    if not shape.is_gang:
        return _restored(ctx, make, directory, ctx.winner_identity)
    committed = Committed.newest(directory, ctx.winner_identity, shape.ranks)
    if committed is None:
        raise UsageError(f"no complete step of the gang's checkpoint in {directory}; the artifact is missing")
    step, val = committed.manifest.step, ctx.data.validation
    own = committed.part(0)
    winner = _loaded(ctx, make, own, TrainerState(own.params, trainer_extra(own)))
    predicted = [ctx.scores(winner, "validation", len(val), step)]
    for rank in range(1, shape.ranks):  # one part in memory at a time beside rank 0's
        part = committed.part(rank)
        predicted.append(ctx.scores(_loaded(ctx, make, part, TrainerState(part.params, trainer_extra(part))), "validation", len(val), step))
        del part
    unlike = unlike_ranks(predicted)
    if unlike:
        raise UsageError(
            f"{ctx.trial_id}'s checkpoint parts at step {step} are not replicas: rank {', '.join(map(str, unlike))}'s part predicts otherwise "
            "than rank 0's (a sharded model, or replicas that drifted apart); rank 0's part alone is not the gang's model, and releasing one from every rank's parts is not built"
        )
    return winner, own


def _released(ctx: _Context) -> tuple[Trainer, ckpt.Checkpoint]:
    """The released baseline as its registry entry holds it (the bytes the contract pins), loaded
    into its trainer: built with the released trial's params and seed, then its state."""
    art = ctx.baseline.artifact
    assert art is not None  # an ARTIFACT baseline has one (Baseline checks it at birth)
    digest = file_digest(art.path)
    if digest != art.sha256:
        raise GovernanceRefusal(
            Outcome.reject("baseline_artifact"),
            f"the released baseline {art.path} has digest {digest}, the contract pins {art.sha256}; restore the released file",
        )
    try:
        found = read_checkpoint(art.path)
    except Unusable as exc:
        raise GovernanceRefusal(Outcome.reject("baseline_artifact"), f"the released baseline {art.path} does not read as a checkpoint ({exc})") from None
    trainer = ctx.baseline_trainer(art.seed)
    with ctx.trainer_code(f"the baseline {ctx.baseline.name}'s trainer {ctx.baseline.target} load_state({art.path})"):
        trainer.load_state(TrainerState(found.params, found.extra or {}))
    return trainer, found


def _save_artifact(ctx: _Context, directory: Path, identity: TrialIdentity, step: int, trainer: Trainer) -> dict[str, Any]:
    with ctx.trainer_code(f"{type(trainer).__name__}.state()"):
        state = trainer.state().checked()
    path = ckpt.CheckpointStore(directory, identity, keep_last=1).save(step, state.arrays, {}, {}, extra=state.scalars)
    return {"path": anchor.shown(path), "sha256": file_digest(path), "step": step, "bytes": path.stat().st_size}


def _trained(
    ctx: _Context,
    records_dir: Path,
    name: str,
    params: Mapping[str, Any],
    identity: TrialIdentity,
    make: Callable[[], Trainer],
    data: TrainingData | None = None,
    chain: Path | None = None,
    gang: _GangRun | None = None,
) -> tuple[Trainer, float, TrialSpec]:
    """Train ``params`` with the trainer ``make`` builds (on ``data``: the job's own by default),
    exactly like a trial (same loop, steps, seed and milestones; no pruning), recorded like one: a
    spec and a journal with its start, the digests it read, its milestones and its ending, under ``records_dir/name``.
    With ``chain``, it claims that checkpoint directory, checkpoints there at the trial's cadence and
    resumes from its newest checkpoint (a refit a requeued or rerun job does not train twice). With
    ``gang``, this is rank 0 of a gang: every rank saves, validates and stops as rank 0 decides, and
    its saves are rank 0's parts of the gang's checkpoints."""
    spec = TrialSpec(
        name, -1, dict(params), ctx.plan.seed, identity.config_hash, ctx.contract.digest, ctx.admitted.image_digest, dict(ctx.contract["resources"])
    )
    directory = fsio.ensure_dir(records_dir / name)
    fsio.create_exclusive_json(directory / "spec.json", spec.to_json())
    journal = TrialWriter(directory, "selection-job")
    journal.started(1, facts_from_env())
    journal.admitted(1, ctx.admitted)
    plan = replace(ctx.plan, params=dict(params))
    step = 0

    def stepped(at: int) -> Stop | None:
        nonlocal step
        step = at
        return None

    def validated(at: int, value: float, final: bool, metrics: Mapping[str, float]) -> Stop | None:
        journal.milestone(1, at, value, at in plan.pruner["milestones"], metrics)
        return None

    store = None if chain is None else _claimed_chain(ctx, chain, identity, plan.keep_last)

    def restore() -> Restored | None:
        latest = None if store is None else store.load_latest()
        if latest is None:
            return None
        journal.resumed(1, latest.step)
        return Restored(latest.step, TrainerState(latest.params, latest.extra or {}))

    def save(at: int, state: TrainerState) -> None:
        if store is not None:
            store.save(at, state.arrays, {}, {}, extra=state.scalars)

    calls = LoopCallbacks(restore, stepped, save, validated)
    watch = None
    if gang is not None:

        def stalled(waited: float) -> None:
            """Rank 0 reached no step boundary within the bound (a collective a peer never joins): the
            job ends now, its rerun's ending written from here (the main thread is in trainer code)."""
            exc = gang.leader.stalled(step + 1, waited)
            cause = Cause.RANK_HUNG if isinstance(exc, RankHung) else Cause.EXCEPTION
            journal.ended(1, Ended(AttemptEnd.FAILED, cause, step=step, message=f"{type(exc).__name__}: {exc}"[:500]))
            print(f"error: {name}: {exc}", file=sys.stderr, flush=True)
            os._exit(1)  # srun (--kill-on-bad-exit), or the local launcher, ends the other ranks

        watch = Watchdog.of_gang(plan.rank_wait_s, stalled)
        side = LeaderSide(gang.leader, watch)
        calls = replace(calls, save=gang.save, agreed=side.after_step, agreed_after_validation=side.after_validation)
    used = data or ctx.data
    try:
        trainer = make()
        with ctx.trainer_code(f"{name}: {type(trainer).__name__} training"):
            last = None if store is None else store.load_latest()
            if last is not None and last.step >= plan.steps:  # a finished chain is scored, not trained again (the worker's rule)
                journal.resumed(1, last.step)
                trainer.load_state(TrainerState(last.params, last.extra or {}))
                value = scorer(plan, used)(checked_probabilities(trainer.predict("validation"), len(used.validation), "validation", last.step))
            else:
                ran = train(plan, trainer, used, calls)
                if gang is not None:
                    gang.writer.wait()  # rank 0's part of the last save is durable (the peers' are theirs)
                if ran.stop is not None and not ran.done:
                    # A rank was signalled (its job preempted, or at its limit): a preempted job runs again from the start.
                    raise UsageError(
                        f"{name} was stopped at step {ran.step} of {plan.steps} ({ran.stop.value}); it is not done, and this job ends without a result"
                    )
                value = ran.value
    except GovernanceRefusal as exc:
        journal.ended(1, Ended(AttemptEnd.REJECTED, step=step, outcome=exc.outcome, reason=str(exc)[:500]))
        raise
    except Exception as exc:
        failure = gang.leader.cause_of(exc.__cause__ if isinstance(exc.__cause__, Exception) else exc, step) if gang is not None else exc
        if isinstance(failure, RankFailed) and failure.cause == FINAL_PARTITION:
            # Another rank's trainer asked for the final partition (caught or not): the job's refusal, in that rank's words.
            refusal = GovernanceRefusal(
                FINAL_PARTITION_OUTCOME, f"on rank {failure.rank}: {failure.traceback} while {name} ran in a selection job; the job stops"
            )
            journal.ended(1, Ended(AttemptEnd.REJECTED, step=step, outcome=refusal.outcome, reason=str(refusal)[:500]))
            raise refusal from exc
        failed = failure if isinstance(failure, RankFailed | RankLost | RankHung) else exc
        journal.ended(1, Ended(AttemptEnd.FAILED, Cause.EXCEPTION, step=step, message=f"{type(failed).__name__}: {failed}"[:500]))
        if failed is not exc:
            raise UsageError(f"{name}: {failed}") from exc
        raise
    finally:
        if watch is not None:
            watch.stop()
    journal.ended(1, Ended(AttemptEnd.COMPLETED, step=plan.steps, metric=float(value)))
    if store is not None and store.claim is not None:
        store.claim.release()  # left in order: a later job scores it from its last checkpoint
    return trainer, float(value), spec


def _claimed_chain(ctx: _Context, chain: Path, identity: TrialIdentity, keep_last: int) -> ckpt.CheckpointStore:
    return ckpt.CheckpointStore(chain, identity, keep_last=keep_last, claim=_chain_claim(ctx, chain, identity))


def _chain_claim(ctx: _Context, chain: Path, identity: TrialIdentity) -> claims.Claim:
    """The selection job's own claim on ``chain``, as a trial's attempt claims its directory: a dead
    earlier run of the job is taken over, a live one is a collision (the job stops)."""
    facts = facts_from_env()
    found = ctx.store.search.identity()
    here = claims.ClaimIdentity.here(identity, job_id=facts.job_id, attempt=facts.restart_count + 1, search_id=found.search_id if found else "")
    return claims.claim_directory(chain, here)


@dataclass(frozen=True)
class _GangRun:
    """Rank 0's side of a gang's rerun: the gang's channel, and its parts of the gang's checkpoints."""

    leader: Leader
    writer: BackgroundWriter

    def save(self, step: int, state: TrainerState) -> None:
        self.writer.submit(step, state.arrays, {}, {}, extra=state.scalars)


def _gang_rerun(ctx: _Context, run_dir: Path, records: Path) -> float:
    """The selected gang's configuration trained again as a gang of its own shape, from the pinned
    snapshot: rank 0 here, the job's other tasks as a trial's peers (``worker/peer.PeerAttempt``).
    One rank would not redo the gang's computation (its gradients are reduced in another order:
    docs/gangs.md), so only this rerun can be held to ``selection.rerun_tolerance``. Its checkpoints go
    to a chain of this job run's own under one claim, as a trial's gang's do; a job run again trains
    again, as a one-rank rerun does. The peers leave once it is trained."""
    gang = cast(_Gang, ctx.gang)
    env, leader, plan, identity = gang.env, cast(Leader, gang.leader), ctx.plan, ctx.winner_identity
    chain = fsio.ensure_dir(run_dir / "rerun-chain")
    claim = _chain_claim(ctx, chain, identity)
    parts = GangCheckpoints(
        chain, identity, rank=0, world_size=env.world_size, attempt=1, keep_last=plan.keep_last, claim=claim, commit_wait_s=plan.rank_wait_s
    )
    leader.send({"train": True, "trial_id": ctx.trial_id, "attempt": 1, "ckpt_dir": str(chain), "claim": claim.record.to_json()})
    run = _GangRun(leader, BackgroundWriter(parts))
    data = replace(ctx.data, rank=0, world_size=env.world_size)
    _, value, _ = _trained(ctx, records, "rerun", plan.params, identity, lambda: ctx.trainer(plan.params, data), data, gang=run)
    claim.release()  # left in order
    return value


def _parity(
    make: Callable[[], Trainer], params: Mapping[str, Any], seed: int, state: TrainerState, data: TrainingData, scores: np.ndarray, tolerance: float
) -> dict[str, Any]:
    """The served model against training: a trainer ``make`` gives, built without examples and given the
    artifact's ``state`` (``trainer.served``, as a registry entry serves it), serving the raw validation
    images of ``data``, against ``scores`` (``predict``). What it raises is the check's ``problem``, a
    failed check (a trainer that cannot serve from its state alone is held, never released)."""
    blank, images = data.without_examples(), data.validation.images
    base = {"tolerance": tolerance, "examples": int(len(scores)), "served": "built without examples, then load_state(artifact)"}
    try:
        trainer = served(make(), params, seed, state, blank)
        answer = checked_probabilities(trainer.serve(images), len(scores), "serving", 0)
    except ParcelError:
        raise
    except Exception as exc:
        problem = f"built without examples and given its artifact's state, {type(exc).__name__}: {one_line(str(exc)) or '(no message)'}"
        return base | {"max_abs_difference": None, "passed": False, "problem": problem}
    finally:
        if blank.asked_for_final:  # caught by the trainer or not, as in training (``_Context.fenced``)
            raise GovernanceRefusal(FINAL_PARTITION_OUTCOME, f"the served trainer asked for {blank.asked_for_final[0]!r}; the job stops")
    diff = float(np.max(np.abs(answer - scores))) if len(scores) else 0.0
    return base | {"max_abs_difference": diff, "passed": diff <= tolerance, "problem": ""}


def _maker(ctx: _Context) -> Callable[[], Trainer]:
    """The search's trainer, unbuilt (``make_trainer`` imports its code copy once; a second call only instantiates)."""
    return lambda: make_trainer(ctx.contract["trainer"], ctx.store.search.path)


def _state_of(artifact: Mapping[str, Any]) -> TrainerState:
    """The state an artifact ``_save_artifact`` wrote holds, read back from its file: the bytes a release ships."""
    found = read_checkpoint(anchor.resolve(artifact["path"]))
    return TrainerState(found.params, found.extra or {})


def _serving_example(ctx: _Context, run_dir: Path, winner: Trainer) -> dict[str, Any]:
    """A few validation frames (never the final partition's) and what the winner serves for them: the
    input example a release records in the model it registers (``release.model``)."""
    frames = np.ascontiguousarray(ctx.data.validation.images[:EXAMPLE_FRAMES], dtype=np.float32)
    path = run_dir / "serving-example.npy"
    buffer = io.BytesIO()
    np.save(buffer, frames, allow_pickle=False)
    fsio.atomic_write_bytes(path, buffer.getvalue())
    scores = ctx.served(winner, frames, ctx.plan.steps, "example")
    return {"path": anchor.shown(path), "sha256": file_digest(path), "partition": "validation", "rows": list(range(len(frames))), "served": scores.tolist()}


def _serving_estimate(trainer: Trainer, images: np.ndarray) -> dict[str, Any]:
    """Per image, on the device the trainer serves from: median latency over repeated batches and the
    peak memory Python traced (a GPU's own memory is not in it)."""
    batch = images[:SERVING_BATCH]
    trainer.serve(batch[:1])  # warm caches and lazy initialisation
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        trainer.serve(batch)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    try:
        trainer.serve(batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {
        "latency_ms_per_image": 1000.0 * statistics.median(times) / len(batch),
        "peak_memory_bytes_per_image": peak / len(batch),
        "batch": int(len(batch)),
        "device": running_on(),  # where it was measured: the GPU the trainer put its model on, else the CPU
        "cpu": platform.machine(),
        "threads": os.environ.get("OMP_NUM_THREADS", ""),
        "host": platform.node(),
    }


def _software(ctx: _Context) -> dict[str, Any]:
    """What this job ran with, as seen where it ran: the code version and the dependency digests, the
    versions of parcel_hpc's key distributions and of every one the trainer's code imports.
    With ``image=computed`` the job's own admission digest is the environment digest already."""
    computed = ctx.plan.image.get("kind", "computed") == "computed"
    versions: dict[str, str | None] = {}
    for name in sorted(set(KEY_DISTRIBUTIONS) | set(ctx.contract["trainer"].get("distributions", {}))):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    environment = ctx.admitted.image_digest if computed else environment_digest()
    return {"code_version": _code_version(), "environment_digest": environment, "key_versions": versions}


def _code_version() -> str:
    """The parcel_hpc checkout's commit, marked when its files differ from it; the package version
    when it is no checkout (the environment digest covers its source byte for byte either way)."""
    root = Path(__file__).resolve().parents[2]
    try:
        with fence.toolkit_programs():  # git is the toolkit's program, in a process fenced for trainer code
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
            if head.returncode == 0:
                dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10)
                return head.stdout.strip() + (" with local changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "parcel-hpc " + importlib.metadata.version("parcel-hpc")


# --- rerun ---------------------------------------------------------------------------------------


def _rerun(ctx: _Context) -> dict[str, Any]:
    run_dir = ctx.store.new_run_dir(ctx.n, JobRole.RERUN)
    records = run_dir / "records"
    val = ctx.data.validation
    columns = ctx.columns(val)
    folded = _fold_reruns(ctx, records) if ctx.folds else None
    rerun_metric = None
    if folded is None:
        # The selected artifact: the trial's own final checkpoint, rescored exactly as the search scored it.
        winner, found = selected_artifact(ctx)
        step, origin = found.step, anchor.shown(found.path)
        # A gang's rerun next, once its artifact is known to be one model: its peers wait for it, and leave once it is trained.
        rerun_metric = _gang_rerun(ctx, run_dir, records) if ctx.gang is not None else None
    else:
        # A K-fold winner's released model: its configuration refit on every non-final frame, recorded like a trial.
        refit = _final_chain(ctx, "refit")  # its own checkpoint chain beside the fold runs' (claimed, resumable)
        winner, _, _ = _trained(ctx, records, "refit", ctx.plan.params, ctx.winner_identity, lambda: ctx.trainer(ctx.plan.params), chain=refit)
        step, origin = ctx.plan.steps, anchor.shown(records / "refit")
    winner_scores = ctx.scores(winner, "validation", len(val), step)
    artifact = _save_artifact(ctx, run_dir / "winner", ctx.winner_identity, step, winner) | {"from": origin}
    with ctx.fenced():
        parity = _parity(_maker(ctx), ctx.plan.params, ctx.plan.seed, _state_of(artifact), ctx.data, winner_scores, ctx.policy.parity_tolerance)
    with ctx.trainer_code(f"{type(winner).__name__}.serve (serving cost)"):
        serving = _serving_estimate(winner, val.images) | {"artifact_bytes": artifact["bytes"]}
        serving |= {"frame_shape": list(val.images.shape[1:]), "example": _serving_example(ctx, run_dir, winner)}
    baseline_scores, baseline = _baseline_on_validation(ctx, run_dir, records)
    if folded is None:
        # The rerun: the same configuration from the pinned snapshot, as a new run (a gang's: as a gang, above).
        if rerun_metric is None:
            _, rerun_metric, _ = _trained(ctx, records, "rerun", ctx.plan.params, ctx.winner_identity, lambda: ctx.trainer(ctx.plan.params))
        artifact_metric, judged = ctx.metric(winner_scores, val.labels), JudgedOn.VALIDATION
        winner_rows = slice_report(winner_scores, val.labels, columns, ctx.metric)
        baseline_rows = slice_report(baseline_scores, val.labels, columns, ctx.metric)
        extra: dict[str, Any] = {}
    else:
        # Judged on out-of-fold predictions: each non-final frame a fold validates, scored by that fold's rerun (and baseline).
        rerun_metric, artifact_metric, judged = statistics.fmean(folded.rerun), statistics.fmean(folded.artifact), JudgedOn.OUT_OF_FOLD
        winner_rows = slice_report(folded.winner_scores, folded.labels, folded.columns, ctx.metric)
        baseline_rows = slice_report(folded.baseline_scores, folded.labels, folded.columns, ctx.metric)
        baseline |= {"metric": statistics.fmean(folded.baseline), "fold_metrics": list(folded.baseline), "refit": ctx.baseline.kind is BaselineKind.TRAINED}
        extra = {
            "folds": folded.to_json(ctx, records),
            "refit": {
                "records": anchor.shown(records / "refit"),
                "chain": anchor.shown(_final_chain(ctx, "refit")),
                "frames": int(len(ctx.data.train.labels)),
                "steps": step,
            },
        }
    return extra | {
        "role": JobRole.RERUN.value,
        "selection": ctx.n,
        "trial_id": ctx.trial_id,
        "run_dir": anchor.shown(run_dir),
        "observed": {k: getattr(ctx.admitted, k) for k in ("snapshot_digest", "split_digest", "image_digest", "trainer_digest")},
        "software": _software(ctx),
        "selected_metric": float(ctx.frozen["metric"]),
        "artifact_metric": artifact_metric,
        "rerun_metric": rerun_metric,
        "rerun_tolerance": ctx.policy.rerun_tolerance,
        # The runs recorded like trials: the rerun (a K-fold winner's refit, whose folds' reruns are under ``folds``) and the trained baseline.
        "records": {"rerun" if folded is None else "refit": anchor.shown(records / ("rerun" if folded is None else "refit"))}
        | ({"baseline": anchor.shown(records / "baseline")} if ctx.baseline.kind is BaselineKind.TRAINED else {}),
        "artifact": artifact,
        "baseline": baseline,
        "parity": parity,
        "serving": serving,
        "slices": {"partition": judged.value, "winner": [r.to_json() for r in winner_rows], "baseline": [r.to_json() for r in baseline_rows]},
    }


def _final_chain(ctx: _Context, fold: str) -> Path:
    """The selected trial's checkpoint chain (``fold``: a K-fold trial's ``fold-<k>``), whose newest checkpoint is at its final step."""
    return Path(ctx.plan.checkpoint_dir()) / fold


@dataclass(frozen=True)
class _Folded:
    """A K-fold winner's folds rerun: per fold, its selected checkpoint rescored, its rerun's and the
    baseline's values; and, over every frame some fold validates, the out-of-fold predictions."""

    selected: tuple[float, ...]
    artifact: tuple[float, ...]
    rerun: tuple[float, ...]
    baseline: tuple[float, ...]
    winner_scores: np.ndarray
    baseline_scores: np.ndarray
    labels: np.ndarray
    columns: dict[str, np.ndarray]

    def to_json(self, ctx: _Context, records: Path) -> dict[str, Any]:
        frames = int(len(self.labels))
        return {
            "k": len(self.rerun),
            "method": ctx.split.method.value,
            "selected": list(self.selected),
            "artifact": list(self.artifact),
            "rerun": list(self.rerun),
            "baseline": list(self.baseline),
            "oof_frames": frames,
            "frames_without_oof": int(len(ctx.data.train.labels)) - frames,  # a time K-fold's earliest period: no fold validates it
            "records": {who: [anchor.shown(p) for p in sorted(records.glob(f"{who}-fold-*"))] for who in ("rerun", "baseline")},
        }


def _fold_reruns(ctx: _Context, records: Path) -> _Folded:
    """Each fold of the selected K-fold trial: its final checkpoint rescored on its fold, its
    configuration rerun from scratch on the fold's training part (same params and seed), and the
    baseline trained there the same way (or the released one served); their predictions on the
    fold's validation part are the out-of-fold predictions the gates judge."""
    record = ctx.store.search.record(ctx.trial_id)
    if record.folds is None or len(record.folds.values) != len(ctx.folds):
        raise UsageError(f"{ctx.trial_id} has no value for each of the {len(ctx.folds)} folds of {ctx.split.path}; it is not a K-fold trial of this split")
    released = _released(ctx) if ctx.baseline.kind is BaselineKind.ARTIFACT else None
    artifact, rerun, baseline, w_scores, b_scores, labels, columns = [], [], [], [], [], [], []
    for k, data in enumerate(ctx.folds):
        val, steps = data.validation, ctx.plan.steps
        make = partial(ctx.trainer, ctx.plan.params, data)
        own, found = _restored(ctx, make, _final_chain(ctx, f"fold-{k}"), ctx.winner_identity)
        if found.step != steps:
            raise UsageError(f"the newest checkpoint of {ctx.trial_id} fold {k} is at step {found.step}, not its final step {steps}")
        artifact.append(ctx.metric(ctx.scores(own, "validation", len(val), found.step), val.labels))
        trainer, value, _ = _trained(ctx, records, f"rerun-fold-{k}", ctx.plan.params, ctx.winner_identity, make, data)
        rerun.append(value)
        w_scores.append(ctx.scores(trainer, "validation", len(val), steps))
        if released is not None:
            scores = ctx.served(released[0], val.images, released[1].step, "validation")
        else:
            make_b = partial(ctx.baseline_trainer, ctx.plan.seed, data)
            b, _, _ = _trained(ctx, records, f"baseline-fold-{k}", ctx.baseline.params, ctx.baseline_identity, make_b, data)
            scores = ctx.scores(b, "validation", len(val), steps)
        b_scores.append(scores)
        baseline.append(ctx.metric(scores, val.labels))
        labels.append(val.labels)
        columns.append(ctx.columns(val))
    return _Folded(
        tuple(record.folds.values),
        tuple(artifact),
        tuple(rerun),
        tuple(baseline),
        np.concatenate(w_scores),
        np.concatenate(b_scores),
        np.concatenate(labels),
        {c: np.concatenate([part[c] for part in columns]) for c in columns[0]},
    )


def _baseline_on_validation(ctx: _Context, run_dir: Path, records: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The approved baseline's validation scores and its part of the result: trained the same way
    as the rerun with its own trainer, or the released artifact scored through ``serve``."""
    val, b = ctx.data.validation, ctx.baseline
    part: dict[str, Any] = {"name": b.name, "kind": b.kind.value, "trainer": b.target, "params": dict(b.params)}
    if b.artifact is not None:
        released, found = _released(ctx)
        scores = ctx.served(released, val.images, found.step, "validation")
        size = Path(b.artifact.path).stat().st_size
        artifact = {"path": b.artifact.path, "sha256": b.artifact.sha256, "step": found.step, "bytes": size}
        released_from = f"{b.artifact.search_revision}/{b.artifact.trial_id}"
        return scores, part | {"config_hash": None, "metric": ctx.metric(scores, val.labels), "artifact": artifact, "released": released_from, "parity": None}
    trainer, metric, spec = _trained(ctx, records, "baseline", b.params, ctx.baseline_identity, lambda: ctx.baseline_trainer(ctx.plan.seed))
    scores = ctx.scores(trainer, "validation", len(val), ctx.plan.steps)
    artifact = _save_artifact(ctx, run_dir / "baseline", ctx.baseline_identity, ctx.plan.steps, trainer)
    with ctx.fenced():
        parity = _parity(
            lambda: baseline_trainer(b, ctx.store.search.path)[0], b.params, ctx.plan.seed, _state_of(artifact), ctx.data, scores, ctx.policy.parity_tolerance
        )
    return scores, part | {"config_hash": spec.config_hash, "metric": metric, "artifact": artifact, "parity": parity}


# --- final -----------------------------------------------------------------------------------------


def _wait_for_own_submission(store: SelectionStore, n: int, own: str, wait_s: float = 60.0) -> None:
    """Return once the newest final job recorded for selection ``n`` is this one; the submitter
    records it just after the scheduler (or the process start) gave it an id, so wait a moment."""
    deadline = time.monotonic() + wait_s
    while True:
        last = store.record().last_job(n, JobRole.FINAL)
        if isinstance(last, JobSubmitted) and last.job_id == own:
            return
        if time.monotonic() > deadline:
            raise GovernanceRefusal(
                Outcome.reject("final-holdout-unclaimed"),
                f"this job ({own}) is not the final evaluation `parcel-hpc evaluate-final` submitted for selection {n}; it does not open the final partition",
            )
        time.sleep(0.2)


def _open_final(ctx: _Context) -> Partition:
    """The protected final partition, read under the revision's claim and plan by the job
    ``evaluate-final`` submitted, and logged; before the job fences itself (``_Context``)."""
    store, n = ctx.store, ctx.n
    claim = store.final_claim()
    if claim is None or int(claim["selection"]) != n:
        raise GovernanceRefusal(
            Outcome.reject("final-holdout-unclaimed"), f"no final evaluation claim for selection {n}; run `parcel-hpc evaluate-final`, which claims it"
        )
    plan = store.final_plan()
    pinned = {
        "contract_digest": ctx.contract.digest,
        "final_digest": ctx.split.final_digest,
        "metric": dict(ctx.contract["metric"]),
        "baseline": dict(ctx.contract["selection"]["baseline"]),
        "selection_revision": ctx.policy.revision,
    }
    for key, value in pinned.items():
        if plan.get(key) != value:
            raise GovernanceRefusal(
                Outcome.reject(f"final_plan_{key}"), f"the final evaluation plan pins {key}={plan.get(key)!r}, this evaluation has {value!r}"
            )
    if store.result(n, JobRole.RERUN) is None:
        raise UsageError(f"selection {n} has no rerun result; run `parcel-hpc select` first")
    # Only the job evaluate-final submitted last reads it (not one run by hand, nor an orphan whose
    # submitter died), and each read is logged, a requeued run's too.
    facts = facts_from_env()
    own = facts.raw_job_id or str(os.getpid())
    _wait_for_own_submission(store, n, own)
    store.writer("final-job").final_opened(FinalOpened(n, own, facts.host, facts.pid, facts.restart_count))
    # The one door to the protected partition (it verifies the file against the split it was sealed with).
    return load_final_partition(ctx.plan.snapshot_path, plan["final_path"], split=ctx.split)


def _final(ctx: _Context) -> dict[str, Any]:
    store, n = ctx.store, ctx.n
    plan, rerun, final = store.final_plan(), cast(dict[str, Any], store.result(n, JobRole.RERUN)), cast(Partition, ctx.final)  # _open_final read them
    columns = ctx.columns(final)
    scored = {}
    # Recorded by name: read through the held search (a released baseline lies outside it, by name).
    winner_dir, baseline_dir = anchor.resolve(rerun["artifact"]["path"]).parent, anchor.resolve(rerun["baseline"]["artifact"]["path"]).parent
    loaded = {
        "winner": _restored(ctx, lambda: ctx.trainer(ctx.plan.params), winner_dir, ctx.winner_identity),
        "baseline": _released(ctx)
        if ctx.baseline.kind is BaselineKind.ARTIFACT
        else _restored(ctx, lambda: ctx.baseline_trainer(ctx.plan.seed), baseline_dir, ctx.baseline_identity),
    }
    for which, artifact in (("winner", rerun["artifact"]), ("baseline", rerun["baseline"]["artifact"])):
        trainer, found = loaded[which]
        if anchor.shown(found.path) != artifact["path"] or file_digest(found.path) != artifact["sha256"]:
            raise GovernanceRefusal(Outcome.reject("artifact"), f"the {which} artifact {found.path} is not the one the selection checked ({artifact['path']})")
        scores = ctx.served(trainer, final.images, found.step, "final")
        rows = slice_report(scores, final.labels, columns, ctx.metric)
        scored[which] = {"metric": ctx.metric(scores, final.labels), "slices": [r.to_json() for r in rows], "artifact_sha256": artifact["sha256"]}
    return {
        "role": JobRole.FINAL.value,
        "selection": n,
        "trial_id": ctx.trial_id,
        "search_revision": plan["search_revision"],
        "final_digest": plan["final_digest"],
        "final_examples": int(len(final.labels)),
        "scored_through": "serve(raw final images)",
        "winner": scored["winner"],
        "baseline": scored["baseline"],
        "evaluated_at": time.time(),
    }

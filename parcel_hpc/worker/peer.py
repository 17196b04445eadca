"""A rank other than 0 of a trial's gang: its share of the training, nothing of the record.

Rank 0 (``attempt.py``) is the attempt: admission, the budget's reservation, the one claim on the
trial's checkpoint directory, the ledger, pruning, the scheduler's signal and the requeue. A peer says
hello on rank 0's channel and waits to be told to train (with the attempt's number, the directory
and the claim); the channel closed instead (rank 0 stopped before training: a rejection, a full
budget, a collision), it exits without having run trainer code. Told to train, it reads the same data, is
fenced from the final partition as rank 0 is, builds the same trainer and runs the same loop as a
``PeerRun``: every decision rank 0's, its part of each checkpoint written under rank 0's claim
(verified before each write). Its exception is reported to rank 0 with its traceback and failure
class, and is the trial's failure there; rank 0 gone (its process ended) ends this rank quietly.
Its last word, however its run ended, is what it read of its GPUs (rank 0 records the gang's). In a
slot shaped like the gang (``peer_slot``) it trains each trial rank 0 takes, told which by rank 0.

Must not: write the ledger, hold a claim of its own, or decide when to save, validate or stop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from parcel_hpc import fence
from parcel_hpc.checkpoints.claims import Claim, ClaimOutcome, ClaimRecord
from parcel_hpc.checkpoints.gang import GangCheckpoints
from parcel_hpc.data import read_split
from parcel_hpc.governance.admission import TrialIdentity
from parcel_hpc.ledger import SearchDir
from parcel_hpc.trainer import Devices, build_params, make_trainer, threads
from parcel_hpc.trainer.function import run_loop
from parcel_hpc.worker import attempt
from parcel_hpc.worker.cache import WorkerCache
from parcel_hpc.worker.devices import UtilizationSampler, device_use
from parcel_hpc.worker.gang import DISMISSED, FINAL_PARTITION, USED, GangEnv, Peer, PeerRun, RankHung, RankLost, Report, report_failure
from parcel_hpc.worker.jobenv import facts_from_env
from parcel_hpc.worker.plan import WorkerPlan
from parcel_hpc.worker.result import Ran, WorkerResult
from parcel_hpc.worker.signals import StepBoundarySignals
from parcel_hpc.worker.training import budget, step_hooks


class PeerAttempt:
    def __init__(self, plan: WorkerPlan, gang: GangEnv, cache: WorkerCache | None = None) -> None:
        self.plan, self.gang = plan, gang
        self.cache = cache or WorkerCache()  # a slot's: the snapshot read once, before the fence, for all its trials

    def execute(self) -> WorkerResult:
        plan, gang = self.plan, self.gang
        peer = Peer.connect(gang.master_addr, gang.channel_port, gang.rank, hang_s=plan.rank_wait_s, job=gang.job_id)
        try:
            told = peer.told(told_within_s(plan))
        except (RankLost, RankHung):
            return WorkerResult(plan.trial_id, Ran.STOPPED, f"rank {gang.rank}: rank 0 ended the attempt before training")
        return self.train(peer, told)

    def train(self, peer: Peer, told: Mapping[str, Any]) -> WorkerResult:
        """Its share of the attempt rank 0 told it to train (``told``: the attempt, its directory and claim)."""
        plan, gang = self.plan, self.gang
        if told.get("trial_id", plan.trial_id) != plan.trial_id:
            peer.close()
            raise RuntimeError(f"rank {gang.rank} was told to train {told.get('trial_id')!r} while running {plan.trial_id!r}")
        threads.bind(plan.cpus)
        search = SearchDir(Path(plan.search_dir))
        contract = search.contract()
        split = read_split(plan.split_path)
        data = self.cache.training_data(plan.snapshot_path, split, plan.preprocessing, 0)  # read before the fence, as rank 0 did
        fence.arm(fence.Protected.of(plan.split_path, plan.snapshot_path))
        facts = facts_from_env()
        asked: list[str] = []  # the partitions its trainer asked the loader for, as rank 0 keeps them
        data = replace(
            data, devices=Devices.from_env(None, facts.cuda_visible_devices), rank=gang.rank, world_size=gang.world_size, _asked_for_final=asked
        )  # its share of the GPUs: what it sees
        ckpt_dir = str(told["ckpt_dir"])
        claim = Claim(Path(ckpt_dir), ClaimOutcome.CLAIMED, ClaimRecord.from_json(told["claim"], ckpt_dir), None)  # rank 0's, verified before each part
        identity = TrialIdentity(plan.trial_id, plan.config_hash, contract.digest, contract["snapshot_digest"])
        checkpoints = GangCheckpoints(
            ckpt_dir, identity, rank=gang.rank, world_size=gang.world_size, attempt=int(told["attempt"]), keep_last=plan.keep_last, claim=claim
        )
        run: PeerRun | None = None
        sampler = UtilizationSampler(data.devices.visible).start()  # after the fence, as rank 0's: its thread is inside it
        with StepBoundarySignals() as held:  # the scheduler's signal here is told to rank 0, whose decision is the gang's
            try:
                trainer = make_trainer(contract["trainer"], search.path)
                data = replace(data, budget=budget(plan, type(trainer).unit))
                params = build_params(trainer, plan.params)
                trainer.build(params, plan.seed, data)
                run = PeerRun(params, plan.seed, data, peer, checkpoints, signalled=lambda: bool(held.pending))
                run.hooks = step_hooks()  # the tests' injected faults reach every rank
                run.final_requests = lambda: fence.reaches(asked)
                run_loop(trainer, run)
                run.writer.wait()  # this rank's part of the last save is durable before it exits
            except (RankLost, RankHung) as exc:
                if exc.rank == 0:  # rank 0 ended the gang (its failure, a peer's, a prune): it recorded why
                    return WorkerResult(plan.trial_id, Ran.STOPPED, f"rank {gang.rank}: {exc}")
                raise
            except Exception as exc:
                # The trial's failure, recorded by rank 0 with this rank's traceback; then this process exits,
                # which frees rank 0 from a collective this rank will never join.
                step = run.step if run is not None else 0  # the last step it told of
                if final := fence.reaches(asked):  # refused, caught or not: the trial's rejection, in these words
                    peer.report(Report(gang.rank, step, error="; ".join(final), cause=FINAL_PARTITION, at=time.time()))
                else:
                    report_failure(peer, step, exc, attempt.failure_class(exc).value)
                raise
            finally:
                self._tell_use(peer, sampler, data.devices.count, run.step if run is not None else 0)
                peer.close()
        stopped = run.stop.value if run.stop is not None else "completed"
        return WorkerResult(plan.trial_id, Ran.STOPPED, f"rank {gang.rank}: {stopped} at step {run.step}")

    def _tell_use(self, peer: Peer, sampler: UtilizationSampler, granted: int, step: int) -> None:
        """This rank's reading of its GPUs, its last word to rank 0 (which records the gang's); a
        reading that fails (the CUDA error that ended the run) is told as unread."""
        sampler.stop()
        try:
            use = device_use(granted, sampler)
        except Exception:
            use = None
        peer.report(Report(self.gang.rank, step, kind=USED, use=use))


def told_within_s(plan: WorkerPlan) -> float:
    """How long a peer waits for rank 0's word to train: rank 0's admission, reservation and claim come
    first (the claim may wait for an earlier attempt's process); rank 0's exit ends the wait at once."""
    return 60.0 * plan.time_limit_min


def peer_slot(search_dir: str, gang: GangEnv, rank_wait_s: float, wait_s: float) -> list[WorkerResult]:
    """A rank other than 0 of a slot shaped like the search's gangs: its share of each trial rank 0's
    slot takes, one after another, until rank 0 dismisses it (its slot is done) or is not there to
    be connected to within ``wait_s`` (its process gone). A trial rank 0 stopped before training (a
    refusal) is skipped here as there."""
    search, cache = SearchDir(Path(search_dir)), WorkerCache()
    results: list[WorkerResult] = []
    while True:
        try:
            peer = Peer.connect(gang.master_addr, gang.channel_port, gang.rank, hang_s=rank_wait_s, job=gang.job_id, connect_s=wait_s)
        except RankHung:
            return results
        try:
            told = peer.told(wait_s)
        except (RankLost, RankHung):
            peer.close()
            continue  # rank 0 ended that attempt before training (or is gone: the next connection says)
        if told.get(DISMISSED):
            peer.close()
            return results
        plan = WorkerPlan.load(search, str(told["trial_id"]))
        results.append(PeerAttempt(plan, gang, cache).train(peer, told))

"""A gang's ranks as runs (parcel_hpc.worker.gang: PeerRun and rank 0's LeaderSide) over the real
channel and the gang's checkpoints, two ranks in two threads of this process, each the toolkit's own
loop over the built-in trainer: a signal on one rank stops both at the same step with both parts
committed, and the resumed gang ends exactly where the uninterrupted one did; a peer's exception is
rank 0's failure with the peer's traceback."""

import socket
import threading
from dataclasses import replace

import numpy as np
import pytest

from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.checkpoints.gang import GANG_KEY, GangCheckpoints
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.governance.admission import TrialIdentity
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.trainer import Budget, TrainerState, build_params
from parcel_hpc.trainer.numpy_mlp import NumpyMLP
from parcel_hpc.trainer.run import Restored, Run, Stop, drive
from parcel_hpc.worker.gang import Leader, LeaderSide, Peer, PeerRun, RankFailed, report_failure

T = TrialIdentity("t0001", "sha256:" + "a" * 64, "sha256:" + "c" * 64, "sha256:" + "d" * 64)
PARAMS = {"lr": 0.05, "hidden": 8, "batch_size": 32}
STEPS, MILESTONES = 30, (10, 20, 30)


class RankZero(Run):
    """Rank 0 as the worker's run will be: its own part and the commit, the gang's decisions sent."""

    def __init__(self, params, seed, data, score, side, checkpoints):
        super().__init__(params, seed, data, score)
        self.side, self.checkpoints, self.values = side, checkpoints, {}
        self.writer = BackgroundWriter(checkpoints)

    def _restore(self):
        found = self.checkpoints.load_latest()
        extra = {k: v for k, v in (found.own.extra or {}).items() if k != GANG_KEY} if found else {}
        return Restored(found.manifest.step, TrainerState(found.own.params, extra)) if found else None

    def _stepped(self, step):
        return None

    def _agreed(self, step, due, stop):
        return self.side.after_step(self, step, due, stop)

    def _save(self, step, state):
        self.writer.submit(step, state.arrays, {}, {}, extra=state.scalars)

    def _validated(self, step, value, final, metrics):
        self.values[step] = value

    def _agreed_after_validation(self, step, stop):
        return self.side.after_validation(step, stop)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broken(NumpyMLP):
    def step(self):
        if getattr(self, "_calls", 0) == 4:
            raise FloatingPointError("rank 1's loss went to inf")
        self._calls = getattr(self, "_calls", 0) + 1
        return super().step()


def _gang(tmp_path, training_data, attempt, *, peer_signal_at=None, peer_trainer=NumpyMLP):
    """One attempt of a 2-rank gang; (rank 0's run, rank 1's run, rank 1's trainer, rank 1's error)."""
    data = replace(training_data, budget=Budget(STEPS, MILESTONES, Cadence(every_steps=STEPS), "step"))
    metric = MissCost("miss-cost-r3", 5.0, 1.0)
    port, out = _port(), {}

    def rank_one():
        try:
            trainer = peer_trainer()
            trainer.build(build_params(trainer, PARAMS), 7, data)
            peer = Peer.connect("127.0.0.1", port, 1, hang_s=30, job="7")
            run = out["peer"] = PeerRun(
                PARAMS, 7, data, peer, GangCheckpoints(tmp_path, T, rank=1, world_size=2, attempt=attempt), signalled=lambda: run.step == peer_signal_at
            )
            out["trainer"] = trainer
            try:
                drive(trainer, run)
            except Exception as exc:
                report_failure(peer, run.step, exc, "exception")
                raise
            run.writer.wait()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=rank_one)
    thread.start()
    trainer = NumpyMLP()
    trainer.build(build_params(trainer, PARAMS), 7, data)
    side = LeaderSide(Leader.open(port, 2, hang_s=30, job="7"))
    run = RankZero(PARAMS, 7, data, lambda s: metric(s, data.validation.labels), side, GangCheckpoints(tmp_path, T, rank=0, world_size=2, attempt=attempt))
    try:
        drive(trainer, run)
        run.writer.wait()
    finally:
        side.leader.close()
        thread.join(timeout=60)
    return run, out.get("peer"), out.get("trainer"), out.get("error"), trainer


def test_a_signal_on_one_rank_stops_the_gang_at_one_step_and_the_resumed_gang_ends_as_the_uninterrupted(tmp_path, training_data):
    whole, _, whole_peer_trainer, error, _ = _gang(tmp_path / "whole", training_data, 1)
    assert error is None and set(whole.values) == set(MILESTONES)

    first, peer, _, error, _ = _gang(tmp_path / "cut", training_data, 1, peer_signal_at=13)
    assert error is None and first.stop is Stop.REQUEUE and first.step == 15 and peer.step == 15 and peer.stop is Stop.REQUEUE
    committed = GangCheckpoints(tmp_path / "cut", T, rank=0, world_size=2, attempt=2).newest_complete()
    assert committed.step == 15 and committed.attempt == 1  # both parts, rank 0's commit

    second, peer, peer_trainer, error, trainer = _gang(tmp_path / "cut", training_data, 2)
    assert error is None and second.step == STEPS
    assert second.values == {s: v for s, v in whole.values.items() if s > 15}  # bit for bit, after the resume
    for name, arr in whole_peer_trainer.state().arrays.items():
        assert np.array_equal(arr, peer_trainer.state().arrays[name]), name  # rank 1 too


def test_a_peers_exception_is_rank_0s_failure_with_the_peers_traceback(tmp_path, training_data):
    with pytest.raises(RankFailed, match="rank 1 failed after step 4: FloatingPointError: rank 1's loss went to inf") as failed:
        _gang(tmp_path, training_data, 1, peer_trainer=Broken)
    assert "Traceback" in failed.value.traceback and "in step" in failed.value.traceback

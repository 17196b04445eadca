"""Lightning's ``Trainer.fit`` over a gang's ranks (issue 50) on the local executor: examples/parcel_lightning
unchanged, as one trial of 2 ranks, each a process submitit started, trained as Lightning's
DistributedDataParallel over ``governed.environment()``. Every rank saves its own Lightning checkpoint
as its part of the trial's checkpoint (the same weights on each: replicas); the scheduler's signal on
rank 1 mid-epoch requeues the gang whole, and each rank resumes from its own part to the uninterrupted
gang's weights bit for bit."""

import json

import pytest
from reference import lightning_weights, local_gang, same_tensors, two_rank_trial, uninterrupted_gang

from parcel_hpc.ledger import AttemptEnd, Cause, TrialState
from parcel_hpc.testing import faults

pytest.importorskip("lightning")
pytest.importorskip("torch")

pytestmark = pytest.mark.xdist_group("lightning-gang-local")  # one worker: the uninterrupted gang once

STEPS = 40  # 891 train frames in the gang's batches of 32: 28 steps an epoch, so a stop near step 12 is mid-epoch
GANG = two_rank_trial("parcel_lightning:train", batch_size=32, lr=0.03, steps=STEPS)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, artifacts):
    search = uninterrupted_gang(tmp_path_factory, artifacts, "lg", GANG)
    return search, search.record("t0000")


def test_a_lightning_gang_trains_ddp_over_its_ranks_each_saving_its_own_part(whole):
    search, record = whole
    assert record.state is TrialState.COMPLETED and len(record.attempts) == 1
    manifest = json.loads((search.path / "checkpoints" / "t0000" / f"ckpt-{STEPS:06d}.manifest.json").read_text())
    assert manifest["world_size"] == 2 and [part[0] for part in manifest["parts"]] == [0, 1]
    assert same_tensors(
        lightning_weights(search.path, STEPS, 0), lightning_weights(search.path, STEPS, 1)
    )  # DDP's replicas: each rank's own file, the same weights
    job = record.attempts[0].job_id
    said = (search.submitit_dir / "local" / f"{job}_0_log.err").read_text() + (search.submitit_dir / "local" / f"{job}_0_log.out").read_text()
    assert "Starting with 2 processes" in said  # Lightning's DDP over the gang's two processes, not two lone trainers


def test_a_lightning_gang_signalled_on_rank_1_mid_epoch_resumes_every_rank_bit_equal(tmp_path, data_dir, whole):
    search = local_gang(tmp_path, data_dir, "lg", GANG, faults.rank_fault_env(tmp_path / "markers", "1:12:signal"))
    record = search.record("t0000")
    first, second = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.TIMEOUT) and 12 < first.step < 28
    assert second.resumed_from == first.step and record.state is TrialState.COMPLETED
    for rank in (0, 1):
        assert same_tensors(lightning_weights(search.path, STEPS, rank), lightning_weights(whole[0].path, STEPS, rank))
    assert record.metric == whole[1].metric

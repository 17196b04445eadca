"""Hugging Face's ``Trainer.train`` over a gang's ranks (issue 50) on the local executor: examples/parcel_hf
unchanged, as one trial of 2 ranks, each a process submitit started, trained as the Trainer's own
DistributedDataParallel (accelerate over gloo). Rank 0's part of each checkpoint holds what the Trainer
wrote on rank 0 (model, optimizer, scheduler, state, its generators), rank 1's its own generators. The
same script with one output_dir for both ranks, signalled on rank 1 mid-epoch, is requeued whole, and
every rank resumes from rank 0's part with its own generators beside it, to the uninterrupted gang's
weights and metric bit for bit."""

import json

import pytest
from reference import EXAMPLES, hf_checkpoint, hf_weights, local_gang, same_tensors, two_rank_trial, uninterrupted_gang

from parcel_hpc.ledger import AttemptEnd, Cause, TrialState
from parcel_hpc.testing import faults

pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("hf-gang-local")  # one worker: the uninterrupted gang once

STEPS = 40  # 891 train frames in the gang's batches of 2 x 16: 28 steps an epoch, so a stop near step 12 is mid-epoch
GANG = two_rank_trial("parcel_hf:train", batch_size=16, lr=0.003, steps=STEPS)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, artifacts):
    search = uninterrupted_gang(tmp_path_factory, artifacts, "hg", GANG)
    return search, search.record("t0000")


def test_an_hf_gang_trains_ddp_over_its_ranks_rank_0_saving_the_replicated_state(whole):
    search, record = whole
    assert record.state is TrialState.COMPLETED and len(record.attempts) == 1
    rank_0, rank_1 = hf_checkpoint(search.path, STEPS, 0), hf_checkpoint(search.path, STEPS, 1)
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state_0.pth"} <= set(rank_0)
    assert set(rank_1) == {"rng_state_1.pth"}  # DDP's replicas: rank 1 adds only its own generators
    # The Trainer's epochs are the gang's: 28 steps of 2 x 16 frames each (two lone Trainers would take 56 of 16).
    assert json.loads(rank_0["trainer_state.json"])["epoch"] == pytest.approx(STEPS / 28)


def test_an_hf_gang_sharing_one_output_dir_signalled_on_rank_1_mid_epoch_resumes_every_rank_bit_equal(tmp_path, data_dir, whole):
    # The example with one output_dir for both ranks, as a script on a shared folder has it: each rank
    # takes only its own files of checkpoint-N/ once every rank has written, and nothing is left there.
    shared, package = tmp_path / "out", tmp_path / "pkg" / "shared_hf"
    shared.mkdir()  # before the launch: the fence leaves no rights on what appears beside the data folder after it arms
    package.mkdir(parents=True)
    source = (EXAMPLES / "parcel_hf" / "train.py").read_text()
    private = "with tempfile.TemporaryDirectory() as output_dir:"
    assert private in source
    (package / "__init__.py").write_text(
        source.replace(private, f"with contextlib.nullcontext({str(shared)!r}) as output_dir:").replace(
            "import tempfile\n", "import contextlib\nimport tempfile\n"
        )
    )
    overrides = [*(o for o in GANG if not o.startswith("trainer.target=")), "trainer.target=shared_hf:train"]
    env = {**faults.rank_fault_env(tmp_path / "markers", "1:12:signal"), "PYTHONPATH": f"{tmp_path / 'pkg'}:{EXAMPLES}"}
    search = local_gang(tmp_path, data_dir, "hg", overrides, env)
    record = search.record("t0000")
    first, second = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.TIMEOUT) and 12 < first.step < 28
    assert second.resumed_from == first.step and record.state is TrialState.COMPLETED
    assert same_tensors(hf_weights(search.path, STEPS), hf_weights(whole[0].path, STEPS))
    assert hf_checkpoint(search.path, STEPS, 1) == hf_checkpoint(whole[0].path, STEPS, 1)  # rank 1's generators, where they ended
    assert record.metric == whole[1].metric
    assert shared.is_dir() and not list(shared.glob("checkpoint-*"))

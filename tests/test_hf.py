"""The Hugging Face callback's pieces (issue 46): TrainingArguments the governance cannot work with,
named with their fix; binary logits to probabilities; and an unchanged Trainer told by a run what is
due: the signal saves the Trainer's checkpoint into the run's and leaves, pruning leaves unsaved."""

import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from transformers import EvalPrediction, TrainingArguments, ViTConfig, ViTForImageClassification  # noqa: E402  # after the skip: transformers is an optional extra

from parcel_hpc.checkpoints.cadence import Cadence  # noqa: E402
from parcel_hpc.integrations.huggingface import Governed, resume_from, saved_checkpoint  # noqa: E402
from parcel_hpc.integrations.huggingface.governed import probabilities, saved_by, ungovernable  # noqa: E402
from parcel_hpc.trainer import Budget, Restored, Stop, TrainerState, build_params  # noqa: E402
from parcel_hpc.trainer.preflight import few_examples  # noqa: E402
from parcel_hpc.trainer.resume import check_resume  # noqa: E402
from parcel_hpc.trainer.run import LoopError, Run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import parcel_hf  # noqa: E402  # the example, from examples/

STEPS, SEED = 6, 7


def arguments(tmp_path, **changed):
    given = {"output_dir": str(tmp_path), "max_steps": STEPS, "seed": SEED, "save_strategy": "no", "report_to": "none", **changed}
    return TrainingArguments(**given)


@pytest.mark.parametrize(
    "changed, named",
    [
        ({}, None),
        ({"report_to": "tensorboard"}, None),
        ({"max_steps": 5}, "TrainingArguments(max_steps=5) is not the trial's length 6; set max_steps=run.budget.steps"),
        ({"save_strategy": "steps"}, "TrainingArguments(save_strategy='steps') saves on its own cadence; set save_strategy='no'"),
        ({"seed": 42}, "TrainingArguments(seed=42, data_seed=None) is not the trial's seed 7; set seed=run.seed"),
        ({"data_seed": 3}, "TrainingArguments(seed=7, data_seed=3) is not the trial's seed 7; set seed=run.seed"),
        ({"save_only_model": True}, "TrainingArguments(save_only_model=True) saves no optimizer, scheduler or RNGs, so nothing resumes"),
        ({"ignore_data_skip": True}, "TrainingArguments(ignore_data_skip=True) replays consumed batches on resume; leave it False"),
        ({"report_to": ["mlflow", "tensorboard"]}, "TrainingArguments(report_to=['mlflow']) sends the run elsewhere; set report_to='none'"),
        ({"push_to_hub": True}, "TrainingArguments(push_to_hub=True) sends the run elsewhere"),
    ],
)
def test_training_arguments_the_governance_cannot_work_with_are_named_with_their_fix(tmp_path, changed, named):
    found = ungovernable(arguments(tmp_path, **changed), STEPS, SEED)
    assert found is None if named is None else found is not None and found.startswith(named), found


def test_a_gang_s_trainer_must_run_over_the_gang_s_ranks_as_ddp(tmp_path):
    # Built in a process with no gang's environment, the Trainer is one process of its own.
    alone = ungovernable(arguments(tmp_path), STEPS, SEED, world_size=2)
    assert alone is not None and alone.startswith("the Trainer runs on 1 process(es) and the trial is a gang of 2 ranks"), alone
    ddp = SimpleNamespace(**{**vars(arguments(tmp_path)), "world_size": 2})
    assert ungovernable(ddp, STEPS, SEED, world_size=2) is None
    for sharded in ({"fsdp": "full_shard"}, {"deepspeed": "ds.json"}):
        found = ungovernable(SimpleNamespace(**{**vars(ddp), **sharded}), STEPS, SEED, world_size=2)
        assert found is not None and found.startswith("TrainingArguments(fsdp/deepspeed) shards the model across the gang"), found


def test_each_rank_keeps_the_files_it_wrote_of_the_trainer_s_checkpoint():
    written = [
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.json",
        "rng_state_0.pth",
        "rng_state_1.pth",
        "rng_state_12.pth",
    ]
    assert [n for n in written if saved_by(n, 0)] == written[:6]
    assert [n for n in written if saved_by(n, 1)] == ["rng_state_1.pth"] and [n for n in written if saved_by(n, 12)] == ["rng_state_12.pth"]
    assert saved_by("rng_state.pth", 0) and not saved_by("rng_state.pth", 1)  # one rank's Trainer names it so


def test_binary_logits_give_the_positive_class_probability():
    two = np.array([[0.0, 0.0], [0.0, 1000.0], [3.0, 1.0]])
    assert np.allclose(probabilities(two), [0.5, 1.0, 1 / (1 + np.exp(2.0))])
    assert np.allclose(probabilities((np.array([[0.0], [2.0]]), "hidden states")), [0.5, 1 / (1 + np.exp(-2.0))])
    with pytest.raises(Exception, match=r"logits have shape \(2, 3\)"):
        probabilities(np.zeros((2, 3)))


class Told(Run):
    """A run that keeps what it is told; ``stop``: what it answers at ``at`` (the signal's REQUEUE at a step, PRUNED at a validation)."""

    def __init__(self, data, params, stop=None, at=0, restored=None):
        super().__init__(params, SEED, data, lambda scores: float(np.mean(scores)))
        self.stop_with, self.at, self.restored = stop, at, restored
        self.steps: list[tuple[int, Mapping[str, float]]] = []
        self.saves: dict[int, TrainerState] = {}
        self.validated: list[int] = []

    def _restore(self):
        return self.restored

    def _stepped(self, step):
        self.steps.append((step, dict(self._metrics)))
        return Stop.REQUEUE if self.stop_with is Stop.REQUEUE and step == self.at else None

    def _save(self, step, state):
        assert step not in self.saves, f"saved twice at step {step}"
        self.saves[step] = state

    def _validated(self, step, value, final, metrics):
        self.validated.append(step)
        return Stop.PRUNED if self.stop_with is Stop.PRUNED and step == self.at else None


@pytest.fixture(scope="module")
def small(training_data):
    return replace(few_examples(training_data), budget=Budget(STEPS, (2,), Cadence(every_steps=3), "step"))


def trained(small, batch_size=8, **told):
    trainer = parcel_hf.train()
    params = build_params(trainer, {"lr": 0.01, "batch_size": batch_size})
    run = Told(small, params, **told)
    parcel_hf.train.function(run)
    return run


def test_the_signal_saves_the_trainers_checkpoint_into_the_runs_and_leaves(small):
    # 16 of 32 examples a batch: every second step ends an epoch, where the Trainer logs, evaluates and
    # saves again if asked; the milestone (2), the signal (4) and the last step (6) each fall there.
    run = trained(small, batch_size=16, stop=Stop.REQUEUE, at=4)
    assert [s for s, _ in run.steps] == [1, 2, 3, 4] and run.validated == [2] and sorted(run.saves) == [3, 4]
    assert set(run.steps[1][1]) == {"loss", "grad_norm", "learning_rate"} and set(run.steps[0][1]) == {"learning_rate"}  # the milestone's log
    names = {n.split("/", 2)[-1] for n in run.saves[4].arrays}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= names
    with saved_checkpoint(run.saves[4]) as checkpoint:
        assert '"global_step": 4' in (checkpoint / "trainer_state.json").read_text()
    # The rest of the trial, resumed by the Trainer from the run's checkpoint, at step 5.
    rest = trained(small, batch_size=16, restored=Restored(4, run.saves[4]))
    assert [s for s, _ in rest.steps] == [5, 6] and rest.validated == [6] and sorted(rest.saves) == [6]
    # Served from the last saved state alone (the example's load: from_pretrained on the Trainer's checkpoint).
    served = parcel_hf.train.loader(rest.saves[6], rest.params, SEED, small)(small.validation.images)
    assert served.shape == (len(small.validation),) and np.isclose(np.mean(served), rest.value, rtol=0, atol=1e-6)


def test_a_signal_at_a_milestone_hands_the_milestone_then_saves_and_leaves(small):
    run = trained(small, stop=Stop.REQUEUE, at=2)  # mid-epoch (4 steps an epoch), at the milestone
    assert [s for s, _ in run.steps] == [1, 2] and run.validated == [2] and sorted(run.saves) == [2]


def test_a_pruned_trainer_leaves_at_the_milestone_without_saving(small):
    run = trained(small, stop=Stop.PRUNED, at=2)
    assert [s for s, _ in run.steps] == [1, 2] and run.validated == [2] and run.saves == {}


def test_a_trainer_not_resumed_from_the_runs_checkpoint_is_refused(small, monkeypatch):
    saved = trained(small, stop=Stop.REQUEUE, at=3).saves[3]

    @contextmanager
    def forgotten(run):  # restores the run, hands the Trainer nothing
        run.restore()
        yield None

    monkeypatch.setattr(sys.modules["parcel_hf.train"], "resume_from", forgotten)
    with pytest.raises(LoopError, match="the Trainer starts at step 0 and the run's last checkpoint is step 3; train inside `with resume_from"):
        trained(small, restored=Restored(3, saved))
    with pytest.raises(LoopError, match="the state holds no Trainer checkpoint"):
        with resume_from(Told(small, {}, restored=Restored(3, TrainerState({"w": np.zeros(1)})))):
            pass


def test_an_eval_set_other_than_the_runs_validation_in_order_is_refused(small):
    governed = Governed(Told(small, {}))
    labels = np.asarray(small.validation.labels).astype(np.int64)
    logits = np.zeros((len(labels), 2))
    assert governed.compute_metrics(EvalPrediction(predictions=logits, label_ids=labels)) == {}
    for wrong in (labels[::-1], labels[1:]):
        with pytest.raises(
            LoopError, match="the Trainer's eval_dataset is not the run's validation examples in their order; build it from run.data.validation"
        ):
            governed.compute_metrics(EvalPrediction(predictions=logits[: len(wrong)], label_ids=wrong))


def test_the_resume_check_refuses_a_vit_whose_trainer_resume_drops_its_encoder_weights(small, monkeypatch):
    # transformers 5.25 writes a ViT's checkpoint under the v4 weight names and the Trainer loads it
    # with strict=False: the resumed run trains on freshly initialised encoder layers (the ResNet of
    # the example resumes bit-exact: every launch of it passes this check in its preflight).
    def vit(width):
        config = ViTConfig(
            image_size=32,
            patch_size=8,
            num_channels=1,
            hidden_size=width,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=2 * width,
            num_labels=2,
        )
        return ViTForImageClassification(config)

    monkeypatch.setattr(sys.modules["parcel_hf.train"], "model", vit)
    found = check_resume(parcel_hf.train, build_params(parcel_hf.train(), {"lr": 0.003, "batch_size": 8}), 0, small)
    assert not found.exact and found.detail.startswith("a resumed run parts from the uninterrupted one at step "), found
    assert "files/checkpoint/model.safetensors" in found.detail

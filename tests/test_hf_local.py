"""A Hugging Face ``Trainer`` kept unchanged (examples/parcel_hf) on the local executor (issue 46): a
search with pruning whose completed trials end with the uninterrupted metric, a trial signalled mid-epoch
resumed by the Trainer itself to exactly the uninterrupted metric, and TrainingArguments that would
fight the governance refused at the launch in one line."""

import functools
import math
import shutil
from pathlib import Path

import pytest
from reference import reference_run

from parcel_hpc.ledger import MetricResume, SearchDir
from parcel_hpc.testing import launch
from parcel_hpc.testing.runs import signalled_once

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
TARGET = "parcel_hf:train"
ENV = {"PYTHONPATH": str(ROOT / "examples")}
SPACE = ["~space.params.hidden", "~space.params.l2", "batch_size=choice(16,32)", "lr=choice(0.003,0.03)", "train.steps=60"]


pytestmark = pytest.mark.xdist_group("hf-local")  # one worker runs the module: the HF search once, not once a worker


@pytest.fixture(scope="module")
def uninterrupted(artifacts):
    """The metric a trial's params reach in 60 uninterrupted steps, computed in this process."""
    return functools.partial(reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"]), steps=60)


def test_a_search_of_an_unchanged_hf_trainer_prunes_and_completes_with_the_uninterrupted_metric(tmp_path_factory, artifacts, uninterrupted):
    # One trial at a time: the large learning rate with the small batch is behind its peers at step 40.
    root = tmp_path_factory.mktemp("hf")
    shutil.copytree(artifacts["dir"], root / "data")
    args = [f"search.root={root / 'runs'}", "search.revision=hf", f"trainer.target={TARGET}", "search.n_trials=6", *SPACE]
    args += ["hydra.launcher.parallelism=1", "pruner.milestones=[40,60]", "pruner.min_peers=1"]
    res = launch(args, cwd=root, data_dir=root / "data", env=ENV)  # its preflight ran the resume check on the example
    assert res.returncode == 0, res.stderr[-2000:]
    search = SearchDir(root / "runs" / "hf")
    records = list(search.records())
    states = [r.state.value for r in records]
    assert "pruned" in states and "completed" in states and set(states) <= {"pruned", "completed"}, states
    for r in records:
        milestones = [e.data for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        assert milestones[0].step == 40 and set(milestones[0].train) == {"loss", "grad_norm", "learning_rate"}  # the Trainer's log of that step
        if r.state.value == "completed":
            assert r.metric == uninterrupted(r.spec.params) and r.metric_resume is MetricResume.UNINTERRUPTED
        else:
            assert [m.step for m in milestones] == [40]  # left at the milestone, without training on


def test_a_signalled_hf_trainer_saves_mid_epoch_and_the_trainer_resumes_exactly(tmp_path, data_dir, uninterrupted, training_data):
    # The flag is read at the Trainer's next step end: it saves checkpoint-N/, the run takes it, the
    # Trainer leaves; the rerun hands it back to trainer.train(resume_from_checkpoint=...), which
    # restores optimizer, scheduler and RNGs and skips the epoch's batches already trained.
    # One point (one corner for the preflight); 28 steps an epoch: the signal comes after the checkpoint at step 10.
    space = [o.replace("choice(16,32)", "choice(32)").replace("choice(0.003,0.03)", "choice(0.03)") for o in SPACE]
    overrides = [f"trainer.target={TARGET}", "pruner=none", "train.step_seconds=0.15", *space]
    rec = signalled_once(overrides, cwd=tmp_path, data_dir=data_dir, env=ENV, first_checkpoint_within=300)  # transformers takes seconds to import
    per_epoch = math.ceil(len(training_data.train) / int(rec.spec.params["batch_size"]))
    assert 1 <= rec.attempts[0].step < 60 and rec.attempts[0].step % per_epoch != 0, (rec.attempts[0].step, per_epoch)
    assert rec.metric == uninterrupted(rec.spec.params)


def test_training_arguments_that_would_fight_the_governance_are_refused_at_the_launch(tmp_path, data_dir):
    # The example with the Trainer's own save cadence: the callback refuses it at train begin, in the preflight.
    fights = tmp_path / "pkg" / "fights"
    fights.mkdir(parents=True)
    source = (ROOT / "examples" / "parcel_hf" / "train.py").read_text()
    assert 'save_strategy="no"' in source
    (fights / "__init__.py").write_text(source.replace('save_strategy="no"', 'save_strategy="steps"'))
    env = {"PYTHONPATH": f"{tmp_path / 'pkg'}:{ROOT / 'examples'}"}
    res = launch(
        [f"search.root={tmp_path / 'runs'}", "search.revision=fights", "trainer.target=fights:train", "pruner=none", *SPACE],
        cwd=tmp_path,
        data_dir=data_dir,
        env=env,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stdout + res.stderr
    assert "preflight: fights:train fails with" in res.stderr
    assert "UngovernableArguments: TrainingArguments(save_strategy='steps') saves on its own cadence; set save_strategy='no'" in res.stderr
    assert not (tmp_path / "runs").exists()  # nothing frozen

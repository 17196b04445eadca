"""A training loop kept as it is, as a SLURM array search on the dev cluster, in each form that keeps
its owner's loop: the function form (examples/parcel_loop, a plain PyTorch loop) and Lightning's
``Trainer.fit`` (examples/parcel_lightning, the ``Governed`` callback). Trials preempted mid-run by a
high-priority job read the scheduler's signal as a flag at their next step, save there (Lightning:
its own checkpoint, mid-epoch), are requeued, resume, and report at every milestone exactly the
values of an uninterrupted run, their records saying the metric was resumed exactly. On the CPU
(resources.gpus=0), as tests/slurm/test_slurm_cnn.py; the Hugging Face form has its own test
(test_slurm_hf.py)."""

import importlib.util
from dataclasses import dataclass

import pytest
from reference import EXAMPLES, reference_run

from parcel_hpc.ledger import MetricResume, SearchDir
from parcel_hpc.testing import launch

from .cluster import PREEMPTOR, preempt, wait_for
from .examples import preempted_and_resumed, running_past

pytestmark = pytest.mark.slurm

MILESTONES = (10, 20, 41, 82)  # pruner=none's grid, validated all the same
STEPS = 100


@dataclass(frozen=True)
class Form:
    target: str
    space: tuple[str, ...]
    trials: int
    step_seconds: float
    per_epoch: int = 0  # > 0: a preemption must fall mid-epoch (that many steps an epoch)


FORMS = {
    "loop": Form("parcel_loop:train", ("batch_size=choice(16,32)", "lr=choice(0.0003,0.03)"), trials=3, step_seconds=0.08),
    # One trial at one corner: Lightning's import costs every process about 10 s of CPU. 891 train frames in batches of 16.
    "lightning": Form("parcel_lightning:train", ("batch_size=choice(16)", "lr=choice(0.03)"), trials=1, step_seconds=0.1, per_epoch=56),
}


def _form(name: str, needs: str):
    missing = importlib.util.find_spec(needs) is None  # the extra scripts/test.sh installs beside the CPU torch
    return pytest.param(FORMS[name], id=name, marks=pytest.mark.skipif(missing, reason=f"needs {needs}"))


@pytest.mark.parametrize("form", [_form("loop", "torch"), _form("lightning", "lightning")])
def test_a_loop_kept_as_it_is_preempted_on_slurm_resumes_with_every_milestone_exact(form, tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    revision = form.target.partition(":")[0].removeprefix("parcel_")
    names += [f"parcel-{revision}", PREEMPTOR]
    args = ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", f"search.revision={revision}", f"trainer.target={form.target}"]
    args += [f"search.n_trials={form.trials}", "~space.params.hidden", "~space.params.l2", *form.space, f"train.steps={STEPS}", "pruner=none"]
    args += [f"hydra.launcher.array_parallelism={form.trials}", "resources.gpus=0", f"train.step_seconds={form.step_seconds}", "search.wait=false"]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env={"PYTHONPATH": str(EXAMPLES)})  # sbatch passes the launch's environment to the jobs
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / revision)

    node = wait_for(lambda: running_past(search, 20), 120, "a running trial with a checkpoint at step >= 20")
    preempt(node, "--exclusive")  # every trial on that node: its whole CPU
    wait_for(lambda: all(search.record(t).state.is_finished() for t in search.trial_ids()), 300, "every trial to finish")

    records = list(search.records())
    assert {r.state.value for r in records} == {"completed"}, [(r.trial_id, r.state.value, r.reason) for r in records]
    preempted = {r.trial_id: r for r in preempted_and_resumed(records)}
    if form.per_epoch:
        assert any(a.step % form.per_epoch for r in preempted.values() for a in r.attempts[:-1]), "no trial was preempted mid-epoch"
    reference = reference_run(form.target, data_dir / "parcels.h5", data_dir / "split-group_r8.json")
    for r in records:
        expected = reference(r.spec.params, STEPS, milestones=MILESTONES)
        reported = [(e.data.step, e.data.value) for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        # every milestone each attempt reported, the resumed ones' included, bit-equal to the uninterrupted run's
        assert {s for s, _ in reported} == set(expected) and all(v == expected[s] for s, v in reported), (r.trial_id, reported, expected)
        assert r.metric == expected[STEPS]
        assert r.metric_resume is (MetricResume.EXACT if r.trial_id in preempted else MetricResume.UNINTERRUPTED), r.trial_id

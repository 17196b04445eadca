"""Lightning's ``Trainer.fit`` unchanged under the governance (issue 46): the ``Governed`` callback's
pure pieces, a Trainer that cannot be governed refused with the setting and the fix, the launch's
resume check passing the example mid-epoch and naming a drifting variant's missing piece, the
example's local search with pruning, and a signalled trial resumed to exactly the uninterrupted metric."""

import functools
import random
import shutil
import sys
import textwrap

import numpy as np
import pytest
from reference import EXAMPLES, Uninterrupted, reference_run

from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import MetricResume, SearchDir
from parcel_hpc.testing import launch
from parcel_hpc.testing.runs import signalled_once
from parcel_hpc.trainer import Budget, Stop, TrainerState, run_loop
from parcel_hpc.trainer import rng as process_rng
from parcel_hpc.trainer.params import with_defaults
from parcel_hpc.trainer.preflight import few_examples, preflight
from parcel_hpc.trainer.resume import check_resume

L = pytest.importorskip("lightning")  # the [lightning] extra; scripts/test.sh installs it beside the CPU torch
torch = pytest.importorskip("torch")

from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment  # noqa: E402

from parcel_hpc.integrations.lightning import Governed, ResumableLoader, Ungoverned  # noqa: E402
from parcel_hpc.integrations.lightning.callback import Requeue, Setup, decode_rngs, encode_rngs, refusal, setup_of, unresumable, unshared  # noqa: E402
from parcel_hpc.integrations.lightning.environment import RanksEnvironment  # noqa: E402
from parcel_hpc.integrations.lightning.loader import ResumableBatchSampler  # noqa: E402

TARGET = "parcel_lightning:train"
ENV = {"PYTHONPATH": str(EXAMPLES)}
SPACE = ["~space.params.hidden", "~space.params.l2", "batch_size=choice(32)", "lr=choice(0.0003,0.03)", "train.steps=100"]


# --- pure pieces ----------------------------------------------------------------------------------

GOOD = Setup(max_steps=120, max_epochs=-1, requeue=Requeue.OFF, processes=1)


@pytest.mark.parametrize(
    "setup, says",
    [
        (GOOD, None),
        (Setup(120, -1, Requeue.LIGHTNING, 1), "requeues by itself (auto_requeue=True"),
        (Setup(120, -1, Requeue.UNSAID, 1), "names no cluster environment, so under SLURM Lightning requeues by itself"),
        (Setup(100, -1, Requeue.OFF, 1), "Trainer(max_steps=100) but the trial trains run.budget.steps=120; pass max_steps=run.budget.steps"),
        (Setup(120, 5, Requeue.OFF, 1), "Trainer(max_epochs=5) can end training before run.budget.steps; pass max_epochs=-1"),
        (Setup(120, -1, Requeue.OFF, 2, devices=2), "the Trainer's flags make 2 process(es) of 2 device(s) each, but the trial is 1 rank(s)"),
        # A gang (issue 50): its ranks are the processes parcel_hpc started, each Lightning's node of one device.
        (Setup(120, -1, Requeue.OFF, 4, gang=4, ranks_environment=True), None),
        (Setup(120, -1, Requeue.OFF, 4, gang=4), "the trial is a gang of 4 ranks that parcel_hpc starts, one process each, but the Trainer's cluster"),
        (Setup(120, -1, Requeue.OFF, 1, gang=4, ranks_environment=True), "make 1 process(es) of 1 device(s) each, but the trial is 4 rank(s)"),
        (Setup(120, -1, Requeue.OFF, 8, gang=4, devices=2, ranks_environment=True), "pass devices=1, num_nodes=run.world_size"),
        (Setup(120, -1, Requeue.OFF, 4, gang=4, ranks_environment=True, distributed_sampler=True), "pass use_distributed_sampler=False"),
    ],
)
def test_a_trainer_that_cannot_be_governed_is_refused_with_the_setting_and_the_fix(setup, says):
    why = refusal(setup, 120)
    assert why is None if says is None else says in why


@pytest.mark.parametrize(
    "plugins, requeue",
    [
        ([], Requeue.UNSAID),
        ([SLURMEnvironment()], Requeue.LIGHTNING),
        ([SLURMEnvironment(auto_requeue=False)], Requeue.OFF),
        ([LightningEnvironment()], Requeue.OFF),
    ],
)
def test_the_setup_is_read_from_a_real_trainer(plugins, requeue):
    trainer = L.Trainer(max_steps=7, max_epochs=-1, plugins=plugins, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert setup_of(trainer) == Setup(7, -1, requeue, 1)


def test_a_gang_rank_s_trainer_is_one_node_of_one_device_in_the_ranks_environment():
    environment = RanksEnvironment(1, 2)
    trainer = L.Trainer(
        max_steps=7, max_epochs=-1, plugins=[environment], accelerator="cpu", devices=1, num_nodes=2, use_distributed_sampler=False, logger=False
    )
    assert setup_of(trainer) == Setup(7, -1, Requeue.OFF, 2, devices=1, ranks_environment=True)
    assert type(trainer.strategy).__name__ == "DDPStrategy" and trainer.strategy.cluster_environment is environment
    environment.set_global_rank(2)  # what Lightning derives from its flags is not obeyed: the trial's rank stands
    environment.set_world_size(5)
    assert (environment.global_rank(), environment.world_size(), environment.local_rank()) == (1, 2, 0)
    assert environment.creates_processes_externally and not RanksEnvironment.detect()
    with pytest.raises(ValueError, match="rank 2 is not one of a gang of 2"):
        RanksEnvironment(2, 2)
    sampled = L.Trainer(max_steps=7, max_epochs=-1, plugins=[RanksEnvironment(0, 2)], accelerator="cpu", devices=1, num_nodes=2, logger=False)
    assert setup_of(sampled).distributed_sampler


def test_a_gang_trainer_without_the_ranks_environment_is_refused_before_it_trains(small_data):
    from dataclasses import replace

    governed = Governed(PrunedAt4(replace(small_data, budget=Budget(8, (4,), Cadence(every_steps=3)), rank=0, world_size=2)))
    module = L.LightningModule()  # the refusal reads the Trainer alone
    trainer = L.Trainer(max_steps=8, max_epochs=-1, plugins=[LightningEnvironment()], accelerator="cpu", devices=1, logger=False, callbacks=[governed])
    with pytest.raises(Ungoverned, match=r"pass plugins=\[governed.environment\(\)\], devices=1, num_nodes=run.world_size"):
        governed.setup(trainer, module, "fit")
    ranks = L.Trainer(
        max_steps=8, max_epochs=-1, plugins=[governed.environment()], accelerator="cpu", devices=1, num_nodes=2, use_distributed_sampler=False, logger=False
    )
    governed.setup(ranks, module, "fit")  # governed: Lightning's DDP over the trial's two ranks


def test_each_rank_takes_its_share_of_the_gang_s_batches_and_resumes_mid_epoch():
    whole = list(ResumableBatchSampler(10, 4, seed=9))
    shares = [ResumableBatchSampler(10, 4, seed=9, rank=r, world_size=2) for r in (0, 1)]
    assert [sorted(a + b) for a, b in zip(*(list(s) for s in shares), strict=True)] == [sorted(b) for b in whole]
    assert len(whole) == 3 and len(shares[0]) == 3  # the last batch of 2 has a frame for each of 2 ranks
    assert len(ResumableBatchSampler(9, 4, seed=9, rank=0, world_size=2)) == 2  # a last batch of 1 would leave a rank without one
    cut = ResumableBatchSampler(10, 4, seed=9, rank=1, world_size=2)
    it = iter(cut)
    first = [next(it)]
    again = ResumableBatchSampler(10, 4, seed=123, rank=1, world_size=2)
    again.load_state_dict(cut.state_dict())
    assert first + list(again) == list(ResumableBatchSampler(10, 4, seed=9, rank=1, world_size=2))
    for bad in ({"rank": 2, "world_size": 2}, {"rank": 0, "world_size": 8}):
        with pytest.raises(ValueError, match="every rank needs a share of each batch"):
            ResumableBatchSampler(10, 4, seed=0, **bad)
    data = torch.utils.data.TensorDataset(torch.zeros(4))
    loader = ResumableLoader(data, 2, seed=0, rank=1, world_size=2)
    assert unshared([loader], 1, 2) == [] and unshared({"a": loader}, 0, 2) == ["ResumableLoader(rank=1, world_size=2)"]
    assert unshared(ResumableLoader(data, 2, seed=0), 0, 2) == ["ResumableLoader(rank=0, world_size=1)"]


def test_the_generators_survive_a_checkpoint_loaded_with_weights_only(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    saved = process_rng.save()
    torch.save({"rngs": encode_rngs(*saved)}, tmp_path / "c.ckpt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    arrays, scalars = decode_rngs(torch.load(tmp_path / "c.ckpt", weights_only=True)["rngs"])
    process_rng.restore(arrays, scalars)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_resumable_loader_goes_on_mid_epoch_with_the_batches_it_owed():
    whole = ResumableBatchSampler(10, 3, seed=9)
    straight = list(whole) + list(whole)  # two epochs
    cut = ResumableBatchSampler(10, 3, seed=9)
    it = iter(cut)
    first = [next(it), next(it)]
    again = ResumableBatchSampler(10, 3, seed=123)  # another seed: the state alone decides
    again.load_state_dict(cut.state_dict())
    assert first + list(again) + list(again) == straight and len(straight) == 8


def test_loaders_that_cannot_be_resumed_are_named():
    data = torch.utils.data.TensorDataset(torch.zeros(4))
    plain, resumable = torch.utils.data.DataLoader(data), ResumableLoader(data, 2, seed=0)
    assert unresumable(resumable) == [] and unresumable({"a": plain, "b": [resumable]}) == ["DataLoader"]


# --- the callback in a real Trainer.fit, and the launch's resume check ------------------------------


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import parcel_lightning
    finally:
        sys.path.remove(str(EXAMPLES))
    return parcel_lightning.train


@pytest.fixture(scope="module")
def small_data(training_data):
    return few_examples(training_data)


def test_the_example_resumes_exactly_mid_epoch_in_the_launchs_check(example, small_data):
    # 32 examples in batches of 8: the check's interruption after step 3 is mid-epoch (4 batches an epoch).
    found = check_resume(example, with_defaults(example.parameters, {"lr": 0.03, "batch_size": 8}), 0, small_data)
    assert found.exact and found.largest == 0.0 and found.unread == (), found.detail


DRIFTING = """
import functools
import torch
from torch.utils.data import DataLoader
import parcel_lightning.model as m

class Jitter(m.ParcelNet):
    def training_step(self, batch, batch_idx):
        if not hasattr(self, "noise"):
            self.noise = torch.Generator().manual_seed(0)  # a generator of its own that no state holds
        frames, labels = batch
        frames = frames + 0.05 * torch.randn(frames.shape, generator=self.noise)
        return torch.nn.functional.binary_cross_entropy_with_logits(self(frames), labels)

def jitter(run):
    m.ParcelNet, kept = Jitter, m.ParcelNet
    try:
        m.train.function(run)
    finally:
        m.ParcelNet = kept

def plain(run):
    m.ResumableLoader, kept = lambda ds, bs, seed, **shares: DataLoader(ds, bs, shuffle=True), m.ResumableLoader
    try:
        m.train.function(run)
    finally:
        m.ResumableLoader = kept

def mixed(run):
    m.L.Trainer, kept = functools.partial(m.L.Trainer, precision="bf16-mixed", accumulate_grad_batches=2), m.L.Trainer
    try:
        m.train.function(run)
    finally:
        m.L.Trainer = kept

Jittering = m.loop(parameters=m.train.parameters, load=m.load)(jitter)
Mixed = m.loop(parameters=m.train.parameters, load=m.load)(mixed)
PlainLoader = m.loop(parameters=m.train.parameters, load=m.load)(plain)
"""


@pytest.fixture(scope="module")
def drifting(example, tmp_path_factory):
    """Variants of the example a user might write: one drawing noise from a generator of its own, one
    with a plain DataLoader(shuffle=True), and one (that resumes) with bf16 autocast and accumulation."""
    import importlib.util

    path = tmp_path_factory.mktemp("drift") / "drifting_lightning.py"
    path.write_text(textwrap.dedent(DRIFTING))
    spec = importlib.util.spec_from_file_location("drifting_lightning", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bf16_autocast_and_gradient_accumulation_resume_exactly_mid_epoch(drifting, small_data):
    # 4 batches an epoch, 2 per optimizer step: the interruption after step 3 falls after batch 6 of 8.
    cls = drifting.Mixed
    found = check_resume(cls, with_defaults(cls.parameters, {"lr": 0.03, "batch_size": 8}), 0, small_data)
    assert found.exact, found.detail


def test_the_launchs_check_refuses_a_lightning_variant_whose_generator_no_state_holds(drifting, small_data):
    cls = drifting.Jittering
    with pytest.raises(UsageError) as refused:
        preflight(cls, "drifting:Jittering", cls.parameters, [("the space's low corner", {"lr": 0.03, "batch_size": 8})], 0, small_data)
    message = str(refused.value)
    assert message.startswith("preflight: drifting:Jittering does not resume exactly with the space's low corner") and "\n" not in message
    assert "a resumed run parts from the uninterrupted one at step 4" in message
    assert "likely: a random generator of the trainer's own that the state leaves out" in message


def test_a_train_loader_lightning_cannot_resume_is_refused_at_the_launch_in_one_line(tmp_path, data_dir):
    # A real launch: Lightning's own chatter (its accelerator, an srun hint) is held back during the
    # preflight, so the refusal is the one line on stderr.
    (tmp_path / "drifting_lightning.py").write_text(textwrap.dedent(DRIFTING))
    target = "drifting_lightning:PlainLoader"
    args = [f"search.root={tmp_path / 'runs'}", "search.revision=plain", f"trainer.target={target}", "trainer.code=[parcel_lightning]"]
    args += ["~space.params.hidden", "~space.params.l2", "batch_size=choice(8)", "lr=choice(0.03)", "train.steps=40", "pruner=none"]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env={"PYTHONPATH": f"{EXAMPLES}:{tmp_path}"})
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert (
        f"preflight: {target} fails with the space's low corner {{batch_size=8, lr=0.03}}: Ungoverned: the train loader (DataLoader) cannot be resumed"
        in res.stderr
    )
    assert "use parcel_hpc.integrations.lightning.ResumableLoader(dataset, batch_size, seed=run.seed)" in res.stderr
    assert not (tmp_path / "runs").exists()  # nothing frozen


class PrunedAt4(Uninterrupted):
    """A fresh run (no checkpoint behind it) pruned at its milestone 4; ``values`` keeps what it was handed."""

    def __init__(self, data):
        super().__init__({"lr": 0.03, "width": 4, "batch_size": 8}, 0, data, lambda scores: float(np.mean(scores)))

    def _validated(self, step, value, final, metrics):
        super()._validated(step, value, final, metrics)
        return Stop.PRUNED if step == 4 else None


def test_a_fit_outside_resume_is_refused_and_a_pruned_fit_ends_without_a_save(example, small_data):
    from dataclasses import replace

    data = replace(small_data, budget=Budget(8, (4,), Cadence(every_steps=3)))
    run = PrunedAt4(data)
    run_loop(example(), run)  # the example's own resume() block: pruned at step 4, fit left quietly
    assert run.stop is Stop.PRUNED and run.step == 4 and list(run.values) == [4]
    assert isinstance(run.last_saved, TrainerState)  # the cadence's save at step 3, none after the prune
    served = example.loader(run.last_saved, run.params, 0, data)(data.validation.images[:5])
    assert served.shape == (5,) and ((served > 0) & (served < 1)).all()

    governed = Governed(PrunedAt4(data))
    trainer = L.Trainer(max_steps=8, max_epochs=-1, plugins=[LightningEnvironment()], callbacks=[governed], logger=False, enable_checkpointing=False)
    module = sys.modules["parcel_lightning.model"].ParcelNet(0.03, 4)
    loader = ResumableLoader(torch.utils.data.TensorDataset(torch.zeros(8, 32, 32), torch.zeros(8)), 4, seed=0)
    with pytest.raises(Ungoverned, match=r"trainer.fit ran outside governed.resume\(\)"):
        trainer.fit(module, loader)


# --- real processes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(artifacts):
    return functools.partial(reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"]), steps=100)


def test_a_lightning_search_prunes_and_completes_with_the_uninterrupted_metric(tmp_path, artifacts, uninterrupted):
    shutil.copytree(artifacts["dir"], tmp_path / "data")
    args = [
        f"search.root={tmp_path / 'runs'}",
        "search.revision=lightning",
        f"trainer.target={TARGET}",
        "search.n_trials=4",
        *SPACE,
        "batch_size=choice(16,32)",
    ]
    # The random sampler draws (32, 0.03) first and (32, 0.0003) third (the others repeat them): the
    # first leads at step 80 (miss-cost 0.520 against 0.582), and the second is pruned there.
    res = launch([*args, "hydra.launcher.parallelism=1", "pruner.milestones=[80,100]", "pruner.min_peers=1"], cwd=tmp_path, data_dir=tmp_path / "data", env=ENV)
    assert res.returncode == 0, res.stderr[-2000:]
    search = SearchDir(tmp_path / "runs" / "lightning")
    records = list(search.records())
    states = [r.state.value for r in records]
    assert states == ["completed", "pruned"], states
    for r in records:
        milestones = [e.data for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        assert milestones[0].step == 80 and set(milestones[0].train) == {"loss", "lr"}  # the step's own numbers ride along
        if r.state.value == "completed":
            assert r.metric == uninterrupted(r.spec.params) and r.metric_resume is MetricResume.UNINTERRUPTED


def test_a_signalled_lightning_trial_saves_at_its_next_step_and_resumes_exactly(tmp_path, data_dir, uninterrupted):
    # SIGUSR2 sets the flag; the next optimizer step's run.stepped makes the checkpoint due, the callback
    # saves Lightning's checkpoint and leaves fit; the requeued attempt resumes with ckpt_path. With 891
    # train frames in batches of 32 an epoch is 28 steps, so the interruption almost always
    # falls mid-epoch (the in-process check above is the deterministic mid-epoch case).
    rec = signalled_once([f"trainer.target={TARGET}", "pruner=none", "train.step_seconds=0.08", *SPACE], cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert 10 <= rec.attempts[0].step < 100
    assert rec.metric == uninterrupted(rec.spec.params)


def test_the_example_adds_the_lines_the_docs_count():
    """docs/bring-your-own-model.md counts the lines a Lightning script adds (target: at most 15), and the two
    more a trial of several ranks needs; the example marks them."""
    lines = (EXAMPLES / "parcel_lightning" / "model.py").read_text().splitlines()
    marked = [line for line in lines if "  # parcel_hpc" in line and "# parcel_hpc (gang)" not in line]
    gang = [line for line in lines if "  # parcel_hpc (gang)" in line]
    docs = (EXAMPLES.parent / "docs" / "bring-your-own-model.md").read_text()
    assert len(marked) == 14 and "# 14 ckpt_path= added" in docs and "Fourteen lines, besides" in docs
    assert len(gang) == 2 and "# gang: each rank one process" in docs and "# gang: the loader shares each batch" in docs

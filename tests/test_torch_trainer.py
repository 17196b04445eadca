"""parcel_hpc.trainer.torch and the CNN example (examples/parcel_cnn), in this process on the CPU:
state_dicts and every generator through a real checkpoint and back, the grant of GPUs, the
conformance check passing the CNN and naming the generator a trainer forgot, and a core that never
imports torch."""

import random
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the [torch] extra; scripts/test.sh installs it, so CI runs these

from parcel_hpc.testing import parcel_hpc  # noqa: E402
from parcel_hpc.trainer import Devices, DevicesNotGranted, TrainerState, UnsavableState, build_params  # noqa: E402
from parcel_hpc.trainer import torch as parcel_torch  # noqa: E402
from parcel_hpc.trainer.conformance import _through_checkpoint, check_trainer  # noqa: E402
from parcel_hpc.trainer.preflight import few_examples  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CNN_CONF = ROOT / "examples" / "parcel_cnn" / "conf"
CNN_PARAMS = {"lr": 0.03, "width": 8, "depth": 2, "dropout": 0.3, "batch_size": 32, "optimizer": "sgd"}


@pytest.fixture
def cnn(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    from parcel_cnn import ParcelCNN

    return ParcelCNN


def _net():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 1))


def test_pack_and_unpack_carry_modules_optimizers_schedulers_scalers_and_generators_bit_for_bit():
    torch.manual_seed(0)
    model, order = _net(), torch.Generator().manual_seed(7)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(3):
        model(torch.rand(8, 1, 6, 6, generator=order)).sum().backward()
        optimizer.step()
        scheduler.step()
    stateful = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
    state = _through_checkpoint(parcel_torch.pack(stateful, step=3, generators={"order": order}))
    assert {"model/1.num_batches_tracked", "optimizer/state/0/exp_avg", "rng/torch", "rng/numpy", "rng/python", "rng/generator/order"} <= set(state.arrays)

    expected_draws = (torch.rand(4, generator=order), torch.rand(4), np.random.random(3), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)  # the generators move on; unpack must put them back
    fresh, fresh_order = _net(), torch.Generator()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.01)
    fresh_stateful = {
        "model": fresh,
        "optimizer": fresh_optimizer,
        "scheduler": torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=2, gamma=0.5),
        "scaler": torch.amp.GradScaler("cpu"),
    }
    assert parcel_torch.unpack(state, fresh_stateful, generators={"order": fresh_order}) == 3
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, fresh.state_dict()[name]), name
    assert fresh_optimizer.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    assert fresh_stateful["scheduler"].state_dict() == scheduler.state_dict()
    assert fresh_stateful["scaler"].get_scale() == 1024.0
    got = (torch.rand(4, generator=fresh_order), torch.rand(4), np.random.random(3), random.random())
    assert torch.equal(got[0], expected_draws[0]) and torch.equal(got[1], expected_draws[1])
    assert np.array_equal(got[2], expected_draws[2]) and got[3] == expected_draws[3]


def test_dtypes_numpy_lacks_are_kept_bit_for_bit_and_what_a_checkpoint_cannot_hold_is_named():
    weights = torch.randn(5, 3).to(torch.bfloat16)
    holder = torch.nn.Module()
    holder.register_buffer("w", weights)
    state = _through_checkpoint(parcel_torch.pack({"m": holder}, step=0))
    other = torch.nn.Module()
    other.register_buffer("w", torch.zeros(5, 3, dtype=torch.bfloat16))
    parcel_torch.unpack(state, {"m": other}, rngs=False)
    assert other.w.dtype == torch.bfloat16 and torch.equal(other.w, weights)

    # A strided view (a transpose, a slice) and a scalar are copied as they read, into memory the array owns.
    strided = {"t": weights.t(), "every_other": torch.arange(10.0)[::2], "scalar": torch.tensor(7, dtype=torch.int64)}

    class Strided:
        def state_dict(self):
            return strided

        def load_state_dict(self, _):
            pass

    packed = parcel_torch.pack({"s": Strided()}, step=0)
    for name, tensor in strided.items():
        arr = packed.arrays[f"s/{name}"]
        assert arr.flags.owndata and not arr.flags.writeable and arr.shape == tuple(tensor.shape), name
    assert np.array_equal(packed.arrays["s/every_other"], [0.0, 2.0, 4.0, 6.0, 8.0]) and packed.arrays["s/scalar"] == 7
    assert torch.equal(torch.from_numpy(packed.arrays["s/t"].copy()).view(torch.bfloat16), weights.t())

    class Odd:
        def state_dict(self):
            return {"handle": object()}

        def load_state_dict(self, _):
            pass

    with pytest.raises(UnsavableState, match="odd/handle is a object"):
        parcel_torch.pack({"odd": Odd()}, step=0)
    with pytest.raises(KeyError, match="holds no 'optimizer'"):
        parcel_torch.unpack(state, {"optimizer": torch.optim.SGD(_net().parameters(), lr=0.1)})


def test_pack_reuses_the_memory_of_a_state_nothing_holds_and_never_writes_into_one_still_held():
    net = torch.nn.Linear(600, 600)  # a 1.4 MB weight: pooled; its 2.4 KB bias is allocated afresh (the heap reuses it anyway)
    stateful, weight = {"model": net}, "model/weight"

    small = weakref.ref(parcel_torch.pack(stateful, step=0).arrays["model/bias"])
    assert small() is None  # dropped with its state: nothing keeps a small array

    def bump():
        with torch.no_grad():
            net.weight.add_(1.0)

    dropped = weakref.ref(parcel_torch.pack(stateful, step=1).arrays[weight])  # the state is dropped at once
    assert dropped() is not None  # ... and its array kept for the next pack
    bump()
    second = parcel_torch.pack(stateful, step=2)
    assert second.arrays[weight] is dropped() and np.array_equal(second.arrays[weight], net.weight.detach().numpy())
    assert not second.arrays[weight].flags.writeable

    kept = second.arrays[weight]  # as a trainer keeping its state, or the writer writing it, would
    before = kept.copy()
    bump()
    third = parcel_torch.pack(stateful, step=3)
    assert not np.shares_memory(third.arrays[weight], kept) and np.array_equal(kept, before)

    view = third.arrays[weight][:2]  # a view holds its array as the array itself does
    del second, third, kept
    bump()
    fourth = parcel_torch.pack(stateful, step=4)
    assert not np.shares_memory(fourth.arrays[weight], view) and np.array_equal(view, before[:2] + 1.0)

    # A run keeps its last save until the next one: two states' arrays, taken in turn, and no more.
    del view, fourth
    last, taken = None, []
    for step in range(5, 11):
        last = parcel_torch.pack(stateful, step=step)
        taken.append(weakref.ref(last.arrays[weight]))
    assert all(taken[i]() is taken[i - 2]() is not None for i in range(2, len(taken))) and taken[-1]() is not taken[-2]()

    # Many arrays of one shape (layers alike, and an optimizer's moments of each): every one reused.
    layers = torch.nn.Sequential(*(torch.nn.Linear(600, 600) for _ in range(6)))
    opt = torch.optim.AdamW(layers.parameters())
    layers(torch.ones(1, 600)).sum().backward()
    opt.step()
    big = lambda state: {n: weakref.ref(a) for n, a in state.arrays.items() if a.nbytes >= 1 << 20}  # noqa: E731
    first = big(parcel_torch.pack({"m": layers, "o": opt}, step=1))
    again = parcel_torch.pack({"m": layers, "o": opt}, step=2)
    assert len(first) == 18 and {id(r()) for r in first.values()} == {id(a) for n, a in again.arrays.items() if n in first}


def test_a_trainer_gets_the_gpus_it_was_granted_and_is_refused_more(training_data):
    assert parcel_torch.device(training_data) == torch.device("cpu")  # granted none: the CPU
    with pytest.raises(DevicesNotGranted, match="asks for 1 GPU and the attempt was granted 0"):
        parcel_torch.devices(training_data, 1)
    preflight = few_examples(training_data)
    from dataclasses import replace

    granted_elsewhere = replace(preflight, devices=Devices(2))  # the launch's preflight: granted to the trials, tried here on the CPU
    assert parcel_torch.devices(granted_elsewhere, 2) == [torch.device("cpu")] * 2
    with pytest.raises(DevicesNotGranted, match="asks for 3 GPUs and the attempt was granted 2"):
        parcel_torch.devices(granted_elsewhere, 3)
    assert Devices.from_env(None, "GPU-1a,GPU-2b") == Devices(2, ("GPU-1a", "GPU-2b"))
    assert Devices.from_env(1, "3") == Devices(1, ("3",)) and Devices.from_env(None, "") == Devices(0, ())
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="granted GPUs 0 and torch .* sees 0; a CPU build: install a CUDA build"):
            parcel_torch.device(replace(training_data, devices=Devices(1, ("0",))))


def test_the_conformance_check_passes_the_cnn(training_data, cnn):
    findings = check_trainer(cnn, few_examples(training_data, 96), CNN_PARAMS, seed=3, steps=6)
    assert all(f.ok for f in findings), findings
    assert [f.check for f in findings] == ["step", "predict", "state", "resume", "determinism", "serving parity", "serving from state", "final partition"]


def test_the_conformance_check_names_the_torch_generator_a_state_leaves_out(training_data, cnn):
    class ForgetsTorchRNG(cnn):
        def state(self):
            s = super().state()
            return TrainerState({k: v for k, v in s.arrays.items() if not k.startswith("rng/torch")}, s.scalars)

    findings = check_trainer(ForgetsTorchRNG, few_examples(training_data, 96), CNN_PARAMS, seed=3, steps=6)
    resume = next(f for f in findings if f.check == "resume")
    assert not resume.ok
    assert "state() leaves out torch's CPU generator (torch.get_rng_state: dropout" in resume.detail


def test_the_conformance_check_names_numpys_global_generator_too(training_data, cnn):
    class DrawsFromNumpy(cnn):
        def step(self):
            metrics = super().step()
            with torch.no_grad():
                self.model.head[-1].bias.add_(float(np.random.normal(scale=1e-3)))  # a global draw its state never saves
            return metrics

        def state(self):
            s = super().state()
            return TrainerState({k: v for k, v in s.arrays.items() if k != "rng/numpy"}, s.scalars)

    resume = next(f for f in check_trainer(DrawsFromNumpy, few_examples(training_data, 96), CNN_PARAMS, seed=3, steps=4) if f.check == "resume")
    assert not resume.ok and "leaves out numpy's global generator" in resume.detail


def test_a_resumed_cnn_ends_bit_equal_to_an_uninterrupted_one(training_data, cnn):
    """The preemption guarantee in one process: 30 steps, checkpoint, a fresh build resumed from it,
    30 more, against 60 uninterrupted; the batch order crosses an epoch boundary on the way."""
    params = build_params(cnn(), CNN_PARAMS | {"batch_size": 128})
    data = few_examples(training_data, 300)  # 300 frames, 2 batches an epoch: several epochs
    straight = cnn()
    straight.build(params, 11, data)
    for _ in range(60):
        straight.step()
    first = cnn()
    first.build(params, 11, data)
    for _ in range(31):
        first.step()
    state = _through_checkpoint(first.state())
    torch.manual_seed(12345)  # another process's generators
    resumed = cnn()
    resumed.build(params, 11, data)
    resumed.load_state(state)
    for _ in range(29):
        resumed.step()
    assert np.array_equal(resumed.predict("validation"), straight.predict("validation"))
    assert np.array_equal(resumed.serve(data.validation.images), straight.predict("validation"))


OPTIONAL = (
    "parcel_hpc.trainer.torch",
    "parcel_hpc.testing.torch_trainers",
    "parcel_hpc.integrations.lightning",
    "parcel_hpc.integrations.huggingface",
)  # the extras' own modules


def test_the_core_never_imports_torch():
    """Every module of parcel_hpc but the optional parcel_hpc.trainer.torch (and the test trainers built
    on it) and the Lightning and Hugging Face integrations, imported in a fresh interpreter: torch and lightning stay out of sys.modules."""
    code = (
        "import importlib, pkgutil, sys, parcel_hpc\n"
        f"optional = {OPTIONAL!r}\n"
        # walk_packages imports every package it walks into: the optional ones are never walked
        "def walk(path, prefix):\n"
        "    for m in pkgutil.iter_modules(path, prefix):\n"
        "        if m.name in optional or m.name.endswith('__main__'): continue\n"
        "        yield m.name\n"
        "        if m.ispkg: yield from walk([f'{path[0]}/{m.name.rsplit(\".\", 1)[1]}'], m.name + '.')\n"
        "names = list(walk(parcel_hpc.__path__, 'parcel_hpc.'))\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names), 'torch' in sys.modules, 'lightning' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) > 100 and out[1:] == ["False", "False"]


def test_check_trainer_runs_the_cnn_with_its_own_space_and_baseline(data_dir):
    res = parcel_hpc(
        ["check-trainer", "parcel_cnn:ParcelCNN", "space=cnn_r1", "selection/baseline=cnn_approved", f"hydra.searchpath=[file://{CNN_CONF}]"]
        + ["--data", str(data_dir), "--steps", "4"],
        env={"PYTHONPATH": str(ROOT / "examples")},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "preflight passed at the space's low corner, the space's high corner, the baseline cnn-approved-2026-12" in res.stdout
    assert "FAILED" not in res.stdout


def test_a_trainer_asking_for_more_gpus_than_the_resources_grant_is_refused_before_the_freeze(tmp_path, data_dir):
    (tmp_path / "greedy.py").write_text(
        "from parcel_cnn import ParcelCNN\n"
        "from parcel_hpc.trainer import torch as parcel_torch\n\n\n"
        "class TwoGPUs(ParcelCNN):\n"
        "    def build(self, params, seed, data):\n"
        "        parcel_torch.devices(data, 2)\n"
        "        super().build(params, seed, data)\n"
    )
    from parcel_hpc.testing import launch

    res = launch(
        [
            f"search.root={tmp_path}",
            "search.revision=greedy",
            "trainer.target=greedy:TwoGPUs",
            "trainer.code=[parcel_cnn]",
            "space=cnn_r1",
            f"hydra.searchpath=[file://{CNN_CONF}]",
        ],
        cwd=tmp_path,
        data_dir=data_dir,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT / 'examples'}"},
    )
    assert res.returncode == 2, res.stderr
    assert "DevicesNotGranted: the trainer asks for 2 GPUs and the attempt was granted 1; raise resources.gpus" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "greedy").exists()  # one line, nothing written

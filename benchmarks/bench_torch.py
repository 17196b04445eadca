"""The PyTorch CNN (examples/parcel_cnn) under parcel_hpc against the same loop run bare, same run, alternating.

    .venv/bin/python benchmarks/bench_torch.py [--repeats 3] [--device cpu|cuda] [--batch-size 8] [--every-steps 10]
                                               [--state-mb 100] [--large-state-mb 1024]

Step time. Ours: one trial of the CNN searched on the embedded local executor (validation at the
pruner's milestones 41, 82 and 240, the ledger, the fence), timed by the ledger's own timestamps
from its milestone at step 41 to its last at 240, twice: at the default cadence (``checkpoint.every_s``
from the launcher's signal delay) and with a checkpoint every ``--every-steps``. The bare loop: the
same trainer stepped and validated at the same steps in one process (no checkpoint, no ledger),
timed over the same span. All fresh interpreters, one CPU thread. A small batch (``--batch-size``)
makes the step as short as a GPU's, so a checkpoint's cost is not hidden. Targets: <= 1.02x at the
default cadence, <= 1.10x every 10 steps.

Checkpoint. Ours: a model's and its AdamW optimizer's state (``--state-mb`` in all) packed by
``parcel_hpc.trainer.torch.pack`` and saved by the checkpoint store (HDF5, digest, fsync, rename);
the baseline: ``torch.save`` of the same two state_dicts, fsynced and renamed. Both start from the
device the model lives on. Target: <= 1.25x.

Blocking time. What the training thread waits for at a save: the state packed and handed to the
background writer (checked and copied; the writer writes, hashes, fsyncs and renames it while the
loop goes on), against a synchronous ``torch.save`` + fsync + rename of the same state, for
``--state-mb`` and ``--large-state-mb`` (0: not measured). Each write is left to finish, untimed,
before the next measurement. Target: <= 0.2x.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import ROOT, Figure, alternate, env, launch, main, ratio  # noqa: E402

DEFAULT_CADENCE_TARGET = 1.02
EVERY_STEPS_TARGET = 1.10
CHECKPOINT_TARGET = 1.25
BLOCKING_TARGET = 0.2
EXAMPLES = ROOT / "examples"
MILESTONES = (41, 82, 240)
PARAMS = {"lr": 0.03, "width": 32, "depth": 3, "dropout": 0.1, "optimizer": "adamw"}  # the space's largest network; the batch is an option

BARE = """
import json, sys, time
from parcel_hpc.data import read_split
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.trainer import Devices, build_params, load_training_data
from dataclasses import replace
from parcel_cnn import ParcelCNN

params, device, milestones = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
data = load_training_data("data/parcels.h5", read_split("data/split-group_r8.json"), {"revision": "stats-r1", "pool": 4})
if device == "cuda":
    data = replace(data, devices=Devices(1, ("0",)))
metric = MissCost("miss-cost-r3", 5.0, 1.0)
trainer = ParcelCNN()
trainer.build(build_params(trainer, params), 1234, data)
marks = {}
for step in range(1, milestones[-1] + 1):
    trainer.step()
    if step in milestones:
        metric(trainer.predict("validation"), data.validation.labels)
        marks[step] = time.perf_counter()
print(marks[milestones[-1]] - marks[milestones[0]])
"""


def _overrides(device: str, params: dict, cadence: list[str]) -> list[str]:
    swept = [f"{k}=choice({v})" for k, v in params.items()]
    return [
        "trainer.target=parcel_cnn:ParcelCNN",
        f"hydra.searchpath=[file://{EXAMPLES / 'parcel_cnn' / 'conf'}]",
        "space=cnn_r1",
        "selection/baseline=cnn_approved",
        "pruner=asha_cnn_r1",
        f"train.steps={MILESTONES[-1]}",
        "search.n_trials=1",
        f"resources.gpus={1 if device == 'cuda' else 0}",
        *cadence,
        *swept,
    ]


def ours_steps(device: str, params: dict, cadence: list[str]) -> float:
    """``cadence``: checkpoint overrides ([] : the default)."""
    from parcel_hpc.ledger import SearchDir

    with tempfile.TemporaryDirectory() as tmp:
        launch(
            tmp,
            f"checkpoint.dir={tmp}/ckpt",
            "search.revision=cnn-bench",
            *_overrides(device, params, cadence),
            extra_env={"PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))},
        )
        search = SearchDir(Path(tmp) / "runs" / "cnn-bench")
        at = {e.data.step: e.t for e in search.events("t0000") if e.kind.value == "milestone"}
    return at[MILESTONES[-1]] - at[MILESTONES[0]]


def bare_steps(device: str, params: dict) -> float:
    argv = [sys.executable, "-c", BARE, json.dumps(params), device, json.dumps(MILESTONES)]
    out = subprocess.run(
        argv,
        cwd=ROOT,
        env={**env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.split()[-1])


def _torch_state(device: str, state_mb: int):
    """A model and its AdamW optimizer after one step, ``state_mb`` MiB of state in all."""
    import torch

    # AdamW keeps two moments per weight: the model is a third of the state.
    side = int((state_mb * 2**20 / 4 / 3 / 4) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side) for _ in range(4)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, side, device=device)).sum().backward()
    optimizer.step()
    return model, optimizer


def _torch_save(model, optimizer, tmp: str) -> None:
    """The baseline: ``torch.save`` of both state_dicts, fsynced, renamed, the directory fsynced."""
    import torch

    from parcel_hpc.fsio import fsync_dir

    path, part = Path(tmp) / "raw.pt", Path(tmp) / "raw.pt.tmp"
    with open(part, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)
    fsync_dir(tmp)


def _store(tmp: str):
    from parcel_hpc.checkpoints.store import CheckpointStore, TrialIdentity

    digest = "sha256:" + "0" * 64
    return CheckpointStore(Path(tmp) / "ckpt", TrialIdentity("t0000", digest, digest, digest), keep_last=1)


def checkpoint_figure(device: str, repeats: int, state_mb: int) -> Figure:
    from parcel_hpc.trainer import torch as parcel_torch

    model, optimizer = _torch_state(device, state_mb)
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(tmp)
        steps = iter(range(1, 10_000))

        def ours() -> None:
            state = parcel_torch.pack({"model": model, "optimizer": optimizer}, step=0).checked()
            store.save(next(steps), state.arrays, {}, {}, extra=state.scalars)

        ours()
        _torch_save(model, optimizer, tmp)  # warm-up: first HDF5 file, first pickle
        a, b = alternate(ours, lambda: _torch_save(model, optimizer, tmp), repeats)
        size = os.path.getsize(Path(tmp) / "raw.pt") / 2**20
    return ratio(f"checkpoint a {size:.0f} MiB torch state ({device})", "torch.save+fsync+rename", a, b, CHECKPOINT_TARGET)


def blocking_figure(device: str, repeats: int, state_mb: int) -> Figure:
    """The training thread's wait at a save handed to the background writer, against a synchronous one."""
    from parcel_hpc.checkpoints.writer import BackgroundWriter
    from parcel_hpc.trainer import torch as parcel_torch

    model, optimizer = _torch_state(device, state_mb)
    with tempfile.TemporaryDirectory() as tmp:
        writer = BackgroundWriter(_store(tmp))
        steps = iter(range(1, 10_000))
        ours, baseline, whole = [], [], []
        for i in range(repeats + 1):  # the first round warms up (first HDF5 file, first pickle)
            t0 = time.perf_counter()
            _torch_save(model, optimizer, tmp)
            t1 = time.perf_counter()
            state = parcel_torch.pack({"model": model, "optimizer": optimizer}, step=0).checked()
            writer.submit(next(steps), state.arrays, {}, {}, extra=state.scalars)
            t2 = time.perf_counter()
            del state
            writer.wait()  # untimed: each measurement starts with no write in flight
            t3 = time.perf_counter()
            if i:
                baseline.append(t1 - t0)
                ours.append(t2 - t1)
                whole.append(t3 - t1)
        size = os.path.getsize(Path(tmp) / "raw.pt") / 2**20
    note = f"blocking {statistics.median(ours) * 1000:.0f} ms against {statistics.median(baseline) * 1000:.0f} ms; the background write done {statistics.median(whole) * 1000:.0f} ms after the save began"
    return ratio(f"save of a {size:.0f} MiB torch state, blocking time ({device})", "torch.save+fsync+rename", ours, baseline, BLOCKING_TARGET, note)


def run(repeats: int = 3, device: str = "cpu", batch_size: int = 8, every_steps: int = 10, state_mb: int = 100, large_state_mb: int = 1024) -> list[Figure]:
    params = {**PARAMS, "batch_size": batch_size}
    bare, default, every = [], [], []
    for _ in range(repeats):  # alternating: all three see the same machine
        bare.append(bare_steps(device, params))
        default.append(ours_steps(device, params, []))
        every.append(ours_steps(device, params, [f"checkpoint.every_steps={every_steps}"]))
    n = MILESTONES[-1] - MILESTONES[0]
    note = f"{n} steps of width {PARAMS['width']}, depth {PARAMS['depth']}, batch {batch_size}; bare median {statistics.median(bare) / n * 1000:.1f} ms/step"
    figures = [
        ratio(f"CNN step under parcel_hpc ({device}, default cadence)", "the same loop, bare", default, bare, DEFAULT_CADENCE_TARGET, note),
        ratio(f"CNN step under parcel_hpc ({device}, checkpoint every {every_steps})", "the same loop, bare", every, bare, EVERY_STEPS_TARGET, note),
        checkpoint_figure(device, repeats, state_mb),
        blocking_figure(device, repeats, state_mb),
    ]
    if large_state_mb:
        figures.append(blocking_figure(device, repeats, large_state_mb))
    return figures


if __name__ == "__main__":
    main(run, __doc__)

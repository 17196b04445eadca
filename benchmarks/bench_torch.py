"""The PyTorch CNN (examples/parcel_cnn) under parcel_hpc against the same loop run bare, same run, alternating.

    .venv/bin/python benchmarks/bench_torch.py [--repeats 3] [--device cpu|cuda] [--state-mb 100] [--every-steps 10]

Step time. Ours: one trial of the CNN searched on the embedded local executor (the checkpoint every
10 steps, validation at the pruner's milestones 41, 82 and 240, the ledger, the fence), timed by the
ledger's own timestamps from its milestone at step 41 to its last at 240. The bare loop: the same
trainer stepped and validated at the same steps in one process (no checkpoint, no ledger), timed
over the same span. Both fresh interpreters, one CPU thread. Target: <= 1.05x.

Checkpoint. Ours: a model's and its AdamW optimizer's state (``--state-mb`` in all) packed by
``parcel_hpc.trainer.torch.pack`` and saved by the checkpoint store (HDF5, digest, fsync, rename);
the baseline: ``torch.save`` of the same two state_dicts, fsynced and renamed. Both start from the
device the model lives on. Target: <= 1.25x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import ROOT, Figure, alternate, env, launch, main, ratio  # noqa: E402

STEP_TARGET = 1.05
CHECKPOINT_TARGET = 1.25
EXAMPLES = ROOT / "examples"
MILESTONES = (41, 82, 240)
PARAMS = {"lr": 0.03, "width": 32, "depth": 3, "dropout": 0.1, "batch_size": 128, "optimizer": "adamw"}  # the space's largest network

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


def _overrides(device: str, every_steps: int) -> list[str]:
    swept = [f"{k}=choice({v})" for k, v in PARAMS.items()]
    return [
        "trainer.target=parcel_cnn:ParcelCNN",
        f"hydra.searchpath=[file://{EXAMPLES / 'parcel_cnn' / 'conf'}]",
        "space=cnn_r1",
        "selection/baseline=cnn_approved",
        "pruner=asha_cnn_r1",
        f"train.steps={MILESTONES[-1]}",
        "search.n_trials=1",
        f"resources.gpus={1 if device == 'cuda' else 0}",
        f"checkpoint.every_steps={every_steps}",
        *swept,
    ]


def ours_steps(device: str, every_steps: int) -> float:
    from parcel_hpc.ledger import SearchDir

    with tempfile.TemporaryDirectory() as tmp:
        launch(
            tmp,
            f"checkpoint.dir={tmp}/ckpt",
            "search.revision=cnn-bench",
            *_overrides(device, every_steps),
            extra_env={"PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))},
        )
        search = SearchDir(Path(tmp) / "runs" / "cnn-bench")
        at = {e.data.step: e.t for e in search.events("t0000") if e.kind.value == "milestone"}
    return at[MILESTONES[-1]] - at[MILESTONES[0]]


def bare_steps(device: str) -> float:
    argv = [sys.executable, "-c", BARE, json.dumps(PARAMS), device, json.dumps(MILESTONES)]
    out = subprocess.run(
        argv,
        cwd=ROOT,
        env={**env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.split()[-1])


def _paired(ours, baseline, repeats: int) -> tuple[list[float], list[float]]:
    """Each side's own measured span (not the wall time of its process), alternating."""
    a, b = [], []
    for _ in range(repeats):
        b.append(baseline())
        a.append(ours())
    return a, b


def checkpoint_figure(device: str, repeats: int, state_mb: int) -> Figure:
    import torch

    from parcel_hpc.checkpoints.store import CheckpointStore, TrialIdentity
    from parcel_hpc.fsio import fsync_dir
    from parcel_hpc.trainer import torch as parcel_torch

    # AdamW keeps two moments per weight: the model is a third of the state.
    side = int((state_mb * 2**20 / 4 / 3 / 4) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side) for _ in range(4)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, side, device=device)).sum().backward()
    optimizer.step()
    digest = "sha256:" + "0" * 64
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp) / "ckpt", TrialIdentity("t0000", digest, digest, digest), keep_last=1)
        steps = iter(range(1, 10_000))

        def ours() -> None:
            state = parcel_torch.pack({"model": model, "optimizer": optimizer}, step=0).checked()
            store.save(next(steps), state.arrays, {}, {}, extra=state.scalars)

        def baseline() -> None:
            path, part = Path(tmp) / "raw.pt", Path(tmp) / "raw.pt.tmp"
            with open(part, "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
            fsync_dir(tmp)

        ours()
        baseline()  # warm-up: first HDF5 file, first pickle
        a, b = alternate(ours, baseline, repeats)
        size = os.path.getsize(Path(tmp) / "raw.pt") / 2**20
    return ratio(f"checkpoint a {size:.0f} MiB torch state ({device})", "torch.save+fsync+rename", a, b, CHECKPOINT_TARGET)


def run(repeats: int = 3, device: str = "cpu", state_mb: int = 100, every_steps: int = 10) -> list[Figure]:
    ours, bare = _paired(lambda: ours_steps(device, every_steps), lambda: bare_steps(device), repeats)
    n = MILESTONES[-1] - MILESTONES[0]
    note = f"{n} steps of width {PARAMS['width']}, depth {PARAMS['depth']}, batch {PARAMS['batch_size']}; bare median {sorted(bare)[len(bare) // 2] / n * 1000:.1f} ms/step"
    return [
        ratio(f"CNN step under parcel_hpc ({device}, checkpoint every {every_steps})", "the same loop, bare", ours, bare, STEP_TARGET, note),
        checkpoint_figure(device, repeats, state_mb),
    ]


if __name__ == "__main__":
    main(run, __doc__)

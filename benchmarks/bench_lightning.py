"""Lightning's ``Trainer.fit`` (examples/parcel_lightning) under parcel_hpc against the same fit alone, same run, alternating.

    .venv/bin/python benchmarks/bench_lightning.py [--repeats 3]

Ours: one trial of the example searched on the embedded local executor (the ``Governed`` callback
telling the run every step, Lightning's own checkpoint saved into the trial's checkpoint every 10
steps, validation probabilities at the milestones 10, 20, 41, 82 and 240, the ledger, the fence),
timed by the ledger's own timestamps from its milestone at step 41 to its last at 240. The fit
alone: the same module, loader and ``Trainer`` arguments in one process, with a plain callback that
computes the same validation probabilities at the same steps and notes the time (no checkpoint, no
ledger), timed over the same span. Both fresh interpreters, one CPU thread. Target: <= 1.05x.
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
from _suite import ROOT, Figure, env, launch, main, ratio  # noqa: E402

STEP_TARGET = 1.05
EXAMPLES = ROOT / "examples"
MILESTONES = (10, 20, 41, 82, 240)  # pruner=none's grid and the last step: both sides validate at each
PARAMS = {"lr": 0.03, "width": 16, "batch_size": 64}

ALONE = """
import json, os, sys, tempfile, time
import lightning as L
import numpy as np
import torch
from lightning.pytorch.plugins.environments import LightningEnvironment
from torch.utils.data import TensorDataset
from parcel_hpc.data import read_split
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.integrations.lightning import ResumableLoader, probabilities
from parcel_hpc.trainer import load_training_data
from parcel_lightning.model import ParcelNet

params, milestones = json.loads(sys.argv[1]), json.loads(sys.argv[2])
root = os.environ.get("PARCEL_DATA_DIR", "data")
data = load_training_data(f"{root}/parcels.h5", read_split(f"{root}/split-group_r8.json"), {"revision": "stats-r1", "pool": 4})
metric = MissCost("miss-cost-r3", 5.0, 1.0)
marks = {}

class Milestones(L.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step in milestones:
            metric(probabilities(module, data.validation.images), data.validation.labels)
            marks[trainer.global_step] = time.perf_counter()

L.seed_everything(1234, verbose=False)
frames = torch.tensor(np.asarray(data.train.images))
labels = torch.tensor(np.asarray(data.train.labels), dtype=torch.float32)
model = ParcelNet(params["lr"], params["width"], frames.mean().item(), frames.std().item())
loader = ResumableLoader(TensorDataset(frames, labels), params["batch_size"], seed=1234)
with tempfile.TemporaryDirectory() as logs:
    trainer = L.Trainer(max_steps=milestones[-1], max_epochs=-1, plugins=[LightningEnvironment()], callbacks=[Milestones()], accelerator="cpu",
        devices=1, gradient_clip_val=1.0, deterministic=True, logger=L.pytorch.loggers.CSVLogger(logs), default_root_dir=logs,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
print(marks[milestones[-1]] - marks[milestones[2]])
"""


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))


def ours_steps() -> float:
    from parcel_hpc.ledger import SearchDir

    with tempfile.TemporaryDirectory() as tmp:
        launch(
            tmp,
            f"checkpoint.dir={tmp}/ckpt",
            "search.revision=lightning-bench",
            "trainer.target=parcel_lightning:train",
            "~space.params.hidden",
            "~space.params.l2",
            *[f"{k}=choice({v})" for k, v in PARAMS.items()],
            f"train.steps={MILESTONES[-1]}",
            "pruner=none",
            "search.n_trials=1",
            "resources.gpus=0",
            "checkpoint.every_steps=10",
            extra_env={"PYTHONPATH": _pythonpath()},
        )
        search = SearchDir(Path(tmp) / "runs" / "lightning-bench")
        at = {e.data.step: e.t for e in search.events("t0000") if e.kind.value == "milestone"}
    return at[MILESTONES[-1]] - at[MILESTONES[2]]


def alone_steps() -> float:
    argv = [sys.executable, "-c", ALONE, json.dumps(PARAMS), json.dumps(MILESTONES)]
    out = subprocess.run(argv, cwd=ROOT, env={**env(), "PYTHONPATH": _pythonpath()}, check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def run(repeats: int = 3) -> list[Figure]:
    ours, alone = [], []
    for _ in range(repeats):  # each side's own measured span (not its process's wall time), alternating
        alone.append(alone_steps())
        ours.append(ours_steps())
    n = MILESTONES[-1] - MILESTONES[2]
    note = f"{n} steps of width {PARAMS['width']}, batch {PARAMS['batch_size']}; fit alone median {sorted(alone)[len(alone) // 2] / n * 1000:.1f} ms/step"
    return [ratio("Lightning step under parcel_hpc (cpu, checkpoint every 10)", "the same Trainer.fit alone", ours, alone, STEP_TARGET, note)]


if __name__ == "__main__":
    main(run, __doc__)

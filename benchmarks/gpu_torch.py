"""The PyTorch CNN's checks on a GPU, in one run of a few minutes (issue 29's device script).

    python3 benchmarks/gpu_torch.py [--out DIR]      # from the repository root, on a CUDA host
    python3 benchmarks/gpu_torch.py --cpu            # the same steps on the CPU: try the script before a GPU lease

1. the conformance check of examples/parcel_cnn on cuda:0 (``check-trainer`` with CUDA_VISIBLE_DEVICES=0);
2. a 12-trial search with its pruner, each trial granted the GPU by the local executor (resources.gpus=1);
3. one trial signalled with SIGUSR2 mid-run, resumed from its checkpoint, against the same params
   run uninterrupted on the same GPU in this process (deterministic algorithms on: equal, bit for bit);
4. the used-GPU figures of both searches (``status --json``, ``export``);
5. the CNN benchmark on cuda (``bench_torch``: step time under parcel_hpc against the bare loop,
   a 100 MB state's checkpoint against torch.save + fsync).

Everything it prints is also written to ``--out``/gpu_torch.json. It needs parcel_hpc's
dependencies and torch with CUDA; the device tool's note in the README of the closing note says how
the wheels travel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples"
sys.path[:0] = [str(HERE), str(EXAMPLES)]
CNN = [
    "trainer.target=parcel_cnn:ParcelCNN",
    f"hydra.searchpath=[file://{EXAMPLES / 'parcel_cnn' / 'conf'}]",
    "space=cnn_r1",
    "selection/baseline=cnn_approved",
    "pruner=asha_cnn_r1",
    "train.steps=240",
    "resources.gpus=1",
]
SIGNALLED = {"lr": 0.03, "width": 16, "depth": 2, "dropout": 0.3, "batch_size": 64, "optimizer": "sgd"}


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def sh(*argv: str, **extra: str) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env(**extra), capture_output=True, text=True)
    print(f"$ {' '.join(argv[:4])} ... -> exit {res.returncode} in {time.monotonic() - t0:.1f} s", flush=True)
    if res.returncode != 0:
        print(res.stdout[-3000:], res.stderr[-3000:], flush=True)
    return res


def gpu_figures(search: Path) -> dict:
    status = json.loads(sh("-m", "parcel_hpc", "status", str(search), "--json").stdout or "{}")
    sh("-m", "parcel_hpc", "export", str(search), "-o", str(search.parent / f"{search.name}.csv"), "--format", "csv")
    rows = (search.parent / f"{search.name}.csv").read_text().splitlines() if (search.parent / f"{search.name}.csv").exists() else []
    header = rows[0].split(",") if rows else []
    keep = [i for i, h in enumerate(header) if "gpu" in h or h in ("trial_id", "state", "device")]
    return {
        "gpu_line": status.get("gpu_line"),
        "gpu_use": status.get("spend", {}).get("gpu_use"),
        "device_use": [t.get("device_use") for t in status.get("trials", [])],
        "export": [[row.split(",")[i] for i in keep] for row in rows[:13]],
    }


def uninterrupted(params: dict, steps: int, gpu: bool) -> float:
    from dataclasses import replace

    from parcel_cnn import ParcelCNN

    from parcel_hpc.data import read_split
    from parcel_hpc.governance.metric import MissCost
    from parcel_hpc.trainer import Devices, build_params, load_training_data

    data = load_training_data(ROOT / "data" / "parcels.h5", read_split(ROOT / "data" / "split-group_r8.json"), {"revision": "stats-r1", "pool": 4})
    data = replace(data, devices=Devices(1, ("0",)) if gpu else Devices())
    trainer = ParcelCNN()
    trainer.build(build_params(trainer, params), 1234, data)
    for _ in range(steps):
        trainer.step()
    return MissCost("miss-cost-r3", 5.0, 1.0)(trainer.predict("validation"), data.validation.labels)


def signalled_trial(root: Path, gpu: bool) -> dict:
    from parcel_hpc.ledger import SearchDir

    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={root}", "search.revision=sig", *CNN, "search.n_trials=1", "pruner=none"]
    argv += ["train.step_seconds=0.05", *[f"{k}=choice({v})" for k, v in SIGNALLED.items()]]
    launcher = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    search = SearchDir(root / "sig")
    deadline = time.monotonic() + 120
    while not any((root / "sig" / "checkpoints" / "t0000").glob("ckpt-*.h5")) and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    started = [e for e in search.events("t0000") if e.kind.value == "started"][-1]
    os.kill(started.data.pid, signal.SIGUSR2)
    _, err = launcher.communicate(timeout=240)
    rec = search.record("t0000")
    reference = uninterrupted(rec.spec.params, 240, gpu)
    return {
        "launcher_exit": launcher.returncode,
        "stderr_tail": err[-500:],
        "attempts": [
            {"how": a.how.value if a.how else None, "cause": a.cause.value if a.cause else None, "step": a.step, "resumed_from": a.resumed_from}
            for a in rec.attempts
        ],
        "metric": rec.metric,
        "uninterrupted_metric": reference,
        "equal": rec.metric == reference,
        "difference": None if rec.metric is None else abs(rec.metric - reference),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    ap.add_argument("--cpu", action="store_true", help="no GPU: the same steps on the CPU")
    args = ap.parse_args()
    import torch

    gpu = not args.cpu
    report: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if gpu else "cpu"}
    print(report, flush=True)
    root = Path("/tmp/gpu-torch")
    subprocess.run(["rm", "-rf", str(root)], check=True)
    sh("-m", "parcel_hpc", "make-snapshot", "data")
    check = sh("-m", "parcel_hpc", "check-trainer", "parcel_cnn:ParcelCNN", *CNN[1:4], "resources.gpus=1", **({"CUDA_VISIBLE_DEVICES": "0"} if gpu else {}))
    report["conformance"] = {"exit": check.returncode, "table": check.stdout[-2500:]}
    print(check.stdout[-2500:], flush=True)
    search = sh("-m", "parcel_hpc.launch", "-m", f"search.root={root}", "search.revision=cnn-gpu", *CNN, "search.n_trials=12", "search.seed=4")
    from parcel_hpc.ledger import SearchDir

    s = SearchDir(root / "cnn-gpu")
    report["search"] = {
        "exit": search.returncode,
        "trials": {r.trial_id: [r.state.value, r.metric, r.step] for r in s.records()},
        "summary": search.stdout[-1500:],
        "used": gpu_figures(root / "cnn-gpu"),
    }
    print(json.dumps(report["search"], indent=1), flush=True)
    report["signalled"] = signalled_trial(root, gpu)
    report["signalled"]["used"] = gpu_figures(root / "sig")
    print(json.dumps(report["signalled"], indent=1), flush=True)
    import bench_torch
    from _suite import print_table

    figures = bench_torch.run(repeats=3, device="cuda" if gpu else "cpu")
    print_table(figures)
    report["benchmark"] = [f.to_json() for f in figures]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_torch.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()

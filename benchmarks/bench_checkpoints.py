"""Checkpoint write bandwidth as a ratio against a raw fsync'd write of the same bytes, same run.

    .venv/bin/python benchmarks/bench_checkpoints.py [--mb 50] [--repeats 7] [--dir PATH]

The baseline writes every parameter array's bytes with open/write/fsync into a new file in the same
directory, then fsyncs the directory. A checkpoint save adds the content checksum, the HDF5 layout,
the body hash for the header, the rename and the directory fsync. Runs alternate (baseline,
checkpoint, ...) so both see the same disk and page-cache weather; the medians are compared.
Point --dir at the shared filesystem to measure NFS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from parcel_hpc.checkpoints import CheckpointStore, TrialIdentity
from parcel_hpc.fsio import fsync_dir


def make_params(total_mb: int) -> dict[str, np.ndarray]:
    """A model-like mix: a few big float32 matrices and some small vectors, ~total_mb MiB in all."""
    rng = np.random.default_rng(0)
    n_big = 8
    per = total_mb * (1 << 20) // 4 // n_big
    side = int(per**0.5)
    params = {f"block{i}/weight": rng.random((side, per // side), dtype=np.float32) for i in range(n_big)}
    params.update({f"block{i}/bias": rng.random(per // side, dtype=np.float32) for i in range(n_big)})
    return params


def raw_write(path: Path, params: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        for arr in params.values():
            f.write(memoryview(arr).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path.parent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()

    params = make_params(args.mb)
    nbytes = sum(a.nbytes for a in params.values())
    trial = TrialIdentity("t0001", "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        store = CheckpointStore(root / "ckpt", trial, keep_last=1)
        rng_state = np.random.default_rng(1).bit_generator.state
        store.save(0, params, {}, rng_state)  # warm-up: imports, first HDF5 file
        raw_times, ckpt_times = [], []
        for step in range(1, args.repeats + 1):
            path = root / f"raw-{step}.bin"
            t0 = time.perf_counter()
            raw_write(path, params)
            raw_times.append(time.perf_counter() - t0)
            path.unlink()
            t0 = time.perf_counter()
            store.save(step, params, {}, rng_state)  # keep_last=1: the previous file is removed after
            ckpt_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert store.load_latest().step == args.repeats
        load_s = time.perf_counter() - t0

    raw_s, ckpt_s = statistics.median(raw_times), statistics.median(ckpt_times)
    mib = nbytes / (1 << 20)
    print(f"payload            {mib:.1f} MiB in {len(params)} arrays, {args.repeats} runs each, medians")
    print(f"raw write+fsync    {raw_s * 1000:8.1f} ms  {mib / raw_s:8.1f} MiB/s")
    print(f"checkpoint save    {ckpt_s * 1000:8.1f} ms  {mib / ckpt_s:8.1f} MiB/s")
    print(f"verified load      {load_s * 1000:8.1f} ms  (header, body hash, HDF5 read, content checksum)")
    print(f"ratio save/raw     {ckpt_s / raw_s:8.2f}x")


if __name__ == "__main__":
    main()

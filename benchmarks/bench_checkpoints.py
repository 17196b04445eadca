"""Checkpoint save and resume against raw file I/O of the same bytes, same run, alternating.

    .venv/bin/python benchmarks/bench_checkpoints.py [--repeats 5] [--directory PATH] [--sizes 8,256]

Save baseline: the parameter bytes written with open/write/fsync into a temp file, renamed, and the
directory fsynced (what any atomic write costs). Resume baseline: the same file read back whole.
``CheckpointStore.save`` adds the HDF5 layout, the body digest and its header (2 KiB or more);
``load_latest`` adds reading the header and the digest check. Point --directory at the
shared filesystem to measure NFS. Targets: both <= 1.25x, at 8 MiB and 256 MiB.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _suite import Figure, alternate, main, ratio  # noqa: E402

from parcel_hpc.checkpoints.store import CheckpointStore, TrialIdentity  # noqa: E402
from parcel_hpc.fsio import fsync_dir  # noqa: E402

TARGET = 1.25


def make_params(total_mb: int) -> dict[str, np.ndarray]:
    """A model-like mix: a few big float32 matrices and some small vectors, ~total_mb MiB in all."""
    rng = np.random.default_rng(0)
    n_big = 8
    per = total_mb * (1 << 20) // 4 // n_big
    side = int(per**0.5)
    params = {f"block{i}/weight": rng.random((side, per // side), dtype=np.float32) for i in range(n_big)}
    params.update({f"block{i}/bias": rng.random(per // side, dtype=np.float32) for i in range(n_big)})
    return params


def raw_save(path: Path, params: dict[str, np.ndarray]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for arr in params.values():
            f.write(memoryview(arr).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def raw_read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def run(repeats: int = 5, directory: Path | None = None, sizes: tuple[int, ...] = (8, 256)) -> list[Figure]:
    return [figure for mb in sizes for figure in one_size(mb, repeats, directory)]


def one_size(mb: int, repeats: int, directory: Path | None) -> list[Figure]:
    trial = TrialIdentity("t0001", "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64)
    rng_state = np.random.default_rng(1).bit_generator.state
    params = make_params(mb)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        root = Path(tmp)
        store = CheckpointStore(root / "ckpt", trial, keep_last=1)
        store.save(0, params, {}, rng_state)  # warm-up: imports, first HDF5 file
        step = iter(range(1, 10_000))
        raw = root / "raw.bin"
        save_ours, save_raw = alternate(lambda: store.save(next(step), params, {}, rng_state), lambda: raw_save(raw, params), repeats)
        load_ours, load_raw = alternate(store.load_latest, lambda: raw_read(raw), repeats)
    return [
        ratio(f"checkpoint save {mb} MiB", "write+fsync+rename", save_ours, save_raw, TARGET),
        ratio(f"checkpoint resume {mb} MiB", "read", load_ours, load_raw, TARGET, "page cache warm for both"),
    ]


if __name__ == "__main__":
    main(run, __doc__, directory=Path, sizes=lambda text: tuple(int(s) for s in text.split(",")))

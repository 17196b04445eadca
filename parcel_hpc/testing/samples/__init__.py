"""Recorded sacct texts for tests (parcel_hpc's and users'); README.md says where each came from.

Owns: locating the sample files shipped as package data. Must not: parse them.
"""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent

__all__ = ["SAMPLES_DIR", "sample_names", "sample_path", "read_sample"]


def sample_names() -> list[str]:
    """The sacct text samples (``*.txt``, without the ``.stderr.txt`` recordings), sorted."""
    return sorted(p.name for p in SAMPLES_DIR.glob("*.txt") if not p.name.endswith(".stderr.txt"))


def sample_path(name: str) -> Path:
    path = SAMPLES_DIR / name
    if path.parent != SAMPLES_DIR or not path.is_file():
        raise FileNotFoundError(f"no sacct sample {name!r}; known: {', '.join(sample_names())}")
    return path


def read_sample(name: str) -> bytes:
    return sample_path(name).read_bytes()

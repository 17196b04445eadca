"""``parcel-hpc make-snapshot OUT_DIR``: write the synthetic parcel snapshot and its splits (group, 5-fold group, random)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.data import make_default_artifacts

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    for key, value in make_default_artifacts(args.out_dir, seed=args.seed).items():
        print(f"{key}: {value}")
    return 0

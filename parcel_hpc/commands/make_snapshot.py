"""``parcel-hpc make-snapshot OUT_DIR``: write the synthetic parcel snapshot and its splits.

With ``--assign FILE``, split the snapshot already in OUT_DIR (yours or the synthetic one) the way
the file says instead, and write nothing else: a split whose parcels cross partitions is refused
(exit 2) unless ``--group-leaks`` moves each crossing component into its latest partition.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from parcel_hpc.data import SNAPSHOT_FILENAME, make_assigned_split, make_default_artifacts
from parcel_hpc.errors import UsageError

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reshipped", type=int, default=0, metavar="N", help="parcels shipped a second time, in a later shipment")
    parser.add_argument(
        "--drift", type=float, default=0.0, metavar="X", help="0..1: the last 30%% x X of the shipments follow a switch of lighting and review policy"
    )
    parser.add_argument("--assign", type=Path, metavar="FILE", help='a JSON object {"<shipment_id>": "train" | "validation" | "final", ...}')
    parser.add_argument("--revision", help="the revision of the --assign split")
    parser.add_argument("--group-leaks", action="store_true", help="with --assign: move each component that crosses partitions into its latest one")


def run(args: argparse.Namespace) -> int:
    if args.assign is None:
        if args.revision or args.group_leaks:
            raise UsageError("--revision and --group-leaks go with --assign FILE; drop them, or give the assignment")
        for key, value in make_default_artifacts(args.out_dir, seed=args.seed, reshipped=args.reshipped, drift=args.drift).items():
            print(f"{key}: {value}")
        return 0
    if not args.revision:
        raise UsageError("--assign needs --revision NAME: the split file is split-NAME.json")
    try:
        assignment = json.loads(args.assign.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--assign {args.assign} cannot be read as JSON ({exc}); give a JSON object of shipment id to partition") from None
    if not isinstance(assignment, dict):
        raise UsageError(f"--assign {args.assign} holds a {type(assignment).__name__}; give a JSON object of shipment id to partition")
    info = make_assigned_split(args.out_dir / SNAPSHOT_FILENAME, args.out_dir, assignment, revision=args.revision, group_leaks=args.group_leaks)
    print(f"split_path: {info.split_path}\nfinal_path: {info.final_path}\ncounts: {' '.join(map(str, info.counts))}")
    return 0

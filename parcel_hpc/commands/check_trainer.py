"""``parcel-hpc check-trainer PACKAGE.MODULE:NAME``: the trainer conformance check, in seconds,
before a search relies on it (resume, determinism, serving parity)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.errors import UsageError
from parcel_hpc.trainer import conformance

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="PACKAGE.MODULE:NAME")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a trial parameter (repeat); VALUE is JSON or text")
    parser.add_argument("--data", type=Path, default=Path("data"), metavar="DIR", help="snapshot and split directory (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=12, metavar="N", help="steps before and after the checkpoint (default %(default)s)")
    parser.add_argument("--preprocessing", default="stats-r1", metavar="REVISION", help="feature revision (default %(default)s)")


def parse_params(items: list[str]) -> dict[str, object]:
    params: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--param {item!r} is not NAME=VALUE; e.g. --param lr=0.01")
        try:
            params[name] = json.loads(text)
        except ValueError:
            params[name] = text
    return params


def run(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be >= 1")
    ok = conformance.run(
        args.target, args.data, params, seed=args.seed, steps=args.steps, preprocessing={"revision": args.preprocessing, "pool": 4}, console=make_console()
    )
    return 0 if ok else 1

"""``parcel-hpc release SEARCH_DIR``: write the release packet (JSON, Markdown, HTML) and register
the artifact when every check passed or was decided (``release.publish``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.ownership import require_own_search
from parcel_hpc.release import publish

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--registry", type=Path, metavar="DIR", help="the folder registry's root (default: <search.root>/registry)")
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="release.registry=mlflow: the tracking server, before MLFLOW_TRACKING_URI and the contract's release.tracking_uri (a server that moved)",
    )


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    packet = publish(args.search_dir, args.registry, out=make_console(), tracking_uri=args.tracking_uri)
    return 0 if packet["registry_path"] else 3  # held: the outcome was printed first, with the checks

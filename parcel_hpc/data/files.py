"""Where a split revision's two files are: ``split-<revision>.json`` beside ``final-<revision>.json``.

Apart from ``split.py`` because the ledger's readers name these files (a selection's record points
at the final list) and a read command should not load numpy and h5py to spell a path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from parcel_hpc.errors import UsageError

_REVISION = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def _check_revision(revision: str) -> None:
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise UsageError(f"revision {revision!r} must match {_REVISION.pattern} (it becomes part of a file name)")


def split_paths(out_dir: str | os.PathLike, revision: str) -> tuple[Path, Path]:
    _check_revision(revision)
    return Path(out_dir) / f"split-{revision}.json", Path(out_dir) / f"final-{revision}.json"

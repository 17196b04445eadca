"""The one rich Console every command prints through."""

from __future__ import annotations

import shutil
import sys

from rich.console import Console


def make_console(*, stderr: bool = False) -> Console:
    """``stderr``: progress, kept apart from the results scripts read on stdout."""
    # Piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else max(160, shutil.get_terminal_size().columns))

"""The one rich Console every command prints through."""

from __future__ import annotations

import shutil
import sys

from rich.console import Console


def make_console() -> Console:
    # Piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column default.
    return Console(highlight=False, width=None if sys.stdout.isatty() else max(160, shutil.get_terminal_size().columns))

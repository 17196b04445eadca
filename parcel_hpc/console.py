"""The one rich Console every command prints through, and what makes printing records safe.

Records come from a shared root, where anyone may have written them: a trial id, user name, error
text, parameter value or path can hold rich markup (``[/]`` would crash the print) and terminal
control sequences (which would move the cursor, retitle the terminal, or hide lines). The console
strips control characters from every string it renders (``plain``); a record put into a string
that also carries markup goes through ``safe``, which escapes its markup too.
"""

from __future__ import annotations

import re
import shutil
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

# ESC sequences whole (CSI, OSC up to its terminator, two-character ones), then any other C0
# control but newline and tab, DEL and C1 controls (U+0080-U+009F, C1's CSI among them).
_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -~])?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: object) -> str:
    """``value`` as text a terminal shows as is: no control character but newline and tab."""
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", str(value)))


def safe(value: object) -> str:
    """A record's ``value`` to put into text rich reads markup from: controls gone, markup escaped."""
    return escape(plain(value))


class _RecordSafeConsole(Console):
    """Strips control characters from every string it renders (prints, table cells, titles)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(plain(text), **kwargs)


def make_console(*, stderr: bool = False) -> Console:
    """``stderr``: progress, kept apart from the results scripts read on stdout."""
    # Piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    return _RecordSafeConsole(stderr=stderr, highlight=False, width=None if stream.isatty() else max(160, shutil.get_terminal_size().columns))

"""The one rich Console every command prints through, and what makes printing records safe.

Records come from a shared root, where anyone may have written them: a trial id, user name, error
text, parameter value or path can hold rich markup (``[/]`` would crash the print), terminal
control sequences (which would move the cursor, retitle the terminal, or hide lines) and characters
that make one name pass for another: bidi controls that reorder what follows, zero-width and other
invisible characters, odd spaces, a combining mark on a Latin letter, a Cyrillic or Greek letter
among Latin ones, a fullwidth or mathematical letter. The console shows each of those escaped as
Python writes it (``\x1b``, ``\u202e``) in every string it renders (``plain``), so two names that
differ never look alike and nothing hides; newline and tab stay. A real name keeps its letters
(``Müller``, ``東京``, ``Ελλάδα``). A record put into a string that also carries markup goes through
``safe``, which escapes its markup too. ``documents.csv_cell`` shows the same characters the same
way in a CSV cell.
"""

from __future__ import annotations

import functools
import re
import shutil
import sys
import unicodedata
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

_ASCII_HIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # the controls of ASCII text, newline and tab aside
_WORD = re.compile(r"\w+")
_SHOWN_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"})


def plain(value: object) -> str:
    """``value`` as text a terminal shows as is: every character that would hide, move or pass for
    another (the module docstring) shown escaped; newline and tab kept."""
    text = str(value)
    if text.isascii():  # the usual text: only its controls to escape
        return _ASCII_HIDDEN.sub(_escape_match, text) if _ASCII_HIDDEN.search(text) else text
    out = []
    latin_words: bytearray | None = None  # 1 where a word holding an ASCII letter is, found once if needed
    for i, ch in enumerate(text):
        if ch.isascii():
            out.append(_escaped(ch) if _ASCII_HIDDEN.match(ch) else ch)
            continue
        hide = _hidden(ch) or (_is_mark(ch) and i > 0 and _latin(text[i - 1]))
        if not hide and _foreign_letter(ch):
            latin_words = _latin_words(text) if latin_words is None else latin_words
            hide = bool(latin_words[i])
        out.append(_escaped(ch) if hide else ch)
    return "".join(out)


def safe(value: object) -> str:
    """A record's ``value`` to put into text rich reads markup from: shown as ``plain``, markup escaped."""
    return escape(plain(value))


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escape_match(m: re.Match[str]) -> str:
    return _escaped(m.group())


@functools.lru_cache(maxsize=4096)
def _hidden(ch: str) -> bool:
    """A non-ASCII character never shown as itself: a control, a format character (bidi, zero-width),
    a space other than the space, a separator, a private, unassigned or surrogate code, or a letter
    or digit that is a compatibility form of another (fullwidth, mathematical, ligature, superscript)."""
    category = unicodedata.category(ch)
    if category not in _SHOWN_CATEGORIES and not category.startswith("M"):
        return True
    return category[0] in "LN" and unicodedata.decomposition(ch).startswith("<")


@functools.lru_cache(maxsize=4096)
def _is_mark(ch: str) -> bool:
    return unicodedata.category(ch).startswith("M")


@functools.lru_cache(maxsize=4096)
def _latin(ch: str) -> bool:
    return ch.isascii() and ch.isalpha() or unicodedata.name(ch, "").startswith("LATIN ")


@functools.lru_cache(maxsize=4096)
def _foreign_letter(ch: str) -> bool:
    """A letter of a script other than Latin (Cyrillic а, Greek ο: many look like Latin ones)."""
    return ch.isalpha() and not _latin(ch)


def _latin_words(text: str) -> bytearray:
    """1 at each character of a word of ``text`` that holds an ASCII letter: another script's
    letter there is a look-alike mixed into a Latin name."""
    mask = bytearray(len(text))
    for m in _WORD.finditer(text):
        if any(c.isascii() and c.isalpha() for c in m.group()):
            mask[m.start() : m.end()] = b"\1" * (m.end() - m.start())
    return mask


class _RecordSafeConsole(Console):
    """Strips control characters from every string it renders (prints, table cells, titles)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(plain(text), **kwargs)


def make_console(*, stderr: bool = False) -> Console:
    """``stderr``: progress, kept apart from the results scripts read on stdout."""
    # Piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    return _RecordSafeConsole(stderr=stderr, highlight=False, width=None if stream.isatty() else max(160, shutil.get_terminal_size().columns))

"""What the toolkit writes for other programs to open: CSV cells a spreadsheet cannot run as a
formula and that carry no raw control, bidi or look-alike character (shown escaped as the terminal
shows them: ``console.plain``), Markdown text a viewer cannot run as HTML or follow as a link.

Owns the two rules, used by every CSV and Markdown writer (``export``, ``reconcile --csv``, the
release packet's ``.md``): ``csv_cell`` (and ``csv_cells``, the same rule over a column of a
million cells) and ``markdown_text``. Pure; must
not decide where a file goes (``fsio.write_output`` does) nor what a terminal shows (``console``).
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from parcel_hpc.console import plain

# OWASP's CSV injection rule: a text cell starting with one of these is a formula to a spreadsheet.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A text cell that is one plain decimal number ("-3", "+1.5e-3") is read as that number, never as a
# formula: it stays as written, like every typed number (a negative float is a number, not a formula).
_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# Markdown (and the HTML it may hold) a value could form: tags and entities, links and images,
# code spans, table cells, and a backslash that would undo the escapes.
_MARKDOWN = str.maketrans(
    {"\\": "\\\\", "&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]", "`": "\\`", "|": "\\|", "\r": " ", "\n": " ", "\u2028": " ", "\u2029": " "}
)
# Link schemes that run or embed content when followed; http and https are left to link as text.
_SCHEME_RE = re.compile(r"\b(javascript|vbscript|data|file|blob)(\s*):", re.IGNORECASE)


def csv_cell(value: object) -> object:
    """``value`` as a CSV cell: text shown as ``console.plain`` shows it (a control or bidi
    character escaped; newline and tab kept, a quoted cell holds them), and text a spreadsheet
    would run gets a leading single quote (OWASP); numbers, numeric text, empty and None are unchanged."""
    if not isinstance(value, str):
        return value
    value = plain(value)
    if value.startswith(FORMULA_STARTS) and not _NUMBER_RE.fullmatch(value):
        return "'" + value
    return value


def csv_cells(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``csv_cell`` over a column of text, in Arrow (one pass, no Python object per cell but the
    rare one holding a character past printable ASCII, which ``plain`` shows)."""
    odd = pc.fill_null(pc.match_substring_regex(column, r"[^\x{20}-\x{7e}\t\n]"), False)
    if pc.any(odd).as_py():
        if isinstance(column, pa.ChunkedArray):
            column, odd = column.combine_chunks(), odd.combine_chunks()
        shown = pa.array([plain(v) for v in pc.filter(column, odd).to_pylist()], pa.string())
        column = pc.replace_with_mask(column, odd, shown)
    starts = pc.starts_with(column, FORMULA_STARTS[0])
    for start in FORMULA_STARTS[1:]:
        starts = pc.or_(starts, pc.starts_with(column, start))
    risky = pc.and_(starts, pc.invert(pc.match_substring_regex(column, f"^(?:{_NUMBER_RE.pattern})$")))
    return pc.if_else(risky, pc.binary_join_element_wise("'", column, ""), column)


def markdown_text(value: object) -> str:
    """``value`` as literal Markdown text: HTML escaped, no link, image, code span or table cell can
    start or end in it, one line, and a script scheme (``javascript:``, ``data:``) never reads as one."""
    return _SCHEME_RE.sub(r"\1\2&#58;", str(value).translate(_MARKDOWN))

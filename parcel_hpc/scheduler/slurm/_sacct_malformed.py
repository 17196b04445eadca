"""The error path of parse_sacct: find the malformed line and say what is wrong with it.

Owns: ``raise_malformed`` (one place for every "line N is bad" message) and the locator that
finds the line when pyarrow's reader itself fails (its errors name no line). Must not: be on
the fast path, or accept a line the fast path rejected without saying so.

Locating stays vectorized (a second, all-text read with pyarrow: a 1,000,000-line dump with
a bad last line is reported in about a second, not the half minute a Python loop takes);
only the one bad line is then examined in Python.
"""

from __future__ import annotations

import datetime as _dt
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from parcel_hpc.errors import AccountingError
from parcel_hpc.scheduler.slurm.sacct import SACCT_FIELDS, SACCT_FORMAT
from parcel_hpc.scheduler.states import JobState

NULL_TIMES = ("Unknown", "None")
MAX_DIGITS = 18  # int64 holds 18 digits; SLURM ids are 32-bit, so a longer one is garbage
EXIT_CODE = re.compile(r"^(\d{1,5}):(\d{1,5})$")
_JOB_ID_TEXT = r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?(?:\..+)?$"
_RAW_ID_TEXT = r"^\d+(?:\..+)?$"
_TIME_TEXT = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$"
_CANCELLED_BY = r"^CANCELLED by \d+$"
_TIME_PARTS = {"year": (0, 4), "month": (5, 7), "day": (8, 10), "hour": (11, 13), "minute": (14, 16), "second": (17, 19)}


def raise_malformed(body: memoryview, source: str, first_line: int, row: int | None, detail: str, fields: tuple[str, ...] = SACCT_FIELDS) -> None:
    """Raise AccountingError for the bad line at 0-based ``row`` of ``body`` (None: find it), whose
    lines hold ``fields``."""
    if row is None:
        row = _first_non_utf8_line(body)
    if row is None:
        row = locate_read_error(body, fields)
    if row is None:  # the locator could not pin it down: examine every line (slow, rare)
        lines = bytes(body).split(b"\n")
        row = next((i for i, line in enumerate(lines) if line_problem(line, fields) is not None), None)
        if row is None:
            raise AccountingError(f"{source}: sacct text could not be parsed ({_first_line_of(detail)})")
    problem = line_problem(_line_at(body, row), fields)
    if problem is None:  # the fast path saw something this check does not: still name the line
        problem = f"could not be parsed ({_first_line_of(detail)})"
    raise AccountingError(f"{source}:{first_line + row}: {problem}; sacct text must come from sacct --parsable2 --noheader --format={SACCT_FORMAT}")


def locate_read_error(body: memoryview, fields: tuple[str, ...] = SACCT_FIELDS) -> int | None:
    """0-based row of the first line pyarrow's typed read would reject, or None if unsure."""
    first_invalid: list[int] = []

    def on_invalid_row(invalid: pacsv.InvalidRow) -> str:
        if not first_invalid and invalid.number is not None:
            first_invalid.append(invalid.number - 1)
        return "skip"

    try:
        text = pacsv.read_csv(
            pa.py_buffer(body),
            # Serial reading is what makes pyarrow report each invalid row's line number.
            read_options=pacsv.ReadOptions(column_names=list(fields), use_threads=False, block_size=4 << 20),
            parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False, ignore_empty_lines=False, invalid_row_handler=on_invalid_row),
            convert_options=pacsv.ConvertOptions(column_types={f: pa.string() for f in fields}, strings_can_be_null=False),
        )
        suspect = _suspect_rows(text)
    except (pa.ArrowException, ValueError):
        return None
    candidates = list(first_invalid)
    if pc.any(suspect).as_py():
        index = pc.index(suspect, True).as_py()
        # Rows after a skipped (wrong field count) row are shifted; only earlier ones count.
        if not first_invalid or index < first_invalid[0]:
            candidates.append(index)
    return min(candidates) if candidates else None


def _suspect_rows(text: pa.Table) -> pa.ChunkedArray:
    def fails(name: str, pattern: str) -> pa.ChunkedArray:
        return pc.invert(pc.match_substring_regex(text.column(name), pattern))

    bad = pc.or_(fails("JobID", _JOB_ID_TEXT), fails("JobIDRaw", _RAW_ID_TEXT))
    bad = pc.or_(
        bad,
        pc.and_(fails("ExitCode", EXIT_CODE.pattern), pc.invert(pc.and_(pc.equal(text.column("ExitCode"), ""), pc.match_substring(text.column("JobID"), ".")))),
    )
    elapsed = text.column("ElapsedRaw")
    bad = pc.or_(bad, pc.invert(pc.ascii_is_decimal(elapsed)))
    bad = pc.or_(bad, pc.greater(pc.utf8_length(elapsed), MAX_DIGITS))
    known = pa.array([s.text for s in JobState])
    state = text.column("State")
    bad = pc.or_(bad, pc.invert(pc.or_(pc.is_in(state, value_set=known), pc.match_substring_regex(state, _CANCELLED_BY))))
    for name in ("Submit", "Start", "End"):
        column = text.column(name)
        shaped = pc.match_substring_regex(column, _TIME_TEXT)
        ok = pc.or_(pc.is_in(column, value_set=pa.array(NULL_TIMES)), shaped)
        # The shape passes 2026-02-30 and strptime rolls it over to March 2: an impossible date
        # shows as a field of the parsed time that differs from its text.
        as_time = pc.if_else(shaped, column, "1970-01-01T00:00:00")
        parsed = pc.strptime(as_time, format="%Y-%m-%dT%H:%M:%S", unit="s", error_is_null=True)
        bad = pc.or_(bad, pc.or_(pc.invert(ok), pc.is_null(parsed)))
        for part, (lo, hi) in _TIME_PARTS.items():
            written = pc.cast(pc.utf8_slice_codeunits(as_time, lo, hi), pa.int64())
            bad = pc.or_(bad, pc.fill_null(pc.not_equal(getattr(pc, part)(parsed), written), False))
    return bad


def line_problem(line_bytes: bytes, names: tuple[str, ...] = SACCT_FIELDS) -> str | None:
    """What is wrong with one line of sacct text, or None if nothing is."""
    line_bytes = line_bytes[:-1] if line_bytes.endswith(b"\r") else line_bytes
    try:
        line = line_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return "line is not UTF-8"
    fields = line.split("|")
    if len(fields) != len(names):
        hint = " (a '|' inside a job name?)" if len(fields) > len(names) else ""
        return f"expected {len(names)} '|'-separated fields, found {len(fields)}{hint}"
    row = dict(zip(names, fields))
    if not re.match(_JOB_ID_TEXT, row["JobID"]):
        return f"JobID {row['JobID']!r} is not a SLURM job id (12, 29_3, 12.batch)"
    if not re.match(_RAW_ID_TEXT, row["JobIDRaw"]):
        return f"JobIDRaw {row['JobIDRaw']!r} is not a SLURM job id"
    try:
        JobState.parse(row["State"])
    except AccountingError as exc:
        return str(exc)
    m = EXIT_CODE.match(row["ExitCode"])
    if row["ExitCode"] == "" and "." in row["JobID"]:
        pass  # a step cancelled with its node has no exit code
    elif not m or int(m.group(1)) > 32767 or int(m.group(2)) > 32767:
        return f"ExitCode {row['ExitCode']!r} is not <status>:<signal>"
    for name in ("Submit", "Start", "End"):
        value = row[name]
        if value not in NULL_TIMES and not _is_time(value):
            return f"{name} {value!r} is not a time (YYYY-MM-DDTHH:MM:SS or Unknown)"
    if not row["ElapsedRaw"].isascii() or not row["ElapsedRaw"].isdigit() or len(row["ElapsedRaw"]) > MAX_DIGITS:
        return f"ElapsedRaw {row['ElapsedRaw']!r} is not a whole number of seconds"
    for part in re.split(r"[._+\[\]]", row["JobID"].split(".", 1)[0]) + [row["JobIDRaw"].split(".", 1)[0]]:
        if part.isdigit() and len(part) > MAX_DIGITS:
            return f"job id {part!r} is longer than {MAX_DIGITS} digits"
    return None


def _first_non_utf8_line(body: memoryview) -> int | None:
    data = bytes(body)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return data.count(b"\n", 0, exc.start)
    return None


def _line_at(body: memoryview, row: int) -> bytes:
    newlines = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == 0x0A)
    start = 0 if row == 0 else int(newlines[row - 1]) + 1
    end = int(newlines[row]) if row < len(newlines) else len(body)
    return bytes(body[start:end])


def _is_time(text: str) -> bool:
    if not re.match(_TIME_TEXT, text):
        return False
    try:
        _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return False
    return True


def _first_line_of(detail: str) -> str:
    return detail.splitlines()[0] if detail else "bad value"

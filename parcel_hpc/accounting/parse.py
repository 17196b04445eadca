"""Parse sacct's ``--parsable2`` text into columns, without a Python object per line.

Owns: ``parse_sacct`` and ``SacctTable``, the columnar view every accounting computation
reads. Must not: run sacct, group attempts or price anything (``attempts.py`` does that), or
skip a line it cannot read — a malformed line raises AccountingError naming the source and
its 1-based line number.

How it stays fast (1,000,000 lines in a small multiple of pyarrow's own CSV time): pyarrow's
CSV reader splits the text with explicit column types (plain strings: its own dictionary
conversion is slower than encoding afterwards), State, ExitCode and AllocTRES are
dictionary-encoded so each distinct value is interpreted once, not once per line, and
pyarrow.compute derives the job id parts. Detection is vectorized; only when something is
wrong does a slow line-by-line pass (``_first_bad_line``) find the line and say what is wrong,
so every error message comes from one place.
"""

from __future__ import annotations

import dataclasses
import os
import datetime as _dt
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from parcel_hpc.accounting.sacct import SACCT_FIELDS, SACCT_FORMAT
from parcel_hpc.accounting.states import JobState
from parcel_hpc.errors import AccountingError, UsageError

_TEXT = pa.string()
_TS = pa.timestamp("s")
_READ_TYPES = {
    "JobID": pa.string(),
    "JobIDRaw": pa.string(),
    "JobName": _TEXT,
    "State": _TEXT,
    "ExitCode": _TEXT,
    "Submit": _TS,
    "Start": _TS,
    "End": _TS,
    "ElapsedRaw": pa.int64(),
    "AllocTRES": _TEXT,
    "NodeList": _TEXT,
    "Partition": _TEXT,
    "Account": _TEXT,
    "QOS": _TEXT,
    "User": _TEXT,
    "Reason": _TEXT,
}
assert tuple(_READ_TYPES) == SACCT_FIELDS
# sacct prints Unknown for a time not reached yet; None shows up in some dumps for never-started jobs.
_NULL_TIMES = ["Unknown", "None"]
_MAX_DIGITS = 18
_THREADS = min(8, os.cpu_count() or 1)
_MIN_ROWS_PER_THREAD = 50_000  # below this, a thread costs more than it saves
_BLOCK_BYTES = 4 << 20

SCHEMA = pa.schema(
    [
        ("line", pa.int64()),            # 1-based line in the source text
        ("job_id", pa.string()),         # as submitted, without the step: 12, 29_3, 12+0, 29_[4-9]
        ("base_job_id", pa.int64()),     # 29 for 29_3
        ("array_task", pa.int64()),      # 3 for 29_3; null for plain jobs and pending array ranges
        ("step", pa.string()),           # batch, extern, 0 ...; null on an allocation row
        ("is_allocation", pa.bool_()),   # the job's own row (one per attempt with --duplicates)
        ("raw_job_id", pa.int64()),      # JobIDRaw without the step
        ("job_name", _TEXT),
        ("state", pa.int8()),            # JobState.code
        ("state_text", _TEXT),           # as printed, e.g. "CANCELLED by 0"
        ("exit_status", pa.int16()),     # ExitCode before the colon
        ("exit_signal", pa.int16()),     # ExitCode after the colon
        ("submit", pa.int64()),          # epoch seconds, null when Unknown
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("elapsed_s", pa.int64()),
        ("gpus", pa.int64()),            # gres/gpu=N in AllocTRES, 0 when absent
        ("cpus", pa.int64()),            # cpu=N in AllocTRES, 0 when absent
        ("billing", pa.int64()),         # billing=N in AllocTRES, 0 when absent
        ("alloc_tres", _TEXT),
        ("node_list", _TEXT),
        ("partition", _TEXT),
        ("account", _TEXT),
        ("qos", _TEXT),
        ("user", _TEXT),
        ("reason", _TEXT),
    ]
)

__all__ = ["SCHEMA", "SacctTable", "parse_sacct"]


@dataclasses.dataclass(frozen=True)
class SacctTable:
    """Parsed sacct rows as columns (``SCHEMA``), in source order, one row per input line."""

    table: pa.Table
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.table, pa.Table) or not self.table.schema.equals(SCHEMA):
            raise TypeError("SacctTable.table must be a pyarrow Table with parse.SCHEMA; build it with parse_sacct")
        if not self.source:
            raise ValueError("SacctTable.source must name where the text came from")

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> pa.ChunkedArray:
        return self.table.column(name)

    def allocations(self, columns: list[str] | None = None) -> pa.Table:
        """The allocation rows only (one per attempt), in source order; all columns by default."""
        table = self.table if columns is None else self.table.select(columns)
        return table.filter(self.table.column("is_allocation"))


def parse_sacct(data: bytes, *, source: str = "<sacct>", tz: str = "UTC") -> SacctTable:
    """Parse ``sacct --parsable2 --noheader --format=SACCT_FORMAT`` output.

    ``tz`` is the zone the times were printed in (``run_sacct`` makes it UTC). A header line
    is accepted only if it names exactly ``SACCT_FIELDS``. Raises AccountingError on any
    malformed line, naming ``source`` and the line.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"parse_sacct needs bytes, got {type(data).__name__}; read the file in binary mode")
    body, first_line = _split_header(memoryview(data), source)
    body = _without_trailing_newlines(body)
    if len(body) == 0:
        return SacctTable(SCHEMA.empty_table(), source)
    try:
        raw = pacsv.read_csv(
            pa.py_buffer(body),
            # 4 MiB blocks: fewer, larger chunks make every compute call after this cheaper.
            read_options=pacsv.ReadOptions(column_names=list(SACCT_FIELDS), block_size=_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types=_READ_TYPES,
                null_values=_NULL_TIMES,
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowException, ValueError) as exc:
        _raise_first_bad_line(body, source, first_line, None, str(exc))
        raise AssertionError("unreachable")  # pragma: no cover
    return SacctTable(_derive(raw, body, source, first_line, tz), source)


def _derive(raw: pa.Table, body: memoryview, source: str, first_line: int, tz: str) -> pa.Table:
    # pyarrow.compute releases the GIL but runs each call on one core: derive row ranges in
    # parallel threads (like the CSV reader itself), then stitch the chunks back in order.
    n = raw.num_rows
    parts = max(1, min(_THREADS, n // _MIN_ROWS_PER_THREAD))
    bounds = [n * i // parts for i in range(parts + 1)]
    problems: list[tuple[int, str]] = []  # (first bad row, what), from every thread
    if parts == 1:
        derived = [_derive_rows(raw, 0, tz, problems)]
    else:
        with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="parse_sacct") as pool:
            futures = [
                pool.submit(_derive_rows, raw.slice(lo, hi - lo), lo, tz, problems)
                for lo, hi in zip(bounds[:-1], bounds[1:])
            ]
            derived = [f.result() for f in futures]
    if problems:
        row, what = min(problems)
        _raise_first_bad_line(body, source, first_line, row, what)
    line = pa.array(np.arange(first_line, first_line + n, dtype=np.int64))
    columns = []
    for field in SCHEMA:
        if field.name == "line":
            columns.append(line)
        else:
            columns.append(pa.chunked_array([c for d in derived for c in d[field.name].chunks], type=field.type))
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def _derive_rows(raw: pa.Table, row0: int, tz: str, problems: list[tuple[int, str]]) -> dict[str, pa.ChunkedArray]:
    """Every SCHEMA column but ``line`` for these rows; bad rows are flagged (offset by row0)."""
    found: list[tuple[int, str]] = []
    job_id, step, base_text, task_number = _job_id_columns(raw.column("JobID"), found)
    raw_text = _before(raw.column("JobIDRaw"), ".")
    _flag(found, pc.invert(pc.ascii_is_decimal(raw_text)), "JobIDRaw is not a SLURM job id")
    _flag(found, pc.greater(pc.utf8_length(raw_text), _MAX_DIGITS), f"job id longer than {_MAX_DIGITS} digits")
    (state,) = _per_distinct(raw.column("State"), (_state_codes, pa.int8()))
    _flag(found, pc.is_null(state), "unknown State")
    exit_status, exit_signal = _per_distinct(
        raw.column("ExitCode"), (lambda v: _exit_part(v, 0), pa.int16()), (lambda v: _exit_part(v, 1), pa.int16())
    )
    _flag(found, pc.is_null(exit_status), "ExitCode is not <status>:<signal>")
    elapsed = raw.column("ElapsedRaw")
    _flag(found, pc.is_null(elapsed), "ElapsedRaw is missing")
    _flag(found, pc.less(elapsed, 0), "ElapsedRaw is negative")
    tres = raw.column("AllocTRES")
    gpus, cpus, billing = _per_distinct(
        tres, *[(lambda v, key=key: _tres_count(v, key), pa.int64()) for key in ("gres/gpu", "cpu", "billing")]
    )
    problems.extend((row0 + row, what) for row, what in found)  # list.extend is atomic under the GIL
    if found:
        return {}
    return {
        "job_id": job_id,
        "base_job_id": pc.cast(base_text, pa.int64()),
        "array_task": pc.cast(task_number, pa.int64()),
        "step": step,
        "is_allocation": pc.is_null(step),
        "raw_job_id": pc.cast(raw_text, pa.int64()),
        "job_name": raw.column("JobName"),
        "state": state,
        "state_text": raw.column("State"),
        "exit_status": exit_status,
        "exit_signal": exit_signal,
        "submit": _epoch(raw.column("Submit"), tz),
        "start": _epoch(raw.column("Start"), tz),
        "end": _epoch(raw.column("End"), tz),
        "elapsed_s": elapsed,
        "gpus": gpus,
        "cpus": cpus,
        "billing": billing,
        "alloc_tres": tres,
        "node_list": raw.column("NodeList"),
        "partition": raw.column("Partition"),
        "account": raw.column("Account"),
        "qos": raw.column("QOS"),
        "user": raw.column("User"),
        "reason": raw.column("Reason"),
    }


def _job_id_columns(job_id_full: pa.ChunkedArray, problems: list[tuple[int, str]]) -> tuple[pa.ChunkedArray, ...]:
    """JobID -> (job_id, step, base id text, array task text or null); flags bad rows."""
    job_id, step = _split_once(job_id_full, ".")
    base_text, task_core = _split_once(job_id, "_")
    base_ok, task_ok, task_is_number = _id_parts_ok(base_text, task_core)
    if not (pc.all(base_ok).as_py() and pc.all(task_ok).as_py()) and pc.any(pc.match_substring(job_id, "+")).as_py():
        # Heterogeneous job components (12+0, 29_3+1) are rare: only look for them when the
        # plain split left something that is not a number.
        base_text, task_core = _before(base_text, "+"), _before(task_core, "+")
        base_ok, task_ok, task_is_number = _id_parts_ok(base_text, task_core)
    _flag(problems, pc.invert(base_ok), "JobID is not a SLURM job id")
    _flag(problems, pc.invert(task_ok), "JobID is not a SLURM job id")
    _flag(problems, pc.equal(step, ""), "JobID has an empty step")
    task_number = pc.if_else(task_is_number, task_core, pa.scalar(None, pa.string()))
    # int64 holds 18 digits; SLURM ids are 32-bit, so a longer one is garbage, not a big job.
    for text in (base_text, task_number):
        _flag(problems, pc.greater(pc.utf8_length(text), _MAX_DIGITS), f"job id longer than {_MAX_DIGITS} digits")
    return job_id, step, base_text, task_number


def _id_parts_ok(base_text: pa.ChunkedArray, task_core: pa.ChunkedArray) -> tuple[pa.ChunkedArray, ...]:
    # A task part is digits (29_3) or a pending range (29_[4-9%2]); null when there is none.
    task_is_number = pc.ascii_is_decimal(task_core)
    task_is_range = pc.and_(pc.starts_with(task_core, "["), pc.ends_with(task_core, "]"))
    return pc.ascii_is_decimal(base_text), pc.or_(task_is_number, task_is_range), task_is_number


def _flag(problems: list[tuple[int, str]], bad: pa.ChunkedArray, what: str) -> None:
    """Record the first row where ``bad`` is true (nulls are not bad); the message comes later."""
    if pc.any(bad).as_py():
        problems.append((pc.index(bad, True).as_py(), what))


def _before(text: pa.ChunkedArray, separator: str) -> pa.ChunkedArray:
    return _split_once(text, separator)[0]


def _split_once(text: pa.ChunkedArray, separator: str) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """(text before the first separator, text after it or null when there is none).

    Reads both parts straight from the split's list offsets: half the cost of
    list_element + list_slice on a million rows.
    """
    heads, tails = [], []
    for lists in pc.split_pattern(text, separator, max_splits=1).chunks:
        offsets = lists.offsets.to_numpy()
        count = offsets[1:] - offsets[:-1]  # 0 where the input was null
        first = offsets[:-1]
        heads.append(lists.values.take(pa.array(first, mask=count == 0)))
        tails.append(lists.values.take(pa.array(first + 1, mask=count != 2)))
    return pa.chunked_array(heads, type=pa.string()), pa.chunked_array(tails, type=pa.string())


def _per_distinct(
    column: pa.ChunkedArray, *maps: tuple[Callable[[pa.Array], pa.Array], pa.DataType]
) -> list[pa.Array]:
    """Interpret each distinct value of a low-cardinality text column once, then gather per row.

    dictionary_encode of a chunked array gives every chunk the same (full) dictionary.
    """
    encoded = pc.dictionary_encode(column)
    if encoded.num_chunks == 0:
        return [pa.chunked_array([], type=out_type) for _, out_type in maps]
    dictionary = encoded.chunk(0).dictionary
    out = []
    for per_values, out_type in maps:
        mapped = per_values(dictionary).cast(out_type)
        out.append(pa.chunked_array([mapped.take(chunk.indices) for chunk in encoded.chunks], type=out_type))
    return out


def _state_codes(values: pa.Array) -> pa.Array:
    codes = []
    for text in values.to_pylist():
        try:
            codes.append(JobState.parse(text).code)
        except AccountingError:
            codes.append(None)
    return pa.array(codes, pa.int8())


_EXIT_CODE = re.compile(r"^(\d{1,5}):(\d{1,5})$")


def _exit_part(values: pa.Array, which: int) -> pa.Array:
    out = []
    for text in values.to_pylist():
        m = _EXIT_CODE.match(text)
        out.append(int(m.group(which + 1)) if m and int(m.group(which + 1)) <= 32767 else None)
    return pa.array(out, pa.int16())


def _tres_count(values: pa.Array, name: str) -> pa.Array:
    # Anchored on a comma so "gres/gpu=" does not match a typed "gres/gpu:a100=" entry (the
    # untyped one is SLURM's total) and "cpu=" does not match inside another key.
    found = pc.extract_regex(values, rf"(?:^|,){re.escape(name)}=(?P<n>\d+)(?:,|$)")
    return pc.fill_null(pc.cast(pc.struct_field(found, "n"), pa.int64()), 0)


def _epoch(ts: pa.ChunkedArray, tz: str) -> pa.ChunkedArray:
    if tz != "UTC":
        try:
            ts = pc.assume_timezone(ts, timezone=tz, ambiguous="earliest", nonexistent="earliest")
        except pa.ArrowException as exc:
            raise UsageError(f"unknown time zone {tz!r} for sacct times ({exc}); use an IANA name like Europe/Zurich") from None
    return pc.cast(ts, pa.int64())


def _split_header(view: memoryview, source: str) -> tuple[memoryview, int]:
    """The text after an optional header line, and the line number its first row has."""
    if bytes(view[:6]) != b"JobID|":
        return view, 1
    end = bytes(view[:4096]).find(b"\n")
    end = len(view) if end < 0 else end
    header = bytes(view[:end]).rstrip(b"\r").decode("utf-8", "replace")
    if header != "|".join(SACCT_FIELDS):
        raise AccountingError(
            f"{source}:1: header names the fields {header!r}, not parcel_hpc's; "
            f"export with sacct --parsable2 --noheader --duplicates --format={SACCT_FORMAT}"
        )
    return view[end + 1 :], 2


def _without_trailing_newlines(body: memoryview) -> memoryview:
    # Blank lines at the very end carry no rows (an export may append some); a blank line
    # between rows is still malformed. The last row needs no terminator.
    end = len(body)
    while end > 0 and body[end - 1] in (0x0A, 0x0D):
        end -= 1
    return body[:end]


# ---- the slow path: find the first bad line and say what is wrong with it -------------------

_JOB_ID_TEXT = re.compile(r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?(?:\..+)?$")
_RAW_ID_TEXT = re.compile(r"^\d+(?:\..+)?$")
_TIME_TEXT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")


def _raise_first_bad_line(body: memoryview, source: str, first_line: int, row: int | None, detail: str) -> None:
    lines = bytes(body).split(b"\n")
    start = 0 if row is None else row
    for index in range(start, len(lines)):
        problem = _line_problem(lines[index])
        if problem is not None:
            raise AccountingError(
                f"{source}:{first_line + index}: {problem}; sacct text must come from "
                f"sacct --parsable2 --noheader --format={SACCT_FORMAT}"
            )
    where = f"{source}:{first_line + row}" if row is not None else source
    raise AccountingError(f"{where}: sacct text could not be parsed ({detail.splitlines()[0] if detail else 'bad value'})")


def _line_problem(line_bytes: bytes) -> str | None:
    line_bytes = line_bytes[:-1] if line_bytes.endswith(b"\r") else line_bytes
    try:
        line = line_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return "line is not UTF-8"
    fields = line.split("|")
    if len(fields) != len(SACCT_FIELDS):
        hint = " (a '|' inside a job name?)" if len(fields) > len(SACCT_FIELDS) else ""
        return f"expected {len(SACCT_FIELDS)} '|'-separated fields, found {len(fields)}{hint}"
    row = dict(zip(SACCT_FIELDS, fields))
    if not _JOB_ID_TEXT.match(row["JobID"]):
        return f"JobID {row['JobID']!r} is not a SLURM job id (12, 29_3, 12.batch)"
    if not _RAW_ID_TEXT.match(row["JobIDRaw"]):
        return f"JobIDRaw {row['JobIDRaw']!r} is not a SLURM job id"
    try:
        JobState.parse(row["State"])
    except AccountingError as exc:
        return str(exc)
    m = _EXIT_CODE.match(row["ExitCode"])
    if not m or int(m.group(1)) > 32767 or int(m.group(2)) > 32767:
        return f"ExitCode {row['ExitCode']!r} is not <status>:<signal>"
    for name in ("Submit", "Start", "End"):
        value = row[name]
        if value not in _NULL_TIMES and not _is_time(value):
            return f"{name} {value!r} is not a time (YYYY-MM-DDTHH:MM:SS or Unknown)"
    if not row["ElapsedRaw"].isascii() or not row["ElapsedRaw"].isdigit():
        return f"ElapsedRaw {row['ElapsedRaw']!r} is not a whole number of seconds"
    for part in re.split(r"[._+\[\]]", row["JobID"].split(".", 1)[0]) + [row["JobIDRaw"].split(".", 1)[0]]:
        if part.isdigit() and len(part) > _MAX_DIGITS:
            return f"job id {part!r} is longer than {_MAX_DIGITS} digits"
    return None


def _is_time(text: str) -> bool:
    if not _TIME_TEXT.match(text):
        return False
    try:
        _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return False
    return True

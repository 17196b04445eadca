"""Parse sacct's ``--parsable2`` text into columns, without a Python object per line.

Owns: ``parse_sacct`` (of sacct's output, or ``parse_sacct_file`` of a dump) and ``SacctTable``,
the columnar view every accounting computation reads. Must not: run sacct, group job runs or price anything (``runs.py`` does that), or
skip a line it cannot read — a malformed line raises AccountingError naming the source and
its 1-based line number.

How it stays fast (1,000,000 lines in under about twice pyarrow's own CSV time; see
benchmarks/bench_sacct.py): pyarrow's CSV reader splits the text with explicit column types;
State, ExitCode and AllocTRES are dictionary-encoded afterwards so each distinct value is
interpreted once, not once per line; pyarrow.compute splits the job ids (JobIDRaw's number is
read straight from the string buffer with numpy); the text is read a 4 MiB block at a time and
each block derived in a thread while the next is read (pyarrow releases the GIL), so a dump is
never held whole, and a caller that needs only the jobs' own rows (``allocations_only``: every
reconcile) keeps a third of them. Detection is vectorized; only when something is wrong does
``_malformed`` find the line and say what is wrong with it, so every error message comes from
one place.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from parcel_hpc.errors import AccountingError, UsageError
from parcel_hpc.scheduler.slurm._sacct_malformed import EXIT_CODE, MAX_DIGITS, NULL_TIMES, raise_malformed
from parcel_hpc.scheduler.slurm.sacct import SACCT_FIELDS, SACCT_FORMAT
from parcel_hpc.scheduler.slurm.version import PER_RUN_FIELDS
from parcel_hpc.scheduler.states import JobState

_TEXT = pa.string()  # plain: pyarrow's own dictionary conversion while reading is slower
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
    "SLUID": _TEXT,  # 26.05's per-run columns, when asked for (version.PER_RUN_FIELDS)
    "Restarts": _TEXT,  # a number on a job's row, empty on its steps': cast after reading
}
_WITH_PER_RUN = SACCT_FIELDS + PER_RUN_FIELDS
assert tuple(_READ_TYPES) == _WITH_PER_RUN
# sacct prints Unknown for a time not reached yet; None shows up in some dumps for never-started jobs.
_NULL_TIMES = list(NULL_TIMES)
_MAX_DIGITS = MAX_DIGITS
_THREADS = min(8, os.cpu_count() or 1)
_BLOCK_BYTES = 4 << 20

SCHEMA = pa.schema(
    [
        ("line", pa.int64()),  # 1-based line in the source text
        ("job_id", pa.string()),  # as submitted, without the step: 12, 29_3, 12+0, 29_[4-9]
        ("base_job_id", pa.int64()),  # 29 for 29_3
        ("array_task", pa.int64()),  # 3 for 29_3; null for plain jobs and pending array ranges
        ("step", pa.string()),  # batch, extern, 0 ...; null on an allocation row
        ("is_allocation", pa.bool_()),  # the job's own row (one per run with --duplicates)
        ("raw_job_id", pa.int64()),  # JobIDRaw without the step
        ("job_name", _TEXT),
        ("state", pa.int8()),  # JobState.code
        ("state_text", _TEXT),  # as printed, e.g. "CANCELLED by 0"
        ("exit_status", pa.int16()),  # ExitCode before the colon
        ("exit_signal", pa.int16()),  # ExitCode after the colon
        ("submit", pa.int64()),  # epoch seconds, null when Unknown
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("elapsed_s", pa.int64()),
        ("gpus", pa.int64()),  # gres/gpu=N in AllocTRES, 0 when absent
        ("cpus", pa.int64()),  # cpu=N in AllocTRES, 0 when absent
        ("billing", pa.int64()),  # billing=N in AllocTRES, 0 when absent
        ("alloc_tres", _TEXT),
        ("node_list", _TEXT),
        ("partition", _TEXT),
        ("account", _TEXT),
        ("qos", _TEXT),
        ("user", _TEXT),
        ("reason", _TEXT),
        ("sluid", _TEXT),  # the run's own id (26.05's SLUID); null where sacct was not asked for it
        ("restarts", pa.int64()),  # requeues before this run (26.05's Restarts); null where not asked for
    ]
)

__all__ = ["SCHEMA", "SacctTable", "parse_sacct", "parse_sacct_file"]


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
        """The allocation rows only (one per job run), in source order; all columns by default."""
        table = self.table if columns is None else self.table.select(columns)
        mask = self.table.column("is_allocation")
        return table if pc.all(mask).as_py() is not False else table.filter(mask)  # parsed allocations_only: as it is


def parse_sacct(data: bytes, *, source: str = "<sacct>", tz: str = "UTC", allocations_only: bool = False) -> SacctTable:
    """Parse ``sacct --parsable2 --noheader --format=SACCT_FORMAT`` output (with 26.05's per-run
    SLUID and Restarts after it, when ``build_sacct_argv`` was given that version: told by the header or the
    first line's field count).

    ``tz`` is the zone the times were printed in (``run_sacct`` makes it UTC). A header line
    is accepted only if it names exactly ``SACCT_FIELDS`` (and the per-run fields). Raises AccountingError on any
    malformed line, naming ``source`` and the line. ``allocations_only``: every line is checked,
    only the jobs' own rows (one per run) are kept, a third of a dump's lines.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"parse_sacct needs bytes, got {type(data).__name__}; read the file in binary mode")
    body, first_line, fields = _split_header(memoryview(data), source)
    body = _without_trailing_newlines(body)
    return _parse(pa.BufferReader(pa.py_buffer(body)), lambda: body, first_line, fields, source, tz, allocations_only)


def parse_sacct_file(path: str | os.PathLike, *, source: str, tz: str = "UTC", allocations_only: bool = False) -> SacctTable:
    """``parse_sacct`` of a dump on disk, read by pyarrow a block at a time: a month's dump is never
    held whole in memory (the text is read again only to name a malformed line; a dump under 4 KiB,
    or one ending in blank lines, is read as bytes). Raises OSError when the file cannot be read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(4096)
        f.seek(max(0, size - 4096))
        tail = f.read()
    last_line_ended = tail.removesuffix(b"\n").removesuffix(b"\r")
    if len(head) == size or last_line_ended.endswith((b"\n", b"\r")):  # small, or blank lines at the end: as bytes
        return parse_sacct(Path(path).read_bytes(), source=source, tz=tz, allocations_only=allocations_only)
    after_header, _, fields = _split_header(memoryview(head), source)
    header_end = len(head) - len(after_header)

    def text() -> memoryview:
        return _without_trailing_newlines(memoryview(Path(path).read_bytes())[header_end:])

    with pa.OSFile(str(path)) as stream:
        stream.seek(header_end)
        return _parse(stream, text, 1 if header_end == 0 else 2, fields, source, tz, allocations_only)


def _parse(
    stream: pa.NativeFile, text: Callable[[], memoryview], first_line: int, fields: tuple[str, ...], source: str, tz: str, allocations_only: bool
) -> SacctTable:
    """Read the text a block at a time and derive each block's columns in a thread as the next is
    read (pyarrow.compute releases the GIL but runs each call on one core); ``text()`` is the body
    again, only to name the line of an error."""
    derived: list[pa.Table] = []
    problems: list[tuple[int, str]] = []  # (first bad row, what), from every thread
    with ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="parse_sacct") as pool:
        pending: deque[Future[pa.Table]] = deque()
        try:
            row0 = 0
            for batch in _batches(stream, fields):
                pending.append(pool.submit(_derive_block, batch, row0, first_line, tz, problems, allocations_only))
                row0 += batch.num_rows
                if len(pending) > _THREADS:  # a few blocks in flight: the text read ahead stays bounded
                    derived.append(pending.popleft().result())
                if problems:  # the first bad block is known: the rest need not be read
                    break
            derived += [f.result() for f in pending]
        except (pa.ArrowException, ValueError) as exc:
            raise_malformed(text(), source, first_line, None, str(exc), fields)
    if problems:
        row, what = min(problems)
        raise_malformed(text(), source, first_line, row, what, fields)
    return SacctTable(pa.concat_tables([SCHEMA.empty_table(), *derived]), source)


def _batches(stream: pa.NativeFile, fields: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    if stream.size() == stream.tell():  # no text, no rows (pyarrow would ask for a first line)
        return iter(())
    return iter(
        pacsv.open_csv(
            stream,
            # 4 MiB blocks: fewer, larger chunks make every compute call after this cheaper.
            read_options=pacsv.ReadOptions(column_names=list(fields), block_size=_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={f: _READ_TYPES[f] for f in fields},
                null_values=_NULL_TIMES,
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    )


def _derive_block(batch: pa.RecordBatch, row0: int, first_line: int, tz: str, problems: list[tuple[int, str]], allocations_only: bool) -> pa.Table:
    """One block's SCHEMA columns (its allocation rows only, if asked); bad rows go to ``problems``."""
    raw = pa.Table.from_batches([batch])
    columns = _derive_rows(raw, row0, tz, problems)
    if not columns:
        return SCHEMA.empty_table()
    columns["line"] = pa.chunked_array([pa.array(np.arange(first_line + row0, first_line + row0 + raw.num_rows, dtype=np.int64))])
    table = pa.Table.from_arrays([pc.cast(columns[f.name], f.type) for f in SCHEMA], schema=SCHEMA)
    return table.filter(table.column("is_allocation")) if allocations_only else table


def _derive_rows(raw: pa.Table, row0: int, tz: str, problems: list[tuple[int, str]]) -> dict[str, pa.ChunkedArray]:
    """Every SCHEMA column but ``line`` for these rows; bad rows are flagged (offset by row0)."""
    found: list[tuple[int, str]] = []
    job_id, step, base_job_id, array_task = _job_id_columns(raw.column("JobID"), found)
    raw_job_id = _raw_ids(raw.column("JobIDRaw"), found)
    (state,) = _per_distinct(raw.column("State"), (_state_codes, pa.int8()))
    if state.null_count:
        _flag(found, pc.is_null(state), "unknown State")
    exit_status, exit_signal = _per_distinct(raw.column("ExitCode"), (lambda v: _exit_part(v, 0), pa.int16()), (lambda v: _exit_part(v, 1), pa.int16()))
    if exit_status.null_count:
        # A step cancelled with its node (NODE_FAIL) has an empty ExitCode (seen on 22.05); an
        # allocation row never does.
        step_without_code = pc.and_(pc.equal(raw.column("ExitCode"), ""), pc.is_valid(step))
        _flag(found, pc.and_(pc.is_null(exit_status), pc.invert(step_without_code)), "ExitCode is not <status>:<signal>")
    elapsed = raw.column("ElapsedRaw")
    if elapsed.null_count:
        _flag(found, pc.is_null(elapsed), "ElapsedRaw is missing")
    _flag(found, pc.less(elapsed, 0), "ElapsedRaw is negative")
    tres = raw.column("AllocTRES")
    gpus, cpus, billing = _per_distinct(tres, *[(lambda v, key=key: _tres_count(v, key), pa.int64()) for key in ("gres/gpu", "cpu", "billing")])
    problems.extend((row0 + row, what) for row, what in found)  # list.extend is atomic under the GIL
    if found:
        return {}
    return {
        "job_id": job_id,
        "base_job_id": base_job_id,
        "array_task": array_task,
        "step": step,
        "is_allocation": pc.is_null(step),
        "raw_job_id": raw_job_id,
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
        **_per_run(raw),
    }


def _per_run(raw: pa.Table) -> dict[str, pa.ChunkedArray]:
    """26.05's SLUID and Restarts where sacct printed them, else null columns."""
    if "SLUID" not in raw.column_names:
        nulls = pa.nulls(raw.num_rows)
        return {"sluid": pa.chunked_array([nulls.cast(_TEXT)]), "restarts": pa.chunked_array([nulls.cast(pa.int64())])}
    restarts = raw.column("Restarts")
    return {"sluid": raw.column("SLUID"), "restarts": pc.cast(pc.if_else(pc.equal(restarts, ""), pa.scalar(None, _TEXT), restarts), pa.int64())}


def _job_id_columns(job_id_full: pa.ChunkedArray, found: list[tuple[int, str]]) -> tuple[pa.ChunkedArray, ...]:
    """JobID -> (job_id, step, base job id, array task or null); flags bad rows."""
    job_id, step = _split_once(job_id_full, ".")
    _flag(found, pc.equal(step, ""), "JobID has an empty step")
    base_text, task_text = _split_once(job_id, "_")
    try:
        # The common case, every part plain digits, costs two casts; anything else (a pending
        # range 29_[4-9], a het component 12+0, garbage) takes the careful path below.
        base, task = pc.cast(base_text, pa.int64()), pc.cast(task_text, pa.int64())
        if _all_in_range(base) and _all_in_range(task):
            return job_id, step, base, task
    except pa.ArrowInvalid:
        pass
    if pc.any(pc.match_substring(job_id, "+")).as_py():
        base_text, task_text = _before(base_text, "+"), _before(task_text, "+")
    is_range = pc.fill_null(pc.and_(pc.starts_with(task_text, "["), pc.ends_with(task_text, "]")), False)
    task_number = pc.if_else(is_range, pa.scalar(None, pa.string()), task_text)
    base = _ids(base_text, "JobID is not a SLURM job id", found)
    task = _ids(task_number, "JobID is not a SLURM job id", found)
    return job_id, step, base, task


def _ids(text: pa.ChunkedArray, what: str, found: list[tuple[int, str]]) -> pa.ChunkedArray:
    """Cast id text to int64; flag the first bad value's row (the result is then unused)."""
    try:
        ids = pc.cast(text, pa.int64())
        if _all_in_range(ids):
            return ids
    except pa.ArrowInvalid:
        pass
    # int64 holds 18 digits; SLURM ids are 32-bit, so a longer one is garbage, not a big job.
    bad = pc.or_(pc.invert(pc.ascii_is_decimal(text)), pc.greater(pc.utf8_length(text), _MAX_DIGITS))
    _flag(found, bad, what)
    return pa.chunked_array([pa.nulls(len(text), pa.int64())])


def _raw_ids(text: pa.ChunkedArray, found: list[tuple[int, str]]) -> pa.ChunkedArray:
    """JobIDRaw ("12", "12.batch") -> 12, reading the leading digits straight from the
    string buffers: no intermediate strings, unlike a split (a third of the derive time)."""
    chunks, row = [], 0
    for chunk in text.chunks:
        ids, ok = _leading_integer(chunk)
        if not ok.all():
            found.append((row + int(np.argmin(ok)), "JobIDRaw is not a SLURM job id"))
        chunks.append(pa.array(ids))
        row += len(chunk)
    return pa.chunked_array(chunks, type=pa.int64())


def _leading_integer(chunk: pa.StringArray) -> tuple[np.ndarray, np.ndarray]:
    """(value of the leading digits, ok) per row; ok: 1-18 digits, then the end or a '.' and more."""
    n = len(chunk)
    offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32, count=n + 1, offset=chunk.offset * 4)
    data_buffer = chunk.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None and data_buffer.size else np.zeros(1, np.uint8)
    start = offsets[:-1].astype(np.int64)
    length = (offsets[1:] - offsets[:-1]).astype(np.int64)
    last = len(data) - 1
    value = np.zeros(n, dtype=np.int64)
    digits = np.zeros(n, dtype=np.int64)
    active = length > 0
    for k in range(_MAX_DIGITS + 1):
        if not active.any():
            break
        byte = data[np.minimum(start + k, last)]
        active &= (k < length) & (byte >= 0x30) & (byte <= 0x39)
        value = np.where(active, value * 10 + (byte.astype(np.int64) - 0x30), value)
        digits += active
    after = data[np.minimum(start + digits, last)]
    ok = (digits > 0) & (digits <= _MAX_DIGITS)
    ok &= (digits == length) | ((after == 0x2E) & (digits + 1 < length))
    return value, ok


def _all_in_range(ids: pa.ChunkedArray) -> bool:
    # At most 18 digits, like the text check: SLURM ids are 32-bit, a longer one is garbage.
    bounds = pc.min_max(ids)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return low is None or (low >= 0 and high < 10**_MAX_DIGITS)


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


def _per_distinct(column: pa.ChunkedArray, *maps: tuple[Callable[[pa.Array], pa.Array], pa.DataType]) -> list[pa.Array]:
    """Interpret each distinct value of a low-cardinality text column once, then gather per row.

    dictionary_encode of a chunked array gives every chunk the same (full) dictionary.
    """
    encoded = pc.dictionary_encode(column)
    if encoded.num_chunks == 0:
        return [pa.chunked_array([], type=out_type) for _, out_type in maps]
    dictionary = encoded.chunk(0).dictionary
    # One gather over all rows beats one per chunk.
    indices = pa.chunked_array([chunk.indices for chunk in encoded.chunks], type=pa.int32()).combine_chunks()
    return [pa.chunked_array([per_values(dictionary).cast(out_type).take(indices)]) for per_values, out_type in maps]


def _state_codes(values: pa.Array) -> pa.Array:
    codes: list[int | None] = []
    for text in values.to_pylist():
        try:
            codes.append(JobState.parse(text).code)
        except AccountingError:
            codes.append(None)
    return pa.array(codes, pa.int8())


def _exit_part(values: pa.Array, which: int) -> pa.Array:
    out = []
    for text in values.to_pylist():
        m = EXIT_CODE.match(text)
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


def _split_header(view: memoryview, source: str) -> tuple[memoryview, int, tuple[str, ...]]:
    """The text after an optional header line, the line number its first row has, and the fields
    (SACCT_FIELDS, or with the per-run ones after: named by the header, else counted on the first line)."""
    end = bytes(view[:4096]).find(b"\n")
    end = len(view) if end < 0 else end
    first = bytes(view[:end]).rstrip(b"\r")
    if bytes(view[:6]) != b"JobID|":
        return view, 1, _WITH_PER_RUN if first.count(b"|") == len(_WITH_PER_RUN) - 1 else SACCT_FIELDS
    header = first.decode("utf-8", "replace")
    if header not in ("|".join(SACCT_FIELDS), "|".join(_WITH_PER_RUN)):
        raise AccountingError(
            f"{source}:1: header names the fields {header!r}, not parcel_hpc's; export with sacct --parsable2 --noheader --duplicates --format={SACCT_FORMAT}"
        )
    return view[end + 1 :], 2, tuple(header.split("|"))


def _without_trailing_newlines(body: memoryview) -> memoryview:
    # Blank lines at the very end carry no rows (an export may append some); a blank line
    # between rows is still malformed. The last row needs no terminator.
    end = len(body)
    while end > 0 and body[end - 1] in (0x0A, 0x0D):
        end -= 1
    return body[:end]

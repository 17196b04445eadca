"""Report rows as columns: the lines of the jobs a ledger does not know, made and written in Arrow.

An account's month holds hundreds of thousands of jobs no search knows; a search's own jobs are a
few thousand at most. So the ledger's lines stay records (``reconcile.AttemptLine``: matching them
to attempts is per-trial logic), and the rest stay columns from the parse to the printed text:
``other_lines`` makes their report lines from the scheduler's runs, ``orphan_flags`` their flags,
and ``json_items`` / ``csv_text`` write them in slices, without a Python object per row (but for
the rare column whose values JSON must escape or cannot write as numbers: json writes those).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from parcel_hpc.budget import Rates
from parcel_hpc.documents import csv_cell, csv_cells

# One report line (reconcile.AttemptLine's fields, in its order) as a column each.
LINE_SCHEMA = pa.schema(
    [
        ("trial_id", pa.string()),
        ("job_id", pa.string()),
        ("run", pa.int64()),
        ("state", pa.string()),
        ("node", pa.string()),
        ("submit", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("elapsed_s", pa.int64()),
        ("gpus", pa.int64()),
        ("cpus", pa.int64()),
        ("gpu_hours", pa.float64()),
        ("cpu_hours", pa.float64()),
        ("cost", pa.float64()),
        ("queue_wait_s", pa.int64()),
        ("ledger_attempt", pa.int64()),
        ("ledger_how", pa.string()),
        ("waste", pa.string()),
        ("partition", pa.string()),
        ("user", pa.string()),
        ("account", pa.string()),
        ("device", pa.string()),
        ("gpu_utilization", pa.float64()),
        ("gpu_hours_used", pa.float64()),
        ("gpu_hours_idle", pa.float64()),
    ]
)
FLAG_SCHEMA = pa.schema([("job_id", pa.string()), ("detail", pa.string())])
Text = bytes | memoryview  # what the writers yield: a view of Arrow's buffer where one will do
SLICE_ROWS = 1 << 16  # rows written at a time: the text of one slice is all that is held
_ESCAPED = '[\\x00-\\x1f"\\\\]'  # what JSON escapes: left to json.dumps, on the rare column that has one


def other_lines(runs: pa.Table, known: Collection[str], rates: Rates) -> pa.Table:
    """The report lines (``LINE_SCHEMA``) of the runs (``runs.run_table`` columns) whose job the
    ledger does not know: the scheduler's hours priced at the search's rates, nothing matched."""
    runs = without(runs, pc.is_in(runs.column("job_id"), value_set=pa.array(list(known), pa.string())))
    n = runs.num_rows
    gpu_h, cpu_h = runs.column("gpu_hours"), runs.column("cpu_hours")
    cost = pa.array(rates.cost(gpu_h.to_numpy(), cpu_h.to_numpy()), pa.float64())  # the one price formula, over columns
    empty = pa.repeat("", n)
    none_int, none_float = pa.nulls(n, pa.int64()), pa.nulls(n, pa.float64())
    # No worker read these runs' GPUs: their GPU-hours are neither used nor idle (null), and a run
    # without GPUs used and idled none (0.0), as spend.GpuUse.columns says of every line.
    unread = pc.if_else(pc.greater(runs.column("gpus"), 0), none_float, pa.repeat(0.0, n))
    columns = {
        "trial_id": empty,
        "job_id": runs.column("job_id"),
        "run": runs.column("attempt"),
        "state": runs.column("state_text"),
        "node": runs.column("node_list"),
        "submit": runs.column("submit"),
        "start": runs.column("start"),
        "end": runs.column("end"),
        "elapsed_s": runs.column("elapsed_s"),
        "gpus": runs.column("gpus"),
        "cpus": runs.column("cpus"),
        "gpu_hours": gpu_h,
        "cpu_hours": cpu_h,
        "cost": cost,
        "queue_wait_s": runs.column("queue_wait_s"),
        "ledger_attempt": none_int,
        "ledger_how": empty,
        "waste": empty,
        "partition": runs.column("partition"),
        "user": runs.column("user"),
        "account": runs.column("account"),
        "device": empty,
        "gpu_utilization": none_float,
        "gpu_hours_used": unread,
        "gpu_hours_idle": unread,
    }
    return pa.table([pc.cast(columns[f.name], f.type) for f in LINE_SCHEMA], schema=LINE_SCHEMA)


def orphan_flags(lines: pa.Table, own: Collection[str]) -> pa.Table:
    """One flag (``FLAG_SCHEMA``) per job of ``lines`` that is not the search's ``own`` (its slots),
    told by its first run: the ledger does not know it, yet it runs under the search's name."""
    lines = without(lines, pc.is_in(lines.column("job_id"), value_set=pa.array(list(own), pa.string())))
    if not lines.num_rows:
        return FLAG_SCHEMA.empty_table()
    # A job's first run is the first row with its id: dictionary codes are numbered in order of
    # first appearance, so a row is a first exactly where its code exceeds every code before it
    # (linear, and right even where a job's runs are not together: listed under two names).
    codes = pc.dictionary_encode(lines.column("job_id").combine_chunks()).indices.to_numpy()
    firsts = lines.filter(pa.array(codes > np.maximum.accumulate(np.r_[-1, codes[:-1]])))
    job = firsts.column("job_id")
    detail = pc.binary_join_element_wise(
        "job ", job, " (", firsts.column("state"), ", ", firsts.column("node"), ") runs under the search's name but the ledger does not know it", ""
    )
    return pa.table([job, detail], schema=FLAG_SCHEMA)


def without(table: pa.Table, drop: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The rows ``drop`` does not mark; the table itself, not a copy, when it marks none."""
    return table.filter(pc.invert(drop)) if pc.any(drop).as_py() else table


def totals(lines: pa.Table) -> Mapping[str, float]:
    """gpu_hours, cpu_hours and cost summed over the lines."""
    return {name: float(pc.sum(lines.column(name)).as_py() or 0.0) for name in ("gpu_hours", "cpu_hours", "cost")}


def json_items(table: pa.Table, constants: Mapping[str, object] | None = None) -> Iterator[Text]:
    """The rows as JSON objects, each followed by a comma, a slice of rows at a time: the text of a
    JSON array's items (the caller drops the last comma). ``constants`` come first in each object."""
    head = "".join(f"{json.dumps(k)}:{json.dumps(v)}," for k, v in (constants or {}).items())
    for at in range(0, table.num_rows, SLICE_ROWS):
        part = table.slice(at, SLICE_ROWS)
        pieces: list[str | pa.ChunkedArray] = ["{" + head]
        for i, field in enumerate(part.schema):
            _append(pieces, ("," if i else "") + json.dumps(field.name) + ":")
            _append(pieces, _json_values(part.column(i)))
        _append(pieces, "},")
        if len(pieces) == 1:  # every column is one value: every row is the same text
            yield str(pieces[0]).encode() * part.num_rows
        else:
            yield _text_of(pc.binary_join_element_wise(*pieces, ""))


def csv_text(table: pa.Table, constants: Mapping[str, str] | None = None) -> Iterator[bytes]:
    """The rows as CSV lines (no header), ``constants`` as the first columns, every text cell through
    ``csv_cells`` as ``csv_cell`` does for the records; a slice of rows at a time."""
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    cells = {k: str(csv_cell(v)) for k, v in (constants or {}).items()}
    for at in range(0, table.num_rows, SLICE_ROWS):
        part = table.slice(at, SLICE_ROWS)
        columns = [pa.repeat(v, part.num_rows) for v in cells.values()] + [csv_cells(c) if pa.types.is_string(c.type) else c for c in part.columns]
        out = pa.BufferOutputStream()
        pacsv.write_csv(pa.table(columns, names=[*cells, *part.column_names]), out, options)
        yield out.getvalue().to_pybytes()


def json_list_items(rows: Sequence[object]) -> bytes:
    """A few rows as JSON array items, each followed by a comma, as ``json_items`` writes them."""
    return b"".join(json.dumps(row).encode() + b"," for row in rows)


def json_array(items: Iterable[Text]) -> Iterator[Text]:
    """A JSON array from chunks of items that each end in a comma (``json_items``): the last comma
    is dropped, so one chunk is held back."""
    yield b"["
    held: Text = b""
    for chunk in items:
        if chunk:
            yield held
            held = chunk
    yield held[:-1]
    yield b"]"


def _append(pieces: list[str | pa.ChunkedArray], piece: str | pa.ChunkedArray) -> None:
    """Add a piece of the row template; text next to text is joined once, not once per row."""
    if isinstance(piece, str) and isinstance(pieces[-1], str):
        pieces[-1] += piece
    else:
        pieces.append(piece)


def _json_values(column: pa.ChunkedArray) -> str | pa.ChunkedArray:
    """Each value as JSON text (null as ``null``), or the one text of a column that is all one value."""
    if column.null_count == len(column):
        return "null"
    kind = column.type
    if pa.types.is_string(kind):
        if column.null_count == 0 and pc.max(pc.binary_length(column)).as_py() == 0:
            return '""'
        if pc.any(pc.match_substring_regex(column, _ESCAPED)).as_py():  # rare: let json escape them
            return _dumped(column)
        text = pc.binary_join_element_wise('"', column, '"', "")
    elif pa.types.is_floating(kind):
        if not pc.all(pc.is_finite(column)).as_py():  # NaN or infinity: no JSON number; json writes them as Python does
            return _dumped(column)
        text = pc.cast(column, pa.string())
        # Arrow writes 3.0 as "3", which a reader takes for an int: a float stays one, as json writes it.
        text = pc.if_else(pc.match_substring_regex(text, "^-?[0-9]+$"), pc.binary_join_element_wise(text, ".0", ""), text)
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, "true", "false")
    else:
        text = pc.cast(column, pa.string())
    return pc.fill_null(text, "null")


def _dumped(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """json.dumps of each value (None as ``null``): the slow way, for the values Arrow cannot write."""
    return pa.chunked_array([pa.array([json.dumps(v) for v in column.to_pylist()], pa.string())])


def _text_of(rows: pa.ChunkedArray | pa.Array) -> Text:
    """The rows' text end to end: the data buffer between the first and last offsets (a view of
    Arrow's buffer, not a copy, when the rows are one chunk)."""
    chunks = rows.chunks if isinstance(rows, pa.ChunkedArray) else [rows]
    out = []
    for chunk in chunks:
        if not len(chunk):
            continue
        _, offsets, data = chunk.buffers()
        bounds = np.frombuffer(offsets, dtype=np.int32, count=len(chunk) + 1, offset=chunk.offset * 4)
        out.append(memoryview(data)[bounds[0] : bounds[-1]])
    return out[0] if len(out) == 1 else b"".join(out)

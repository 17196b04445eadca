"""The report's columns (accounting/columns.py): the JSON and CSV text Arrow writes reads back as the
values, orphans are one flag per job, and a dump read from disk in blocks parses as its bytes do."""

import csv
import io
import json
import math
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from test_reconcile import _search

from parcel_hpc.accounting import columns
from parcel_hpc.accounting.reconcile import reconcile
from parcel_hpc.accounting.search_report import ROWS_SHOWN, csv_chunks, json_chunks, render_table
from parcel_hpc.budget import BudgetCaps, Rates
from parcel_hpc.documents import csv_cell
from parcel_hpc.errors import AccountingError
from parcel_hpc.scheduler.run_table import job_runs
from parcel_hpc.scheduler.slurm.runs import run_table
from parcel_hpc.scheduler.slurm.sacct import SACCT_FIELDS
from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct, parse_sacct_file
from parcel_hpc.testing.runs import subprocess_env

SAMPLES = Path(resources.files("parcel_hpc.testing") / "samples")
RATES = Rates(per_gpu_hour=2.0, per_cpu_hour=0.5)
_LEADING = re.compile(rb"^\d+")
CAPS = BudgetCaps(max_trials=82, gpu_hours_cap=1.0, cost_cap=10.0, rates=RATES)

text = st.one_of(st.text(max_size=12), st.sampled_from(['"', "\\", "\x00\x1f", "=cmd", "-3", "é\u2028", ""]))
rows = st.lists(
    st.tuples(
        st.none() | text,
        st.none() | st.integers(-(2**62), 2**62),
        st.none() | st.floats(allow_nan=False, allow_infinity=False, width=64),
        st.none() | st.booleans(),
    ),
    max_size=40,
)


def table_of(values) -> pa.Table:
    names = ["s", "i", "f", "b"]
    types = [pa.string(), pa.int64(), pa.float64(), pa.bool_()]
    return pa.table([pa.array([r[k] for r in values], t) for k, t in enumerate(types)], names=names)


@settings(max_examples=300, deadline=None)
@given(rows, st.integers(1, 7))
def test_json_items_read_back_as_the_values(values, slice_rows):
    table = table_of(values)
    original, columns.SLICE_ROWS = columns.SLICE_ROWS, slice_rows  # several slices, and one
    try:
        text_ = b"".join(columns.json_array(columns.json_items(table, {"campaign": 'c"1'})))
    finally:
        columns.SLICE_ROWS = original
    read = json.loads(text_)
    assert read == [{"campaign": 'c"1', **row} for row in table.to_pylist()]
    assert all(isinstance(row["f"], float) for row in read if row["f"] is not None)  # 3.0 stays a float, not 3


@settings(max_examples=200, deadline=None)
@given(rows)
def test_csv_text_reads_back_as_csv_cell_writes_each_value(values):
    table = table_of(values)
    got = list(csv.reader(io.StringIO(b"".join(columns.csv_text(table, {"campaign": "=c"})).decode())))
    want = [["'=c", *("" if v is None else _csv_form(csv_cell(v)) for v in row.values())] for row in table.to_pylist()]
    assert [[_number_or_text(c) for c in r] for r in got] == [[_number_or_text(c) for c in r] for r in want]


def _csv_form(value) -> str:
    return {True: "true", False: "false"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _number_or_text(cell: str):
    try:
        number = float(cell)
    except ValueError:
        return cell
    return number if math.isfinite(number) else cell


def test_every_json_value_arrow_cannot_write_falls_back_to_json_itself():
    table = pa.table({"f": [1.5, math.nan, math.inf, None], "s": ["a\nb", "q", None, "x"]})
    text_ = b"".join(columns.json_array(columns.json_items(table)))
    assert (
        text_ == json.dumps([{"f": 1.5, "s": "a\nb"}, {"f": math.nan, "s": "q"}, {"f": math.inf, "s": None}, {"f": None, "s": "x"}]).replace(" ", "").encode()
    )


def test_orphans_are_one_flag_per_job_told_by_its_first_run_and_slots_are_lines_only():
    runs = run_table(parse_sacct((SAMPLES / "requeue_duplicates.txt").read_bytes()))
    jobs = runs.column("job_id").to_pylist()
    slot, *rest = dict.fromkeys(jobs)
    lines = columns.other_lines(runs, set(), RATES)
    flags = columns.orphan_flags(lines, {slot})
    assert flags.column("job_id").to_pylist() == rest and lines.num_rows == len(jobs)
    first = {job: i for i, job in reversed(list(enumerate(jobs)))}
    for job, detail in zip(rest, flags.column("detail").to_pylist()):
        row = runs.slice(first[job], 1).to_pylist()[0]
        assert detail == f"job {job} ({row['state_text']}, {row['node_list']}) runs under the search's name but the ledger does not know it"
    assert columns.totals(lines)["cost"] == pytest.approx(sum(RATES.cost(r.gpu_hours, r.cpu_hours) for r in job_runs(runs)))


def test_a_job_whose_runs_are_apart_is_one_orphan_and_a_run_without_gpus_used_and_idled_none():
    runs = run_table(parse_sacct((SAMPLES / "recorded_dev_cluster.txt").read_bytes()))  # with and without GPUs
    assert {0, 2} <= set(runs.column("gpus").to_pylist())
    apart = pa.concat_tables([runs, runs.slice(0, 1)])  # its first run listed again, under another name
    lines = columns.other_lines(apart, set(), RATES)
    flags = columns.orphan_flags(lines, set())
    assert flags.column("job_id").to_pylist() == list(dict.fromkeys(runs.column("job_id").to_pylist()))
    for row in lines.to_pylist():
        want = None if row["gpus"] else 0.0  # as spend.GpuUse.columns says of an unread line
        assert row["gpu_hours_used"] == row["gpu_hours_idle"] == want


def test_a_month_of_orphans_prints_the_first_rows_and_streams_every_one(tmp_path):
    dump = _grown(tmp_path, "recorded_dev_cluster.txt", 30)
    listed = run_table(parse_sacct_file(dump, source=str(dump)))
    rec = reconcile("s1", "m", "test", [], [], listed, CAPS)
    assert rec.flag_count == len(set(listed.column("job_id").to_pylist())) > ROWS_SHOWN
    console = Console(file=io.StringIO(), width=200)
    render_table([rec], console)
    shown = console.file.getvalue()
    assert f"{rec.flag_count} flags" in shown and f"the first {ROWS_SHOWN}; --json or --csv list them all" in shown
    report = json.loads(b"".join(json_chunks([rec])))["campaigns"][0]
    assert len(report["flags"]) == rec.flag_count and len(report["attempts"]) == listed.num_rows
    assert report["attempts"][0] == {**rec.lines().slice(0, 1).to_pylist()[0]}
    assert sum(a["gpu_hours"] for a in report["attempts"]) == pytest.approx(rec.scheduler["gpu_hours"]["used"])
    table = list(csv.DictReader(io.StringIO(b"".join(csv_chunks([rec])).decode())))
    assert len(table) == listed.num_rows and {r["campaign"] for r in table} == {"s1"}


@pytest.mark.parametrize("form", ["--json", "--csv"])
def test_a_reader_that_leaves_early_still_gets_the_page_and_the_exit_code(tmp_path, form):
    """``reconcile --json --html page | head -c 100``: the page is written and the command exits
    as it would have, though its output went nowhere after the first bytes."""
    dump = _grown(tmp_path, "recorded_dev_cluster.txt", 200)  # far more text than a pipe holds
    search = _search(tmp_path)
    page = tmp_path / "page.html"
    argv = [sys.executable, "-m", "parcel_hpc", "reconcile", str(search.path), "--sacct-file", str(dump), form, "--html", str(page)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(None, None))
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert len(head) == 100 and page.is_file() and f"wrote {page}" in err and "Traceback" not in err


def _grown(tmp_path: Path, name: str, times: int, header: bool = False, tail: bytes = b"") -> Path:
    """A sample repeated with fresh job ids (JobID and JobIDRaw shifted by 1000 each time): a file
    large enough to be read in blocks."""
    lines = (SAMPLES / name).read_bytes().splitlines()
    out = []
    for k in range(1, times + 1):
        for line in lines:
            fields = line.split(b"|")
            fields[:2] = [_LEADING.sub(lambda m, k=k: str(int(m.group()) + 1000 * k).encode(), f, count=1) for f in fields[:2]]
            out.append(b"|".join(fields))
    path = tmp_path / f"grown-{name}"
    path.write_bytes(("|".join(SACCT_FIELDS) + "\n").encode() * header + b"\n".join(out) + b"\n" + tail)
    return path


@pytest.mark.parametrize("header", [False, True])
@pytest.mark.parametrize("tail", [b"", b"\n", b"\n\n\n", b"\r\n", b"\r\n\r\n"])
def test_a_dump_read_from_disk_in_blocks_parses_as_its_bytes(tmp_path, header, tail):
    dump = _grown(tmp_path, "recorded_dev_cluster.txt", 40, header, tail)
    assert dump.stat().st_size > 8192  # read in blocks, not as bytes
    from_disk = parse_sacct_file(dump, source="d")
    assert from_disk.table.equals(parse_sacct(dump.read_bytes(), source="d").table) and len(from_disk) > 100


def test_a_malformed_line_deep_in_a_dump_on_disk_is_named_as_in_its_bytes(tmp_path):
    dump = _grown(tmp_path, "recorded_dev_cluster.txt", 40, header=True)
    lines = dump.read_bytes().split(b"\n")
    lines[-40] = lines[-40].replace(b"|", b"|x|", 1)  # one field too many
    dump.write_bytes(b"\n".join(lines))
    with pytest.raises(AccountingError) as from_disk:
        parse_sacct_file(dump, source="d")
    with pytest.raises(AccountingError) as from_bytes:
        parse_sacct(dump.read_bytes(), source="d")
    assert str(from_disk.value) == str(from_bytes.value) and f"d:{len(lines) - 39}:" in str(from_disk.value)

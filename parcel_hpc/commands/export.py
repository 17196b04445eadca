"""``parcel-hpc export``: a search's trials as a table for pandas (CSV, Parquet or JSON lines), or
where researchers already look (``--to mlflow``: ``integrations/mlflow/runs.py``; ``--to
optuna-journal FILE``: ``integrations/optuna_journal.py``).

One row per trial (``--attempts``: per attempt) with typed columns, so ``pandas.read_csv`` and
``pandas.read_parquet`` give numbers as numbers: ids, every parameter as its own ``params_<name>``
column (Optuna's ``trials_dataframe`` naming), state and reason, the best and the final validation
miss-cost and how it stands against an uninterrupted run's (``metric_resume``), milestones reached,
attempts, GPU- and CPU-hours, cost at the search's rates, queue wait, UTC start and end times, and
last the trainer's own metrics at its last validated step (``train_<name>``: they inform, the
contract's metric decides). Hours are the search's spend (``accounting.spend``), attempt by
attempt: what each settled in the budget journal (one that never reserved: its start to end, times
the CPUs it held and the GPUs its scheduler allocated), and what is still held; ``reconcile`` has
the scheduler's own accounting. Pack gaps and selection jobs are no trial's: ``status`` shows them.

Must not write under the search: it reads the ledger and writes only the file it is given.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from parcel_hpc import fsio
from parcel_hpc.accounting.trials import table
from parcel_hpc.documents import csv_cell
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.release_target import ReleaseTarget, shown, tracking_uri
from parcel_hpc.integrations.mlflow.runs import export_runs
from parcel_hpc.integrations.optuna_journal import export_journal
from parcel_hpc.ledger import SearchDir

READ_ONLY = True


class Format(Enum):
    CSV = "csv"
    PARQUET = "parquet"
    JSONL = "jsonl"


def write(data: pa.Table, fmt: Format, out: BinaryIO) -> None:
    if fmt is Format.PARQUET:
        pq.write_table(data, out)
    elif fmt is Format.CSV:
        pacsv.write_csv(_as_written(data), out, pacsv.WriteOptions(quoting_style="needed"))
    else:
        for row in data.to_pylist():
            out.write((json.dumps({k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}) + "\n").encode())


def _as_written(data: pa.Table) -> pa.Table:
    """Text cells a spreadsheet cannot run (``documents.csv_cell``: a parameter value or a reason
    is anyone's text), and float columns as Python writes floats: pyarrow's CSV writer prints 0.0
    as "0", and a column of zeros (no GPU-hours) would then read back as integers."""
    for i, field in enumerate(data.schema):
        if pa.types.is_string(field.type):
            text = pa.array([csv_cell(v) for v in data.column(i).to_pylist()], pa.string())
        elif pa.types.is_floating(field.type):
            text = pa.array([None if v is None else repr(v) for v in data.column(i).to_pylist()], pa.string())
        else:
            continue
        data = data.set_column(i, field.name, text)
    return data


def export(search: SearchDir, fmt: Format, output: Path | None, attempts: bool = False) -> int:
    """Write the table to ``output`` (whole or not at all: temp + rename), else stdout; the number of rows."""
    if output is not None:
        fsio.check_output(output, "--output")
    if output is None and fmt is Format.PARQUET and sys.stdout.isatty():
        raise UsageError("--format parquet is binary: give --output FILE (or redirect stdout to a file)")
    data = table(search, attempts)
    buffer = io.BytesIO()
    write(data, fmt, buffer)
    if output is None:
        sys.stdout.buffer.write(buffer.getvalue())
        sys.stdout.flush()
    else:
        fsio.write_output(output, buffer.getvalue(), "--output")
    return data.num_rows


class Target(Enum):
    MLFLOW = "mlflow"
    OPTUNA_JOURNAL = "optuna-journal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--format", choices=[f.value for f in Format], default=Format.CSV.value, help="default %(default)s")
    parser.add_argument("--attempts", action="store_true", help="one row per attempt instead of per trial")
    parser.add_argument("--output", "-o", type=Path, metavar="FILE", help="write here instead of stdout")
    parser.add_argument(
        "--to",
        nargs="+",
        metavar=("TARGET", "URI|FILE"),
        help="instead of a table: `mlflow [URI]`, one MLflow run per trial under one per search (URI: else MLFLOW_TRACKING_URI, else the "
        "contract's release.tracking_uri); `optuna-journal FILE`, an Optuna journal `optuna-dashboard FILE` opens. Exporting again adds nothing",
    )
    parser.add_argument("--experiment", metavar="NAME", help="--to mlflow: the experiment (default: the search's revision)")


def _target(args: argparse.Namespace) -> tuple[Target, str | None]:
    """``--to`` checked: the target and its one argument (exit 2, one line, otherwise)."""
    kinds = ", ".join(t.value for t in Target)
    name, *rest = args.to
    if name not in {t.value for t in Target}:
        raise UsageError(f"--to {name} is not an export target; give one of {kinds}")
    target = Target(name)
    if len(rest) > 1 or (target is Target.OPTUNA_JOURNAL and not rest):
        raise UsageError("--to takes `mlflow [URI]` or `optuna-journal FILE`")
    if args.output is not None or args.attempts or args.format != Format.CSV.value:
        raise UsageError("--to writes runs or a journal, not a table: leave out --format, --attempts and --output")
    if args.experiment is not None and target is not Target.MLFLOW:
        raise UsageError("--experiment names an MLflow experiment: use it with --to mlflow")
    return target, rest[0] if rest else None


def run(args: argparse.Namespace) -> int:
    search = SearchDir(args.search_dir)
    if args.to:
        target, where = _target(args)
        contract = search.contract()  # not a search directory: one line, exit 2, before any server is asked
        if target is Target.MLFLOW:
            uri = tracking_uri(where, os.environ, ReleaseTarget.of(contract).tracking_uri)
            done = export_runs(search, uri, args.experiment)
            print(
                f"exported {done.created + done.updated + done.unchanged} trials to MLflow at {shown(uri)}, experiment {done.experiment!r} "
                f"(parent run {done.parent_run_id}): {done.created} created, {done.updated} updated, {done.unchanged} unchanged",
                file=sys.stderr,
            )
        else:
            wrote = export_journal(search, Path(str(where)))
            print(
                f"exported to {where}, study {wrote.study_name!r} (optuna-dashboard {where}): {wrote.added} trials added, "
                f"{wrote.present} there already, {wrote.unfinished} not finished (a later export adds them)",
                file=sys.stderr,
            )
        return 0
    if args.experiment is not None:
        raise UsageError("--experiment names an MLflow experiment: use it with --to mlflow")
    rows = export(search, Format(args.format), args.output, args.attempts)
    if args.output is not None:
        print(f"wrote {rows} rows to {args.output}", file=sys.stderr)
    return 0

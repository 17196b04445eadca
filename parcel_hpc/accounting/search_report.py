"""``parcel-hpc reconcile``: ask the scheduler (or read an exported dump), reconcile, report.

The edge of the accounting package: the only place that asks a search's scheduler for its runs
(its backend's ``runs`` and ``listed``) or reads a ``--sacct-file`` (``dump_runs``). A failing or
unreachable accounting tool is an error (exit 2), never a partial report.
"""

from __future__ import annotations

import datetime as _dt
import html
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from parcel_hpc.accounting import columns, spend
from parcel_hpc.accounting.ranks import RankLine, StepLine, node_hours, rank_lines, step_lines
from parcel_hpc.accounting.reconcile import Reconciliation, reconcile
from parcel_hpc.budget import BudgetLedger, search_caps
from parcel_hpc.console import safe
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import SearchDir, TrialRecord, collector_paused
from parcel_hpc.ledger.searches import owner_of
from parcel_hpc.plotting import png_of, pyplot
from parcel_hpc.scheduler.registry import BACKENDS, DEFAULT, backend_of
from parcel_hpc.scheduler.run_table import job_runs, runs_table


@collector_paused()
def reconcile_search(search: SearchDir, sacct_file: Path | None = None) -> Reconciliation:
    """The search's reconciliation, with a gang's runs per rank (``ranks.rank_lines``) and, read from
    the scheduler itself (a dump holds no steps), its srun steps (``ranks.step_lines``). The ledger is
    read once: the lines and the ranks' readings are of the same records."""
    records = list(search.records())
    rec = _reconciled_search(search, records, sacct_file)
    shapes = {r.trial_id: r.spec.shape for r in records}  # each trial's own (a search may hold several)
    if not any(shape.is_gang for shape in shapes.values()):
        return rec
    backend_by_trial = {r.trial_id: backend_of(r.executor) for r in records}
    uses = {(r.trial_id, a.number): a.device_use for r in records for a in r.attempts if a.device_use is not None}
    ranks = [
        rank
        for line in rec.attempts
        if line.trial_id in backend_by_trial
        for rank in rank_lines([line], shapes[line.trial_id], backend_by_trial[line.trial_id].node_names, uses)
    ]
    steps: list[StepLine] = []
    if sacct_file is None:
        for backend in {backend_by_trial[line.trial_id] for line in rec.attempts if line.trial_id in backend_by_trial}:
            jobs = {line.job_id for line in rec.attempts if backend_by_trial.get(line.trial_id) is backend}
            steps += step_lines([line for line in rec.attempts if line.job_id in jobs], backend.steps(sorted(jobs)))
    return replace(rec, ranks=tuple(ranks), steps=tuple(steps))


def _reconciled_search(search: SearchDir, records: list[TrialRecord], sacct_file: Path | None) -> Reconciliation:
    contract = search.contract()
    caps = search_caps(contract)
    # The budget journal and the selection's jobs, read only: the search's one spend, and its holds.
    journal, jobs_run, path = BudgetLedger.read(search.path), spend.selection_jobs(search), str(search.path)
    campaign, objective = contract["search_revision"], contract["metric_revision"]
    backends = {backend_of(r.executor) for r in records} or {DEFAULT}
    if sacct_file is not None:
        # The search's own scheduler's dump first, else the first that exports one.
        reader, rows = next(((b, t) for b in (*sorted(backends, key=BACKENDS.index), *BACKENDS) if (t := b.dump_runs(sacct_file)) is not None), (None, None))
        if reader is None or rows is None:
            raise UsageError(f"--sacct-file {sacct_file}: no scheduler here exports an accounting dump; reconcile without --sacct-file")
        ours = pc.is_in(rows.column("job_id"), value_set=pa.array(sorted({j for r in records for j in r.jobs}), pa.string()))
        # The dump is exported by the search's job name (README): every row the ledger lacks is an orphan.
        return reconcile(
            campaign,
            objective,
            f"{reader.accounting}-file:{sacct_file}",
            records,
            job_runs(rows.filter(ours)),
            columns.without(rows, ours),
            caps,
            journal,
            jobs_run,
            search_path=path,
            slot_jobs=_slot_jobs(search),
        )
    filing = sorted((b for b in backends if b.files_runs), key=BACKENDS.index)
    if not filing:  # no scheduler keeps a record: each backend's own
        runs = [run for b in backends for run in b.local_runs(records, owner_of(search)) or []]
        source = "+".join(b.accounting for b in sorted(backends, key=BACKENDS.index))
        return reconcile(campaign, objective, source, records, runs, [], caps, journal, jobs_run, search_path=path)
    runs = []
    for b in filing:
        if jobs := sorted({j for r in records if backend_of(r.executor) is b for j in r.jobs}):
            runs += [run for of_job in b.runs(jobs).values() for run in of_job]
    listed = pa.concat_tables([runs_table([]), *(b.listed(search) for b in filing)])
    source = "+".join(b.accounting for b in filing)
    return reconcile(
        campaign, objective, source, records, runs, listed, caps, journal, jobs_run, now=time.time(), search_path=path, slot_jobs=_slot_jobs(search)
    )


def _slot_jobs(search: SearchDir) -> set[str]:
    return {str(s.get("job_id", "")) for s in search.slot_records()}


# --- renderers ---------------------------------------------------------------------------------

ROWS_SHOWN = 200  # flags and lines a terminal or page lists (JSON and CSV list them all)


def render_table(results: Sequence[Reconciliation], console) -> None:
    for rec in results:
        console.print(f"[bold]campaign {safe(rec.campaign)}[/] objective {safe(rec.objective)}  source: {safe(rec.source)}")
        console.print(f"spend: {rec.spend.line()}", markup=False, highlight=False)
        if rec.unrecorded:
            console.print(unrecorded_line(rec), markup=False, highlight=False)
        if rec.spend.gpus.allocated:
            console.print(f"GPUs (the ledger's hours, the workers' utilization): {rec.spend.gpus.line()}", markup=False, highlight=False)
        summary = Table(title=f"the scheduler's hours ({safe(rec.source)}) against the caps", show_header=True)
        for col in ("ceiling", "used", "cap", "left"):
            summary.add_column(col)
        for name, s in rec.scheduler.items():
            summary.add_row(name, f"{s['used']:.4f}", f"{s['cap']:.4f}", f"{s['left']:.4f}")
        console.print(summary)
        figs = rec.figures
        console.print(f"the scheduler's figures ({safe(rec.source)}): " + "  ".join(f"{k}={_fmt(v)}" for k, v in figs.items()))
        console.print("wasted hours by cause: " + "  ".join(f"{k}={v:.4f}" for k, v in rec.waste_hours.items()))
        if rec.pending:
            waiting = Table(title=f"{len(rec.pending)} jobs not yet accounted in full: figures may still change (rerun, or pass --wait SECONDS)")
            for col in ("trial", "job", "why"):
                waiting.add_column(col)
            for p in rec.pending:
                waiting.add_row(safe(p.trial_id), safe(p.job_id), safe(p.detail))
            console.print(waiting)
        trials = Table(title="per trial")
        for col in ("trial", "state", "attempts", "GPU-h", "CPU-h", "wall s", "cost", "queue wait s", "effective"):
            trials.add_column(col)
        for t in rec.trials:
            trials.add_row(
                safe(t.trial_id),
                safe(t.state),
                str(t.attempts),
                f"{t.gpu_hours:.4f}",
                f"{t.cpu_hours:.4f}",
                str(t.wall_s),
                f"{t.cost:.4f}",
                ",".join(str(w) for w in t.queue_wait_s),
                "yes" if t.effective else "no",
            )
        console.print(trials)
        if rec.ranks:
            console.print(_rank_table(rec))
        if rec.steps:
            console.print(_step_table(rec))
        if rec.flag_count:
            flags = Table(title=f"{rec.flag_count} flags")
            for col in ("kind", "trial", "job", "detail"):
                flags.add_column(col)
            for f in rec.all_flags(ROWS_SHOWN):
                flags.add_row(safe(f.kind.value), safe(f.trial_id), safe(f.job_id), safe(f.detail))
            if rec.flag_count > ROWS_SHOWN:
                flags.caption = f"the first {ROWS_SHOWN}; --json or --csv list them all"
            console.print(flags)
        else:
            console.print("no flags: the ledger and the scheduler agree")


_RANK_GPU_COLUMNS = ("GPU util", "GPU-h used", "GPU-h idle")


def _rank_gpu_cells(r: RankLine) -> list[str]:
    """A rank's GPU use in jobstats' words, from its own worker's reading ("unread": it told none)."""
    if r.gpu_hours_used is None or r.gpu_hours_idle is None:
        return ["unread"] * len(_RANK_GPU_COLUMNS)
    return [f"{r.gpu_utilization:.0%}" if r.gpu_utilization is not None else "", f"{r.gpu_hours_used:.4f}", f"{r.gpu_hours_idle:.4f}"]


def _rank_table(rec: Reconciliation) -> Table:
    ranks = Table(title="per rank: each run's allocation (the scheduler's hours) over its nodes and ranks, as srun laid them out")
    gpus = any(r.gpu_hours > 0 for r in rec.ranks)  # each rank's GPU use, where the gang had GPUs
    for col in ("trial", "job", "run", "rank", "node", "GPUs", "CPUs", "GPU-h", "CPU-h", "node GPU-h", "node CPU-h", *(_RANK_GPU_COLUMNS if gpus else ())):
        ranks.add_column(col)
    per_node = node_hours(rec.ranks)
    for r in rec.ranks[:ROWS_SHOWN]:
        node_gpu, node_cpu = per_node[(r.trial_id, r.job_id, r.run, r.node)]
        ranks.add_row(
            *(safe(str(v)) for v in (r.trial_id, r.job_id, r.run, r.rank, r.node, r.gpus, r.cpus)),
            f"{r.gpu_hours:.4f}",
            f"{r.cpu_hours:.4f}",
            f"{node_gpu:.4f}",
            f"{node_cpu:.4f}",
            *(_rank_gpu_cells(r) if gpus else ()),
        )
    if len(rec.ranks) > ROWS_SHOWN:
        ranks.caption = f"the first {ROWS_SHOWN}; --json lists them all"
    return ranks


_STEP_COLUMNS = ("trials", "job", "run", "step", "nodes", "ranks", "elapsed s", "CPU-h used", "CPU use", "memory", "busiest rank", "its CPU-h")


def _step_cells(s: StepLine) -> list[str]:
    busiest = f"{s.busiest_rank} on {s.busiest_node}" if s.busiest_rank is not None else "not measured"
    return [
        *(str(v) for v in (s.trials, s.job_id, s.run, s.step, s.nodes, s.ranks, s.elapsed_s)),
        f"{s.cpu_hours_used:.4f}" if s.cpu_hours_used is not None else "not measured",
        f"{s.cpu_use:.0%}" if s.cpu_use is not None else "",
        _bytes(s.memory_bytes),
        busiest,
        f"{s.busiest_cpu_hours:.4f}" if s.busiest_cpu_hours is not None else "",
    ]


def _bytes(n: int | None) -> str:
    return "not measured" if n is None else f"{n / 2**20:.1f} MiB"


def _step_table(rec: Reconciliation) -> Table:
    steps = Table(title="per srun step: what the ranks used, as the scheduler measured its tasks (every rank's together, and the busiest)")
    for col in _STEP_COLUMNS:
        steps.add_column(col)
    for s in rec.steps[:ROWS_SHOWN]:
        steps.add_row(*(safe(c) for c in _step_cells(s)))
    if len(rec.steps) > ROWS_SHOWN:
        steps.caption = f"the first {ROWS_SHOWN}; --json lists them all"
    return steps


def unrecorded_line(rec: Reconciliation) -> str:
    """What this report settled that the ledger has not recorded yet."""
    return (
        f"{len(rec.unrecorded)} runs sacct has filed are not recorded in the ledger yet: this report settles them at sacct's hours;"
        f" `parcel-hpc status` and `list` count them provisionally until the launch following the search or `parcel-hpc sync {rec.search_path}` records them"
    )


def csv_chunks(results: Sequence[Reconciliation]) -> Iterator[bytes]:
    """One CSV row per line (job run, or a trial's share of a packed one), a slice at a time."""
    yield (",".join(["campaign", *columns.LINE_SCHEMA.names]) + "\n").encode()
    for rec in results:
        yield from columns.csv_text(rec.lines(), {"campaign": rec.campaign})


def json_chunks(results: Sequence[Reconciliation]) -> Iterator[columns.Text]:
    """``{"campaigns": [...]}``, a slice of lines at a time."""
    yield b'{"campaigns":['
    for i, rec in enumerate(results):
        yield b"," if i else b""
        yield from rec.json_chunks()
    yield b"]}"


def to_html(results: Sequence[Reconciliation]) -> str:
    """A self-contained page: tables and PNG plots inlined as data URIs (opens with no network)."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>parcel_hpc accounting</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}"
        ".flag{color:#a00}img{max-width:48%;margin:0.5%}</style></head><body>",
    ]
    for rec in results:
        parts.append(
            f"<h1>campaign {html.escape(rec.campaign)}</h1><p>objective {html.escape(rec.objective)}; source {html.escape(rec.source)}; "
            f"generated {_dt.datetime.now(_dt.UTC).isoformat(timespec='seconds')}</p>"
        )
        parts.append(f"<p id='spend'>spend: {html.escape(rec.spend.line())}</p>")
        if rec.unrecorded:
            parts.append(f"<p id='unrecorded'>{html.escape(unrecorded_line(rec))}</p>")
        if rec.spend.gpus.allocated:
            parts.append(f"<p id='gpu-use'>GPUs (the ledger's hours, the workers' utilization): {html.escape(rec.spend.gpus.line())}</p>")
        parts.append(_html_table(["ceiling", "used", "cap", "left"], [[k, _fmt(v["used"]), _fmt(v["cap"]), _fmt(v["left"])] for k, v in rec.scheduler.items()]))
        parts.append(_html_table(["figure", "value"], [[k, _fmt(v)] for k, v in rec.figures.items()]))
        for png in _plots(rec):
            parts.append(f"<img alt='plot' src='data:image/png;base64,{png}'>")
        if rec.pending:
            parts.append(
                f"<h2>{len(rec.pending)} jobs not yet accounted in full</h2><p>figures may still change</p>"
                + _html_table(["trial", "job", "why"], [[p.trial_id, p.job_id, p.detail] for p in rec.pending])
            )
        parts.append(
            "<h2>flags</h2>"
            + (
                _html_table(["kind", "trial", "job", "detail"], [[f.kind.value, f.trial_id, f.job_id, f.detail] for f in rec.all_flags(ROWS_SHOWN)])
                + _more(rec.flag_count)
                if rec.flag_count
                else "<p>none: the ledger and the scheduler agree</p>"
            )
        )
        parts.append(
            "<h2>trials</h2>"
            + _html_table(
                ["trial", "state", "attempts", "GPU-h", "CPU-h", "wall s", "cost", "effective"],
                [[t.trial_id, t.state, t.attempts, _fmt(t.gpu_hours), _fmt(t.cpu_hours), t.wall_s, _fmt(t.cost), t.effective] for t in rec.trials],
            )
        )
        if rec.ranks:
            gpus = any(r.gpu_hours > 0 for r in rec.ranks)
            parts.append(
                "<h2>per rank</h2>"
                + _html_table(
                    ["trial", "job", "run", "rank", "node", "GPU-h", "CPU-h", *(_RANK_GPU_COLUMNS if gpus else ())],
                    [
                        [r.trial_id, r.job_id, r.run, r.rank, r.node, _fmt(r.gpu_hours), _fmt(r.cpu_hours), *(_rank_gpu_cells(r) if gpus else ())]
                        for r in rec.ranks[:ROWS_SHOWN]
                    ],
                )
                + _more(len(rec.ranks))
            )
        if rec.steps:
            parts.append("<h2>per srun step</h2>" + _html_table(list(_STEP_COLUMNS), [_step_cells(s) for s in rec.steps[:ROWS_SHOWN]]) + _more(len(rec.steps)))
        shown = rec.lines().slice(0, ROWS_SHOWN).to_pylist()
        parts.append(
            "<h2>attempts</h2>"
            + _html_table(
                ["trial", "job", "run", "state", "node", "elapsed s", "GPU-h", "queue wait s", "waste"],
                [
                    [a["trial_id"], a["job_id"], a["run"], a["state"], a["node"], a["elapsed_s"], _fmt(a["gpu_hours"]), a["queue_wait_s"], a["waste"]]
                    for a in shown
                ],
            )
            + _more(len(rec.attempts) + rec.other_lines.num_rows)
        )
    parts.append("</body></html>")
    return "".join(parts)


def cap_on_scale(used: float, cap: float) -> bool:
    """Whether a cap drawn on the spend's own axis leaves the spend readable: within 20x of it.
    Beyond that the curve would flatten into the axis, so the plot says the cap in words."""
    return cap <= 20 * used


def _plots(rec: Reconciliation) -> list[str]:
    plt = pyplot()
    pngs = []

    def emit(fig) -> None:
        pngs.append(png_of(fig))

    lines = rec.lines()
    ends = pc.cast(lines.column("end"), pa.float64()).to_numpy(zero_copy_only=False)
    ended = ~np.isnan(ends)
    order = np.argsort(ends[ended], kind="stable")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    if ended.any():
        xs = (ends[ended][order] - ends[ended][order][0]) / 60.0
        ys = np.cumsum(lines.column("gpu_hours").to_numpy()[ended][order])
        ax.step(xs, ys, where="post", label="GPU-hours used")
    cap, top = rec.scheduler["gpu_hours"]["cap"], rec.scheduler["gpu_hours"]["used"]
    if cap_on_scale(top, cap):
        ax.axhline(cap, color="red", linestyle="--", label="cap")
    else:  # the cap drawn to scale would flatten the spend into the axis: say it in words instead
        ax.text(0.02, 0.95, f"cap {cap:g} GPU-h, {100 * top / cap:.3g} % used (off this scale)", transform=ax.transAxes, va="top", color="red")
    ax.set_xlabel("minutes since first attempt ended")
    ax.set_ylabel("GPU-hours")
    ax.set_title("spend over time against the cap")
    ax.legend()
    emit(fig)

    def bars(title: str, labels: list, values: list, **ticks) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.bar(labels, values)
        ax.set_title(title)
        ax.tick_params(axis="x", **ticks)
        emit(fig)

    bars("trials by state", list(rec.counts), list(rec.counts.values()), rotation=45)
    bars("GPU-hours per trial", [t.trial_id for t in rec.trials], [t.gpu_hours for t in rec.trials], rotation=90, labelsize=6)
    bars("wasted hours by cause", list(rec.waste_hours), list(rec.waste_hours.values()), rotation=45)
    return pngs


def _more(count: int) -> str:
    return f"<p>the first {ROWS_SHOWN} of {count}; --json or --csv list them all</p>" if count > ROWS_SHOWN else ""


def _html_table(head: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)

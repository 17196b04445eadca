"""What a launch prints: the contract line, the budget commitment, progress and the summary (rich)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from parcel_hpc.accounting.spend import read_spend
from parcel_hpc.budget import render_commitment
from parcel_hpc.console import safe
from parcel_hpc.governance.shape import ShapePlan
from parcel_hpc.ledger import SearchDir, TrialState
from parcel_hpc.ledger.summary import best_completed, count_states, counts_by_state
from parcel_hpc.selection.policy import SelectionPolicy


def contract_line(contract, path: Path, created: bool, dry_run: bool = False) -> str:
    verb = ("would freeze" if dry_run else "froze") if created else "matched frozen"
    trainer = contract.fields.get("trainer") or {}
    line = f"[bold]{verb}[/] contract {contract.digest[:19]}… in {safe(path)} (trainer {safe(trainer.get('target', '?'))}, source {safe(str(trainer.get('source_digest', ''))[:15])}…)"
    if "selection" not in contract.fields:  # frozen before selection was pinned
        return line
    policy = SelectionPolicy.from_mapping(contract["selection"], trainer)
    return f"{line}\n  {safe(policy.baseline.describe())}\n  {policy.describe()}"


def commitment_text(decision) -> str:
    return render_commitment(decision)


DRY_RUN_ROWS = 50  # trials a dry run shows: the rest are counted (a million rows is nothing anyone reads)


def dry_run_table(first, n: int, contract) -> Table:
    """The first trials of the ``n`` a dry run would dispatch, one row each, and how many more."""
    more = f"; the first {len(first)} shown" if n > len(first) else ""
    table = Table(title=f"dry run: {n} trials would be dispatched (nothing submitted, nothing written{more})")
    res = contract["resources"]
    mixed = ShapePlan.of(res).mixed  # trials of several shapes: each row says its own
    for col in ("trial", "params", "gpus", "cpus", "mem_gb", "time_min", *(("shape",) if mixed else ())):
        table.add_column(col)
    for spec in first:
        table.add_row(
            safe(spec.trial_id),
            safe(", ".join(f"{k}={v}" for k, v in spec.params.items())),
            str(res["gpus"]),
            str(res["cpus"]),
            str(res["mem_gb"]),
            str(res["time_limit_min"]),
            *((spec.shape.describe(),) if mixed else ()),
        )
    if n > len(first):
        table.add_row(f"... {n - len(first)} more", *[""] * (len(table.columns) - 1))
    return table


def learning_line(sampler, remaining: int, slots: int, slotted: bool = False) -> str:
    how = "by the slot itself, which runs it" if slotted else "(one job a trial)"
    return f"proposing up to {remaining} trials by {sampler.describe()}, each when one of {slots} slots frees {how}, told every result known then"


def worst_case_line(decision) -> str:
    c = decision.commitment
    return f"worst case: {c.gpu_hours:.2f} GPU-hours, {c.cpu_hours:.2f} CPU-hours, cost {c.cost:.2f} ({c.trials} trials x {c.attempts_per_trial} attempts)"


def slots_line(packing, n_trials: int, slots: int, minutes: int) -> str:
    n = min(slots, n_trials)
    return (
        f"slots: up to {n} jobs of {minutes} min each running {n_trials} trials, each slot taking the longest expected trial that fits "
        f"its time left until none is left (room for {packing.size} at the time limit; {packing.basis})"
    )


def packing_line(packing, n_trials: int) -> str:
    if packing.size <= 1:
        return f"packing: none, one job per trial ({packing.basis})"
    return f"packing: up to {packing.size} trials a job, in turn, {-(-n_trials // packing.size)} jobs for {n_trials} trials ({packing.basis})"


def nothing_to_do(report) -> str:
    return (
        f"nothing to dispatch: {report.proposed} proposed, {len(report.finished_before)} already finished, "
        f"{len(report.duplicates)} duplicates, {len(report.rejected)} rejected"
    )


def detached_text(search: SearchDir, report) -> str:
    return (
        f"dispatched {len(report.dispatched)} trials ({', '.join(sorted(set(j.split('_')[0] for j in report.jobs.values())))}); "
        f"not waiting: follow with `parcel-hpc status {search.path}`"
    )


class Progress:
    """A one-line live count of trials by state; quiet when stdout is not a terminal."""

    def __init__(self, console: Console, total: int) -> None:
        self.console, self.total = console, total
        self._last = ""
        self._progress: RichProgress | None = None  # made on __enter__

    def __enter__(self) -> Progress:
        self._progress = RichProgress(
            TextColumn("trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
            disable=not self.console.is_terminal,
        )
        self._progress.__enter__()
        self._task = self._progress.add_task("", total=self.total)
        return self

    def update(self, states: list[TrialState], total: int) -> None:
        """``total``: trials this launch will have followed (a sampler that learns adds them as it goes)."""
        self.total = total
        counts = count_states(states)
        done = sum(n for s, n in counts.items() if TrialState(s).is_finished())
        text = " ".join(f"{s}={n}" for s, n in counts.items() if n)
        assert self._progress is not None  # used inside its with block
        self._progress.update(self._task, completed=done, total=total, description=text)
        if not self.console.is_terminal and text != self._last:
            self.console.print(f"[progress] {done}/{total} finished: {text}", markup=False)
        self._last = text

    def __exit__(self, *exc) -> None:
        assert self._progress is not None  # __enter__ made it
        self._progress.__exit__(*exc)


def calls_line(calls: dict[str, int], wall_s: float) -> str:
    """What this launch asked the scheduler, and how often a minute (SLURM rate-limits each user)."""
    total = sum(calls.values())
    each = ", ".join(f"{n} {name}" for name, n in sorted(calls.items(), key=lambda c: (-c[1], c[0])))
    return f"scheduler calls by this launch: {total} ({each}), {60.0 * total / max(wall_s, 1.0):.1f} a minute over {wall_s:.0f} s"


def summary(search: SearchDir, wall_s: float, next_step: str = "") -> Table:
    """``next_step``: what to do next when the launch stopped before its trials ended."""
    records = list(search.records())
    counts = counts_by_state(records)
    table = Table(title=f"search {safe(search.path.name)}: summary", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("trials", str(len(records)))
    table.add_row("by state", "  ".join(f"{s.value}={counts[s.value]}" for s in TrialState))
    best = best_completed(records)
    table.add_row(
        "best validation",
        safe(f"{best.trial_id} miss-cost={best.metric:.4f} ({', '.join(f'{k}={v}' for k, v in best.spec.params.items())})") if best else "none completed",
    )
    # A best validation number is not a result yet: selection reruns, gates and releases it. Without
    # one there is nothing to select: what failed, and why, comes first.
    if next_step:
        table.add_row("next", safe(next_step))
    elif best is not None:
        table.add_row("next", safe(f"parcel-hpc select {search.path}"))
    elif records:
        table.add_row("next", safe(f"parcel-hpc logs {search.path}  (why the trials failed)"))
    table.add_row("wall time", f"{wall_s:.1f} s")
    table.add_row("spend", safe(read_spend(search, records).line()))
    return table

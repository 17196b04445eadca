"""``status``, admission and ``reconcile`` at 1k, 10k and 100k trial records: does 10x the records
cost at most 11x the time?

    .venv/bin/python benchmarks/bench_scale.py [--repeats 3] [--sizes 1000,10000,100000]

For each size, once, a frozen search (a launch of no trials) gets that many proposed trials, each
with its spec and one finished attempt's journal (submitted, started, admitted, four milestones,
ended), written directly (the setup is not what is measured). Then, in this process, times:
``status.collect`` (what ``parcel-hpc status`` reads), the launch's admission of the same
proposals (dedup, finished-before, admit; a dry run, writing nothing), and ``reconcile_search``
(the local executor's runs).

Each call is made once untimed at the smallest size first (imports, caches). A repetition then
times every call at every size in turn, so the sizes compared share the machine's moment, as the
suite's baselines do (``alternate``); the heap is collected before each timed call, so no call
pays for the garbage of the one before. Each figure is time(10n) / time(n) per repetition,
reported as the median and range over the repetitions (``_suite.ratio``); target <= 11.

The cyclic garbage collector's seconds in each call are kept beside its time (``samples``), and
the figure's note gives its share and the ratio without it. In this range of sizes its full
collections, each over the whole heap, add up faster than the records do (CPython 3.11 makes one
whenever the heap has grown by a quarter: none in a call at 1k, one at 10k, ten or eleven at
100k), so they alone can put a ratio over 11.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, launch, main, ratio  # noqa: E402

from parcel_hpc.accounting.search_report import reconcile_search  # noqa: E402
from parcel_hpc.commands import status  # noqa: E402
from parcel_hpc.launch.report import LaunchReport  # noqa: E402
from parcel_hpc.launch.search import SearchLaunch  # noqa: E402
from parcel_hpc.ledger import SearchDir  # noqa: E402
from parcel_hpc.propose.specs import history_free_specs  # noqa: E402

CFG = {"train": {"seed": 1234}}


def populate(root: str, n: int) -> SearchDir:
    launch(root, "search.n_trials=0", f"budget.max_trials={n}")
    search = SearchDir(Path(root) / "runs" / "parcel-search-r1")
    contract = search.contract()
    t = time.time() - 3600
    for i, spec in enumerate(history_free_specs(contract, 0, n)):
        d = search.trial_dir(spec.trial_id)
        os.makedirs(d)
        (d / "spec.json").write_text(json.dumps(spec.to_json()))
        job, start = str(100000 + i), t + i * 0.01
        events = [
            {"kind": "submitted", "t": start - 1, "job_id": job, "executor": "local", "launch_id": "bench"},
            {"kind": "started", "t": start, "attempt": 1, "job_id": job, "raw_job_id": job, "node": "n1", "host": "n1", "pid": 1, "executor": "local"},
            {
                "kind": "admitted",
                "t": start + 0.1,
                "attempt": 1,
                "snapshot_digest": contract["snapshot_digest"],
                "split_digest": contract["split_digest"],
                "image_digest": contract["image_digest"],
                "trainer_digest": "",
            },
            *(
                {"kind": "milestone", "t": start + 0.2 + m, "attempt": 1, "step": step, "value": 0.5, "is_milestone": True}
                for m, step in enumerate((10, 20, 41, 82))
            ),
            {"kind": "ended", "t": start + 5, "attempt": 1, "how": "completed", "metric": 0.5, "step": 82},
        ]
        lines = "".join(json.dumps({"writer": "bench", "seq": k, **e}) + "\n" for k, e in enumerate(events))
        (d / "journal-bench.jsonl").write_text(lines)
    return search


def admission(search: SearchDir, n: int) -> None:
    report = LaunchReport(search.path, "bench", search.contract().digest, dry_run=True)
    SearchLaunch(CFG, lambda s: None)._admit_proposals(search, search.contract(), n, report, None)
    assert len(report.finished_before) + len(report.duplicates) == n, (len(report.finished_before), len(report.duplicates), n)


OPS = ("status", "admission", "reconcile")


def calls(search: SearchDir, n: int) -> dict[str, Callable[[], object]]:
    """What is timed on a search of ``n`` records, by name (``OPS``)."""
    return {"status": lambda: status.collect(search), "admission": lambda: admission(search, n), "reconcile": lambda: reconcile_search(search)}


class CollectorClock:
    """Seconds the cyclic garbage collector ran while it was in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._since = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._since


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """One call's seconds, from a collected heap, and how many of them the garbage collector took."""
    gc.collect()
    clock = CollectorClock()
    gc.callbacks.append(clock)
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, clock.seconds
    finally:
        gc.callbacks.remove(clock)


def run(repeats: int = 3, sizes: tuple[int, ...] = (1000, 10000, 100000)) -> list[Figure]:
    with tempfile.TemporaryDirectory() as root:
        ops = {n: calls(populate(f"{root}/{n}", n), n) for n in sizes}
        os.sync()  # the setup's writes leave for the disk now, not during the first repetition
        for fn in ops[sizes[0]].values():
            fn()  # untimed: the imports and caches of a first call
        times: dict[tuple[int, str], list[float]] = {(n, op): [] for n in sizes for op in OPS}
        collecting: dict[tuple[int, str], list[float]] = {(n, op): [] for n in sizes for op in OPS}
        for _ in range(repeats):
            for n in sizes:
                for op, fn in ops[n].items():
                    took, gc_s = timed(fn)
                    times[n, op].append(took)
                    collecting[n, op].append(gc_s)
    figures = []
    for small, large in zip(sizes, sizes[1:]):
        for op in OPS:
            f = ratio(
                f"{op} at {large:,} records",
                f"{op} at {small:,}",
                times[large, op],
                times[small, op],
                11.0,
                note=_collector_note(op, small, large, times, collecting),
            )
            figures.append(replace(f, samples={**f.samples, "ours_gc_s": collecting[large, op], "baseline_gc_s": collecting[small, op]}))
    return figures


def _collector_note(op: str, small: int, large: int, times: dict, collecting: dict) -> str:
    """The garbage collector's median share of each size's time, and the median ratio of the times
    less its seconds."""
    share = {n: statistics.median(g / t for g, t in zip(collecting[n, op], times[n, op])) for n in (small, large)}
    without = statistics.median(
        (tl - gl) / (ts - gs) for tl, gl, ts, gs in zip(times[large, op], collecting[large, op], times[small, op], collecting[small, op])
    )
    return f"garbage collector {share[small]:.0%} of the time at {small:,}, {share[large]:.0%} at {large:,}; {without:.3g}x without it"


if __name__ == "__main__":
    main(run, __doc__, sizes=lambda text: tuple(int(s) for s in text.split(",")))

"""``status``, admission and ``reconcile`` at 1k, 10k and 100k trial records: does 10x the records
cost at most 11x the time?

    .venv/bin/python benchmarks/bench_scale.py [--sizes 1000,10000,100000]

For each size, a frozen search (a launch of no trials) gets that many proposed trials, each with
its spec and one finished attempt's journal (submitted, started, admitted, four milestones,
ended), written directly (the setup is not what is measured). Then, in this process, times:
``status.collect`` (what ``parcel-hpc status`` reads), the launch's admission of the same
proposals (dedup, finished-before, admit; a dry run, writing nothing), and ``reconcile_search``
(the local executor's runs). Each figure is time(10n) / time(n); target <= 11.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, launch, main  # noqa: E402

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


def measure(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        search = populate(root, n)
        out = {}
        for name, fn in (
            ("status", lambda: status.collect(search)),
            ("admission", lambda: admission(search, n)),
            ("reconcile", lambda: reconcile_search(search)),
        ):
            t0 = time.perf_counter()
            fn()
            out[name] = time.perf_counter() - t0
        return out


def run(repeats: int = 1, sizes: tuple[int, ...] = (1000, 10000, 100000)) -> list[Figure]:
    times = {n: [measure(n) for _ in range(repeats)] for n in sizes}
    figures = []
    for small, large in zip(sizes, sizes[1:]):
        for op in ("status", "admission", "reconcile"):
            a, b = [t[op] for t in times[large]], [t[op] for t in times[small]]
            figures.append(
                Figure(f"{op} at {large:,} records", f"{op} at {small:,}", [x / y for x, y in zip(a, b)], 11.0, samples={"large_s": a, "small_s": b})
            )
    return figures


if __name__ == "__main__":
    main(run, __doc__, sizes=lambda text: tuple(int(s) for s in text.split(",")))

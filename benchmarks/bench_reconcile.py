"""``parcel-hpc reconcile`` of a 1,000,000-line sacct dump, end to end through the command, against
pyarrow's CSV read of the same file; the command's peak memory against the file's size; and how
its time grows from 100,000 to 10,000,000 lines.

    .venv/bin/python benchmarks/bench_reconcile.py [--lines 1000000] [--repeats 3] [--scaling 100000,1000000,10000000]

The dump is bench_sacct's generator (allocation, .batch and .extern rows per run, arrays, requeues,
a few running jobs). The search is a frozen one with no trials, so every job in the dump is an
orphan to report: parse, job runs, reconcile, the JSON report, all in the command. Both sides run
as fresh processes (interpreter and imports included), alternating. Targets: <= 2x the time,
peak RSS <= 3x the file. Scaling, measured after the headline pair: the same command on dumps of
each size (generated here, the largest about 1.6 GB, deleted after), every size once per
repetition, each beside pyarrow's read_csv of the same dump; each figure is the time of 10x the
lines over the time of the lines, target <= 11x, with pyarrow's own ratio in its note.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _suite import Figure, env, launch, main, ratio  # noqa: E402
from bench_sacct import generate  # noqa: E402

PEAK = str(HERE / "peer_app" / "peak.py")
BASELINE = "import pyarrow.csv as c, sys; c.read_csv(sys.argv[-1], parse_options=c.ParseOptions(delimiter='|', quote_char=False), read_options=c.ReadOptions(autogenerate_column_names=True))"


def timed(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one process."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True)
    took = time.perf_counter() - t0
    if out.returncode not in (0, 3):  # 3: the report has flags (every job here is an orphan)
        raise RuntimeError(out.stderr[-2000:])
    return took, int(out.stderr.split()[-1]) / 1024


def run(repeats: int = 3, lines: int = 1_000_000, scaling: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)) -> list[Figure]:
    sizes = sorted({lines, *scaling})
    with tempfile.TemporaryDirectory() as tmp:
        dumps = {n: Path(tmp) / f"sacct-{n}.txt" for n in sizes}
        for n, dump in dumps.items():
            dump.write_bytes(generate(n))
        file_mb = dumps[lines].stat().st_size / 2**20
        launch(tmp, "search.n_trials=0")  # a frozen search with no trials
        search = f"{tmp}/runs/parcel-search-r1"

        def ours_argv(n: int) -> list[str]:
            return [sys.executable, PEAK, "-m", "parcel_hpc", "reconcile", search, "--sacct-file", str(dumps[n]), "--json"]

        def base_argv(n: int) -> list[str]:
            return [sys.executable, PEAK, "-c", BASELINE, str(dumps[n])]

        # The headline pair first and on its own: the largest dump's gigabytes would otherwise
        # sit in the same minutes (page cache, memory) as the small one's repetitions.
        mine = [timed(argv) for _ in range(repeats) for argv in (base_argv(lines), ours_argv(lines))]
        base, headline = mine[0::2], mine[1::2]
        ours: dict[int, list[tuple[float, float]]] = {n: [] for n in scaling}
        bases: dict[int, list[tuple[float, float]]] = {n: [] for n in scaling}
        for _ in range(repeats):
            for n in scaling:
                bases[n].append(timed(base_argv(n)))
                ours[n].append(timed(ours_argv(n)))
    note = f"{lines:,} lines, {file_mb:.0f} MB"
    figures = [
        ratio(f"reconcile {lines:,} sacct lines, end to end", "pyarrow read_csv of the file", [o[0] for o in headline], [b[0] for b in base], 2.0, note),
        Figure(
            "reconcile peak RSS / file size",
            f"the dump, {file_mb:.0f} MB",
            [o[1] / file_mb for o in headline],
            3.0,
            note=f"pyarrow's read_csv alone: {statistics.median(b[1] for b in base) / file_mb:.2f}x",
        ),
    ]
    for small, large in zip(scaling, scaling[1:]):
        figures.append(
            ratio(
                f"reconcile {large:,} / {small:,} lines",
                f"the same command on {small:,} lines",
                [o[0] for o in ours[large]],
                [o[0] for o in ours[small]],
                11.0 * large / small / 10,
                f"{statistics.median(o[0] for o in ours[small]):.2f} s and {statistics.median(o[0] for o in ours[large]):.2f} s;"
                f" pyarrow's read_csv alone: {_median_ratio(bases[large], bases[small]):.1f}x",
            )
        )
    return figures


def _median_ratio(large: list[tuple[float, float]], small: list[tuple[float, float]]) -> float:
    return statistics.median(a[0] / b[0] for a, b in zip(large, small))


if __name__ == "__main__":
    main(run, __doc__, scaling=lambda text: tuple(int(n) for n in text.split(",")))

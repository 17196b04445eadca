"""``parcel-hpc reconcile`` of a 1,000,000-line sacct dump, end to end through the command, against
pyarrow's CSV read of the same file; and the command's peak memory against the file's size.

    .venv/bin/python benchmarks/bench_reconcile.py [--lines 1000000] [--repeats 3]

The dump is bench_sacct's generator (allocation, .batch and .extern rows per run, arrays, requeues,
a few running jobs). The search is a frozen one with no trials, so every job in the dump is an
orphan to report: parse, job runs, reconcile, the JSON report, all in the command. Both sides run
as fresh processes (interpreter and imports included), alternating. Targets: <= 2x the time,
peak RSS <= 3x the file.
"""

from __future__ import annotations

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


def run(repeats: int = 3, lines: int = 1_000_000) -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "sacct.txt"
        dump.write_bytes(generate(lines))
        file_mb = dump.stat().st_size / 2**20
        launch(tmp, "search.n_trials=0")  # a frozen search with no trials
        search = f"{tmp}/runs/parcel-search-r1"
        ours_argv = [sys.executable, PEAK, "-m", "parcel_hpc", "reconcile", search, "--sacct-file", str(dump), "--json"]
        base_argv = [sys.executable, PEAK, "-c", BASELINE, str(dump)]
        ours, base = [], []
        for _ in range(repeats):
            base.append(timed(base_argv))
            ours.append(timed(ours_argv))
    note = f"{lines:,} lines, {file_mb:.0f} MB"
    return [
        ratio(f"reconcile {lines:,} sacct lines, end to end", "pyarrow read_csv of the file", [o[0] for o in ours], [b[0] for b in base], 2.0, note),
        Figure(
            "reconcile peak RSS / file size", f"the dump, {file_mb:.0f} MB", [o[1] / file_mb for o in ours], 3.0, note=f"pyarrow alone: {base[0][1]:.0f} MB"
        ),
    ]


if __name__ == "__main__":
    main(run, __doc__)

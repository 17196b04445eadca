"""Run the benchmark suite (or some of it): a table of ratios against baselines measured in the same
run, with targets, and the figures as JSON.

    .venv/bin/python benchmarks/run.py                 # everything
    .venv/bin/python benchmarks/run.py checkpoints     # one benchmark
    .venv/bin/python benchmarks/run.py --json out.json --repeats 3

Nothing here fails a build: the figures are quoted in docs/performance.md, met or not.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _suite import Figure, print_table  # noqa: E402

BENCHES = (
    "checkpoints",
    "local",
    "pruning",
    "sampler",
    "rss",
    "ledger",
    "reconcile",
    "scale",
    "faults",
    "slurm",
    "slots",
    "torch",
    "lightning",
    "report",
    "folds",
    "gangs",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", choices=[*BENCHES, []], help="benchmarks to run (default: all)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results.json"))
    args = ap.parse_args()
    figures: list[Figure] = []
    started = time.time()
    failed: dict[str, str] = {}
    took: dict[str, float] = {}
    for name in args.names or BENCHES:
        module = __import__(f"bench_{name}")
        t0 = time.time()
        try:
            figures += module.run(**({"repeats": args.repeats} if args.repeats else {}))
        except Exception as exc:  # one benchmark's failure is reported; the others still run
            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"{name} failed: {failed[name]}", file=sys.stderr)
        took[name] = time.time() - t0
        print(f"{name}: {took[name]:.0f} s", file=sys.stderr, flush=True)
        done = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(), "wall_s": time.time() - started, "seconds": took, "failed": failed}
        args.json.write_text(json.dumps({**done, "figures": [f.to_json() for f in figures]}, indent=1))  # after each: nothing is lost
    print_table(figures)
    for name, why in failed.items():
        print(f"{name}: FAILED ({why})")
    print(f"wrote {args.json} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()

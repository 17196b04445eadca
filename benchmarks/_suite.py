"""What every benchmark returns and how the runner shows it. Most figures are a ratio of our time
over a baseline's, both measured in the same run, alternating, repetition by repetition; a few are
a measured quantity against its target (a fraction saved, a memory ceiling)."""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS = HERE / ".peers"  # the peers' own environment: hydra-submitit-launcher names its launcher as parcel_hpc does
PEER_PACKAGES = ["hydra-submitit-launcher==1.2.0", "hydra-core>=1.3.2,<1.4", "submitit==1.5.4"]


@dataclass(frozen=True)
class Figure:
    name: str
    baseline: str  # what the value is measured against
    values: list[float]  # one per repetition
    target: float
    at_least: bool = False  # the target is a floor (True) or a ceiling (False)
    unit: str = "x"
    note: str = ""
    samples: dict = field(default_factory=dict)  # the raw measurements behind ``values``

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def met(self) -> bool:
        return self.median >= self.target if self.at_least else self.median <= self.target

    def to_json(self) -> dict:
        return {**asdict(self), "median": self.median, "min": min(self.values), "max": max(self.values), "met": self.met}


def ratio(name: str, baseline: str, ours_s: list[float], baseline_s: list[float], target: float, note: str = "") -> Figure:
    """Our time over the baseline's, per repetition."""
    return Figure(name, baseline, [a / b for a, b in zip(ours_s, baseline_s)], target, note=note, samples={"ours_s": ours_s, "baseline_s": baseline_s})


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def launch(root: str, *overrides: str, extra_env: Mapping[str, str] | None = None) -> None:
    """The README's main job, ``python -m parcel_hpc.launch -m``, into ``<root>/runs``."""
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={root}/runs", *overrides]
    subprocess.run(argv, cwd=ROOT, env={**env(), **(extra_env or {})}, check=True, capture_output=True)


def peer_python(extra: Sequence[str] = ()) -> str:
    """The peers' interpreter, with ``PEER_PACKAGES`` and ``extra`` installed (once)."""
    python = PEERS / "bin" / "python"
    if not python.exists():
        venv.create(PEERS, with_pip=True)
    stamp = PEERS / ("installed-" + "-".join(sorted(p.split("=")[0].split(">")[0] for p in [*PEER_PACKAGES, *extra])))
    if not stamp.exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES, *extra], check=True)
        stamp.touch()
    return str(python)


def alternate(ours: Callable[[], object], baseline: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Time ``baseline`` then ``ours``, ``repeats`` times, alternating, so both see the same machine."""
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((baseline, b), (ours, a)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return a, b


def print_table(figures: list[Figure]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="parcel_hpc benchmarks: ours against a baseline measured in the same run")
    for col in ("figure", "against", "median", "range", "n", "target", "met"):
        table.add_column(col)
    for f in figures:
        u = f.unit
        bound = f">= {f.target:g}{u}" if f.at_least else f"<= {f.target:g}{u}"
        table.add_row(f.name, f.baseline, f"{f.median:.3g}{u}", f"{min(f.values):.3g}-{max(f.values):.3g}", str(len(f.values)), bound, "yes" if f.met else "NO")
    Console(width=200).print(table)


def main(run: Callable[..., list[Figure]], doc: str, **convert: Callable[[str], object]) -> None:
    """Run one benchmark alone: each keyword of its ``run`` is an option with the same default
    (``--step-seconds`` for ``step_seconds``), read as the default's type unless ``convert`` says how."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, param in inspect.signature(run).parameters.items():
        ap.add_argument("--" + name.replace("_", "-"), type=convert.get(name, type(param.default)), default=param.default)
    print_table(run(**vars(ap.parse_args())))

"""The trainer conformance check: what a search will rely on, tried in seconds before a search.

``check_trainer`` builds a trainer on real data and checks, in order: finite step metrics;
one probability per example; a state that a checkpoint holds (through the real h5py checkpoint
format); a resume that continues exactly (the preempted-trial guarantee); two builds with the same
seed that agree (each trainer checked with process-wide generators of its own, as in its own
worker, so a state that leaves out torch's or numpy's global generator is named); serving parity (raw images through ``serve`` against ``predict``); serving from
the state alone (a trainer built without examples, as a registry entry builds it, given the state,
serving as ``predict`` scored); and no request for the final partition. ``parcel-hpc check-trainer`` prints the findings; the tests run it
against every trainer this project ships.

Must not: write anything outside its own temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.table import Table

from parcel_hpc.console import safe
from parcel_hpc.data import GROUP_REVISION, SNAPSHOT_FILENAME, read_split
from parcel_hpc.errors import UsageError
from parcel_hpc.fence import Protected, run_fenced
from parcel_hpc.trainer import rng
from parcel_hpc.trainer.base import Trainer, TrainerState, checked_probabilities, finite_metrics
from parcel_hpc.trainer.data import Devices, TrainingData, load_training_data
from parcel_hpc.trainer.function import FunctionTrainer
from parcel_hpc.trainer.resume import check_resume, probe, through_checkpoint
from parcel_hpc.trainer.served import served
from parcel_hpc.trainer.target import build_params, trainer_class

SERVE_FROM_STATE = "put everything serve() needs in state() (the preprocessing's arrays(), a model's own statistics) and build without touching the examples"
PARITY_TOLERANCE = 1e-9  # serve() against predict(): the same model, the same features, up to float noise
FRESH_PROCESS_SEED = 20_261_204  # each checked trainer's process-wide generators start from this plus its number
T = TypeVar("T")
RNGs = tuple[rng.Arrays, rng.Scalars]


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


def check_trainer(cls: type[Trainer], data: TrainingData, params: Mapping[str, Any], *, seed: int = 0, steps: int = 12) -> list[Finding]:
    """Every check, in order; stops at the first that fails (later ones would only repeat it)."""
    findings: list[Finding] = []

    def found(check: str, ok: bool, detail: str) -> bool:
        findings.append(Finding(check, ok, detail))
        return ok

    if issubclass(cls, FunctionTrainer):
        _check_loop(cls, data, params, seed, max(1, steps // 2), found)
        return findings
    callers_rngs = rng.save()
    try:
        first = _Worker(cls, params, seed, data, process=1)
        metrics = {}
        for step in range(1, steps + 1):
            metrics = finite_metrics(first.run(first.trainer.step), step)
        if not found("step", True, f"{steps} {cls.unit}s, last metrics {metrics}"):
            return findings
        scores = first.run(lambda: checked_probabilities(first.trainer.predict("validation"), len(data.validation), "validation", steps))
        first.run(lambda: checked_probabilities(first.trainer.predict("train"), len(data.train), "train", steps))
        found("predict", True, f"{len(scores)} validation probabilities in [{scores.min():.3f}, {scores.max():.3f}]")

        state = _through_checkpoint(first.run(first.trainer.state))
        at_state = first.rngs
        restored = _Worker(cls, params, seed, data, process=2)
        restored.run(partial(restored.trainer.load_state, state))
        found("state", True, "saved and read back through an h5py checkpoint")
        expected = first.after(steps)
        same = np.array_equal(expected, restored.after(steps))
        if not found(
            "resume",
            same,
            "resumed trainer predicts exactly as the uninterrupted one" if same else _drift(cls, params, seed, data, state, at_state, expected, steps),
        ):
            return findings

        again = _Worker(cls, params, seed, data, process=3)
        same = np.array_equal(expected, again.after(2 * steps))
        if not found(
            "determinism",
            same,
            "two builds with one seed agree" if same else "two builds with the same params and seed differ: seed every generator from build's seed",
        ):
            return findings

        serving = first.run(lambda: checked_probabilities(first.trainer.serve(data.validation.images), len(data.validation), "serve", 2 * steps))
        gap = float(np.max(np.abs(serving - expected)))
        if not found("serving parity", gap <= PARITY_TOLERANCE, f"serve(raw images) vs predict: max difference {gap:.3g} (tolerance {PARITY_TOLERANCE:g})"):
            return findings
        if not found("serving from state", *_from_state(cls, params, seed, data, _through_checkpoint(first.run(first.trainer.state)), expected)):
            return findings
    except Exception as exc:  # the trainer's own error is the finding
        found("error", False, f"{type(exc).__name__}: {exc}")
        return findings
    finally:
        rng.restore(*callers_rngs)
    found(
        "final partition",
        not data.asked_for_final,
        "never asked for" if not data.asked_for_final else f"asked for {', '.join(sorted(set(data.asked_for_final)))}",
    )
    return findings


def _check_loop(cls: type[FunctionTrainer], data: TrainingData, params: Mapping[str, Any], seed: int, k: int, found: Callable[[str, bool, str], bool]) -> None:
    """The function form: its loop resumed exactly (``resume.check_resume``: steps, saves, validation,
    determinism in one), its ``load`` serving raw images from the saved state alone as the loop scored them."""
    built = build_params(cls(), params)
    try:
        resumed = check_resume(cls, built, seed, data, k)
        if not found("resume", resumed.exact, f"{k} {cls.unit}s, saved, restored in a fresh build, {k} more: exact" if resumed.exact else resumed.detail):
            return
        whole = probe(cls, built, seed, data, k, process=6)
        state, expected = whole.saved[2 * k], whole.validations[2 * k]
        if not found("serving from state", *_from_state(cls, params, seed, data, state, expected)):
            return
    except Exception as exc:  # the trainer's own error is the finding
        found("error", False, f"{type(exc).__name__}: {exc}")
        return
    asked = data.asked_for_final
    found("final partition", not asked, "never asked for" if not asked else f"asked for {', '.join(sorted(set(asked)))}")


class _Worker:
    """A trainer as in a worker process of its own: the global generators it draws from are its own,
    swapped in around each call, so two trainers checked side by side never draw from each other's."""

    def __init__(
        self, cls: type[Trainer], params: Mapping[str, Any], seed: int, data: TrainingData, *, process: int, state: TrainerState | None = None
    ) -> None:
        rng.reseed(FRESH_PROCESS_SEED + process)  # a fresh process's generators: a trainer must seed what it uses
        self.rngs = rng.save()
        self.trainer = cls()
        if state is None:
            self.run(lambda: self.trainer.build(build_params(self.trainer, params), seed, data))
        else:  # the served model (``trainer.served``)
            self.run(lambda: served(self.trainer, params, seed, state, data))

    def run(self, call: Callable[[], T]) -> T:
        rng.restore(*self.rngs)
        try:
            return call()
        finally:
            self.rngs = rng.save()

    def after(self, steps: int) -> np.ndarray:
        """Its validation predictions after ``steps`` more steps."""
        for _ in range(steps):
            self.run(self.trainer.step)
        return np.asarray(self.run(lambda: self.trainer.predict("validation")))


def _drift(
    cls: type[Trainer], params: Mapping[str, Any], seed: int, data: TrainingData, state: TrainerState, at_state: RNGs, expected: np.ndarray, steps: int
) -> str:
    """Why a resumed trainer drifts: the process-wide generator its state left out, where putting
    that one back (as it was when ``state()`` was taken) makes the resume exact."""
    for generator in rng.process_rngs():
        probe = _Worker(cls, params, seed, data, process=4)
        probe.run(partial(probe.trainer.load_state, state))
        probe.rngs = _with(probe.rngs, at_state, generator)
        if np.array_equal(expected, probe.after(steps)):
            return (
                f"a resumed trainer drifts from the uninterrupted one: state() leaves out {generator.words}; "
                "save it (parcel_hpc.trainer.torch.pack saves every process-wide generator)"
            )
    return "a resumed trainer drifts from the uninterrupted one: put everything that decides the next step (optimizer moments, RNG state, counters) in state()"


def _with(rngs: RNGs, saved: RNGs, generator: rng.ProcessRNG) -> RNGs:
    """``rngs`` with ``generator`` as ``saved`` holds it."""
    arrays = {k: v for k, v in rngs[0].items() if not k.startswith(generator.name)} | {k: v for k, v in saved[0].items() if k.startswith(generator.name)}
    scalars = {k: v for k, v in rngs[1].items() if not k.startswith(generator.name)} | {k: v for k, v in saved[1].items() if k.startswith(generator.name)}
    return arrays, scalars


def _from_state(cls: type[Trainer], params: Mapping[str, Any], seed: int, data: TrainingData, state: TrainerState, expected: np.ndarray) -> tuple[bool, str]:
    """A trainer built as a registry entry builds it (no examples: ``serving_data``), given ``state``,
    serving the raw validation images as the trained one predicted them."""
    frames = data.validation.images
    try:
        fresh = _Worker(cls, params, seed, data.without_examples(), process=5, state=state)
        scores = fresh.run(lambda: checked_probabilities(fresh.trainer.serve(frames), len(frames), "serve", 0))
    except Exception as exc:
        return False, f"built without data and given its state, it does not serve ({type(exc).__name__}: {exc}): {SERVE_FROM_STATE}"
    gap = float(np.max(np.abs(scores - expected)))
    if gap <= PARITY_TOLERANCE:
        return True, "built without data and given its state, it serves raw images as predict scored them"
    return False, f"built without data and given its state, it serves raw images {gap:.3g} away from predict: {SERVE_FROM_STATE}"


def _through_checkpoint(state: TrainerState) -> TrainerState:
    """The state as a resumed worker sees it: written and read back by the checkpoint store."""
    if not isinstance(state, TrainerState):
        raise TypeError(f"state() returned a {type(state).__name__}; return parcel_hpc.trainer.TrainerState(arrays, scalars)")
    return through_checkpoint(state.checked())


def data_files(data_dir: Path) -> tuple[Path, Path]:
    """The snapshot and group split in ``data_dir``, or one line saying how to make them."""
    snapshot, split = data_dir / SNAPSHOT_FILENAME, data_dir / f"split-{GROUP_REVISION}.json"
    for path in (snapshot, split):
        if not path.is_file():
            raise UsageError(f"{path} does not exist; create the data with `parcel-hpc make-snapshot {data_dir}` or pass --data DIR")
    return snapshot, split


def prepared(target: str, data_dir: Path, *, seed: int, steps: int, preprocessing: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], list[dict[str, Any]]]:
    """The check made ready in this process (the snapshot and split in ``data_dir`` read here, unfenced),
    to run with the parameters it is given where trainer code may run: a child fenced from the final
    partition's files (``check-trainer`` runs it after the launch's checks, in their child). Its
    findings as JSON values (``findings_of`` reads them back)."""
    snapshot, split = data_files(data_dir)
    # On the GPUs CUDA_VISIBLE_DEVICES names, as a worker given them would run; none named: the CPU.
    data = replace(load_training_data(snapshot, read_split(split), preprocessing), devices=Devices.from_env(None, os.environ.get("CUDA_VISIBLE_DEVICES", "")))
    return lambda params: [asdict(f) for f in check_trainer(trainer_class(target), data, params, seed=seed, steps=steps)]


def findings_of(answer: Any) -> list[Finding] | None:
    """The findings in a fenced child's answer; None where it is not a list of findings (trainer code
    shares that child's pipe: an answer is checked like any input)."""
    if not isinstance(answer, list):
        return None
    try:
        found = [Finding(**f) for f in answer]
    except TypeError:
        return None
    typed = all(isinstance(f.check, str) and isinstance(f.ok, bool) and isinstance(f.detail, str) for f in found)
    return found if typed else None


def run_alone(check: Callable[[Mapping[str, Any]], list[dict[str, Any]]], params: Mapping[str, Any], target: str, data_dir: Path) -> list[Finding]:
    """``check`` run with ``params`` in a child of its own, fenced from the final partition's files."""
    snapshot, split = data_files(data_dir)
    answer = run_fenced(Protected.of(split, snapshot), f"check-trainer {target}", check, params)
    found = findings_of(answer)
    if found is None:
        raise UsageError(f"check-trainer {target}: the fenced check answered {type(answer).__name__}, not its findings; run it again")
    return found


def show(target: str, data_dir: Path, findings: list[Finding], console: Console) -> bool:
    """The findings as a table; all passed?"""
    table = Table(title=f"{safe(target)} on {safe(data_dir)}", title_justify="left")
    for column in ("check", "", "detail"):
        table.add_column(column)
    for f in findings:
        table.add_row(safe(f.check), "[green]ok[/]" if f.ok else "[red]FAILED[/]", safe(f.detail))
    console.print(table)
    return all(f.ok for f in findings)

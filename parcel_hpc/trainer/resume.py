"""Exact resume, tried before a search: k steps, save, restore in a fresh build, continue, compare.

``check_resume`` runs a trainer of either form three times through ``ProbeRun`` (a ``Run`` that keeps
everything in memory): uninterrupted for 2k steps, interrupted after k (its state written and read
back through the real h5py checkpoint), and resumed from that state in a fresh build for the last k,
each as in a process of its own (the process-wide generators reseeded differently, so a state that
leaves one out shows). A second uninterrupted run tells an unseeded trainer from one that does not
resume. The finding names what differs first: the step where the runs part, the largest difference,
the state's keys that differ at the end, and the likely missing piece (an optimizer, an LR scheduler,
a data-loader generator, a library RNG without a getter). ``ReadParams`` finds a declared parameter
the trainer never reads. Pure but for the trainer's own code and a temporary checkpoint file.

Must not: write anything outside its own temporary directory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.checkpoints.store import CheckpointStore
from parcel_hpc.governance.admission import TrialIdentity
from parcel_hpc.trainer import rng
from parcel_hpc.trainer.base import Trainer, TrainerState
from parcel_hpc.trainer.data import Budget, TrainingData
from parcel_hpc.trainer.function import run_loop
from parcel_hpc.trainer.run import Restored, Run, Stop

K = 3  # steps before the interruption, and after it; the probes' milestone and checkpoint cadence
PROCESS_SEED = 20_261_205  # each probe's process-wide generators start from this plus its number
_LR_WORDS = ("lr", "learning_rate", "sched")
_OPTIMIZER_WORDS = ("optim", "adam", "momentum", "exp_avg", "moment")


class ReadParams(Mapping[str, Any]):
    """The trial's params, remembering which ones the trainer read."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self._params = dict(params)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        value = self._params[name]
        self.read.add(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def unread(self) -> list[str]:
        return sorted(set(self._params) - self.read)


class ProbeRun(Run):
    """A run kept in memory: every step's metrics, every state saved (through a real checkpoint), every
    validation handed. ``stop_at``: stop after this step, saving first; ``put_back``: a process-wide
    generator set as it was when the interrupted run saved, with the restored state."""

    def __init__(
        self,
        params: Mapping[str, Any],
        seed: int,
        data: TrainingData,
        k: int,
        *,
        stop_at: int = 0,
        restored: Restored | None = None,
        put_back: tuple[rng.ProcessRNG, tuple[rng.Arrays, rng.Scalars]] | None = None,
    ) -> None:
        super().__init__(
            params, seed, replace(data, budget=Budget(2 * k, (k,), Cadence(every_steps=k), data.budget.unit)), lambda scores: float(np.mean(scores))
        )
        self.stop_at, self.restored, self.put_back = stop_at, restored, put_back
        self.metrics: dict[int, dict[str, float]] = {}
        self.saved: dict[int, TrainerState] = {}
        self.validations: dict[int, np.ndarray] = {}
        self.rngs_at: dict[int, tuple[rng.Arrays, rng.Scalars]] = {}

    def _restore(self) -> Restored | None:
        if self.restored is not None and self.put_back is not None:
            generator, (arrays, scalars) = self.put_back
            generator.restore(arrays, scalars)
        return self.restored

    def _stepped(self, step: int) -> Stop | None:
        self.metrics[step] = dict(self._metrics)
        return Stop.CHECKED if step == self.stop_at else None

    def _save(self, step: int, state: TrainerState) -> None:
        self.saved[step] = through_checkpoint(state)
        self.rngs_at[step] = rng.save()

    def _validated(self, step: int, value: float, final: bool, metrics: Mapping[str, float]) -> Stop | None:
        return None

    def validate(self, probabilities: Any) -> float:
        value = super().validate(probabilities)
        self.validations[self.step] = np.asarray(probabilities, dtype=np.float64).reshape(-1)
        return value


@dataclass(frozen=True)
class ResumeFinding:
    exact: bool
    largest: float  # the largest difference in validation probabilities between the resumed run and the uninterrupted one (0.0: exact)
    detail: str  # what differs first and the likely missing piece ("" when exact)
    unread: tuple[str, ...] = ()  # declared parameters the trainer never read


def check_resume(make: Callable[[], Trainer], params: Mapping[str, Any], seed: int, data: TrainingData, k: int = K) -> ResumeFinding:
    """The trainer ``make`` gives (unbuilt) trained 2k steps uninterrupted, and k + k with a resume."""
    callers = rng.save()
    try:
        read = ReadParams(params)
        whole = probe(make, read, seed, data, k, process=1)
        cut = probe(make, params, seed, data, k, process=2, stop_at=k)
        if k not in cut.saved:
            return ResumeFinding(False, np.inf, f"its loop saved no state at step {k} where run.stepped said a checkpoint is due")
        restored = Restored(k, cut.saved[k])
        resumed = probe(make, params, seed, data, k, process=3, restored=restored)
        gap = _validation_gap(whole, resumed, 2 * k)
        if gap is None:
            return ResumeFinding(True, 0.0, "", tuple(read.unread()))
        again = probe(make, params, seed, data, k, process=4)
        keys = _changed_keys(whole.saved.get(2 * k), resumed.saved.get(2 * k))
        likely = _likely(make, params, seed, data, k, whole, again, keys, restored, cut.rngs_at.get(k))
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "") if keys else "none"
        detail = (
            f"a resumed run parts from the uninterrupted one {_parting(whole, resumed, again, k)} (largest difference in the validation "
            f"probabilities at step {2 * k}: {gap:.3g}); state keys that differ at step {2 * k}: {shown}; likely: {likely}"
        )
        return ResumeFinding(False, gap, detail, tuple(read.unread()))
    finally:
        rng.restore(*callers)


def probe(make: Callable[[], Trainer], params: Mapping[str, Any], seed: int, data: TrainingData, k: int, *, process: int, **run: Any) -> ProbeRun:
    """The trainer ``make`` gives, built and run for 2k steps (or as ``run`` says) as in a process of its own."""
    rng.reseed(PROCESS_SEED + process)  # a fresh process's generators: a trainer must seed (and save) what it uses
    probe = ProbeRun(params, seed, data, k, **run)
    trainer = make()
    trainer.build(params, seed, probe.data)  # with the probe's budget of steps
    run_loop(trainer, probe)
    return probe


def _validation_gap(a: ProbeRun, b: ProbeRun, step: int) -> float | None:
    """The largest difference between two runs' validation probabilities at ``step`` (None: bit-equal;
    inf: one did not hand them). Exactness is judged here alone: a loop's own metrics (a step's time,
    its memory) may differ between runs that train identically."""
    va, vb = a.validations.get(step), b.validations.get(step)
    if va is None or vb is None or va.shape != vb.shape:
        return float(np.inf)
    return None if np.array_equal(va, vb) else float(np.max(np.abs(va - vb)))


def _parting(whole: ProbeRun, resumed: ProbeRun, again: ProbeRun, k: int) -> str:
    """Where the resumed run first differs from the uninterrupted one: the first step after k at which
    a metric two uninterrupted runs agree on differs; else (an unseeded run agrees on none) the first at
    which any metric differs; else the validation itself."""
    steps = range(k + 1, 2 * k + 1)
    for steady_only in (True, False):
        for step in steps:
            a, b, c = whole.metrics.get(step, {}), resumed.metrics.get(step, {}), again.metrics.get(step, {})
            names = {n for n in a.keys() & c.keys() if a[n] == c[n]} if steady_only else set(a) | set(b)
            if any(a.get(n) != b.get(n) for n in names):
                return f"at step {step} (its metrics {_shown({n: a[n] for n in names if n in a})} against {_shown({n: b[n] for n in names if n in b})})"
    return f"at the validation of step {2 * k}"


def _likely(
    make: Callable[[], Trainer],
    params: Mapping[str, Any],
    seed: int,
    data: TrainingData,
    k: int,
    whole: ProbeRun,
    again: ProbeRun,
    keys: list[str],
    restored: Restored,
    rngs_at_save: tuple[rng.Arrays, rng.Scalars] | None,
) -> str:
    """The piece the state most likely leaves out, in words with the fix."""
    if _validation_gap(whole, again, k) is not None or _validation_gap(whole, again, 2 * k) is not None:
        return (
            "an unseeded generator: two uninterrupted runs with one seed already differ (a data-loader's shuffle or an initialisation "
            "drawn without run.seed); give the DataLoader a torch.Generator seeded from the seed, and save it"
        )
    if any(word in key.lower() for key in keys for word in _LR_WORDS):
        return "the LR scheduler: the learning rate differs after the resume; save scheduler.state_dict() with the state (parcel_hpc.trainer.torch.pack)"
    if rngs_at_save is not None:
        for generator in rng.process_rngs():
            tried = probe(make, params, seed, data, k, process=5, restored=restored, put_back=(generator, rngs_at_save))
            if _validation_gap(whole, tried, 2 * k) is None:
                return f"{generator.words}: the state leaves it out; save it (parcel_hpc.trainer.torch.pack saves every process-wide generator)"
    names = [n.lower() for n in restored.state.arrays] + [n.lower() for n in _flat(restored.state.scalars)]
    # A library's own checkpoint file (Lightning's, Hugging Face's) holds its optimizer under no key of ours.
    if not restored.has_files and not any(word in name for name in names for word in _OPTIMIZER_WORDS):
        return "the optimizer: no key of the state holds its moments; save optimizer.state_dict() with the state"
    return (
        "a random generator of the trainer's own that the state leaves out: a sampler's torch.Generator (save it: pack(..., generators=...)) "
        "or a library RNG without a getter (LightGBM-style: it cannot be saved; declare train.resume_tolerance, or reseed it from the seed and step)"
    )


def _changed_keys(a: TrainerState | None, b: TrainerState | None) -> list[str]:
    """The state's array names and flattened scalar paths whose values differ (missing on one side included)."""
    if a is None or b is None:
        return []
    names = sorted(set(a.arrays) | set(b.arrays))
    changed = [n for n in names if n not in a.arrays or n not in b.arrays or not np.array_equal(a.arrays[n], b.arrays[n])]
    fa, fb = _flat(a.scalars), _flat(b.scalars)
    changed += [n for n in sorted(set(fa) | set(fb)) if fa.get(n) != fb.get(n)]
    # What decides the next step (learning rates, counters, generators) before the weights that follow from it.
    return sorted(changed, key=lambda n: (not any(w in n.lower() for w in _LR_WORDS), n.count("/") == 0, n))


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{path}/{key}" if path else str(key)).items()}
    if isinstance(value, list):
        return {k: v for i, sub in enumerate(value) for k, v in _flat(sub, f"{path}/{i}").items()}
    return {path: value}


def _shown(metrics: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items())) + "}"


def through_checkpoint(state: TrainerState) -> TrainerState:
    """The state as a resumed worker sees it: written and read back by the checkpoint store."""
    digest = "sha256:" + "0" * 64
    with tempfile.TemporaryDirectory(prefix="parcel-check-") as d:
        store = CheckpointStore(d, TrialIdentity("check", digest, digest, digest), keep_last=1)
        store.save(1, state.arrays, {}, {}, extra=state.scalars)
        ckpt = store.load_latest()
    assert ckpt is not None  # saved just above
    return TrainerState(ckpt.params, ckpt.extra or {})

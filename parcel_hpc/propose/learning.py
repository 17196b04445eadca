"""Model-based proposals through Optuna's ask-and-tell interface (pure: same inputs, same proposal).

Proposal k is drawn by a fresh in-memory study told, in trial order, every result known when the
slot freed (``told_of``): completed with its metric, pruned with its value at the milestone where
it stopped, failed as failed, still running as running (so TPE's constant liar and GP steer away
from it); quarantined and refused trials are never told. Its sampler is seeded by (search seed, k).
Nothing else enters: no global random state, no storage, no clock a sampler reads (Optuna stamps
trials with the time, which no sampler looks at). So the proposal record (what it was told, its
seed, the sampler's revision) re-derives it exactly (``proposals --replay``).

A sampler that keeps state in its trials (CMA-ES) gets each told trial's state back from the
proposal that made it (``system_attrs``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

import numpy as np

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import digest_of
from parcel_hpc.ledger import TrialRecord, TrialState
from parcel_hpc.propose.samplers import SamplerName, SamplerSpec
from parcel_hpc.propose.space import CHOICE, INT, rounded


class Told(str, Enum):
    """What a proposal was told of one earlier trial."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"
    RUNNING = "running"


@dataclass(frozen=True)
class ToldTrial:
    trial_id: str
    told: Told
    params: Mapping[str, Any]
    value: float | None = None  # complete: its metric; pruned: its value at ``step``
    step: int | None = None  # pruned: the milestone it stopped at
    proposal: int | None = None  # the proposal that made it (its sampler state comes from there)

    def to_json(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "told": self.told.value,
            "params": dict(self.params),
            "value": self.value,
            "step": self.step,
            "proposal": self.proposal,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ToldTrial:
        return cls(str(d["trial_id"]), Told(d["told"]), dict(d["params"]), d.get("value"), d.get("step"), d.get("proposal"))


def told_of(records: Iterable[TrialRecord], pending: Iterable[ToldTrial] = ()) -> list[ToldTrial]:
    """Every result a proposal is told now, in trial order (pure). ``pending``: proposals whose
    trials are not written yet, told as running."""
    out = list(pending)
    for r in records:
        proposal = (r.spec.origin or {}).get("proposal")
        if r.invalid_metrics or r.state in (TrialState.QUARANTINED, TrialState.REJECTED, TrialState.BUDGET_EXHAUSTED, TrialState.CANCELLED):
            continue  # withdrawn (quarantined) or never about the design
        if r.state is TrialState.COMPLETED:
            out.append(ToldTrial(r.trial_id, Told.COMPLETE, r.spec.params, r.metric, None, proposal))
        elif r.state is TrialState.PRUNED:
            out.append(ToldTrial(r.trial_id, Told.PRUNED, r.spec.params, r.last_value, r.milestone, proposal))
        elif r.state is TrialState.FAILED:
            out.append(ToldTrial(r.trial_id, Told.FAILED, r.spec.params, None, None, proposal))
        else:
            out.append(ToldTrial(r.trial_id, Told.RUNNING, r.spec.params, None, None, proposal))
    return sorted(out, key=lambda t: (len(t.trial_id), t.trial_id))  # t9999 before t10000


def told_digest(told: Sequence[ToldTrial]) -> str:
    """The history digest a trial's lineage names."""
    return digest_of([t.to_json() for t in told])


def proposal_seed(search_seed: int, k: int) -> int:
    """Proposal k's sampler seed, from (search seed, k): independent of what any other proposal drew."""
    return int(np.random.SeedSequence([int(search_seed), int(k)]).generate_state(1)[0])


def ask(
    sampler: SamplerSpec, space: Mapping[str, Mapping[str, Any]], seed: int, told: Sequence[ToldTrial], attrs: Mapping[int, Mapping[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, the sampler's state for this trial). ``attrs``: each earlier proposal's state, by number."""
    import optuna
    from optuna.trial import TrialState as OptunaState
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a fresh study per proposal would say so each time
    distributions = optuna_distributions(space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature and independent-sampling notices, once per proposal
        study = optuna.create_study(direction="minimize", sampler=sampler_for(sampler, seed))
        for t in told:
            inside = {k: v for k, v in t.params.items() if k in distributions}
            kwargs: dict[str, Any] = {"params": inside, "distributions": {k: distributions[k] for k in inside}}
            kwargs["system_attrs"] = dict(attrs.get(t.proposal, {})) if t.proposal is not None else {}
            if t.told is Told.COMPLETE:
                trial = create_trial(state=OptunaState.COMPLETE, value=float(cast(float, t.value)), **kwargs)  # told_of: a completed trial's metric
            elif t.told is Told.PRUNED:
                values = {int(t.step): float(t.value)} if t.step is not None and t.value is not None else {}
                trial = create_trial(state=OptunaState.PRUNED, intermediate_values=values, **kwargs)
            elif t.told is Told.FAILED:
                trial = create_trial(state=OptunaState.FAIL, **kwargs)
            else:
                trial = create_trial(state=OptunaState.RUNNING, **kwargs)
            study.add_trial(trial)
        asked = study.ask(distributions)
        state = dict(study.trials[-1].system_attrs)  # what the sampler wrote to the trial it asked for
    params = {name: rounded(space[name], asked.params[name]) for name in sorted(space)}
    return params, _json_safe(state)


def optuna_distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The space (``propose.space``) as Optuna's distributions, by parameter name: what a sampler
    asks from, and what an exported journal or the search report's importance reads."""
    return {name: _distribution(spec) for name, spec in sorted(space.items())}


def _distribution(spec: Mapping[str, Any]) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec["type"] == CHOICE:
        return CategoricalDistribution(list(spec["values"]))
    if spec["type"] == INT:
        return IntDistribution(spec["low"], spec["high"], log=spec["log"], step=spec["step"])
    return FloatDistribution(spec["low"], spec["high"], log=spec["log"], step=spec["step"])


def sampler_for(spec: SamplerSpec, seed: int) -> Any:
    """The Optuna sampler a proposal draws with."""
    import optuna

    o = dict(spec.options)
    if spec.name is SamplerName.TPE:
        return optuna.samplers.TPESampler(seed=seed, **o)
    if spec.name is SamplerName.GP:
        return optuna.samplers.GPSampler(seed=seed, **o)
    if spec.name is SamplerName.CMAES:
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False, **o)
    raise ValueError(f"sampler {spec.name.value} does not learn from results")


def _json_safe(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A sampler's trial state as the proposal record keeps it (Optuna's are JSON already)."""
    out = {}
    for k, v in attrs.items():
        if isinstance(v, (str, int, float, bool, list, dict)) or v is None:
            out[k] = v
        else:
            logging.getLogger(__name__).warning("sampler state %s is not JSON (%s); it is not carried", k, type(v).__name__)
    return out


def check_options(spec: SamplerSpec) -> None:
    """The library's own checks of a learning sampler's options (CMA-ES refuses some pairs), at the
    door rather than at the first proposal; one line naming the fix."""
    if not spec.name.learns:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "experimental feature" notices: the proposals silence them too
            sampler_for(spec, 0)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"sampler={spec.name.value} refuses these options ({' '.join(str(exc).split())}); change them") from None

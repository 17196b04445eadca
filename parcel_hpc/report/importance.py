"""Parameter importance for the report: Optuna's fANOVA evaluator on an in-memory study of the
completed trials, seeded so the same trials give the same figure; or, where it cannot be
computed, the sentence the page shows instead. fANOVA's forest takes ~7 ms a trial, so a search
with more than ``MAX_TRIALS`` completed ones is evaluated on that many, evenly spaced in trial order.

Optuna is an optional extra, imported here only when the report asks (``propose.learning`` builds
the distributions). Must not read files or plot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parcel_hpc.propose.learning import optuna_distributions
from parcel_hpc.report.data import SearchFacts

MIN_TRIALS = 10  # completed trials before an importance says more than the noise of a few points
MAX_TRIALS = 200  # ~1.4 s of fANOVA; 10,000 would take over a minute
SEED = 0  # the evaluator's forest: the same trials draw the same figure


@dataclass(frozen=True)
class Importance:
    shares: dict[str, float] = field(default_factory=dict)  # parameter -> its share of the metric's variance, largest first
    note: str = ""  # why there are none (shown instead), or which trials they were computed on


def importance(facts: SearchFacts) -> Importance:
    done = facts.completed
    if len(done) < MIN_TRIALS:
        more = MIN_TRIALS - len(done)
        return Importance(note=f"{len(done)} completed trials: parameter importance needs {MIN_TRIALS}, {more} more.")
    try:
        import optuna  # optional, and slow to import: only this figure needs it
        from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    except ImportError:
        return Importance(note="parameter importance needs Optuna: pip install 'parcel_hpc[optuna]'")
    used = [done[i * len(done) // MAX_TRIALS] for i in range(MAX_TRIALS)] if len(done) > MAX_TRIALS else done
    if len({t.metric for t in used}) == 1:  # fANOVA divides by the metric's variance
        return Importance(note=f"every completed trial scored {used[0].metric:.4g}: no parameter explains a difference.")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = optuna_distributions(facts.space)
    study = optuna.create_study(direction="minimize")
    study.add_trials([optuna.trial.create_trial(params={p: t.params[p] for p in distributions}, distributions=distributions, value=t.metric) for t in used])
    shares = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=SEED))
    sampled = f"computed on {len(used)} of the {len(done)} completed trials, evenly spaced in trial order" if len(used) < len(done) else ""
    return Importance({p: float(v) for p, v in shares.items()}, sampled)

"""The search report's figures against Optuna's own matplotlib plots of the same trials.

    .venv/bin/python benchmarks/bench_report.py [--trials-n 10000] [--repeats 3]

The same synthetic trials (completed, pruned at a milestone, failed, running; four parameters, two
on a log scale) are drawn both ways, alternating, repetition by repetition: our optimization
history, milestone curves and parallel coordinates (``report.plots``), and Optuna's
``plot_optimization_history``, ``plot_intermediate_values`` and ``plot_parallel_coordinate``
(``optuna.visualization.matplotlib``), each encoded as the PNG a page inlines. Importance is left
out of both (Optuna's fANOVA on every trial takes minutes at this size; the report's runs on 200).
Target: no slower than Optuna's (<= 1.0x). The whole page (``report.page.to_html``, importance
included) is reported beside it, in seconds.
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _suite import Figure, main  # noqa: E402

from parcel_hpc.accounting.spend import Hours  # noqa: E402
from parcel_hpc.ledger import TrialState  # noqa: E402
from parcel_hpc.plotting import png_of  # noqa: E402
from parcel_hpc.propose.learning import optuna_distributions  # noqa: E402
from parcel_hpc.propose.space import normalize  # noqa: E402
from parcel_hpc.report.data import AttemptFacts, SearchFacts, TrialFacts  # noqa: E402
from parcel_hpc.report.page import to_html  # noqa: E402
from parcel_hpc.report.plots import curves_figure, history_figure, parallel_figure  # noqa: E402

SPACE = normalize(
    {
        "batch_size": {"type": "choice", "values": [32, 64, 128]},
        "hidden": {"type": "choice", "values": [0, 16, 32, 64]},
        "l2": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
        "lr": {"type": "float", "low": 0.003, "high": 0.3, "log": True},
    }
)
MILESTONES = (10, 20, 41, 82)


def trials(n: int, seed: int = 0) -> list[tuple[TrialFacts, AttemptFacts]]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        params = {"batch_size": r.choice([32, 64, 128]), "hidden": r.choice([0, 16, 32, 64]), "l2": 10 ** r.uniform(-5, -2), "lr": 10 ** r.uniform(-2.5, -0.53)}
        base = 0.5 + 2 * params["lr"] + 0.01 * r.random()
        curve = tuple((s, base + 0.3 / (k + 1)) for k, s in enumerate(MILESTONES))
        start, kind, tid = 1000.0 + 3 * i, r.random(), f"t{i:05d}"
        if kind < 0.4 or i == 0:
            trial = TrialFacts(tid, TrialState.COMPLETED, params, curve[-1][1], start + 60, curve)
        elif kind < 0.85:
            k = r.randrange(1, 3)
            trial = TrialFacts(tid, TrialState.PRUNED, params, None, start + 20 * k, curve[:k], curve[k - 1])
        elif kind < 0.95:
            trial = TrialFacts(tid, TrialState.FAILED, params, None, start + 10, curve[:1])
        else:
            trial = TrialFacts(tid, TrialState.RUNNING, params, None, None, curve[:2])
        took = None if trial.ended is None else trial.ended - start
        out.append((trial, AttemptFacts(tid, 1, Hours((took or 0) / 3600, (took or 0) / 3600), trial.ended, None, 10 ** r.uniform(-1, 4), took)))
    return out


def study_of(drawn: list[tuple[TrialFacts, AttemptFacts]]):
    import optuna
    from optuna.trial import TrialState as OptunaState
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = optuna_distributions(SPACE)
    study = optuna.create_study(direction="minimize")
    states = {TrialState.COMPLETED: OptunaState.COMPLETE, TrialState.PRUNED: OptunaState.PRUNED, TrialState.FAILED: OptunaState.FAIL}
    study.add_trials(
        [
            create_trial(
                state=states.get(t.state, OptunaState.RUNNING),
                value=t.metric,
                params=dict(t.params),
                distributions=distributions,
                intermediate_values=dict(t.curve),
            )
            for t, _ in drawn
        ]
    )
    return study


def ours(facts: SearchFacts) -> float:
    began = time.perf_counter()
    for make in (history_figure, curves_figure, parallel_figure):
        png_of(make(facts))
    return time.perf_counter() - began


def optunas(study) -> float:
    from optuna.visualization import matplotlib as plots

    began = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental" notices
        for plot in (plots.plot_optimization_history, plots.plot_intermediate_values, plots.plot_parallel_coordinate):
            png_of(plot(study).figure)
    return time.perf_counter() - began


def run(repeats: int = 3, trials_n: int = 10_000) -> list[Figure]:
    drawn = trials(trials_n)
    facts = SearchFacts("bench", SPACE, tuple(t for t, _ in drawn), tuple(a for _, a in drawn))
    study = study_of(drawn)
    ours(facts), optunas(study)  # warm: matplotlib's fonts and imports are paid once, by neither
    ratios, samples, pages = [], [], []
    for _ in range(repeats):
        mine, theirs = ours(facts), optunas(study)
        ratios.append(mine / theirs)
        samples.append({"ours_s": mine, "optuna_s": theirs})
        began = time.perf_counter()
        to_html(facts, time.time())
        pages.append(time.perf_counter() - began)
    return [
        Figure(
            f"report: 3 figures at {trials_n} trials",
            "Optuna's matplotlib plots of the same trials",
            ratios,
            1.0,
            samples={"runs": samples},
        ),
        Figure(f"report: the whole page at {trials_n} trials", "a budget of 30 s", pages, 30.0, unit="s", note="importance on 200 completed trials"),
    ]


if __name__ == "__main__":
    main(run, __doc__)

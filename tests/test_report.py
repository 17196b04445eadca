"""The search report (``parcel-hpc report SEARCH --html FILE``): its values from records and events
(pure), its figures readable at 3 trials and at 10,000, and the page of a real local search with
pruned trials, finished or still running, loaded in headless Chromium with no network. Also the
admin page's bars at a small spend, under the same check."""

import json
import random
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from browser import check_html_plots
from figures import unreadable
from test_accounts import line, rec

from parcel_hpc.accounting.account import SearchPart, over_searches
from parcel_hpc.accounting.account_report import figures as account_figures
from parcel_hpc.accounting.spend import Hours
from parcel_hpc.ledger import Cause, Event, MetricResume, SearchDir, TrialSpec, TrialState, fold
from parcel_hpc.ledger.summary import queue_waits
from parcel_hpc.plotting import pyplot
from parcel_hpc.report import importance as importance_module
from parcel_hpc.report.data import AttemptFacts, SearchFacts, TrialFacts, attempt_facts, cause_counts, facts_of, history, state_counts, trial_facts
from parcel_hpc.report.importance import MIN_TRIALS, importance
from parcel_hpc.report.plots import figures
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.testing.runs import resumed_within_tolerance

pytestmark = pytest.mark.xdist_group("report")  # one search for the module's tests

SPEC = TrialSpec("t0001", 1, {"lr": 0.1}, 1234, "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64, {"gpus": 1, "cpus": 2})
SPACE = {
    "batch_size": {"type": "choice", "values": [32, 64, 128]},
    "hidden": {"type": "choice", "values": [0, 16, 32, 64]},
    "l2": {"type": "float", "low": 1e-05, "high": 0.01, "log": True, "step": None},
    "lr": {"type": "float", "low": 0.003, "high": 0.3, "log": True, "step": None},
}
SECTIONS = (
    "Optimization history",
    "Milestone curves",
    "Parallel coordinates",
    "Parameter importance",
    "States and failure classes",
    "Queue wait and attempt duration",
)


def ev(kind, t, **kw):
    defaults = {"submitted": {"executor": "local", "launch_id": "l1"}}.get(kind, {})
    # A writer numbers its events with whole numbers; ``t`` may fall between two whole seconds.
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": round(t * 10), **defaults, **kw})


# --- the values (pure) -----------------------------------------------------------------------


def test_a_trial_s_curve_keeps_each_step_s_latest_value_and_drops_a_quarantined_attempt_s():
    events = [
        ev("submitted", 1, job_id="7"),
        ev("started", 2, attempt=1, job_id="7"),
        ev("milestone", 3, attempt=1, step=10, value=0.9),
        ev("quarantined", 4, reason="shared prefix", attempts_upto=1),
        ev("started", 5, attempt=2, job_id="7"),
        ev("milestone", 6, attempt=2, step=10, value=0.7),
        ev("ended", 7, attempt=2, how="interrupted", cause="preempted", step=15),
        ev("started", 8, attempt=3, job_id="7"),
        ev("milestone", 9, attempt=3, step=10, value=0.6),  # resumed before step 10: reported again
        ev("milestone", 10, attempt=3, step=20, value=0.5),
        ev("ended", 11, attempt=3, how="pruned", milestone=20, value=0.5, step=20, reason="worse than its peers"),
    ]
    t = trial_facts(fold(SPEC, events), events)
    assert t.state is TrialState.PRUNED and t.metric is None and t.ended == 11
    assert t.curve == ((10, 0.6), (20, 0.5)) and t.pruned_at == (20, 0.5)


def test_an_attempt_s_hours_wait_duration_and_cause():
    events = [
        ev("submitted", 100, job_id="7"),
        ev("started", 130, attempt=1, job_id="7"),
        ev("ended", 3730, attempt=1, how="interrupted", cause="preempted", step=5),
        ev("started", 3790, attempt=2, job_id="7"),  # the scheduler requeued job 7: it waits from its last run's end
    ]
    record = fold(SPEC, events)
    assert queue_waits(record, events) == (30, 60)
    first, second = attempt_facts(record, events, {})
    assert first.cause is Cause.PREEMPTED and first.duration_s == 3600 and first.queue_wait_s == 30
    assert first.spent == Hours(1.0, 2.0)  # its start to end at the trial's GPUs and CPUs: it never reserved
    assert second.ended is None and second.duration_s is None and second.spent == Hours()  # still running: nothing yet
    running = trial_facts(record, events)
    assert running.state is TrialState.RUNNING and running.ended is None


def completed(tid, metric, ended, **params):
    return TrialFacts(tid, TrialState.COMPLETED, {"lr": 0.01, **params}, metric, ended, ((10, metric),))


def test_history_is_the_best_so_far_in_finishing_order_against_what_every_ended_attempt_had_spent():
    trials = (
        completed("t0", 0.6, ended=30.0),
        TrialFacts("t1", TrialState.PRUNED, {"lr": 0.1}, None, 10.0, ((10, 0.9),), (10, 0.9)),
        completed("t2", 0.7, ended=20.0),
        completed("t3", 0.4, ended=40.0),
        TrialFacts("t4", TrialState.RUNNING, {"lr": 0.2}),
    )
    attempts = (
        AttemptFacts("t1", 1, Hours(1.0, 1.0), ended=10.0),
        AttemptFacts("t2", 1, Hours(2.0, 2.0), ended=20.0),
        AttemptFacts("t4", 1, Hours(4.0, 4.0), ended=25.0, cause=Cause.PREEMPTED),  # an unfinished trial's attempt spent too
        AttemptFacts("t0", 1, Hours(8.0, 8.0), ended=30.0),
        AttemptFacts("t3", 1, Hours(16.0, 16.0), ended=40.0),
    )
    points = history(SearchFacts("s", {}, trials, attempts))
    assert [(p.trial_id, p.n, p.spent.gpu_hours, p.metric, p.best) for p in points] == [
        ("t1", 1, 1.0, None, None),
        ("t2", 2, 3.0, 0.7, 0.7),
        ("t0", 3, 15.0, 0.6, 0.6),
        ("t3", 4, 31.0, 0.4, 0.4),
    ]


def test_counts_are_typed_and_in_order():
    trials = (completed("t0", 0.5, 1.0), TrialFacts("t1", TrialState.FAILED, {}), TrialFacts("t2", TrialState.FAILED, {}))
    attempts = tuple(AttemptFacts(f"t{i}", 1, Hours(), cause=c) for i, c in enumerate([Cause.TIMEOUT, Cause.EXCEPTION, Cause.EXCEPTION, None]))
    facts = SearchFacts("s", {}, trials, attempts)
    assert state_counts(facts) == {TrialState.COMPLETED: 1, TrialState.FAILED: 2}
    assert list(cause_counts(facts).items()) == [(Cause.EXCEPTION, 2), (Cause.TIMEOUT, 1)]
    assert facts.best is not None and facts.best.trial_id == "t0" and facts.unfinished == 0 and not facts.uses_gpus


def test_a_value_that_contradicts_its_state_cannot_exist():
    with pytest.raises(ValueError, match="carries a finite metric"):
        TrialFacts("t0", TrialState.COMPLETED, {})
    with pytest.raises(ValueError, match="only a pruned trial"):
        TrialFacts("t0", TrialState.FAILED, {}, pruned_at=(10, 0.5))
    with pytest.raises(ValueError, match="has not finished"):
        TrialFacts("t0", TrialState.RUNNING, {}, ended=5.0)
    with pytest.raises(ValueError, match="one value per step"):
        TrialFacts("t0", TrialState.PRUNED, {}, curve=((20, 0.5), (10, 0.6)))


# --- importance ------------------------------------------------------------------------------


def test_importance_finds_the_parameter_that_matters_the_same_way_twice():
    facts = synthetic(60, seed=3)
    first, again = importance(facts), importance(facts)
    assert first == again and first.note == ""
    assert max(first.shares, key=first.shares.get) == "lr"  # the synthetic metric follows lr


def test_importance_says_how_many_more_trials_or_what_to_install(monkeypatch):
    facts = synthetic(40, seed=1)
    few = replace(facts, trials=facts.completed[: MIN_TRIALS - 3])
    assert importance(few).note.endswith(f"needs {MIN_TRIALS}, 3 more.") and importance(few).shares == {}
    monkeypatch.setitem(sys.modules, "optuna", None)  # not installed
    assert "pip install 'parcel_hpc[optuna]'" in importance(facts).note


def test_importance_of_many_trials_is_computed_on_an_even_sample(monkeypatch):
    monkeypatch.setattr(importance_module, "MAX_TRIALS", 20)
    facts = synthetic(100, seed=2)
    shares = importance(facts)
    assert shares.shares and f"computed on 20 of the {len(facts.completed)} completed trials" in shares.note


# --- the figures, at 3 trials and at 10,000 ----------------------------------------------------

MILESTONES = (10, 20, 41, 82)


def synthetic(n: int, seed: int = 0, gpus: int = 1) -> SearchFacts:
    """``n`` trials in every state, built through the typed values: completed, pruned at a milestone,
    failed, running; a few attempts interrupted; queue waits from 0.1 s to 3 hours."""
    r = random.Random(seed)
    trials, attempts = [], []
    for i in range(n):
        params = {"batch_size": r.choice([32, 64, 128]), "hidden": r.choice([0, 16, 32, 64]), "l2": 10 ** r.uniform(-5, -2), "lr": 10 ** r.uniform(-2.5, -0.53)}
        base = 0.5 + 2 * params["lr"] + 0.01 * r.random()
        curve = tuple((s, base + 0.3 / (k + 1)) for k, s in enumerate(MILESTONES))
        start, tid, kind, cause = 1000.0 + 3 * i, f"t{i:05d}", r.random(), None
        if kind < 0.4 or i == 0:
            trial = TrialFacts(tid, TrialState.COMPLETED, params, curve[-1][1], start + 60, curve)
        elif kind < 0.85 or i == 1:
            k = r.randrange(1, 3)
            trial = TrialFacts(tid, TrialState.PRUNED, params, None, start + 20 * k, curve[:k], curve[k - 1])
        elif kind < 0.95:
            cause = r.choice([Cause.EXCEPTION, Cause.OUT_OF_MEMORY, Cause.DIVERGED])
            trial = TrialFacts(tid, TrialState.FAILED, params, None, start + 10, curve[:1])
        else:
            trial = TrialFacts(tid, TrialState.RUNNING, params, None, None, curve[:2])
        trials.append(trial)
        took = None if trial.ended is None else trial.ended - start
        attempts.append(AttemptFacts(tid, 2, Hours(gpus * (took or 0) / 3600, (took or 0) / 3600), trial.ended, cause, 10 ** r.uniform(-1, 4), took))
        if r.random() < 0.05:
            attempts.append(
                AttemptFacts(tid, 1, Hours(gpus * 0.001, 0.001), start - 1, r.choice([Cause.PREEMPTED, Cause.TIMEOUT]), 10 ** r.uniform(-1, 4), 3.6)
            )
    return SearchFacts("synthetic", SPACE, tuple(trials), tuple(attempts), "spend")


def readable(drawn: dict) -> None:
    try:
        problems = {name: unreadable(fig) for name, fig in drawn.items()}
        assert not any(problems.values()), problems
    finally:
        for fig in drawn.values():
            pyplot().close(fig)


@pytest.mark.parametrize("n", [3, 10_000])
def test_every_figure_keeps_its_text_inside_and_its_tick_labels_apart(n):
    facts = synthetic(n)
    drawn = figures(facts, importance(facts))  # how long it takes: benchmarks/bench_report.py
    assert set(drawn) == {"history", "curves", "parallel", "states", "durations"} | ({"importance"} if n >= MIN_TRIALS else set())
    readable(drawn)


def test_a_search_with_nothing_yet_says_so_in_every_figure():
    drawn = figures(SearchFacts("empty", SPACE, (), ()), importance(SearchFacts("empty", SPACE, (), ())))
    said = {name: [t.get_text() for ax in fig.axes for t in ax.texts] for name, fig in drawn.items()}
    assert said["history"][0].startswith("no trial has completed yet") and said["curves"] == ["no trial has reported a milestone yet"]
    assert said["durations"] == ["no attempt has started yet", "no attempt has ended yet"]
    assert all(not ax.axison for name in ("history", "curves", "parallel", "durations") for ax in drawn[name].axes)  # no empty axes
    readable(drawn)


def test_a_search_without_gpus_is_plotted_against_its_cpu_hours():
    drawn = figures(synthetic(12, gpus=0), importance(synthetic(12, gpus=0)))
    assert "CPU-hours spent (the search used no GPUs)" in drawn["history"].axes[1].get_xlabel().replace("\n", " ")
    readable(drawn)


def test_the_check_finds_text_cut_off_and_tick_labels_on_top_of_each_other():
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 1.5))
    ax.set_xlabel("% of the search's GPU-hour cap used (axis fitted to the largest: small shares stay visible) " * 2)
    ax.set_xticks(range(30), [f"label-{i}" for i in range(30)])
    problems = unreadable(fig)
    plt.close(fig)
    assert any("leaves the figure" in p for p in problems) and any("overlap" in p for p in problems)


def test_the_admin_page_s_bars_at_a_small_spend_are_visible_labelled_and_inside():
    tiny = SearchPart("/r/ana/a-r1", "ana", rec("a-r1", [line("10", 0.00002, "ana")], cap=200.0))
    big = SearchPart("/r/bo/a/long/path/to/where/the/search/lives/b-r1", "bo", rec("b-r1", [line("20", 3.0, "")], cap=200.0))
    drawn = dict(account_figures(over_searches("root /r", [tiny, big])))
    ax = drawn["GPU-hours by user"].axes[0]
    widths = [b.get_width() for b in ax.containers[0]]
    assert widths[0] == 3.0 and 0.01 * 3.0 <= widths[1] < 3.0  # the tiny one visible, still the smaller
    assert [t.get_text() for t in ax.texts] == ["3 GPU-h", "2e-05 GPU-h"]
    readable(drawn)


# --- the page of a real search -----------------------------------------------------------------


@pytest.fixture(scope="module")
def search(tmp_path_factory, artifacts) -> Path:
    """A local search of 12 trials whose milestones pruned some."""
    where = tmp_path_factory.mktemp("report")
    res = launch(
        [f"search.root={where / 'runs'}", "search.revision=rep", "search.n_trials=12", "hydra.launcher.parallelism=2"],
        cwd=where,
        data_dir=Path(artifacts["dir"]),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    path = where / "runs" / "rep"
    states = {r.state for r in SearchDir(path).records()}
    assert TrialState.PRUNED in states and TrialState.COMPLETED in states
    return path


def test_the_report_of_a_search_opens_in_a_browser_with_no_network(search, tmp_path):
    page = tmp_path / "report.html"
    res = parcel_hpc(["report", str(search), "--html", str(page)])
    assert res.returncode == 0 and res.stdout == "" and f"wrote the report of 12 trials to {page}" in res.stderr, res.stderr
    html = page.read_text()
    assert "<script" not in html and "http" not in html  # nothing to fetch, nothing to run
    assert "<td>pruned</td>" in html and "the search used no GPUs" in html
    assert f"needs {MIN_TRIALS}" in html or 'id="importance-table"' in html
    dom = check_html_plots(page, tmp_path, at_least=5, sections=SECTIONS)
    assert "The search is not finished" not in dom


def test_a_running_trial_is_reported_as_it_stands(search, tmp_path):
    running = tmp_path / "running"
    shutil.copytree(search, running)
    sd = SearchDir(running)
    tid = next(r.trial_id for r in sd.records() if r.state is TrialState.COMPLETED)
    for journal in sd.trial_dir(tid).glob("journal-a1-*.jsonl"):  # as read between its last milestone and its end
        journal.write_text("".join(ln + "\n" for ln in journal.read_text().splitlines() if json.loads(ln)["kind"] not in ("ended", "device_use")))
    assert sd.record(tid).state is TrialState.RUNNING
    page = tmp_path / "running.html"
    res = parcel_hpc(["report", str(running), "--html", str(page)])
    assert res.returncode == 0, res.stderr
    check_html_plots(page, tmp_path, at_least=5, sections=(*SECTIONS, "The search is not finished: 1 trials are queued or running"))
    facts = facts_of("x", SPACE, [(r, sd.events(r.trial_id)) for r in sd.records()], {})
    assert next(t for t in facts.trials if t.trial_id == tid).curve  # its milestones so far are drawn


def test_a_metric_resumed_within_tolerance_is_marked_beside_the_trainer_s_own_metrics(search, tmp_path):
    """Every trial's row says its miss-cost and the metrics its trainer reported (the test trainer's
    loss); the one resumed under a declared tolerance says so, in the table and as the best so far."""
    copy = tmp_path / "tolerance"
    shutil.copytree(search, copy)
    sd = SearchDir(copy)
    best = min((r for r in sd.records() if r.state is TrialState.COMPLETED), key=lambda r: (r.metric, r.trial_id))
    assert resumed_within_tolerance(sd, best.trial_id).metric_resume is MetricResume.WITHIN_TOLERANCE
    page = tmp_path / "tolerance.html"
    assert parcel_hpc(["report", str(copy), "--html", str(page)]).returncode == 0
    dom = check_html_plots(page, tmp_path, at_least=5, sections=("Trials", "<th>loss</th>"))
    mark = f'<span class="inexact">({MetricResume.WITHIN_TOLERANCE.mark()})</span>'
    rows = {row.split("</td>", 1)[0]: row for row in dom.split("<tr><td>")[1:] if row.startswith("t0")}
    assert len(rows) == 12 and mark in rows[best.trial_id] and all(mark not in row for tid, row in rows.items() if tid != best.trial_id)
    assert f"best so far <b>{best.trial_id}</b>, validation miss-cost {best.metric:.4f} {mark}" in dom
    losses = {r.trial_id: r.train_metrics["loss"] for r in sd.records()}
    assert all(f"<td>{losses[tid]:.4g}</td>" in row for tid, row in rows.items())  # each trial's own loss at its last validation


def test_bad_input_is_one_line_naming_the_problem_and_exit_2(search, tmp_path):
    not_a_search = parcel_hpc(["report", str(tmp_path), "--html", str(tmp_path / "r.html")])
    assert not_a_search.returncode == 2 and "not a search directory" in not_a_search.stderr and not_a_search.stderr.count("\n") == 1
    nowhere = parcel_hpc(["report", str(search), "--html", str(tmp_path / "missing" / "r.html")])
    assert nowhere.returncode == 2 and "--html" in nowhere.stderr and "folder does not exist" in nowhere.stderr and nowhere.stderr.count("\n") == 1
    (tmp_path / "a-folder.html").mkdir()
    folder = parcel_hpc(["report", str(tmp_path), "--html", str(tmp_path / "a-folder.html")])
    assert folder.returncode == 2 and "--html" in folder.stderr  # the output is checked before the search is read
    no_html = parcel_hpc(["report", str(search)])
    assert no_html.returncode == 2 and "--html" in no_html.stderr and no_html.stderr.count("\n") == 1
    assert not (tmp_path / "r.html").exists()

"""A 5-fold search end to end on the local executor (issue 48): each trial is five fold runs in turn,
each with its own claimed checkpoint chain, pruned on the mean over the folds it has run, scored as
the mean over its folds (shown with their spread); and a trial signalled in the middle of a fold
resumes that fold from its own checkpoint to exactly the uninterrupted trial's values."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys

import pytest

from parcel_hpc.budget import BudgetLedger
from parcel_hpc.data import read_split
from parcel_hpc.ledger import AttemptEnd, Cause, SearchDir, Started, TrialState
from parcel_hpc.ledger.events import Milestone, Resumed
from parcel_hpc.pruning import MilestoneStore
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.testing.runs import subprocess_env, wait_for, with_suite_cadence

K = 5
SPLIT = "split=group_kfold_r1"
MILESTONES = (10, 20, 41, 82)


pytestmark = pytest.mark.xdist_group("folds-local")  # one worker runs the module: the fold search once, not once a worker


@pytest.fixture(scope="module")
def fold_search(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("folds")
    args = [f"search.root={root / 'runs'}", "search.revision=kf", SPLIT, "search.n_trials=6", "pruner.min_peers=2", "hydra.launcher.parallelism=2"]
    shutil.copytree(artifacts["dir"], root / "data")
    res = launch(args, cwd=root, data_dir=root / "data")
    assert res.returncode == 0, res.stderr[-3000:]
    return {"root": root, "search": SearchDir(root / "runs" / "kf"), "stdout": res.stdout}


def test_a_fold_trial_runs_k_fold_runs_each_on_its_own_claimed_chain_and_scores_their_mean(fold_search, artifacts):
    search = fold_search["search"]
    assert read_split(artifacts["group_kfold_split_path"]).fold_count == K
    records = search.records()
    assert len(records) == 6 and all(r.state in (TrialState.COMPLETED, TrialState.PRUNED) for r in records)
    completed = [r for r in records if r.state is TrialState.COMPLETED]
    assert completed
    for r in completed:
        assert r.folds is not None and len(r.folds.values) == K
        assert r.metric == pytest.approx(statistics.fmean(r.folds.values), abs=1e-12)
        assert r.folds.spread == pytest.approx(statistics.stdev(r.folds.values), abs=1e-12)
        # Each fold's last milestone in the ledger is its value: the metric is theirs, fold by fold.
        last = {m.fold: m.value for m in (e.data for e in search.events(r.trial_id)) if isinstance(m, Milestone) and m.step == 82}
        assert tuple(last[k] for k in range(K)) == r.folds.values
        for k in range(K):
            chain = fold_search["root"] / "runs" / "kf" / "checkpoints" / r.trial_id / f"fold-{k}"
            claims = sorted(chain.glob("claim-*.json"))
            assert claims and {json.loads(c.read_text())["fold"] for c in claims} == {k}
            assert json.loads(claims[-1].read_text())["state"] == "released"
    # The worst case a launch admits, and each attempt reserves, is K fold runs' time limit (resources.time_limit_min=10).
    assert f"x {K * 10 / 60:.2f} h limit" in fold_search["stdout"]
    assert search.contract()["resources"]["time_limit_min"] == K * 10
    cpus = search.contract()["resources"]["cpus"]
    assert [h.reserved_cpu_hours for h in BudgetLedger.read(search.path).holds.values()] == pytest.approx([cpus * K * 10 / 60] * 6)


def test_a_fold_trial_is_compared_on_its_mean_over_the_folds_so_far_with_the_same_fold_s_peers(fold_search):
    search = fold_search["search"]
    store = MilestoneStore(search.path, MILESTONES, readonly=True)
    for r in search.records():
        values = [m for m in (e.data for e in search.events(r.trial_id)) if isinstance(m, Milestone) and m.is_milestone]
        for fold in range(K):
            for step in MILESTONES:
                report = store.of_fold(fold).report_of(r.trial_id, step) if fold else store.report_of(r.trial_id, step)
                own = [m.value for m in values if m.step == step and m.fold is not None and m.fold <= fold]
                if report is None:
                    continue
                assert len(own) == fold + 1 and report.value == pytest.approx(statistics.fmean(own), abs=1e-12)
    # Later folds decide among the trials that reached them (each decision's peers are that fold's).
    later = [d.decision for f in range(1, K) for d in store.of_fold(f).decisions()]
    assert later and all(set(d.peer_ids) <= {r.trial_id for r in search.records()} for d in later)
    assert all("of fold" in r.reason for r in search.records() if r.state is TrialState.PRUNED)


def test_status_and_export_show_each_fold_and_the_spread(fold_search):
    search = fold_search["search"]
    status = parcel_hpc(["status", str(search.path)], env={"COLUMNS": "400"})
    assert status.returncode == 0 and f"over {K} folds [" in status.stdout, status.stdout[-2000:]
    shown = json.loads(parcel_hpc(["status", str(search.path), "--json"]).stdout)["trials"]
    assert {t["trial_id"]: t["fold_metrics"] for t in shown} == {r.trial_id: list(r.folds.values) if r.folds else None for r in search.records()}
    export = parcel_hpc(["export", str(search.path), "--format", "jsonl"])
    assert export.returncode == 0, export.stderr
    rows = {row["trial_id"]: row for row in map(json.loads, export.stdout.splitlines())}
    for r in search.records():
        if r.state is TrialState.COMPLETED:
            assert r.folds is not None
            assert [float(v) for v in rows[r.trial_id]["fold_metrics"].split()] == list(r.folds.values)
            assert rows[r.trial_id]["fold_spread"] == pytest.approx(r.folds.spread)


def test_a_fold_signalled_mid_run_resumes_its_own_chain_to_the_uninterrupted_values(tmp_path, data_dir):
    common = [SPLIT, "search.n_trials=1", "pruner=none", "train.step_seconds=0.03"]
    ref = launch([f"search.root={tmp_path}", "search.revision=ref", *common], cwd=tmp_path, data_dir=data_dir)
    assert ref.returncode == 0, ref.stderr[-2000:]
    reference = SearchDir(tmp_path / "ref").record("t0000")

    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={tmp_path}", "search.revision=sig", *with_suite_cadence(common)]
    launcher = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, {}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    fold_2 = tmp_path / "sig" / "checkpoints" / "t0000" / "fold-2"
    wait_for(lambda: launcher.poll() is not None or any(fold_2.glob("ckpt-*.h5")), 180, "a first checkpoint of fold 2")
    assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
    search = SearchDir(tmp_path / "sig")
    started = [e.data for e in search.events("t0000") if isinstance(e.data, Started)][-1]
    os.kill(started.pid, signal.SIGUSR2)  # what submitit's controller sends at the time limit
    _, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-2000:]

    record = search.record("t0000")
    first, second = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.TIMEOUT) and 0 < first.step < 82
    assert second.how is AttemptEnd.COMPLETED
    resumed = {e.data.fold: e.data.step for e in search.events("t0000") if isinstance(e.data, Resumed) and e.attempt == second.number}
    assert resumed == {0: 82, 1: 82, 2: first.step}  # the finished folds scored from their last checkpoint; fold 2 where it stopped
    assert record.folds == reference.folds and record.metric == reference.metric  # bit-equal to the uninterrupted trial


def test_select_judges_out_of_fold_predictions_and_releases_the_refit(fold_search):
    search = fold_search["search"]
    sel = parcel_hpc(["select", str(search.path), "--now", "--reason", "six trials are enough for the fold test"])
    assert sel.returncode in (0, 3), sel.stdout + sel.stderr
    assert "Traceback" not in sel.stderr
    frozen = json.loads((search.path / "selection" / "selection-1.json").read_text())
    winner = search.record(frozen["trial_id"])
    rerun = json.loads((search.path / "selection" / "1" / "rerun" / "result.json").read_text())
    folds = rerun["folds"]
    # Each fold rerun from scratch on its own training part, against the value the fold was selected with.
    assert folds["k"] == K and folds["selected"] == list(winner.folds.values)
    assert folds["artifact"] == folds["selected"]  # each fold's own final checkpoint rescores to its value
    assert len(folds["rerun"]) == K and all(abs(r - s) <= 1e-9 for r, s in zip(folds["rerun"], folds["selected"], strict=True))
    assert len(folds["records"]["rerun"]) == K and len(folds["records"]["baseline"]) == K
    # The gates judge out-of-fold predictions: every non-final frame of a grouped K-fold, once.
    assert rerun["slices"]["partition"] == "out-of-fold" and folds["frames_without_oof"] == 0
    overall = next(r for r in rerun["slices"]["winner"] if r["column"] == "overall")
    assert overall["n"] == folds["oof_frames"] == rerun["refit"]["frames"]
    assert rerun["baseline"]["fold_metrics"] == folds["baseline"]
    # The released model is the refit on all non-final data, recorded like a trial.
    assert rerun["artifact"]["from"] == rerun["refit"]["records"]
    assert "slice gate, out-of-fold" in sel.stdout and "out-of-fold miss-cost" in sel.stdout, sel.stdout
    assert "on validation" not in sel.stdout and "found: validation" not in sel.stdout, sel.stdout  # every gate's finding says what it judged
    held = sel
    while held.returncode == 3 and held.stdout.splitlines()[0] in ("hold:slice-quality", "hold:performance"):  # each decidable hold, one decision each
        held = parcel_hpc(["decide", str(search.path), "--accept", "--by", "Dana", "--reason", "accepted for the fold test"])
    assert held.returncode == 0 and held.stdout.splitlines()[0] == "evaluate:final-holdout", held.stdout + held.stderr
    final = parcel_hpc(["evaluate-final", str(search.path)])
    assert final.stdout.splitlines()[0] == "evaluate:final-holdout", final.stdout + final.stderr
    rel = parcel_hpc(["release", str(search.path)])
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    # The release ships the refit: the artifact the final partition was scored on, registered byte for byte.
    packet = json.loads((search.path / "release" / "packet.json").read_text())
    assert packet["final"]["winner"]["artifact_sha256"] == rerun["artifact"]["sha256"] == packet["artifact"]["sha256"]
    assert packet["folds"]["rerun"] == folds["rerun"] and packet["rerun"]["fold"] in range(K)
    assert packet["slices"]["partition"] == "out-of-fold"
    data = packet["lineage"]["on_what_data"]
    assert data["split_method"] == "group_kfold" and "K folds" in data["boundary"]
    refit = packet["lineage"]["refit"]
    assert refit["records"] == rerun["refit"]["records"] and refit["params"] == dict(winner.spec.params) and refit["seed"] == winner.spec.seed
    assert packet["recorded"]["refit"]["state"] == "completed" and packet["recorded"]["refit"]["params"] == dict(winner.spec.params)
    md = (search.path / "release" / "packet.md").read_text()
    html = (search.path / "release" / "packet.html").read_text()
    for text in (md, html):
        assert f"{K} folds (group_kfold)" in text and "Released as its refit" in text and "group_kfold: by shipment, K folds" in text
    assert all(f"| {k} | {packet['folds']['selected'][k]:.4f}" in md for k in range(K)), md


def test_a_time_k_fold_winner_has_no_out_of_fold_prediction_for_the_earliest_period_and_the_packet_says_so(tmp_path, data_dir):
    res = launch([f"search.root={tmp_path}", "search.revision=tk", "split=time_kfold_r1", "search.n_trials=2", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    search = SearchDir(tmp_path / "tk")
    split = read_split(data_dir / "split-time_kfold_r1.json")
    sel = parcel_hpc(["select", str(search.path), "--now", "--reason", "two trials for the time fold test"])
    assert sel.returncode in (0, 3) and "Traceback" not in sel.stderr, sel.stdout + sel.stderr
    rerun = json.loads((search.path / "selection" / "1" / "rerun" / "result.json").read_text())
    folds = rerun["folds"]
    assert folds["k"] == split.fold_count and folds["method"] == "time_kfold"
    # Every non-final frame trains the refit; the earliest period (train_only) is validated by no fold.
    assert folds["frames_without_oof"] > 0 and folds["oof_frames"] + folds["frames_without_oof"] == rerun["refit"]["frames"]
    held = sel
    while held.returncode == 3 and held.stdout.splitlines()[0] in ("hold:slice-quality", "hold:performance"):
        held = parcel_hpc(["decide", str(search.path), "--accept", "--by", "Dana", "--reason", "accepted for the time fold test"])
    assert held.stdout.splitlines()[0] == "evaluate:final-holdout", held.stdout + held.stderr
    assert parcel_hpc(["evaluate-final", str(search.path)]).returncode == 0
    assert parcel_hpc(["release", str(search.path)]).returncode == 0
    md = (search.path / "release" / "packet.md").read_text()
    assert f"{folds['frames_without_oof']} non-final frames of the earliest period have none" in md and "time_kfold: by time, forward-chained" in md


REFIT_SEARCH = [SPLIT, "search.n_trials=1", "pruner=none", "train.step_seconds=0.02"]
REFIT_WHY = ["--now", "--reason", "one trial for the refit test"]


@pytest.fixture(scope="module")
def uninterrupted_refit(tmp_path_factory, artifacts):
    """What the uninterrupted refit serves: one search selected without a fault, shared by both kills."""
    root = tmp_path_factory.mktemp("refit-ref")
    shutil.copytree(artifacts["dir"], root / "data")
    res = launch([f"search.root={root}", "search.revision=ref", *REFIT_SEARCH], cwd=root, data_dir=root / "data")
    assert res.returncode == 0, res.stderr[-2000:]
    ref = parcel_hpc(["select", str(root / "ref"), *REFIT_WHY])
    assert ref.returncode in (0, 3), ref.stdout + ref.stderr
    return json.loads((root / "ref" / "selection" / "1" / "rerun" / "result.json").read_text())["serving"]["example"]["served"]


@pytest.mark.xdist_group("refit-kills")  # one worker runs both: the uninterrupted refit is made once
@pytest.mark.parametrize("when", ["mid-refit", "after-refit"])
def test_a_refit_killed_mid_run_resumes_its_own_chain_to_the_uninterrupted_refit(tmp_path, data_dir, when, uninterrupted_refit):
    res = launch([f"search.root={tmp_path}", "search.revision=sig", *REFIT_SEARCH], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    why = REFIT_WHY
    search = tmp_path / "sig"
    argv = [sys.executable, "-m", "parcel_hpc", "select", str(search), *why]
    select = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, {}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chain = search / "checkpoints" / "t0000" / "refit"

    def claims():
        return [json.loads(c.read_text()) for c in sorted(chain.glob("claim-*.json"))]

    if when == "mid-refit":
        wait_for(lambda: select.poll() is not None or any(chain.glob("ckpt-*.h5")), 300, "a first checkpoint of the refit")
    else:  # the refit finished and released its chain; the job goes on (the baseline's refit, serving)
        wait_for(lambda: select.poll() is not None or any(c["state"] == "released" for c in claims()), 300, "the refit's chain released")
    assert select.poll() is None, select.communicate()
    os.kill(claims()[-1]["pid"], signal.SIGKILL)  # the rerun job dies
    out, err = select.communicate(timeout=300)
    assert select.returncode == 3 and out.splitlines()[0] == "hold:invalid-winner", out + err
    again = parcel_hpc(["select", str(search)])
    assert again.returncode in (0, 3) and "Traceback" not in again.stderr, again.stdout + again.stderr
    result = json.loads((search / "selection" / "1" / "rerun" / "result.json").read_text())
    # The second run's refit resumed from the chain the killed one left (records name their paths from the search).
    events = [json.loads(line) for p in sorted((search / result["refit"]["records"]).glob("*.jsonl")) for line in p.read_text().splitlines()]
    step = [e["step"] for e in events if e["kind"] == "resumed"][0]
    assert (0 < step < 82) if when == "mid-refit" else step == 82, events
    assert result["refit"]["chain"].endswith("checkpoints/t0000/refit")
    assert result["serving"]["example"]["served"] == uninterrupted_refit  # bit-equal to the uninterrupted refit

"""MLflow where a team already runs it: a real ``mlflow server`` (SQLite backend store, local
artifact root) on a free loopback port, read back through MLflow's own client.

A search launched with ``release.registry=mlflow``: a held release creates no version, a server that
is down is one line naming its URI (exit 2) with nothing written, a release that registers makes
one version (the artifact's exact bytes, the packet, the lineage and the checks as tags, the alias
moved), a second release makes no second version, and the version's files serve. ``export --to
mlflow`` writes one run per trial under one per search, and again adds nothing.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from mlflow_server import client, free_port, mlflow_server, started

from parcel_hpc.data import load_partition, read_split
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.release_target import ReleaseTarget, shown
from parcel_hpc.integrations.mlflow.runs import ENDED_STATUSES, RUN_STATUS
from parcel_hpc.ledger import MetricResume, SearchDir, TrialState
from parcel_hpc.release import load_release
from parcel_hpc.testing import decide_every_hold, launch, parcel_hpc
from parcel_hpc.testing.runs import resumed_within_tolerance

pytestmark = pytest.mark.xdist_group("mlflow")  # one server and one search for the module's tests
MODEL = "parcel-damage-test"


def tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def story(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("mlflow")
    data = root / "data"
    shutil.copytree(artifacts["dir"], data)
    overrides = [f"search.root={root / 'runs'}", "search.revision=mlf-r1", "search.n_trials=12", "budget.max_trials=12", "pruner=none"]
    res = launch([*overrides, "release.registry=mlflow", f"release.model_name={MODEL}"], cwd=root, data_dir=data)
    assert res.returncode == 0, res.stderr[-2000:]
    with mlflow_server(root / "mlflow") as uri:
        yield {"root": root, "search": root / "runs" / "mlf-r1", "uri": uri, "data": data}


def cli(story, *args, uri=None):
    return parcel_hpc([*args], cwd=story["root"], env={"MLFLOW_TRACKING_URI": uri or story["uri"]}, timeout=600)


def versions(uri):
    """The versions releases made (a version planted by hand carries no selection key)."""
    return [v for v in client(uri).search_model_versions(f"name='{MODEL}'") if "parcel.selection_key" in v.tags]


def plant(uri, tags):
    """A version someone made by hand: a run with a file, registered under MODEL."""
    mlflow = client(uri)
    if not mlflow.search_registered_models(filter_string=f"name='{MODEL}'"):
        mlflow.create_registered_model(MODEL)
    run = mlflow.create_run(mlflow.get_experiment_by_name("Default").experiment_id)
    mlflow.log_text(run.info.run_id, "not a parcel artifact", "entry/artifact.h5")
    return mlflow.create_model_version(MODEL, f"{run.info.artifact_uri}/entry", run_id=run.info.run_id, tags=tags)


def test_the_registry_takes_one_version_per_released_selection(story):
    search, uri = story["search"], story["uri"]
    contract = json.loads((search / "contract.json").read_text())["contract"]
    assert contract["release"] == {"registry": "mlflow", "model_name": MODEL, "alias": "champion", "tracking_uri": None}
    sel = cli(story, "select", str(search))
    held = sel.returncode == 3
    if held:
        # 1. A held selection is refused before anything: no version, no run.
        refused = cli(story, "release", str(search))
        assert refused.returncode == 3 and refused.stdout.splitlines()[0] == sel.stdout.splitlines()[0], refused.stdout + refused.stderr
    ended = decide_every_hold(sel, lambda reason: cli(story, "decide", str(search), "--accept", "--by", "Dana Reviewer", "--reason", reason))
    assert ended.returncode == 0, ended.stdout + ended.stderr
    # 2. Before the final evaluation the release holds: the packet says so, and no version is made.
    early = cli(story, "release", str(search))
    assert early.returncode == 3 and early.stdout.splitlines()[0].startswith("hold:"), early.stdout + early.stderr
    assert versions(uri) == []
    final = cli(story, "evaluate-final", str(search))
    assert final.returncode == 0, final.stdout + final.stderr
    # 3. A registry that is down: one line naming its URI, exit 2, nothing written anywhere.
    before = tree(search)
    dead = f"http://127.0.0.1:{free_port()}"
    down = cli(story, "release", str(search), uri=dead)
    assert down.returncode == 2 and down.stdout == "", down.stdout + down.stderr
    assert len(down.stderr.strip().splitlines()) == 1 and dead in down.stderr, down.stderr
    malformed = cli(story, "release", str(search), uri="localhost:5000")  # no scheme: MLflow's client refuses it
    assert malformed.returncode == 2 and len(malformed.stderr.strip().splitlines()) == 1 and "localhost:5000" in malformed.stderr, malformed.stderr
    assert tree(search) == before and versions(uri) == []
    assert not (story["root"] / "runs" / "registry").exists()  # the folder registry is not a fallback
    # 3b. A version of this selection someone else made (another trial's): refused, left as it is, nothing written.
    key = f"{json.loads((search / 'identity.json').read_text())['search_id']}/selection-1"
    planted = plant(uri, {"parcel.selection_key": key, "parcel.trial_id": "t9999"})
    foreign = cli(story, "release", str(search))
    assert foreign.returncode == 3 and foreign.stdout.splitlines()[0] == "reject:registry-entry", foreign.stdout + foreign.stderr
    assert f"models:/{MODEL}/{planted.version} names parcel." in foreign.stderr and tree(search) == before
    mlflow = client(uri)
    mlflow.delete_model_version_tag(MODEL, planted.version, "parcel.selection_key")  # now just another version of the model
    # 4. The release registers one version: the artifact's exact bytes, the packet, tags, the alias.
    journals = {p.name for p in (search / "selection").glob("journal-*.jsonl")}  # the ledger before any release
    rel = cli(story, "release", str(search))
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    packet = json.loads((search / "release" / "packet.json").read_text())
    [version] = versions(uri)
    assert f"registered: models:/{MODEL}/{version.version} at {uri} (alias champion)" in rel.stdout
    assert mlflow.get_model_version_by_alias(MODEL, "champion").version == version.version
    tags = version.tags
    for answer in ("what_ran", "on_what_data", "how_it_ended", "what_it_cost", "what_was_concluded"):
        assert json.loads(tags[f"parcel.lineage.{answer}"]) == packet["lineage"][answer], answer
    assert {k.removeprefix("parcel.check."): v for k, v in tags.items() if k.startswith("parcel.check.") and k.count(".") == 2} == packet["checks"]
    for g in packet["gates"]:  # each check's rule with the contract's numbers, what it found, what lifts its hold
        assert [tags[f"parcel.check.{g['gate']}.{part}"] for part in ("rule", "found", "lift")] == [g["rule"], g["found"], g["lift"]]
    assert tags["parcel.trial_id"] == packet["selection"]["trial_id"] and tags["parcel.selection"] == str(packet["selection"]["number"])
    winner = SearchDir(search).record(packet["selection"]["trial_id"])
    assert tags["parcel.metric_resume"] == winner.metric_resume.value == packet["lineage"]["how_it_ended"]["metric_resume"]  # as its record says
    if held:
        assert tags["parcel.decision.1.by"] == "Dana Reviewer" and tags["parcel.decision.1.lifted"] == sel.stdout.splitlines()[0]
    else:
        assert not any(k.startswith("parcel.decision.") for k in tags)
    entry = Path(mlflow.download_artifacts(version.run_id, "entry", str(story["root"] / "downloaded")))
    artifact = (entry / "artifact.h5").read_bytes()
    assert "sha256:" + hashlib.sha256(artifact).hexdigest() == packet["final"]["winner"]["artifact_sha256"] == tags["parcel.artifact_sha256"]
    assert json.loads((entry / "packet.json").read_text()) == packet
    assert (entry / "packet.html").read_text() == (search / "release" / "packet.html").read_text()
    assert (entry / "packet.md").exists() and (entry / "registered.json").exists()
    assert mlflow.get_run(version.run_id).info.status == "FINISHED"
    # 5. The version serves: downloaded by its alias as docs/selection-and-release.md says, its files are an entry load_release reads.
    served = story["root"] / "served"
    download = [str(Path(sys.executable).parent / "mlflow"), "artifacts", "download", "-u", f"models:/{MODEL}@champion", "-d", str(served)]
    got = subprocess.run(download, env={**os.environ, "MLFLOW_TRACKING_URI": uri}, capture_output=True, text=True, timeout=120, cwd=story["root"])
    assert got.returncode == 0, got.stderr[-2000:]
    assert (served / "artifact.h5").read_bytes() == artifact
    data = story["data"]
    images = load_partition(data / "parcels.h5", read_split(data / "split-group_r8.json"), "validation").images[:4]
    expected = load_release(served).serve(images)  # no snapshot, no split: the preprocessing travels in the state
    assert expected.shape == (4,) and expected.dtype == np.float64
    # 5b. It is an MLflow model, served over HTTP by `mlflow models serve` (MLflow's own loader, a fresh process, by the
    # alias) while no snapshot exists anywhere: one prediction, equal to load_release's.
    (data / "parcels.h5").rename(data / "parcels.h5.away")
    try:
        assert serve_one(uri, f"models:/{MODEL}@champion", images, story["root"]) == expected.tolist()
    finally:
        (data / "parcels.h5.away").rename(data / "parcels.h5")
    model = mlflow_model(served)
    assert model.signature.inputs.to_dict() == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": (-1, *images.shape[1:])}}]
    assert model.signature.outputs.to_dict() == [{"type": "tensor", "tensor-spec": {"dtype": "float64", "shape": (-1,)}}]
    pins = (served / "requirements.txt").read_text().split()
    assert f"parcel-hpc=={packet['lineage']['what_ran']['dependencies']['key']['parcel-hpc']}" in pins
    assert all(f"{name}=={version}" in pins for name, version in contract["trainer"]["distributions"].items())
    example = np.asarray(json.loads((served / "input_example.json").read_text()), dtype=np.float32)
    rows = packet["serving"]["example"]["rows"]
    validation = load_partition(data / "parcels.h5", read_split(data / "split-group_r8.json"), "validation").images
    assert packet["serving"]["example"]["partition"] == "validation" and np.array_equal(example, validation[rows])
    # 6. Releasing again makes no second version, says where the first is, and leaves the alias where others moved it.
    mlflow.set_registered_model_alias(MODEL, "champion", planted.version)
    again = cli(story, "release", str(search))
    assert again.returncode == 0 and again.stdout.splitlines()[0] == "release:registered", again.stdout + again.stderr
    assert f"already registered: models:/{MODEL}/{version.version}" in again.stdout
    assert [v.version for v in versions(uri)] == [version.version]
    assert mlflow.get_model_version_by_alias(MODEL, "champion").version == planted.version
    # 7. A release whose ledger never heard of the version (it died just after creating it) finds it by its tags
    # and finishes what it left: the alias. The search as it was before step 4 is made in place: a copy elsewhere
    # is another directory, which the search's identity (and every reader, confined to it) refuses.
    released = [p for p in (search / "selection").glob("journal-*.jsonl") if p.name not in journals]
    assert released and all(p.name.startswith("journal-release-") for p in released), released  # only releases wrote
    for journal in released:
        journal.unlink()
    shutil.rmtree(search / "release")
    found = cli(story, "release", str(search))
    assert found.returncode == 0 and f"registered: models:/{MODEL}/{version.version} at {uri}" in found.stdout, found.stdout + found.stderr
    assert [v.version for v in versions(uri)] == [version.version]
    assert mlflow.get_model_version_by_alias(MODEL, "champion").version == version.version
    assert not list(story["root"].glob("mlflow.db"))  # MLflow's client default (./mlflow.db) was never opened


def mlflow_model(entry):
    from mlflow.models import Model

    return Model.load(entry / "MLmodel")


def serve_one(uri, model_uri, frames, workdir):
    """``mlflow models serve`` (the environment as it is: no network) and one POST /invocations; its predictions."""
    port = free_port()
    argv = [str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    with started(argv, workdir / "models-serve.log", f"http://127.0.0.1:{port}/ping", {**os.environ, "MLFLOW_TRACKING_URI": uri}):
        body = json.dumps({"inputs": frames.tolist()}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())["predictions"]


def test_export_writes_one_run_per_trial_under_one_per_search_and_again_adds_nothing(story):
    search, uri = story["search"], story["uri"]
    before = tree(search)
    out = cli(story, "export", str(search), "--to", "mlflow", "--experiment", "mlf-export")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 created, 0 updated, 0 unchanged" in out.stderr, out.stderr
    table = json.loads(cli(story, "status", str(search), "--json").stdout)
    mlflow = client(uri)
    experiment = mlflow.get_experiment_by_name("mlf-export")
    runs = mlflow.search_runs([experiment.experiment_id], max_results=100)
    [parent] = [r for r in runs if r.data.tags["parcel.kind"] == "search"]
    trials = {r.data.tags["parcel.trial_id"]: r for r in runs if r.data.tags["parcel.kind"] == "trial"}
    assert len(trials) == 12 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials.values())
    assert parent.info.status == "FINISHED"
    contract_digest = json.loads((search / "contract.json").read_text())["digest"]
    rows = {r["trial_id"]: r for r in table["trials"]}
    statuses = {"completed": "FINISHED", "failed": "FAILED"}
    for tid, run in trials.items():
        row = rows[tid]
        assert run.data.tags["parcel.state"] == row["state"] and run.info.status == statuses[row["state"]]
        assert run.data.tags["parcel.contract_digest"] == contract_digest and run.data.tags["parcel.config_hash"]
        spec = json.loads((search / "trials" / tid / "spec.json").read_text())
        assert run.data.params == {k: str(v) for k, v in spec["params"].items()}
        history = mlflow.get_metric_history(run.info.run_id, "val_miss_cost")
        assert history and [m.step for m in history] == sorted(m.step for m in history)
        assert run.data.tags["parcel.metric_resume"] == row["metric_resume"]
        # the trainer's own loss at each validated step, beside the pinned metric; its last is status's
        losses = mlflow.get_metric_history(run.info.run_id, "train/loss")
        assert sorted(m.step for m in losses) == sorted(m.step for m in history) and run.data.metrics["train/loss"] == row["train_metrics"]["loss"]
        assert run.data.metrics["attempts"] >= 1 and "gpu_hours" in run.data.metrics and run.data.metrics["cpu_hours"] > 0
        if row["state"] == "completed":
            assert run.data.metrics["final_val_miss_cost"] == pytest.approx(row["metric"])
    again = cli(story, "export", str(search), "--to", "mlflow", "--experiment", "mlf-export")
    assert again.returncode == 0 and "0 created, 0 updated, 12 unchanged" in again.stderr, again.stderr
    assert len(mlflow.search_runs([experiment.experiment_id], max_results=100)) == 13
    assert tree(search) == before  # read-only on the search
    lone = cli(story, "export", str(search), "--experiment", "mlf-export")
    assert lone.returncode == 2 and "use it with --to mlflow" in lone.stderr, lone.stderr
    dead = f"http://127.0.0.1:{free_port()}"
    down = cli(story, "export", str(search), "--to", "mlflow", dead)
    assert down.returncode == 2 and dead in down.stderr and len(down.stderr.strip().splitlines()) == 1, down.stderr


def test_a_trial_resumed_within_tolerance_is_tagged_so_in_its_run(story, tmp_path):
    """A completed trial whose attempt resumed under a declared train.resume_tolerance: its run's
    ``parcel.metric_resume`` says ``within_tolerance``; every other run's says how its own record stands."""
    copy = tmp_path / "tolerance"
    shutil.copytree(story["search"], copy)
    sd = SearchDir(copy)
    marked = next(r for r in sd.records() if r.state is TrialState.COMPLETED).trial_id
    resumed_within_tolerance(sd, marked)
    out = cli(story, "export", str(copy), "--to", "mlflow", "--experiment", "mlf-tolerance")
    assert out.returncode == 0, out.stdout + out.stderr
    mlflow = client(story["uri"])
    runs = mlflow.search_runs([mlflow.get_experiment_by_name("mlf-tolerance").experiment_id], "tags.`parcel.kind` = 'trial'", max_results=100)
    tagged = {r.data.tags["parcel.trial_id"]: r.data.tags["parcel.metric_resume"] for r in runs}
    assert tagged == {r.trial_id: r.metric_resume.value for r in sd.records()} and tagged[marked] == MetricResume.WITHIN_TOLERANCE.value


def test_a_run_ends_exactly_when_its_trial_has_finished():
    ended = {state for state, status in RUN_STATUS.items() if status in ENDED_STATUSES}
    assert ended == {state for state in TrialState if state.is_finished()} and set(RUN_STATUS) == set(TrialState)


def test_the_release_target_is_checked_at_the_door():
    assert ReleaseTarget.from_config(None).pinned() is None  # the folder default stays out of the contract
    with pytest.raises(UsageError, match="release.registry='s3'"):
        ReleaseTarget.from_config({"registry": "s3"})
    with pytest.raises(UsageError, match="release.alias='latest'"):
        ReleaseTarget.from_config({"registry": "mlflow", "alias": "latest"})
    with pytest.raises(UsageError, match="MLFLOW_TRACKING_URI"):
        ReleaseTarget.from_config({"registry": "mlflow"}).uri({})
    pinned = ReleaseTarget.from_config({"registry": "mlflow", "tracking_uri": "http://a:5000"})
    assert pinned.uri({}) == "http://a:5000"  # the config's, when nothing else is given
    assert pinned.uri({"MLFLOW_TRACKING_URI": "http://b"}) == "http://b"  # a server that moved: no new contract needed
    assert pinned.uri({"MLFLOW_TRACKING_URI": "http://b"}, "http://c") == "http://c"
    with pytest.raises(UsageError, match="release.model_name=None is not text"):
        ReleaseTarget.from_config({"registry": "mlflow", "model_name": None})
    with pytest.raises(UsageError, match="carries a password and the query parameter api_key") as refused:
        ReleaseTarget.from_config({"registry": "mlflow", "tracking_uri": "http://alice:s3cr3t@a:5000/?api_key=t0k3n"}).pinned()
    assert "s3cr3t" not in str(refused.value) and "t0k3n" not in str(refused.value) and "http://a:5000/?api_key=***" in str(refused.value)
    assert shown("https://bob@a/x?token=t0k3n&experiment=7") == "https://a/x?token=***&experiment=7" and shown("http://a:5000") == "http://a:5000"


def test_credentials_in_a_tracking_uri_never_reach_a_file_or_a_printed_line(story, tmp_path):
    """A password and a token given in a URI: refused at the launch (the contract is world-readable)
    in a line that does not repeat them; given to a command, used and never printed or written."""
    password, token = "s3cr3t-pw", "t0k3n-42"
    with_user = story["uri"].replace("http://", f"http://alice:{password}@")
    res = launch(
        [f"search.root={tmp_path / 'runs'}", "search.revision=creds", "release.registry=mlflow", f"release.tracking_uri='{with_user}/?token={token}'"],
        cwd=tmp_path,
        data_dir=story["data"],
    )
    assert res.returncode == 2 and "release.tracking_uri=" in res.stderr and "MLFLOW_TRACKING_PASSWORD" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()
    said = res.stdout + res.stderr
    before = tree(story["search"])
    exported = cli(story, "export", str(story["search"]), "--to", "mlflow", "--experiment", "mlf-credentials", uri=with_user)
    assert exported.returncode == 0 and f"to MLflow at {story['uri']}," in exported.stderr, exported.stderr
    tokened = cli(story, "export", str(story["search"]), "--to", "mlflow", "--experiment", "mlf-credentials", uri=f"{story['uri']}/?token={token}")
    said += exported.stdout + exported.stderr + tokened.stdout + tokened.stderr
    assert password not in said and token not in said, said
    assert tree(story["search"]) == before and not any(password.encode() in p.read_bytes() for p in story["search"].rglob("*") if p.is_file())


def test_a_trial_exported_while_it_ran_gets_only_what_is_new_once_it_ended(story, tmp_path):
    """A copy of the search (another search id) with one trial's ending not yet written."""
    copy = tmp_path / "copy"
    shutil.copytree(story["search"], copy, symlinks=True)
    identity = json.loads((copy / "identity.json").read_text())
    (copy / "identity.json").write_text(json.dumps({**identity, "search_id": identity["search_id"][:-4] + "beef"}))
    tid = "t0003"
    (worker,) = (copy / "trials" / tid).glob("journal-a1-*.jsonl")
    whole = worker.read_bytes()
    worker.write_bytes(b"".join(whole.splitlines(keepends=True)[:-1]))  # its ending not yet written: it runs
    first = cli(story, "export", str(copy), "--to", "mlflow", "--experiment", "mlf-running")
    assert first.returncode == 0 and "12 created, 0 updated, 0 unchanged" in first.stderr, first.stderr
    mlflow = client(story["uri"])
    experiment = mlflow.get_experiment_by_name("mlf-running")

    def runs():
        found = mlflow.search_runs([experiment.experiment_id], max_results=100)
        return {r.data.tags.get("parcel.trial_id", "parent"): r for r in found}

    running = runs()
    assert running[tid].info.status == "RUNNING" and running["parent"].info.status == "RUNNING"
    assert "final_val_miss_cost" not in running[tid].data.metrics
    steps = [m.step for m in mlflow.get_metric_history(running[tid].info.run_id, "val_miss_cost")]
    worker.write_bytes(whole)  # it ended
    then = cli(story, "export", str(copy), "--to", "mlflow", "--experiment", "mlf-running")
    assert then.returncode == 0 and "0 created, 1 updated, 11 unchanged" in then.stderr, then.stderr
    ended = runs()
    assert len(ended) == 13 and ended[tid].info.status == "FINISHED" and ended["parent"].info.status == "FINISHED"
    assert ended[tid].data.metrics["final_val_miss_cost"] > 0
    history = [m.step for m in mlflow.get_metric_history(ended[tid].info.run_id, "val_miss_cost")]
    assert history[: len(steps)] == steps and len(history) == len(set(history))  # nothing logged twice

"""A TPE search on the real dev SLURM cluster dispatched as jobs (``hydra.launcher.dispatch=jobs``):
each trial proposed by the launcher when one of the array slots frees, submitted as its own job,
every proposal replayed exactly afterwards. Slots, the default for a learning sampler, are
tests/slurm/test_slurm_slots.py."""

import json

import pytest

from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import sh, wait_for

pytestmark = pytest.mark.slurm


def test_tpe_search_on_slurm_proposes_into_free_slots_and_replays(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-tpe")
    res = launch(
        [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.dispatch=jobs",
            f"search.root={tmp_path / 'runs'}",
            "search.revision=tpe",
            "sampler=tpe",
            "sampler.n_startup_trials=3",
        ]
        + ["lr=tag(log,interval(0.003,0.3))", "search.n_trials=9", "hydra.launcher.array_parallelism=3", "resources.gpus=1"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "proposing up to 9 trials by tpe(" in res.stdout and "each when one of 3 slots frees (one job a trial)" in res.stdout, res.stdout
    search = SearchDir(tmp_path / "runs" / "tpe")
    records = {r.trial_id: r for r in search.records()}
    assert len(records) + len(search.launches()[-1]["duplicates"]) == 9  # duplicates are caught by config hash
    assert all(r.state.is_finished() and len(r.jobs) == 1 for r in records.values())
    assert len({r.jobs[0] for r in records.values()}) == len(records)  # one job a trial
    arrays = {r.jobs[0].split("_")[0] for r in records.values()}
    assert len(arrays) >= 3  # submitted as slots freed (the proposals of one round share an sbatch)
    # never more than the three slots unfinished at once: each proposal was told the others' states
    for k in search.proposal_numbers():
        told = json.loads(search.proposal_path(k).read_text())["told"]
        assert sum(t["told"] == "running" for t in told) <= 2
    out = parcel_hpc(["proposals", str(search.path), "--replay", "--json"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.json()["replayed"] == 9 and out.json()["first_difference"] is None
    # the jobs carry the search's own name, so sacct finds every one of them
    name = search.job_names(Executor("slurm"))[0]
    rows = wait_for(
        lambda: (lambda r: r if len(r.split()) == len(records) else None)(sh("sacct", "-n", "-X", "-P", "--name", name, "--format=JobID")), 60, "sacct rows"
    )
    assert {r.split("_")[0] for r in rows.split()} == arrays


def test_a_learning_sampler_dispatched_as_jobs_cannot_detach(tmp_path, data_dir):
    res = launch(
        [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.dispatch=jobs",
            f"search.root={tmp_path / 'runs'}",
            "search.revision=tpe-d",
            "sampler=tpe",
            "search.wait=false",
        ],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 2 and "sampler=tpe proposes each trial when a slot frees" in res.stderr, res.stderr
    assert "hydra.launcher.dispatch=slots" in res.stderr  # the fix: slots that propose themselves
    assert res.stderr.strip().count("\n") == 0 and not (tmp_path / "runs" / "tpe-d").exists()

"""parcel-hpc schedule-reconcile on the real cluster: the rendered reconcile.sbatch is accepted by
sbatch, runs `python -m parcel_hpc reconcile SEARCH_DIR --json` as a job, and its output file is the report."""

import json

import pytest

from parcel_hpc.ledger import SearchDir
from parcel_hpc.scheduler.slurm import scheduled as scheduled_reconcile
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import sh, wait_for

pytestmark = pytest.mark.slurm

REV = "sched-rec"
JOB_END_S = 180  # the job starts within seconds; the reconcile itself takes a few more


def test_scheduled_reconcile_job_writes_the_json_report(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append(f"parcel-reconcile-{REV}")
    # A small finished search on the local executor: the job only needs its directory (slurmd runs
    # jobs as the submitting user, so it can read tmp_path).
    res = launch([f"search.root={tmp_path / 'runs'}", f"search.revision={REV}", "search.n_trials=2"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    search = tmp_path / "runs" / REV
    name = scheduled_reconcile.job_name(REV, SearchDir(search).identity())
    assert name.startswith(f"parcel-reconcile-{REV}-") and len(name) == len(f"parcel-reconcile-{REV}-") + 12
    out = tmp_path / "acct"

    sub = parcel_hpc(["schedule-reconcile", str(search), "--output-dir", str(out), "--every-min", "0", "--time-limit-min", "5", "--mem", "500M"], timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert job_id.isdigit(), sub.stdout

    # every-min 0: one run and no successor, so the job's end is the end of the schedule
    wait_for(lambda: not sh("squeue", "--noheader", f"--jobs={job_id}", check=False).strip(), JOB_END_S, f"job {job_id} to end")
    report = out / f"{name}-{job_id}.json"
    errors = out / f"{name}-{job_id}.err"
    assert report.exists(), errors.read_text() if errors.exists() else f"no {report}"
    text = report.read_text()
    assert text.strip(), errors.read_text() if errors.exists() else "empty report"
    campaigns = json.loads(text)["campaigns"]
    assert [c["campaign"] for c in campaigns] == [REV]
    assert sh("squeue", "--noheader", f"--name={name}").strip() == ""  # no successor queued

"""Operating searches on the real dev cluster: the admin's account report (every job charged to an
account, those no search knows listed), ``status --watch`` following a detached search through
the queue, and the launch refused before dispatch by the account's association limits."""

import json
import time

import pytest
from browser import check_html_plots

from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import sh, wait_for

pytestmark = pytest.mark.slurm

SLURM = ["hydra/launcher=submitit_slurm", "pruner=none", "train.steps=10", "checkpoint.every_steps=5"]


def all_final(name: str) -> bool:
    rows = sh("sacct", f"--name={name}", "-X", "-n", "-P", "-o", "JobID,State,Partition", "--starttime=now-1hour").splitlines()
    return bool(rows) and all(r.split("|")[2] and r.split("|")[1] not in ("PENDING", "RUNNING", "REQUEUED") for r in rows)


def test_an_account_report_totals_every_users_jobs_and_lists_those_no_search_knows(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-acctday", "stray-"]
    res = launch([*SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=acctday", "search.n_trials=3"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    search = SearchDir(tmp_path / "runs" / "acctday")
    (name,) = search.job_names(Executor("slurm"))
    stray = sh(
        "sbatch", "--parsable", "-A", "parcel", "-J", f"stray-{int(time.time())}", "-o", "/dev/null", "--mem=50M", "-t", "1", "--wrap", "sleep 1"
    ).strip()
    wait_for(lambda: all_final(name) and "COMPLETED" in sh("sacct", "-j", stray, "-X", "-n", "-o", "State"), 90, "final accounting")
    since = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400))
    html = tmp_path / "account.html"
    argv = ["reconcile", "--account", "parcel", "--since", since, "--root", str(tmp_path / "runs"), "--json", "--html", str(html), "--wait", "60"]

    def reported():
        # `sacct -j` can show the stray job a moment before an account-wide query over the day does.
        out = parcel_hpc(argv)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        return report if stray in {c["job_id"] for c in report["unknown_jobs"]} else None

    report = wait_for(reported, 60, "the account report to list the stray job")
    assert report["complete"] and report["scope"].startswith("account parcel since ")
    unknown = {c["job_id"] for c in report["unknown_jobs"]}
    ours = {j for r in search.records() for j in r.jobs}
    assert stray in unknown and not (unknown & ours)  # every other job of the account, other tests' included, is unknown
    by_search = {t["key"]: t for t in report["by_search"]}
    single = json.loads(parcel_hpc(["reconcile", str(search.path), "--json"]).stdout)["campaigns"][0]
    assert by_search[str(search.path)]["gpu_hours"] == pytest.approx(single["figures"]["gpu_hours"])
    rows = sh("sacct", "-A", "parcel", "--allusers", "--duplicates", "-X", "-n", "-P", "-o", "AllocTRES,ElapsedRaw", f"--starttime={since}").splitlines()
    sacct_total = sum(_gpus(row.split("|")[0]) * int(row.split("|")[1]) / 3600 for row in rows)
    assert report["totals"]["gpu_hours"] == pytest.approx(sacct_total, rel=1e-6)  # the scheduler's hours, every run counted once
    assert {u["key"] for u in report["by_user"]} >= {"root"} and {p["key"] for p in report["by_partition"]} >= {"low"}
    check_html_plots(html, tmp_path, at_least=4, sections=('id="unknown"', 'id="by-user"'))


def _gpus(alloc: str) -> int:
    for item in alloc.split(","):
        if item.startswith("gres/gpu="):
            return int(item.split("=")[1])
    return 0


def test_watch_follows_a_detached_search_through_the_queue_to_its_end(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-watchq")
    res = launch(
        [*SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=watchq", "search.n_trials=4", "search.wait=false", "train.step_seconds=0.3"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    watched = parcel_hpc(["status", str(tmp_path / "runs" / "watchq"), "--watch", "--interval", "0.5"], timeout=600)
    assert watched.returncode == 0, watched.stdout[-2000:] + watched.stderr
    lines = watched.stdout.splitlines()
    assert any("(running)" in line for line in lines) or any("(pending" in line for line in lines)  # the queue's word, as it went
    assert lines[-1].split(" ", 1)[1].startswith("completed=4 (total 4)")
    listed = json.loads(parcel_hpc(["list", str(tmp_path / "runs"), "--json"]).stdout)["searches"][0]
    assert listed["launcher"] == "detached" and listed["counts"]["completed"] == 4


@pytest.fixture
def tight_account():
    """An account with a GPU-minute budget, root in it; removed afterwards."""
    sh("sacctmgr", "-i", "add", "account", "tight", "parent=parcel", check=False)
    sh("sacctmgr", "-i", "add", "user", "root", "account=tight", check=False)
    sh("sacctmgr", "-i", "modify", "account", "tight", "set", "GrpTRESMins=gres/gpu=60", "GrpTRESRunMins=gres/gpu=-1")
    wait_for(lambda: "tight" in sh("sshare", "-nP", "-a", "-A", "tight", "-o", "Account"), 30, "the controller to see the account")
    yield "tight"
    for job in sh("squeue", "-h", "-A", "tight", "-o", "%A", check=False).split():
        sh("scancel", job, check=False)
    wait_for(lambda: not sh("squeue", "-h", "-A", "tight", "-o", "%A", check=False).strip(), 60, "the account's jobs to end")
    sh("sacctmgr", "-i", "delete", "user", "root", "account=tight", check=False)
    sh("sacctmgr", "-i", "delete", "account", "tight", check=False)


def test_a_launch_the_accounts_limits_cannot_hold_is_refused_before_dispatch(tmp_path, data_dir, cluster_guard, tight_account):
    _, names = cluster_guard
    names += ["parcel-tight", "holder-"]
    root = tmp_path / "runs"
    # 8 trials x 2 attempts x 1 GPU x 5 min = 80 GPU-min worst case, over GrpTRESMins=gres/gpu=60.
    big = [*SLURM, f"search.root={root}", "search.revision=tight", "resources.account=tight", "resources.time_limit_min=5", "budget.max_retries=1"]
    dry = launch([*big, "search.n_trials=8", "search.dry_run=true"], cwd=tmp_path, data_dir=data_dir)
    assert dry.returncode == 3 and dry.stdout.splitlines()[0] == "hold:budget", dry.stdout + dry.stderr
    assert "account tight GrpTRESMins gres/gpu=60" in dry.stderr and "80" in dry.stderr
    held = launch([*big, "search.n_trials=8"], cwd=tmp_path, data_dir=data_dir)
    assert held.returncode == 3 and held.stdout.splitlines()[0] == "hold:budget", held.stdout + held.stderr
    search = SearchDir(root / "tight")
    assert not any(r.jobs for r in search.records())  # nothing dispatched
    assert not sh("squeue", "-h", "-A", "tight", "-o", "%A").strip()
    # 5 trials = 50 GPU-min fit the 60 alone; a job of the account holding 20 GPU-min while it runs leaves 40.
    holder = sh(
        "sbatch", "--parsable", "-A", "tight", "-J", "holder-x", "--gres=gpu:1", "-t", "20", "-o", "/dev/null", "--mem=50M", "--wrap", "sleep 600"
    ).strip()
    wait_for(lambda: "RUNNING" in sh("squeue", "-h", "-j", holder, "-o", "%T"), 60, "the holder job to run")
    busy = launch([*big, "search.revision=tight2", "search.n_trials=5"], cwd=tmp_path, data_dir=data_dir)
    assert busy.returncode == 3 and busy.stdout.splitlines()[0] == "hold:budget", busy.stdout + busy.stderr
    assert "held by running jobs" in busy.stderr
    sh("scancel", holder)
    wait_for(lambda: not sh("squeue", "-h", "-j", holder, "-o", "%T", check=False).strip(), 60, "the holder to end")
    ok = launch([*big, "search.revision=tight3", "search.n_trials=5", "search.dry_run=true"], cwd=tmp_path, data_dir=data_dir)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "account tight" in ok.stdout and "=> admit" in ok.stdout


def test_an_unknown_account_is_one_line_and_exit_2(tmp_path, data_dir):
    res = launch(
        [*SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=noacct", "search.n_trials=2", "resources.account=nosuchacct"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 2 and "no association for user root in account nosuchacct" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs" / "noacct").exists()  # refused before anything was written

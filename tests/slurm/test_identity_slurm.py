"""A queued array whose search is swapped before it starts (issue 43, part A), on the dev cluster.

A SLURM job resolves its paths when it starts, maybe days after it was queued. Here every node is
drained, root's detached search waits in the queue, and parcel-bob (a member of the team that may
write the 2775 root, accepted with search.allow_renames_in_root=true) exchanges the search with a
copy of his whose job pickles run a command when unpickled. When the nodes come back each job's
first code (worker.gate) refuses the directory in one line in the job's own error file and exits
2, before submitit unpickles anything: the member's command never runs, and the search itself
(under the copy's old name) has no attempt started in it."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from parcel_hpc.ledger import Executor, SearchDir, TrialState
from parcel_hpc.testing import launch
from parcel_hpc.testing.users import BOB, ensure_users, exchange_line, planted_pickle, run_as, team_dir

from .cluster import sh, wait_for

pytestmark = pytest.mark.slurm


def test_a_queued_array_whose_search_is_swapped_before_it_starts_runs_nothing_of_the_members(artifacts, cluster_guard):
    touched, names = cluster_guard
    names.append("parcel-swapped")
    ensure_users()
    top = Path(tempfile.mkdtemp(prefix="parcel-swap-slurm-", dir="/tmp"))
    os.chmod(top, 0o755)
    try:
        shutil.copytree(artifacts["dir"], top / "data")
        root = team_dir(top / "runs", mode=0o2775)
        marker = top / "member-code-ran"
        planted = top / "planted.pkl"
        planted.write_bytes(planted_pickle(f"touch {marker}"))
        os.chmod(planted, 0o644)
        nodes = sorted(set(sh("sinfo", "-h", "-N", "-o", "%N").split()))
        touched.extend(nodes)
        sh("scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", "reason=parcel-test")
        res = launch(
            ["hydra/launcher=submitit_slurm", f"search.root={root}", "search.revision=swapped", "search.n_trials=2", "hydra.launcher.pack_size=1"]
            + ["pruner=none", "train.steps=10", "search.wait=false", "search.allow_renames_in_root=true"],
            cwd=top,
            data_dir=top / "data",
        )
        assert res.returncode == 0, res.stdout + res.stderr
        search = SearchDir(root / "swapped")
        (name,) = search.job_names(Executor("slurm"))
        queued = lambda: sh("squeue", "-h", f"--name={name}", "--array", "-o", "%i").split()  # noqa: E731
        jobs = wait_for(lambda: len(queued()) == 2 and queued(), 60, "two queued jobs")

        theirs = Path(f"{search.path}.theirs")
        swap = (
            f"set -e; cp -r {search.path} {theirs}; find {theirs}/submitit -name '*_submitted.pkl' -exec cp {planted} {{}} ';'; "
            f"{exchange_line(search.path, theirs)}"
        )
        swapped = run_as(BOB, ["sh", "-c", swap], umask=0o002)
        assert swapped.returncode == 0, swapped.stderr
        assert os.stat(search.path).st_uid != 0 and len(list(Path(search.path).rglob("*_submitted.pkl"))) == 2

        sh("scontrol", "update", f"nodename={','.join(nodes)}", "state=resume")
        wait_for(lambda: not queued(), 180, "the queued jobs to start and end")

        # slurmdbd files a job's end a moment after squeue drops it (longer on a busy machine).
        def filed() -> list[str]:
            rows = sh("sacct", "-n", "-P", "-X", "-S", "now-1hour", f"--name={name}", "-o", "JobID,State,ExitCode").split()
            return rows if len(rows) == len(jobs) and not any(r.split("|")[1] in ("PENDING", "RUNNING") for r in rows) else []

        states = wait_for(filed, 60, "sacct to file both jobs' ends")
        assert sorted(states) == sorted(f"{job}|FAILED|2:0" for job in jobs), states
        for job in jobs:
            err = (search.path / "submitit" / "slurm" / job / f"{job}_0_log.err").read_text().strip().splitlines()
            # One line of ours (srun adds its own word on the exit code).
            assert f"{search.path} is not the search directory this process acts for: it is owned by {BOB} now" in err[0], err
            assert err[0].startswith("error: ") and all(line.startswith("srun: ") for line in err[1:]), err
        assert not marker.exists(), "the member's pickle was unpickled"
        # The search itself, under the copy's old name: queued as it was, no attempt started in it.
        assert {r.state for r in SearchDir(theirs).records()} == {TrialState.QUEUED}
        assert not any(r.attempts for r in SearchDir(theirs).records())
    finally:
        shutil.rmtree(top, ignore_errors=True)

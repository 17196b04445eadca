"""Smoke tests of the dev SLURM cluster that scripts/dev-cluster-up.sh starts.

Owns: checking that the running cluster has the shape the rest of the slurm-marked
suite relies on (nodes with gpu gres, the low/high partitions, GPU binding of a job,
gres/gpu in accounting). It must not start or stop the cluster: it runs against the
one named by SLURM_CONF (``source /tmp/parcel-slurm/env.sh``) and skips without it.

Expected shape = the script's defaults (NODES=3, GPUS_PER_NODE=4); a cluster started
with other knobs is expected to fail the node checks.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not os.environ.get("SLURM_CONF"),
        reason="SLURM_CONF is not set: start scripts/dev-cluster-up.sh and `source /tmp/parcel-slurm/env.sh`",
    ),
]

EXPECTED_NODES = ("n1", "n2", "n3")  # dev-cluster-up.sh default NODES=3
EXPECTED_GRES = "gpu:4"  # dev-cluster-up.sh default GPUS_PER_NODE=4
CMD_TIMEOUT_S = 30  # a healthy local slurmctld answers in well under a second


def _run(argv: list[str], timeout: float = CMD_TIMEOUT_S) -> str:
    """Run a Slurm client; a failure is a test failure that shows stderr."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}"
    return proc.stdout


# ---------------------------------------------------------------- pure parsers


def parse_sinfo_nodes(text: str) -> dict[str, tuple[str, str]]:
    """`sinfo -h -N -o %N|%T|%G` -> {node: (state, gres)}; a node appears once per partition."""
    nodes: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        if line.strip():
            name, state, gres = line.split("|")
            nodes[name] = (state, gres)
    return nodes


def parse_oneliner(text: str) -> list[dict[str, str]]:
    """`scontrol show <entity> -o` -> one dict per line of Key=Value fields."""
    records = []
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if fields:
            records.append(fields)
    return records


def parse_sacct(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """`sacct --parsable2 --noheader --format=<fields>` -> one dict per row."""
    return [dict(zip(fields, line.split("|"), strict=True)) for line in text.splitlines() if line]


def test_parsers_read_recorded_output() -> None:
    nodes = parse_sinfo_nodes("n1|idle|gpu:4\nn1|idle|gpu:4\nn2|mixed|gpu:4\n")
    assert nodes == {"n1": ("idle", "gpu:4"), "n2": ("mixed", "gpu:4")}
    (part,) = parse_oneliner("PartitionName=low Default=YES PriorityTier=1 JobDefaults=(null)\n")
    assert part["PartitionName"] == "low" and part["PriorityTier"] == "1"
    (row,) = parse_sacct("7|COMPLETED|billing=11,cpu=1,gres/gpu=1|low\n", ("JobIDRaw", "State", "AllocTRES", "Partition"))
    assert row["AllocTRES"].endswith("gres/gpu=1")


# ---------------------------------------------------------------- the cluster


def test_nodes_idle_with_gpus() -> None:
    # Nodes may still be completing a job of an earlier test: give them a few seconds.
    deadline = time.monotonic() + 15
    while True:
        nodes = parse_sinfo_nodes(_run(["sinfo", "-h", "-N", "-o", "%N|%T|%G"]))
        if all(state == "idle" for state, _ in nodes.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(nodes) == list(EXPECTED_NODES)
    assert {name: state for name, (state, _) in nodes.items()} == dict.fromkeys(EXPECTED_NODES, "idle")
    assert {name: gres for name, (_, gres) in nodes.items()} == dict.fromkeys(EXPECTED_NODES, EXPECTED_GRES)


def test_partitions_low_default_and_high_preempts() -> None:
    parts = {p["PartitionName"]: p for p in parse_oneliner(_run(["scontrol", "show", "partition", "-o"]))}
    assert set(parts) == {"low", "high"}
    assert parts["low"]["Default"] == "YES" and parts["high"]["Default"] == "NO"
    assert int(parts["high"]["PriorityTier"]) > int(parts["low"]["PriorityTier"])
    assert parts["low"]["PreemptMode"] == "REQUEUE"
    assert parts["low"]["GraceTime"] == "15"


def test_root_has_both_accounts_parcel_default() -> None:
    assoc = _run(["sacctmgr", "-n", "-P", "show", "assoc", "user=root", "format=account"]).split()
    assert {"parcel", "other"} <= set(assoc)
    assert _run(["sacctmgr", "-n", "-P", "show", "user", "root", "format=defaultaccount"]).strip() == "parcel"


@pytest.fixture(scope="module")
def gpu_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """One finished `--gres=gpu:1` batch job: (job id, its stdout)."""
    workdir = tmp_path_factory.mktemp("gpu_job")
    out = workdir / "out.txt"
    argv = [
        "sbatch", "--parsable", "--wait", "--job-name=parcel-smoke", "--gres=gpu:1",
        "--mem=100M", "--time=2", f"--chdir={workdir}", f"--output={out}",
        "--wrap", 'echo "CVD=${CUDA_VISIBLE_DEVICES-unset} PART=$SLURM_JOB_PARTITION"',
    ]  # fmt: skip
    job_id = _run(argv, timeout=120).strip().split(";")[0]
    return job_id, Path(out).read_text()


def test_gpu_job_gets_cuda_visible_devices(gpu_job: tuple[str, str]) -> None:
    _, stdout = gpu_job
    # The job's own line; slurmstepd may add a warning line of its own to the same output file.
    line = next((l for l in stdout.splitlines() if l.startswith("CVD=")), None)
    assert line is not None, f"the job printed no CVD= line: {stdout!r}"
    fields = dict(tok.split("=", 1) for tok in line.split())
    assert fields["PART"] == "low", "the default partition should be low"
    devices = fields["CVD"].split(",")
    assert len(devices) == 1 and devices[0].isdigit() and int(devices[0]) < 4, stdout


def test_sacct_records_gpu_in_alloc_tres(gpu_job: tuple[str, str]) -> None:
    job_id, _ = gpu_job
    fields = ("JobID", "JobIDRaw", "State", "AllocTRES", "Partition", "Account")
    argv = ["sacct", "-j", job_id, "--parsable2", "--noheader", f"--format={','.join(fields)}"]
    # Observed on this cluster: for 2-3 s after `sbatch --wait` returns, the row already
    # says COMPLETED but is a placeholder (JobName=allocation, empty Partition and
    # ReqTRES, QOS=Unknown) until slurmdbd applies the job-start record. Poll for both.
    deadline = time.monotonic() + 20
    while True:
        rows = {r["JobID"]: r for r in parse_sacct(_run(argv), fields)}
        row = rows.get(job_id, {})
        if (row.get("State") == "COMPLETED" and row.get("Partition")) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    alloc = rows[job_id]
    assert alloc["State"] == "COMPLETED"
    assert "gres/gpu=1" in alloc["AllocTRES"].split(",")
    assert (alloc["Partition"], alloc["Account"]) == ("low", "parcel")

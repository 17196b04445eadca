"""Record sacct's text for a preemption and requeue on the dev cluster in SLURM_CONF, as the SLURM
backend asks for it (``build_sacct_argv`` + ``run_sacct``), into tests/fixtures/sacct/.

    python -m tests.slurm.record_sacct            (run by scripts/newer-slurm.sh VERSION --record)

Three jobs: one preempted on n1 by a high-partition job, requeued and run again (its work is done
once: a marker file makes a later run exit at once, as a trial finished on its checkpoint does), the
preemptor, and one that exits 137 (what each version stores for a status above 128).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parcel_hpc.scheduler.slurm.sacct import build_sacct_argv, installed_version, run_sacct

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"


def _sbatch(*argv: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *argv], capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip().split(";")[0]


def _state(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.strip()


def _until(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            sys.exit(f"record_sacct: timed out after {timeout:g}s waiting for {what}")
        time.sleep(1)


def main() -> None:
    version = installed_version()
    with tempfile.TemporaryDirectory(prefix="record-sacct-") as tmp:
        done = Path(tmp) / "done"
        work = f"test -e {done} && exit 0; sleep 20; touch {done}"
        victim = _sbatch("-p", "low", "-w", "n1", "--gres=gpu:1", "--mem=100M", "--requeue", "-J", "rec-victim", "--wrap", work)
        _until("the victim to run", lambda: _state(victim) == "RUNNING", 60)
        time.sleep(3)
        preemptor = _sbatch("-p", "high", "-w", "n1", "--gres=gpu:4", "--mem=100M", "-t", "2", "-J", "rec-preemptor", "--wrap", "sleep 3")
        killed = _sbatch("-p", "low", "-w", "n2", "--mem=100M", "-J", "rec-exit137", "--wrap", "exit 137")
        # 24.11 files the run that finished as PREEMPTED and starts one more: wait for every run.
        _until("every run to end", lambda: not any(_state(j) for j in (victim, preemptor, killed)), 300)
        time.sleep(2)  # slurmdbd writes the last run's end a moment after squeue forgets the job
    text = run_sacct(build_sacct_argv([victim, preemptor, killed], version=version))
    out = FIXTURES / f"preempt_requeue_{version}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(text)
    print(f"record_sacct: {out} ({len(text.splitlines())} lines)")


if __name__ == "__main__":
    main()

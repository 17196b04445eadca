"""A fake SLURM that behaves like SLURM 22.05 (or prints 24.11's or 26.05's text: ``version=``) at the
process boundary, for the fast tier of tests.

``FakeSlurm.create(dir)`` writes a state directory with ``bin/sbatch``, ``squeue``, ``sacct``,
``scancel``, ``scontrol``, ``sinfo`` and ``srun`` wrappers and an ``etc/slurm.conf``; with its
``env()`` (PATH, SLURM_CONF) the real SLURM backend (``parcel_hpc.scheduler.slurm``) and submitit's
SlurmExecutor run unchanged against it, exactly as they run against the dev cluster. Submitted jobs
(arrays too, held and released, throttled by ``%N``) run as local process groups with the SLURM_*
environment a job sees; ``--time``, ``--signal``, ``scontrol requeue``, ``scancel``, a higher
partition's job preempting a lower one (PreemptMode=REQUEUE with GraceTime), a node set down
(NODE_FAIL, requeued) behave as on the dev cluster, and sacct prints a row per run and step in
its own format. In the spirit of submitit's ``MockedSubprocess``, but real processes: what this
cannot show is a real slurmctld's faults (daemons killed, slurmdbd restarted); those tests stay on
the dev cluster (tests/slurm/).

Modules: ``state`` (the records and the cluster's rules), ``controller`` (the one process that runs
jobs), ``tools`` (the commands' options and text). Stdlib only.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from parcel_hpc.testing.fakeslurm.state import Config, Job, Node, State, Store
from parcel_hpc.testing.fakeslurm.tools import TOOLS

__all__ = ["FakeSlurm", "Job", "State"]


@dataclasses.dataclass(frozen=True)
class FakeSlurm:
    root: Path

    @classmethod
    def create(cls, root: str | os.PathLike, *, nodes: int = 3, gpus: int = 4, **config: float | str) -> FakeSlurm:
        """A fresh fake cluster in ``root``: ``nodes`` nodes n1.. with ``gpus`` GPUs each, the dev
        cluster's partitions (low, high), and ``Config`` fields (``minute_s``, ``kill_wait_s``,
        ``version``...)."""
        fake = cls(Path(root).resolve())
        fake.store.create(Config(**config), [Node(f"n{i}", gpus) for i in range(1, nodes + 1)])  # type: ignore[arg-type]
        for tool in TOOLS:
            wrapper = fake.store.bin / tool
            wrapper.write_text(f'#!/bin/sh\nPARCEL_FAKE_SLURM={fake.root} exec {sys.executable} -m parcel_hpc.testing.fakeslurm {tool} "$@"\n')
            wrapper.chmod(0o755)
        (fake.root / "etc" / "slurm.conf").write_text(f"# a fake cluster: parcel_hpc.testing.fakeslurm in {fake.root}\nClusterName={Config().cluster}\n")
        (fake.root / "env.sh").write_text(f'export PATH="{fake.store.bin}:$PATH" SLURM_CONF="{fake.root}/etc/slurm.conf"\n')
        return fake

    @property
    def store(self) -> Store:
        return Store(self.root)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (this process's environment) with the fake's tools first on PATH and its SLURM_CONF."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.store.bin}{os.pathsep}{env.get('PATH', '')}"
        env["SLURM_CONF"] = str(self.root / "etc" / "slurm.conf")
        return env

    def set_down(self, what: str, down: bool = True) -> None:
        """``controller`` stops answering (every tool fails as with slurmctld down), ``dbd`` makes
        sacct fail as with slurmdbd down."""
        flag = self.root / {"controller": "down", "dbd": "dbd-down"}[what]
        if down:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no job is pending or running (raises TimeoutError naming what is left)."""
        deadline = time.monotonic() + timeout
        while self.store.active():
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake SLURM jobs still active: {[(j.job_id, j.state) for j in self.store.active()]}")
            time.sleep(0.1)

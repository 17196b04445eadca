"""What one launch did: proposed, deduplicated, admitted, refused, dispatched; written as its launch record."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from parcel_hpc.ownership import current_user


@dataclass
class LaunchReport:
    search_dir: Path
    launch_id: str
    contract_digest: str
    proposed: int = 0
    duplicates: dict[str, str] = field(default_factory=dict)  # trial_id -> twin
    finished_before: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    dispatched: list[str] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    launcher: dict = field(default_factory=dict)
    packing: dict = field(default_factory=dict)  # the pack size and why
    follows: bool = True  # it follows its trials to the end (search.wait); False: detached
    stopped: str = ""  # the outcome that stopped its dispatching (a drift rejection, hold:systematic-failure)
    scheduler_calls: dict[str, int] = field(default_factory=dict)  # squeue, sbatch, sacct ... this launch ran, by command
    user: str = field(default_factory=current_user)  # the uid, never $LOGNAME: anyone sets that
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        return {
            "launcher": self.launcher,
            "launch_id": self.launch_id,
            "contract_digest": self.contract_digest,
            "proposed": self.proposed,
            "duplicates": self.duplicates,
            "finished_before": self.finished_before,
            "rejected": self.rejected,
            "dispatched": self.dispatched,
            "jobs": self.jobs,
            "dry_run": self.dry_run,
            "packing": self.packing,
            "follows": self.follows,
            "stopped": self.stopped,
            "scheduler_calls": self.scheduler_calls,
            "user": self.user,
            "host": self.host,
            "pid": self.pid,
            "at": self.at,
        }

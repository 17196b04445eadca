"""Per-writer, append-only event journals inside a trial's directory.

Each process that records something about a trial (the launcher that submitted it, each worker
attempt, an admin command) appends to its own ``journal-<writer>.jsonl``: one writer per file keeps
appends safe on NFS, where O_APPEND from two clients is not atomic. Readers merge every journal of
the trial and order events by (time, writer, sequence).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import fsio


def writer_name(role: str) -> str:
    host = socket.gethostname().split(".")[0]
    return f"{role}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class Journal:
    """Appends events for one trial from one writer."""

    trial_dir: Path
    writer: str
    clock: Callable[[], float] = time.time
    _seq: int = field(default=0, init=False)

    @property
    def path(self) -> Path:
        return self.trial_dir / f"journal-{self.writer}.jsonl"

    def append(self, kind: str, **fields: Any) -> dict:
        self._seq += 1
        event = {"kind": kind, "t": round(self.clock(), 6), "writer": self.writer, "seq": self._seq, **fields}
        fsio.append_jsonl(self.path, event)
        return event


def read_events(trial_dir: Path) -> list[dict]:
    events: list[dict] = []
    for path in sorted(Path(trial_dir).glob("journal-*.jsonl")):
        events.extend(fsio.read_jsonl(path))
    events.sort(key=lambda e: (e.get("t", 0.0), e.get("writer", ""), e.get("seq", 0)))
    return events

"""Every ``parcel-hpc`` subcommand, one module each, in one registry (``COMMANDS``).

A command module has a docstring, ``READ_ONLY`` (True: it never writes under a search, so admins
can run it on searches they cannot write to; ``tests/test_read_commands.py`` runs every such command
on a read-only mount), ``add_arguments(parser)`` and ``run(args) -> int`` (the exit code).

Adding a command: write ``commands/<name>.py`` with those four, add a line below, and the parser,
``parcel-hpc --help`` and docs/commands.md (``scripts/commands_doc.py``) pick it up.

``cli.py`` imports only the module of the command it runs: the modules pull in h5py, pyarrow,
matplotlib and submitit, and ``parcel-hpc status`` should not pay for all of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Command:
    name: str  # as typed: ``parcel-hpc <name>``
    help: str  # one line for ``parcel-hpc --help``

    @property
    def module_name(self) -> str:
        return f"parcel_hpc.commands.{self.name.replace('-', '_')}"

    def load(self) -> ModuleType:
        return importlib.import_module(self.module_name)


COMMANDS: tuple[Command, ...] = (
    Command("make-snapshot", "write the synthetic parcel snapshot and its splits"),
    Command("check-trainer", "check a trainer against the interface a search relies on (resume, determinism, serving parity)"),
    Command("status", "counts by state and a per-trial table"),
    Command("logs", "why a trial's attempt ended: the scheduler's state and node, its traceback and the output files"),
    Command("list", "every search under a root: counts by state, spend against caps, launcher, last activity"),
    Command("report", "how a search went, as one HTML page: history, milestone curves, parameters, importance, failures, waits"),
    Command("export", "the trials as a table for pandas (one row per trial, or --attempts), or to MLflow runs or an Optuna journal (--to)"),
    Command("proposals", "how each trial was proposed, and with --replay whether every proposal re-derives exactly"),
    Command(
        "sync",
        "record how attempts whose runs ended unannounced ended and the hours of every run sacct filed, and settle their holds (a search whose launcher has gone)",
    ),
    Command("resubmit", "rerun trials whose jobs ended without a result for infrastructure reasons"),
    Command("cancel", "stop the search (or --trial ones) for good: never retried or resubmitted; budget holds settled"),
    Command("reconcile", "reconcile sacct accounting with the ledger and the budget (for admins)"),
    Command("schedule-reconcile", "submit a Slurm job that runs `reconcile --json` on a schedule (for admins)"),
    Command("select", "freeze the completed list, rerun the winner, retrain the baseline, and judge parity, performance and slices on validation"),
    Command("decide", "record a documented decision that lifts hold:performance, hold:slice-quality or hold:final-performance for the selected trial"),
    Command("evaluate-final", "evaluate the selected artifact and the baseline once on the protected final partition"),
    Command("release", "write the release packet (JSON, Markdown, HTML) and register the artifact when every check passed or was decided"),
    Command("selection-job", "(run by select and evaluate-final as a scheduler job) the model work of a selection"),
)
BY_NAME = {c.name: c for c in COMMANDS}

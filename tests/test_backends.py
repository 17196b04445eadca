"""A scheduler backend is one package: only ``scheduler/<backend>/`` and the registry name one
(docs/architecture.md, "Adding a backend"). Every other module asks the registry's backend of a
trial's executor, so adding a backend touches none of them."""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path

import pytest

import parcel_hpc
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import Executor
from parcel_hpc.scheduler.base import Backend, ReconcileSchedule
from parcel_hpc.scheduler.registry import BACKENDS, DEFAULT, backend_of

PACKAGE = Path(parcel_hpc.__file__).resolve().parent
BACKEND_PACKAGES = tuple(f"parcel_hpc.scheduler.{p.name}" for p in (PACKAGE / "scheduler").iterdir() if (p / "__init__.py").exists())
REGISTRY = "parcel_hpc.scheduler.registry"


def names_a_backend(source: str) -> set[str]:
    """What ``source`` names of a backend: a backend module it imports (anywhere, typing too) and
    each executor name it spells out (``Executor("slurm")``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Executor"
            and any(isinstance(a, ast.Constant) for a in node.args)
        ):
            found.add(f"Executor({', '.join(repr(a.value) for a in node.args if isinstance(a, ast.Constant))})")
            continue
        else:
            continue
        found.update(m for m in modules if any(m == p or m.startswith(p + ".") for p in BACKEND_PACKAGES))
    return found


def _module(path: Path) -> str:
    parts = ["parcel_hpc", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def naming_modules() -> dict[str, set[str]]:
    """Every module outside the backend packages and the registry that names a backend, and what."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module(path)
        if module == REGISTRY or any(module == p or module.startswith(p + ".") for p in BACKEND_PACKAGES):
            continue
        if named := names_a_backend(path.read_text()):
            out[module] = named
    return out


def test_only_a_backend_package_and_the_registry_name_a_backend():
    assert naming_modules() == {}


def test_the_check_sees_an_import_a_typing_import_and_an_executor_member():
    assert names_a_backend("from parcel_hpc.scheduler.slurm import queue") == {"parcel_hpc.scheduler.slurm", "parcel_hpc.scheduler.slurm.queue"}
    assert names_a_backend("if TYPE_CHECKING:\n    import parcel_hpc.scheduler.local.runs") == {"parcel_hpc.scheduler.local.runs"}
    assert names_a_backend('x = r.executor == Executor("slurm")') == {"Executor('slurm')"}
    assert names_a_backend("from parcel_hpc.scheduler.registry import backend_of\nx = backend_of(r.executor).files_runs") == set()


def test_the_registry_holds_one_backend_per_executor():
    assert len({b.executor for b in BACKENDS}) == len(BACKENDS) and all(isinstance(b.executor, Executor) for b in BACKENDS)
    assert all(isinstance(b, Backend) and backend_of(b.executor) is b for b in BACKENDS)
    assert len({b.launcher_name for b in BACKENDS}) == len(BACKENDS)
    assert all(b.launcher().kind == b.executor for b in BACKENDS)  # a launcher's kind is its backend's executor


def test_an_executor_no_backend_declares_is_one_line():
    with pytest.raises(UsageError, match="jobs recorded as run on pbs have no backend in this parcel_hpc"):
        backend_of(Executor("pbs"))
    with pytest.raises(ValueError, match="is not a backend's name"):
        Executor("SLURM; rm")
    assert backend_of(None) is DEFAULT and not DEFAULT.files_runs  # a trial never submitted reads as the embedded default's


def test_a_job_environment_is_the_first_backend_that_recognises_it():
    slurm_env = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2", "SLURM_RESTART_COUNT": "1", "SLURM_GPUS_ON_NODE": "2"}
    started = next(s for b in BACKENDS if (s := b.started(slurm_env, "h", 1, None)) is not None)
    assert (started.executor, started.job_id, started.raw_job_id, started.restart_count, started.gpus) == ("slurm", "10_2", "12", 1, 2)
    local = next(s for b in BACKENDS if (s := b.started({"SUBMITIT_LOCAL_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "0,1"}, "h", 1, None)) is not None)
    assert (local.executor, local.job_id, local.gpus, local.restart_count) == ("local", "77", 2, 0)


def test_a_backend_that_files_no_runs_answers_the_admins_reads_from_nothing(tmp_path):
    local = DEFAULT
    assert not local.queues_jobs and local.dump_runs(tmp_path / "dump.txt") is None and local.known_accounts() == []
    assert local.account_runs("acct", dt.datetime(2026, 1, 1, tzinfo=dt.UTC)).num_rows == 0
    with pytest.raises(UsageError, match="schedule-reconcile needs a scheduler that queues jobs"):
        local.schedule_reconcile(ReconcileSchedule(tmp_path, tmp_path, 0, "", "", "", 5, "1G"), dry_run=True)


def test_a_dump_that_cannot_be_read_is_one_line_naming_how_to_export_it(tmp_path):
    slurm = next(b for b in BACKENDS if b.files_runs)
    with pytest.raises(UsageError, match=r"cannot read --sacct-file .*missing\.txt.*export it with `sacct --parsable2"):
        slurm.dump_runs(tmp_path / "missing.txt")

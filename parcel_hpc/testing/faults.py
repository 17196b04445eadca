"""Fault injection for tests, through the worker's step hook (never a branch in the training loop).

Run a search with ``PARCEL_HPC_STEP_HOOK=parcel_hpc.testing.faults:inject`` in its environment, the
trainer that declares a ``fault`` parameter (``TRAINER``) and that parameter in its space
(``+space.params.fault={type:choice,values:[raise]}``): at step 5 a trial with ``fault=raise``
raises, one with ``fault=nan`` diverges.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parcel_hpc.checkpoints.writer import THREAD_NAME
from parcel_hpc.trainer import Diverged
from parcel_hpc.worker.training import STEP_HOOK_ENV

HOOK = "parcel_hpc.testing.faults:inject"
TRAINER = "trainer.target=parcel_hpc.testing.trainers:TakesFault"  # the built-in model, with a fault parameter
FAULT_STEP = 5


def inject(params: Mapping[str, Any], step: int) -> None:
    fault = str(params.get("fault", "none"))
    if step != FAULT_STEP:
        return
    if fault == "raise":
        raise RuntimeError("injected fault: params.fault=raise")
    if fault == "nan":
        raise Diverged("injected fault: params.fault=nan")


INTERRUPT_HOOK = "parcel_hpc.testing.faults:interrupt_once"
INTERRUPT_STEP_ENV = "PARCEL_TEST_INTERRUPT_STEP"
MARKERS_ENV = "PARCEL_TEST_MARKERS"  # a directory: one marker per trial already interrupted


def interrupt_once(params: Mapping[str, Any], step: int) -> None:
    """SIGUSR2, SLURM's checkpoint signal, at step ``$PARCEL_TEST_INTERRUPT_STEP`` of each trial's
    first attempt only (a marker file per trial), so the requeued attempt resumes undisturbed."""
    if step != int(os.environ[INTERRUPT_STEP_ENV]):
        return
    marker = Path(os.environ[MARKERS_ENV]) / hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:16]
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGUSR2)


SAVING_HOOK = "parcel_hpc.testing.faults:interrupt_once_while_saving"


def interrupt_once_while_saving(params: Mapping[str, Any], step: int) -> None:
    """``interrupt_once``, its marker saying whether a checkpoint was being written when the signal
    was sent ("writing" or "idle"): a test of a signal that arrives during a background save."""
    if step != int(os.environ[INTERRUPT_STEP_ENV]):
        return
    writing = any(t.name.startswith(THREAD_NAME) and t.is_alive() for t in threading.enumerate())
    marker = Path(os.environ[MARKERS_ENV]) / hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:16]
    try:
        with open(marker, "x") as fh:
            fh.write("writing" if writing else "idle")
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGUSR2)


RANK_HOOK = "parcel_hpc.testing.faults:rank_fault"
RANK_FAULT_ENV = "PARCEL_TEST_RANK_FAULT"  # "<rank>:<step>:<raise|signal|hang|stall|exit|final>", once a search (``MARKERS_ENV``)
FINAL_PATH_ENV = "PARCEL_TEST_FINAL_PATH"  # the final partition's record, for ``final``


def rank_fault_env(markers: Path, fault: str) -> dict[str, str]:
    """A launch's environment for ``rank_fault``: ``fault`` is ``"<rank>:<step>:<kind>"``, once a search
    (``markers``, made here, holds what already happened)."""
    markers.mkdir(parents=True, exist_ok=True)
    return {STEP_HOOK_ENV: RANK_HOOK, RANK_FAULT_ENV: fault, MARKERS_ENV: str(markers)}


def rank_fault(params: Mapping[str, Any], step: int) -> None:
    """A fault on one rank of a gang (its ``RANK``) at one step of the first attempt that reaches it:
    ``raise`` an exception, send itself the scheduler's ``signal``, ``hang`` (sleep for an hour), ``stall``
    (its next step's loss never returns: the all-reduce rank 0 then waits in is never joined),
    ``exit`` at once as a killed process would (its node gone), or read the ``final`` partition's
    record (``$PARCEL_TEST_FINAL_PATH``), swallowing the refusal."""
    rank, at, kind = os.environ[RANK_FAULT_ENV].split(":")
    if int(os.environ.get("RANK", "0")) != int(rank) or step != int(at):
        return
    try:
        (Path(os.environ[MARKERS_ENV]) / f"rank-{rank}-{kind}").touch(exist_ok=False)
    except FileExistsError:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if kind == "signal":
        os.kill(os.getpid(), signal.SIGUSR2)
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "stall":
        import torch.nn.functional  # the examples' loops compute their loss with it, before the gradients' all-reduce

        def never(*_: object, **__: object) -> Any:
            time.sleep(3600)

        torch.nn.functional.binary_cross_entropy_with_logits = never
    elif kind == "exit":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "final":
        try:
            Path(os.environ[FINAL_PATH_ENV]).read_bytes()
        except PermissionError:
            pass  # the fence refused it; the attempt is rejected all the same

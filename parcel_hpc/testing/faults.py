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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parcel_hpc.trainer import Diverged

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

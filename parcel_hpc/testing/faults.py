"""Fault injection for tests, through the worker's step hook (never a branch in the training loop).

Run a search with ``PARCEL_HPC_STEP_HOOK=parcel_hpc.testing.faults:inject`` in its environment and a
``fault`` parameter in its space (``+space.params.fault={type:choice,values:[raise]}``): at step 5 a
trial with ``fault=raise`` raises, one with ``fault=nan`` diverges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..trainer import Diverged

HOOK = "parcel_hpc.testing.faults:inject"
FAULT_STEP = 5


def inject(params: Mapping[str, Any], step: int) -> None:
    fault = str(params.get("fault", "none"))
    if step != FAULT_STEP:
        return
    if fault == "raise":
        raise RuntimeError("injected fault: params.fault=raise")
    if fault == "nan":
        raise Diverged("injected fault: params.fault=nan")

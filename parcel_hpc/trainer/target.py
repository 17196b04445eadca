"""Which trainer a search runs: ``trainer.target=PACKAGE.MODULE:NAME``, resolved and pinned.

Owns importing the target (one line naming the problem and the fix when it fails) and the trainer
identity pinned in the contract: the target, its step unit and a digest of its source (every ``.py``
file of the package that holds it, or the module file alone; an installed package's version changes
its files too). A worker recomputes the identity from the code it imported; other code is
``reject:trainer``. Must not: build or run a trainer.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from parcel_hpc.errors import UsageError
from parcel_hpc.trainer.base import REQUIRED_METHODS, Trainer

_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
BUILTIN = "parcel_hpc.trainer.numpy_mlp:NumpyMLP"


def trainer_class(target: object) -> type[Trainer]:
    """The class ``target`` names, checked to be a trainer; ``UsageError`` (exit 2) otherwise."""
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise UsageError(f"trainer.target={target!r} is not PACKAGE.MODULE:NAME; e.g. trainer.target={BUILTIN}")
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error while importing user code is the same bad input
        raise UsageError(
            f"trainer.target={target}: module {module_name} does not import ({type(exc).__name__}: {_first_line(exc)}); "
            "make it importable where the launch and its workers run (pip install -e, or PYTHONPATH)"
        ) from None
    cls = getattr(module, name, None)
    if cls is None:
        raise UsageError(f"trainer.target={target}: module {module_name} has no {name}; name a class defined in it")
    if not inspect.isclass(cls):
        raise UsageError(f"trainer.target={target} is a {type(cls).__name__}, not a trainer class; name a subclass of parcel_hpc.trainer.Trainer")
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None)) or m in getattr(cls, "__abstractmethods__", ())]
    if missing:
        raise UsageError(f"trainer.target={target}: {name} lacks {', '.join(missing)}; implement every method of parcel_hpc.trainer.Trainer")
    return cast(type[Trainer], cls)  # a class with every Trainer method (checked above)


def trainer_identity(target: str) -> dict[str, Any]:
    """What the contract pins about the trainer (JSON): target, unit, source digest."""
    cls = trainer_class(target)
    return {"target": target, "unit": str(getattr(cls, "unit", "step")), "source_digest": _source_digest(inspect.getmodule(cls))}


def make_trainer(identity: Mapping[str, Any]) -> Trainer:
    return trainer_class(identity["target"])()


def _source_digest(module: Any) -> str:
    """sha256 over the relative path and bytes of every .py file of the module's package (or the module)."""
    path = Path(inspect.getfile(module)).resolve()
    files = sorted(path.parent.rglob("*.py")) if module.__package__ else [path]  # a top-level module: itself alone
    root = path.parent
    h = hashlib.sha256()
    for file in files:
        if "__pycache__" not in file.parts:
            h.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

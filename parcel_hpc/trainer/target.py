"""Which trainer a search runs: ``trainer.target=PACKAGE.MODULE:NAME``, resolved and pinned.

Owns importing the target (one line naming the problem and the fix when it fails) and the trainer
identity pinned in the contract: the target, its step unit, the digest of its code (``code.py``
copies that code into the search), its declared parameters (``params.py``) and the distributions it
imports. A worker recomputes the identity from the copy it imported; other code is
``reject:trainer``. Must not: build or run a trainer.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from parcel_hpc.errors import UsageError
from parcel_hpc.trainer import code as _code
from parcel_hpc.trainer import params as _params
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
        raise UsageError(
            f"trainer.target={target} is a {type(cls).__name__}, not a trainer; decorate your train(run) with "
            "@parcel_hpc.trainer.loop(parameters=..., load=...), or name a subclass of parcel_hpc.trainer.Trainer"
        )
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None)) or m in getattr(cls, "__abstractmethods__", ())]
    if missing:
        raise UsageError(f"trainer.target={target}: {name} lacks {', '.join(missing)}; implement every method of parcel_hpc.trainer.Trainer")
    return cast(type[Trainer], cls)  # a class with every Trainer method (checked above)


def trainer_identity(target: str, code: Sequence[str] = ()) -> dict[str, Any]:
    """What the contract pins about the trainer (JSON), from the code as it is where the launch runs:
    target, unit, the digest of its code (``code.py``), the packages copied with it, its declared
    parameters and the third-party distributions its code imports, with their versions."""
    cls = trainer_class(target)
    module = inspect.getmodule(cls)
    _code.importable(code)
    roots = _code.code_roots(target, code)
    return {
        "target": target,
        "unit": str(getattr(cls, "unit", "step")),
        "source_digest": _code.source_digest(roots) if roots else _code.module_digest(module),
        "code": [r.module for r in roots],
        "parameters": _params.signature(_params.declared(cls, target)),
        "distributions": _code.distributions(roots, module),
    }


def load_trainer_class(identity: Mapping[str, Any], search_dir: str | os.PathLike) -> type[Trainer]:
    """The class the contract pins, imported from the search's copy of its code."""
    _code.import_from_copy(search_dir, identity)
    return trainer_class(identity["target"])


def observed_identity(identity: Mapping[str, Any], search_dir: str | os.PathLike) -> dict[str, Any]:
    """What a worker finds, computed from the copy it imports and the distributions installed where it
    runs (never the recorded values): equal to ``identity`` or the attempt is ``reject:trainer``."""
    cls = load_trainer_class(identity, search_dir)
    copied = bool(identity.get("code"))
    found = {
        "target": identity["target"],
        "unit": str(getattr(cls, "unit", "step")),
        "source_digest": _code.copy_digest(search_dir, identity) if copied else _code.module_digest(inspect.getmodule(cls)),
        "code": list(identity.get("code", [])),
        "parameters": _params.signature(getattr(cls, "parameters", None) or {}),
        "distributions": {d: _code.installed_version(d) for d in identity.get("distributions", {})},
    }
    return {k: found[k] for k in identity if k in found}  # a trainer pinned before code copies pins fewer keys


def make_trainer(identity: Mapping[str, Any], search_dir: str | os.PathLike) -> Trainer:
    return load_trainer_class(identity, search_dir)()


def build_params(trainer: Trainer, trial_params: Mapping[str, Any]) -> dict[str, Any]:
    """What ``build`` is given: the trainer's declared defaults under the trial's own values."""
    return _params.with_defaults(getattr(type(trainer), "parameters", None) or {}, trial_params)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

"""The parameters a trainer takes, as it declares them, and the checks a launch makes against them.

A trainer names every parameter it reads in ``Trainer.parameters`` (its kind and, when it has one,
its default). The launch checks the search space and the baseline's parameters against that list
before anything is frozen: a parameter the trainer does not take would be searched over and do
nothing; one it needs and nobody gives fails every trial. ``build`` is given the declared defaults
under the trial's own values, so a default is one line in one place. Pure: nothing here imports or
builds a trainer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parcel_hpc.errors import UsageError

if TYPE_CHECKING:
    from parcel_hpc.trainer.base import Trainer


class Kind(str, enum.Enum):
    FLOAT = "float"
    INT = "int"
    BOOL = "bool"
    STR = "str"

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is one of this kind (an int is a float; a bool is neither number)."""
        if self is Kind.BOOL:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if self is Kind.INT:
            return isinstance(value, int)
        if self is Kind.FLOAT:
            return isinstance(value, (int, float))
        return isinstance(value, str)


_KINDS = {float: Kind.FLOAT, int: Kind.INT, bool: Kind.BOOL, str: Kind.STR}
_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One declared parameter: ``Param(float)``, ``Param(int, default=64)``, ``Param(str, default="adam")``."""

    kind: Kind
    default: Any = _REQUIRED

    def __init__(self, kind: type | Kind | str, default: Any = _REQUIRED) -> None:
        resolved = _KINDS.get(kind) if isinstance(kind, type) else Kind(kind)
        if resolved is None:
            raise TypeError(f"Param kind {kind!r} is not float, int, bool or str")
        object.__setattr__(self, "kind", resolved)
        object.__setattr__(self, "default", default)
        if self.has_default and not resolved.accepts(default):
            raise TypeError(f"Param({resolved.value}) has default {default!r}, which is not a {resolved.value}")

    @property
    def has_default(self) -> bool:
        return self.default is not _REQUIRED

    def describe(self) -> str:
        return f"{self.kind.value}={self.default!r}" if self.has_default else f"{self.kind.value}, required"


def declared(cls: type[Trainer], target: str) -> Mapping[str, Param]:
    """What ``cls`` declares it takes; ``UsageError`` when it declares nothing usable."""
    parameters = getattr(cls, "parameters", None)
    example = 'parameters = {"lr": Param(float), "batch_size": Param(int, default=64)}'
    if not isinstance(parameters, Mapping) or not parameters:
        raise UsageError(
            f"trainer.target={target}: {cls.__name__} declares no parameters; list every parameter build() reads, "
            f"e.g. {example} (from parcel_hpc.trainer import Param)"
        )
    for name, param in parameters.items():
        if not isinstance(name, str) or not isinstance(param, Param):
            raise UsageError(f"trainer.target={target}: {cls.__name__}.parameters[{name!r}] is not a Param; declare it as {example}")
    return parameters


def signature(parameters: Mapping[str, Param]) -> dict[str, str]:
    """The declaration as JSON (pinned with the trainer's identity)."""
    return {name: parameters[name].describe() for name in sorted(parameters)}


def space_values(spec: Mapping[str, Any]) -> list[Any]:
    """The values of a normalized space entry a kind check must accept (a choice's values, a range's ends)."""
    if spec["type"] == "choice":
        return list(spec["values"])
    return [spec["low"], spec["high"]] if spec["type"] == "int" else [float(spec["low"]), float(spec["high"])]


def check_space(parameters: Mapping[str, Param], space: Mapping[str, Mapping[str, Any]], trainer: str) -> None:
    """The normalized space against the declaration: every name taken, every value of its kind, nothing
    required left out. ``trainer``: how to name the trainer in the one line."""
    for name in sorted(space):
        if name not in parameters:
            raise UsageError(
                f"the space searches {name}, which {trainer} does not take (it takes {_names(parameters)}); "
                f"remove {name} from the space, or declare it in the trainer's parameters and read it in build()"
            )
        kind = parameters[name].kind
        wrong = [v for v in space_values(space[name]) if not kind.accepts(v)]
        if wrong:
            raise UsageError(f"the space gives {name}={wrong[0]!r}, but {trainer} takes {name} as a {kind.value}; search it over {kind.value} values")
    missing = [n for n in sorted(parameters) if not parameters[n].has_default and n not in space]
    if missing:
        raise UsageError(
            f"the space leaves out {', '.join(missing)}, which {trainer} needs (no default); "
            f"add {missing[0]} to the space (e.g. {missing[0]}='choice(...)' or a space group entry) or give it a default in the trainer's parameters"
        )


def check_params(parameters: Mapping[str, Param], params: Mapping[str, Any], trainer: str, where: str) -> None:
    """Fixed parameters (a baseline's) against the declaration. ``where``: the config key that gives them."""
    for name in sorted(params):
        if name not in parameters:
            raise UsageError(f"{where} names {name}, which {trainer} does not take (it takes {_names(parameters)}); remove {name} from {where}")
        kind = parameters[name].kind
        if not kind.accepts(params[name]):
            raise UsageError(f"{where}.{name}={params[name]!r}, but {trainer} takes {name} as a {kind.value}")
    missing = [n for n in sorted(parameters) if not parameters[n].has_default and n not in params]
    if missing:
        raise UsageError(f"{where} leaves out {', '.join(missing)}, which {trainer} needs (no default); add {where}.{missing[0]}=VALUE")


def with_defaults(parameters: Mapping[str, Param], params: Mapping[str, Any]) -> dict[str, Any]:
    """What ``build`` is given: the declared defaults, under the given values."""
    out = {name: p.default for name, p in parameters.items() if p.has_default}
    out.update(params)
    return out


def _names(parameters: Mapping[str, Param]) -> str:
    return ", ".join(sorted(parameters))

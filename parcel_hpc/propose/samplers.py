"""Which sampler proposes a search's trials, with every option spelled out (pure but for imports).

``sampler=random`` (the default) and ``sampler=qmc`` draw trial i from (search seed, i) alone, so a
launch proposes all its trials at once. ``tpe`` (the model-based default), ``gp`` and ``cmaes``
learn from results: a trial is proposed when a slot frees (``propose.learning``). The contract pins
the name, every option offered here (defaults filled in, so a library whose defaults change
cannot change a search; the few not offered stay the library's, pinned by its version) and the
revision of the code that draws (Optuna's or SciPy's version).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from parcel_hpc.errors import UsageError

RANDOM_REVISION = "parcel_hpc random/1"


class SamplerName(str, Enum):
    RANDOM = "random"
    QMC = "qmc"
    TPE = "tpe"
    GP = "gp"
    CMAES = "cmaes"

    @property
    def learns(self) -> bool:
        """Whether its proposals depend on results (so each waits for a free slot, not for a batch)."""
        return self in (SamplerName.TPE, SamplerName.GP, SamplerName.CMAES)


# Every option offered, with its default. Optuna 5 changed TPE's multivariate and constant_liar
# defaults; here they are fixed, and pinned with the rest.
OPTIONS: dict[SamplerName, dict[str, Any]] = {
    SamplerName.RANDOM: {},
    SamplerName.QMC: {"qmc_type": "sobol", "scramble": True},
    SamplerName.TPE: {"n_startup_trials": 10, "n_ei_candidates": 24, "multivariate": True, "group": False, "constant_liar": True},
    SamplerName.GP: {"n_startup_trials": 10, "deterministic_objective": False},
    SamplerName.CMAES: {
        "n_startup_trials": 1,
        "sigma0": None,
        "popsize": None,
        "consider_pruned_trials": False,
        "use_separable_cma": False,
        "with_margin": False,
        "lr_adapt": False,
    },
}
NUMBER_OR_NULL = {"sigma0", "popsize"}
WHOLE_OR_NULL = {"popsize"}
QMC_TYPES = ("sobol", "halton")
# What each sampler needs installed beyond parcel_hpc, and how to get it.
NEEDS: dict[SamplerName, list[tuple[str, str]]] = {
    SamplerName.QMC: [("scipy", "pip install scipy")],
    SamplerName.TPE: [("optuna", "pip install 'parcel_hpc[optuna]'")],
    SamplerName.GP: [("optuna", "pip install 'parcel_hpc[optuna]'"), ("torch", "pip install torch"), ("scipy", "pip install scipy")],
    SamplerName.CMAES: [("optuna", "pip install 'parcel_hpc[optuna]'"), ("cmaes", "pip install 'parcel_hpc[optuna]'")],
}


@dataclass(frozen=True)
class SamplerSpec:
    name: SamplerName
    options: Mapping[str, Any]
    revision: str  # the library that draws, and its version: proposals replay exactly only under it

    @property
    def learns(self) -> bool:
        return self.name.learns

    def to_json(self) -> dict:
        return {"name": self.name.value, "options": dict(self.options), "revision": self.revision}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SamplerSpec:
        return cls(SamplerName(obj["name"]), dict(obj["options"]), str(obj["revision"]))

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.name.value}({opts}), {self.revision}" if opts else f"{self.name.value}, {self.revision}"


def from_config(node: Mapping[str, Any] | None) -> SamplerSpec:
    """The ``sampler`` config group as a spec: unknown samplers and options, wrong types and missing
    libraries are one line naming the fix (exit 2, before anything is frozen)."""
    node = dict(node or {"name": SamplerName.RANDOM.value})
    raw = node.pop("name", SamplerName.RANDOM.value)
    try:
        name = SamplerName(raw)
    except ValueError:
        raise UsageError(f"sampler={raw!r} is unknown; use one of {', '.join(n.value for n in SamplerName)} (e.g. sampler=tpe)") from None
    defaults = OPTIONS[name]
    unknown = sorted(set(node) - set(defaults))
    if unknown:
        offered = ", ".join(sorted(defaults)) or "none"
        raise UsageError(f"sampler.{unknown[0]} is not an option of sampler={name.value}; its options are: {offered}")
    options = {key: _checked(name, key, node.get(key, default), default) for key, default in defaults.items()}
    if name is SamplerName.QMC and options["qmc_type"] not in QMC_TYPES:
        raise UsageError(f"sampler.qmc_type={options['qmc_type']!r} is unknown; use sobol or halton")
    if name is SamplerName.TPE and options["group"] and not options["multivariate"]:
        raise UsageError("sampler.group=true needs sampler.multivariate=true")
    for module, fix in NEEDS.get(name, []):
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"sampler={name.value} needs {module}, which is not installed; {fix}")
    return SamplerSpec(name, options, revision(name))


def _checked(name: SamplerName, key: str, value: Any, default: Any) -> Any:
    where = f"sampler.{key}={value!r}"
    if key in NUMBER_OR_NULL:
        whole = key in WHOLE_OR_NULL
        if value is not None and (isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or value <= 0):
            raise UsageError(f"{where} must be a positive {'whole ' if whole else ''}number or null (let the sampler choose)")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UsageError(f"{where} must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key != "n_startup_trials" else 0):
            raise UsageError(f"{where} must be a whole number{' >= 0' if key == 'n_startup_trials' else ' >= 1'}")
        return value
    if not isinstance(value, str):
        raise UsageError(f"{where} must be text")
    return value


def revision(name: SamplerName) -> str:
    if name is SamplerName.RANDOM:
        return RANDOM_REVISION
    library = "scipy" if name is SamplerName.QMC else "optuna"
    return f"{library} {importlib.metadata.version(library)}"

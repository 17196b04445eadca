"""``python -m parcel_hpc.launch -m [overrides]``: launch (or continue) a governed search.

No logic here: Hydra composes conf/, the ``parcel`` sweeper runs the search. Hydra's own errors
(an unknown group or option, a malformed override) become one line and exit code 2.

Two of Hydra's own keys would run code before the sweeper sees the config, so they are refused as
soon as it is composed (``_Refusing``), in one line, exit 2: ``hydra.callbacks`` (each one any
callable Hydra instantiates in the launch's own process, outside the contract and the final
partition's fence: a file truncated, the final file copied out) and a ``hydra.sweeper`` other than
the ``parcel`` sweeper (the only one that governs a search).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import hydra
from hydra._internal import hydra as hydra_internal
from hydra._internal.callbacks import Callbacks
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from parcel_hpc.config import ParcelSweeperConf
from parcel_hpc.errors import UsageError, exit_on_error, one_line, require_supported_python
from parcel_hpc.fsio import owner_only_writes


@hydra.main(version_base="1.3", config_path="pkg://parcel_hpc.conf", config_name="config")
def _task(cfg: DictConfig) -> None:
    # Reached only without -m: a search is a multirun of trials.
    print("error: a search dispatches many trials: run `python -m parcel_hpc.launch -m [overrides]`", file=sys.stderr)
    raise SystemExit(2)


PRINT_ONLY = ("--cfg", "-c", "--info", "-i")  # Hydra's flags that print and run nothing
SWEEPER_KEYS = {f.name for f in dataclasses.fields(ParcelSweeperConf)}


def refuse_hydra_code(config: DictConfig) -> None:
    """``UsageError`` for a composed config that would have Hydra run code of its choosing: callbacks,
    or a sweeper other than ``parcel`` (or ``parcel``'s with keys it does not take)."""
    callbacks = OmegaConf.select(config, "hydra.callbacks")
    if callbacks:
        raise UsageError(
            f"hydra.callbacks names {', '.join(sorted(str(k) for k in callbacks))}: a callback is any callable Hydra runs in the launch's own "
            "process, outside the contract and the final partition's fence; a parcel_hpc search takes none, so drop it"
        )
    sweeper = OmegaConf.select(config, "hydra.sweeper") or {}
    target = sweeper.get("_target_")
    if target != ParcelSweeperConf._target_:
        raise UsageError(
            f"hydra.sweeper._target_={target!r}: a parcel_hpc search runs the parcel sweeper only ({ParcelSweeperConf._target_}); drop the override"
        )
    stray = sorted(str(k) for k in sweeper if k not in SWEEPER_KEYS)
    if stray:
        raise UsageError(f"hydra.sweeper.{stray[0]} is not a key of the parcel sweeper, which takes params only (hydra.sweeper.params.NAME=GRAMMAR)")


class _Refusing(Callbacks):
    """Hydra's callbacks, made where Hydra makes them (right after it composes the config, before it
    instantiates a callback or the sweeper): the config is checked first (``refuse_hydra_code``)."""

    def __init__(self, config: DictConfig | None = None) -> None:
        if config is not None:
            refuse_hydra_code(config)
        super().__init__(config)


def _multirun_mode(self: hydra_internal.Hydra, **_called_with: object) -> None:
    """Hydra's ``get_mode`` composes the whole config once more only to read ``hydra.mode``, and with -m
    it runs a multirun whatever that says (on RUN it warns and overrides it): "not set" decides the same,
    without a second composition (about a fifth of a launch's CPU, under the profiler)."""
    return None


def _is_sweep(arg: str) -> bool:
    if arg.startswith("-") or "=" not in arg:
        return False
    try:
        return OverridesParser.create().parse_override(arg).is_sweep_override()
    except OverrideParseException:
        return False  # Hydra says what is wrong with it, in one line, below


def main() -> None:
    with exit_on_error():
        require_supported_python()
    owner_only_writes()
    if any(a in PRINT_ONLY or a.startswith(("--cfg=", "--info=")) for a in sys.argv[1:]):
        # ``-m --cfg job`` (the documented form) asks Hydra for two modes at once, which it refuses:
        # the composed groups print the same with or without -m, so -m goes, and so do sweep-grammar
        # parameters (the sweeper's, not a group's: ``search.dry_run=true`` shows the space they make).
        sweeps = [a for a in sys.argv[1:] if _is_sweep(a)]
        if sweeps:
            print(
                f"note: --cfg prints the config groups; the sweep parameters {' '.join(sweeps)} are the sweeper's (see them with search.dry_run=true)",
                file=sys.stderr,
            )
        sys.argv = [a for a in sys.argv if a not in ("-m", "--multirun") and a not in sweeps]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's errors reach us instead of its multi-line report
    hydra_internal.Callbacks = _Refusing  # type: ignore[misc]  # Hydra 1.3 makes them through this name, nowhere else
    if any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        hydra_internal.Hydra.get_mode = _multirun_mode  # type: ignore[method-assign,assignment]
    with exit_on_error():
        try:
            _task()
        except (HydraException, OmegaConfBaseException) as exc:  # composition, overrides, missing values
            raise UsageError(f"{_hydra_line(exc)}; see `python -m parcel_hpc.launch --help` for config groups and options") from None


def _hydra_line(exc: Exception) -> str:
    """Hydra's or OmegaConf's error in one line, without its pointers to keys and docs."""
    lines = [l for l in str(exc).splitlines() if l.strip() and not l.strip().startswith(("full_key", "object_type", "reference_type", "See https"))]
    text = one_line(chr(10).join(lines))
    return f"malformed override {exc.override!r}: {text}" if isinstance(exc, OverrideParseException) else text


if __name__ == "__main__":
    main()

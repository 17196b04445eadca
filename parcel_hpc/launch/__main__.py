"""``python -m parcel_hpc.launch -m [overrides]``: launch (or continue) a governed search.

No logic here: Hydra composes conf/, the ``parcel`` sweeper runs the search. Hydra's own errors
(an unknown group or option, a malformed override) become one line and exit code 2.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from parcel_hpc.errors import one_line
from parcel_hpc.fsio import owner_only_writes


@hydra.main(version_base="1.3", config_path="pkg://parcel_hpc.conf", config_name="config")
def _task(cfg: DictConfig) -> None:
    # Reached only without -m: a search is a multirun of trials.
    print("error: a search dispatches many trials: run `python -m parcel_hpc.launch -m [overrides]`", file=sys.stderr)
    raise SystemExit(2)


PRINT_ONLY = ("--cfg", "-c", "--info", "-i")  # Hydra's flags that print and run nothing


def _is_sweep(arg: str) -> bool:
    if arg.startswith("-") or "=" not in arg:
        return False
    try:
        return OverridesParser.create().parse_override(arg).is_sweep_override()
    except OverrideParseException:
        return False  # Hydra says what is wrong with it, in one line, below


def main() -> None:
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
    try:
        _task()
    except SystemExit:
        raise
    except Exception as exc:  # Hydra and OmegaConf errors: composition, overrides, missing values
        if not isinstance(exc, (HydraException, OmegaConfBaseException)):
            raise
        lines = [l for l in str(exc).splitlines() if l.strip() and not l.strip().startswith(("full_key", "object_type", "reference_type", "See https"))]
        text = one_line(chr(10).join(lines))
        if isinstance(exc, OverrideParseException):
            text = f"malformed override {exc.override!r}: {text}"
        print(f"error: {text}; see `python -m parcel_hpc.launch --help` for config groups and options", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

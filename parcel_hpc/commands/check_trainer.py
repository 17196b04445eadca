"""``parcel-hpc check-trainer PACKAGE.MODULE:NAME [OVERRIDE ...]``: before a search relies on a trainer,
the launch's own checks (its declared parameters against the space and the baseline, the preflight at
the space's corners) on the config those overrides compose, then the conformance check in seconds
(resume, determinism, serving parity). Nothing is written."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parcel_hpc.console import make_console
from parcel_hpc.errors import UsageError
from parcel_hpc.trainer import conformance

if TYPE_CHECKING:
    from parcel_hpc.fence import StageAnswer
    from parcel_hpc.governance.contract import Contract
    from parcel_hpc.propose.specs import Ahead

READ_ONLY = False  # reads no search; it builds and steps the trainer, which may write where it likes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="PACKAGE.MODULE:NAME")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="the launch's overrides: config groups and values (space=tiny_r1, selection.baseline.params=...) and sweep grammar (lr='interval(0.01,0.1)')",
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="a parameter of the conformance run (repeat; default: the space's low corner)"
    )
    parser.add_argument("--data", type=Path, default=Path("data"), metavar="DIR", help="snapshot and split directory (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=12, metavar="N", help="steps before and after the checkpoint (default %(default)s)")


def parse_params(items: list[str]) -> dict[str, object]:
    params: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--param {item!r} is not NAME=VALUE; e.g. --param lr=0.01")
        try:
            params[name] = json.loads(text)
        except ValueError:
            params[name] = text
    return params


def run(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be >= 1")
    snapshot, split = conformance.data_files(args.data)
    cfg = _composed(args.target, args.overrides, snapshot, split)
    from parcel_hpc.launch.search import preflight_ahead, preflight_checks
    from parcel_hpc.propose.specs import build_contract

    # The launch's checks (the space against the declared parameters), its preflight and the
    # conformance check, in one fenced child: the trainer's code is imported once for all three.
    contract, (preflight, checked) = build_contract(cfg, [preflight_ahead(), _conformance_ahead(args, params)])
    tried = preflight_checks(cfg, contract, preflight)
    console = make_console()
    console.print(f"space and baseline: every parameter taken, none left out; preflight passed at {', '.join(tried)}", markup=False, highlight=False)
    findings = _findings(checked, contract.digest)
    if findings is None:  # not run ahead (its data could not be read there), or answered with something else
        check = conformance.prepared(args.target, args.data, seed=args.seed, steps=args.steps, preprocessing=cfg["preprocessing"])
        findings = conformance.run_alone(check, _conformance_params(params, contract), args.target, args.data)
    return 0 if conformance.show(args.target, args.data, findings, console) else 1


CONFORMANCE = "the conformance check"


def _conformance_ahead(args: argparse.Namespace, params: dict[str, object]) -> Ahead:
    """The conformance check as the last step of the launch's trainer-checks child (``build_contract``)."""

    def prepared(cfg: Mapping[str, Any]) -> Callable[[Contract], dict[str, Any]]:
        check = conformance.prepared(args.target, args.data, seed=args.seed, steps=args.steps, preprocessing=cfg["preprocessing"])
        return lambda contract: {"contract": contract.digest, "findings": check(_conformance_params(params, contract))}

    return CONFORMANCE, prepared


def _conformance_params(params: dict[str, object], contract: Contract) -> Mapping[str, Any]:
    """``--param``'s, or the space's low corner."""
    from parcel_hpc.propose.specs import space_of
    from parcel_hpc.trainer.preflight import corners

    return params or corners(space_of(contract)[0])[0]


def _findings(answered: StageAnswer | None, digest: str) -> list[conformance.Finding] | None:
    """The findings the check answered ahead on this contract; None where it has none to give."""
    if answered is None:
        return None
    answer = answered.result()  # its error (the trainer's, a fence trip), raised here as if it had run alone
    return conformance.findings_of(answer.get("findings")) if isinstance(answer, dict) and answer.get("contract") == digest else None


def _composed(target: str, overrides: list[str], snapshot: Path, split: Path) -> dict[str, Any]:
    """The config a launch with these overrides would run, validated as the launch validates it."""
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from parcel_hpc.errors import one_line
    from parcel_hpc.launch.search import from_hydra

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        grammar = [str(o.input_line) for o in parsed if o.is_sweep_override()]
        plain = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
        with initialize_config_module("parcel_hpc.conf", version_base="1.3"):
            config = compose(
                "config", overrides=[*plain, f"trainer.target={target}", f"snapshot.path={snapshot}", f"split.path={split}"], return_hydra_config=True
            )
    except (HydraException, OmegaConfBaseException) as exc:
        raise UsageError(f"{one_line(str(exc))}; give the launch's overrides (see `python -m parcel_hpc.launch --help`)") from None
    return from_hydra(config, grammar)[0]

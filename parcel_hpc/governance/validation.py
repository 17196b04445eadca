"""Validation at the door: every text that can reach a path, a job name, a batch-script line, a
scheduler argument or a shell, and every number, is checked when the config is composed, before
anything is written.

Owns the rules (control characters, shell characters, names, paths, lengths), the range of every
number in the config (``NUMBERS``: a key with no range there is a test failure) and SLURM's own
units for memory (``4G``, ``100M``) and time (``2:00:00``, ``1-00:00:00``, ``90``). Pure: each refusal
is a UsageError of one line naming the key, the rule and the fix (exit 2). ``sbatch.py`` applies
the same rules to what it renders.
"""

from __future__ import annotations

import math
import os
import re
import string
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.shape import ShapePlan, TrialShape, value_key

MAX_NAME = 64  # characters in a revision, job, partition, account or qos name

MAX_PATH = 1024  # characters in a path (Linux allows 4096; ours are short)
MAX_TIME_MIN = 366 * 24 * 60  # a year and a day: anything longer is a typo
MAX_MEM_GB = 64 * 1024.0  # 64 TiB per trial: anything larger is a typo
MAX_PACK_MINUTES = 7 * 24 * 60  # a week of work in one packed job
MAX_PACK = 256  # trials in one job at most, whatever else allows
AUTO = "auto"  # hydra.launcher.pack_size: sized by the search's history
MAX_SYSTEMATIC = 1000  # budget.systematic_failures: more first failures alike than this is a typo
MAX_STEPS = 10**8  # training steps (and checkpoint cadence, milestones): more is a typo
MAX_TRIALS = 10**6  # trials in one search
MAX_SEED = 2**32 - 1  # numpy's seeds

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NAME_FIX = f"use 1-{MAX_NAME} characters from A-Z a-z 0-9 . _ - starting with a letter or digit, without '..'"
_PATH_RE = re.compile(r"[A-Za-z0-9._/+,@=~-]+")
PATH_FIX = "use letters, digits and . _ / + , @ = ~ - only (a symlink with such a name works)"
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_TARGET_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")

# What an #SBATCH value may be made of: nothing sbatch's directive parser or a shell could misread.
HEADER_SAFE_RE = re.compile(r"[A-Za-z0-9._/+,@=%:-]+")
# sbatch option values may also hold constraint and node-list syntax: harmless in an #SBATCH line.

_PARTITIONS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(,[A-Za-z0-9][A-Za-z0-9._-]*)*")
_MEM_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGT])", re.IGNORECASE)
_TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def show(value: object) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:56] + "...'"


def bad(key: str, value: object, problem: str, fix: str) -> UsageError:
    return UsageError(f"{key}={show(value)} {problem}; {fix}")


def text(key: str, value: object, max_len: int = MAX_PATH) -> str:
    """What every string gets: a str, no control or line-break character, no #SBATCH, a length limit."""
    if not isinstance(value, str):
        raise bad(key, value, f"is a {type(value).__name__}, not a string", "give text")
    for ch in value:
        category = unicodedata.category(ch)
        if category[0] == "C" or category in ("Zl", "Zp") or (ch.isspace() and ch != " "):
            raise bad(key, value, f"contains the control or line-break character {ch!r}", "remove it")
    if "#SBATCH" in value.upper():
        raise bad(key, value, "contains '#SBATCH'", "remove it: a value can never carry a batch directive")
    if len(value) > max_len:
        raise bad(key, value, f"is {len(value)} characters long", f"keep it to {max_len}")
    return value


def name(key: str, value: object, *, max_len: int = MAX_NAME, optional: bool = False) -> str:
    """A name that becomes a directory, a job name or a scheduler argument: no '/', no '..', no shell."""
    value = text(key, value, max_len)
    if optional and value == "":
        return value
    if not _NAME_RE.fullmatch(value) or ".." in value:
        raise bad(key, value, "is not a safe name", NAME_FIX.replace(str(MAX_NAME), str(max_len)))
    return value


def path(key: str, value: object) -> str:
    """A path from the config (relative to the launch directory, or absolute): no whitespace or
    shell characters, since a search's paths reach batch scripts and their #SBATCH lines."""
    value = text(key, value, MAX_PATH)
    if not value:
        raise bad(key, value, "is empty", "give a path")
    if not _PATH_RE.fullmatch(value):
        raise bad(key, value, "holds whitespace or a shell character", PATH_FIX)
    return value


def abs_path(key: str, value: object, *, patterns: bool = False) -> str:
    """An absolute, normalised path (what a batch script holds); ``patterns`` allows sbatch's %j."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    value = text(key, value, MAX_PATH)
    if not value.startswith("/"):
        raise bad(key, value, "is not an absolute path", "give an absolute path")
    if not _PATH_RE.fullmatch(value.replace("%", "") if patterns else value) or "~" in value:
        allowed = "; sbatch's %j-style patterns are allowed" if patterns else ""
        raise bad(key, value, "holds whitespace or a shell character", PATH_FIX.replace(" ~", "") + allowed)
    if os.path.normpath(value) != value or value.startswith("//"):
        raise bad(key, value, "is not normalised (//, /./, /../ or a trailing /)", f"use {show(os.path.normpath(value))}")
    return value


def whole(key: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int:  # bool is an int subclass, and True would render as "True"
        raise bad(key, value, f"is a {type(value).__name__}, not an int", f"give a whole number in {lo}..{hi}")
    if not lo <= value <= hi:
        raise bad(key, value, "is out of range", f"give a whole number in {lo}..{hi}")
    return value


# --- SLURM's units ----------------------------------------------------------------------------


def mem_gb(key: str, value: object) -> float:
    """Memory in GiB: a number means GiB; a string is SLURM's size with its unit (``4G``, ``100M``)."""
    if isinstance(value, bool):
        raise bad(key, value, "is a bool", "give GiB as a number, or a size like 4G or 512M")
    if isinstance(value, (int, float)):
        gb = float(value)
    else:
        match = _MEM_RE.fullmatch(text(key, value, 16).strip())
        if not match:
            raise bad(key, value, "is not a memory size", "give GiB as a number, or SLURM's size with a unit: 4G, 512M, 1T (a bare number string has no unit)")
        gb = float(match.group(1)) * {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}[match.group(2).upper()]
    if not math.isfinite(gb) or gb * 1024 < 1 or gb > MAX_MEM_GB:
        raise bad(key, value, "is out of range", f"give at least 1M and at most {int(MAX_MEM_GB)}G")
    return gb


def time_min(key: str, value: object) -> int:
    """A time limit in whole minutes: an int means minutes; a string is SLURM's ``--time`` form
    (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``); seconds round up, as SLURM does."""
    if isinstance(value, bool) or isinstance(value, float):
        raise bad(key, value, f"is a {type(value).__name__}", "give whole minutes, or SLURM's time like 2:00:00 or 1-00:00:00")
    if isinstance(value, int):
        minutes = value
    else:
        match = _TIME_RE.fullmatch(text(key, value, 16).strip())
        if not match:
            raise bad(key, value, "is not a time limit", "give whole minutes, or SLURM's time like 90, 2:00:00 or 1-00:00:00")
        days, a, b, c = (int(g) if g is not None else None for g in match.groups())
        assert a is not None  # _TIME_RE's hours-or-minutes group is not optional
        if days is not None:  # D-HH[:MM[:SS]]
            seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
        elif c is not None:  # HH:MM:SS
            assert b is not None  # _TIME_RE fills its last group only after the one before
            seconds = a * 3600 + b * 60 + c
        elif b is not None:  # MM:SS
            seconds = a * 60 + b
        else:  # MM
            seconds = a * 60
        minutes = -(-seconds // 60)
    if not 1 <= minutes <= MAX_TIME_MIN:
        raise bad(key, value, "is out of range", f"give 1 minute to {MAX_TIME_MIN // 1440} days")
    return minutes


# --- numbers ----------------------------------------------------------------------------------


class Number(Enum):
    WHOLE = "a whole number"
    REAL = "a number"


@dataclass(frozen=True)
class Range:
    """What one numeric key may hold: ``lo <= value <= hi`` (``lo < value`` when ``above``), finite."""

    kind: Number
    lo: float
    hi: float
    what: str  # the unit or meaning, shown with the fix
    above: bool = False  # lo itself is refused (a cost, a scale: 0 is no value)
    nullable: bool = False  # null leaves the choice to the library

    def check(self, key: str, value: object) -> None:
        if value is None and self.nullable:
            return
        typed = type(value) is int or (self.kind is Number.REAL and type(value) is float)  # bool is an int subclass
        if not typed or not math.isfinite(cast(float, value)):
            raise bad(key, value, f"is not {self.kind.value}", self.fix())
        v = cast(float, value)
        if v < self.lo or (self.above and v == self.lo) or v > self.hi:
            raise bad(key, value, "is out of range", self.fix())

    def fix(self) -> str:
        bounds = f"{int(self.lo)}..{int(self.hi)}" if self.kind is Number.WHOLE else f"{self.lo:g}..{self.hi:g}"
        if self.above:
            bounds = f"> {self.lo:g} and <= {self.hi:g}"
        else:
            bounds = f"in {bounds}"
        return f"give {self.kind.value} {bounds}{', or null' if self.nullable else ''} ({self.what})"


def _whole(lo: float, hi: float, what: str, nullable: bool = False) -> Range:
    return Range(Number.WHOLE, lo, hi, what, nullable=nullable)


def _real(lo: float, hi: float, what: str, above: bool = False, nullable: bool = False) -> Range:
    return Range(Number.REAL, lo, hi, what, above, nullable)


# Every number the composed config can hold (conf/, config.py, the launcher groups), by dotted key;
# ``*`` is any key of a mapping, ``[]`` every item of a list. A key absent from the composed config
# (another sampler's option, the other launcher's) is not checked. tests/test_validation.py fails on
# a numeric key of any group's option that has no range here.
NUMBERS: dict[str, Range] = {
    "search.n_trials": _whole(0, MAX_TRIALS, "trials the search proposes in all"),
    "search.seed": _whole(0, MAX_SEED, "the space's sampling seed"),
    "train.steps": _whole(1, MAX_STEPS, "training steps per trial"),
    "train.seed": _whole(0, MAX_SEED, "the initialisation and batching seed"),
    "train.step_seconds": _real(0, 3600, "minimum seconds per step; 0 trains at full speed"),
    "train.resume_tolerance": _real(
        0, 1, "the largest difference in validation probabilities a resumed run may show against an uninterrupted one", nullable=True
    ),
    "preprocessing.pool": _whole(1, 1024, "pixels per side averaged into one feature"),
    "metric.miss_cost": _real(0, 1e12, "the cost of one missed damaged parcel", above=True),
    "metric.review_cost": _real(0, 1e12, "the cost of one needless review", above=True),
    "resources.gpus": _whole(0, 64, "GPUs per rank (a trial of one rank: per trial)"),
    "resources.cpus": _whole(1, 4096, "CPUs per rank (a trial of one rank: per trial)"),
    "resources.nodes": _whole(1, 1024, "nodes one trial spans"),
    "resources.tasks_per_node": _whole(1, 256, "ranks (processes) of one trial on each node"),
    "budget.max_trials": _whole(1, MAX_TRIALS, "trials in the whole search"),
    "budget.gpu_hours_cap": _real(0, 1e9, "GPU-hours, worst case"),
    "budget.cost_cap": _real(0, 1e12, "money, worst case"),
    "budget.rate_per_gpu_hour": _real(0, 1e9, "money per GPU-hour"),
    "budget.rate_per_cpu_hour": _real(0, 1e9, "money per CPU-hour"),
    "budget.max_retries": _whole(0, 100, "retries per trial"),
    "budget.max_preemptions": _whole(0, 10000, "requeues per trial after preemption"),
    "budget.systematic_failures": _whole(0, MAX_SYSTEMATIC, "first results failing alike that stop the search; 0: never"),
    "checkpoint.every_steps": _whole(1, MAX_STEPS, "training steps between checkpoints", nullable=True),
    "checkpoint.every_s": _real(0, MAX_TIME_MIN * 60, "seconds of training between checkpoints", above=True, nullable=True),
    "checkpoint.keep_last": _whole(1, 1000, "checkpoints kept per trial; the newest is what a resume needs"),
    "pruner.milestones[]": _whole(1, MAX_STEPS, "training steps, strictly increasing"),
    "pruner.reduction_factor": _whole(2, 1000, "3 keeps the best third at each milestone"),
    "pruner.min_peers": _whole(1, MAX_TRIALS, "peers at a milestone before anyone is pruned"),
    "sampler.n_startup_trials": _whole(0, MAX_TRIALS, "random proposals before the model is used"),
    "sampler.n_ei_candidates": _whole(1, 10**6, "candidates TPE scores per proposal"),
    "sampler.sigma0": _real(0, 1e12, "CMA-ES's initial step size", above=True, nullable=True),
    "sampler.popsize": _whole(1, 10**6, "CMA-ES's population", nullable=True),
    "selection.rerun_tolerance": _real(0, 1e12, "|rerun - selected| validation miss-cost"),
    "selection.parity_tolerance": _real(0, 1, "max |serve - predict| per validation image, a probability"),
    "selection.performance_margin": _real(0, 1e12, "validation miss-cost the winner may have above the baseline's"),
    "selection.final_performance_margin": _real(0, 1e12, "final miss-cost the winner may have above the baseline's; null: reported only", nullable=True),
    "selection.slices.shipment_buckets": _whole(1, 10**6, "groups the shipments are hashed into"),
    "selection.slices.min_examples": _whole(1, 10**9, "frames a slice needs to be gated"),
    "selection.gate.max_recall_drop": _real(0, 1, "a recall"),
    "selection.gate.max_miss_cost_rise": _real(0, 1e12, "miss-cost per frame"),
    "selection.gate.min_recall.*": _real(0, 1, "a recall"),
    "hydra.launcher.parallelism": _whole(1, 4096, "trials at once"),
    "hydra.launcher.array_parallelism": _whole(1, 10**6, "array tasks running at once"),
    "hydra.launcher.signal_delay_s": _whole(1, 65535, "seconds before the time limit that the worker is told to checkpoint"),
    "hydra.launcher.pack_minutes": _real(0, MAX_PACK_MINUTES, "expected work per packed job, minutes", above=True, nullable=True),
}
# Numbers with their own form, checked by their own function (SLURM's units; auto or a count).
UNITS = frozenset({"resources.mem_gb", "resources.time_limit_min", "hydra.launcher.pack_size"})
# Subtrees whose numbers are a trainer's parameters: their ranges are the space's (propose.space) and
# the trainer's declaration (trainer.params), checked there.
PARAMETERS = ("space.params.", "selection.baseline.params.")


def numbers(node: Any, prefix: str = "") -> Iterator[tuple[str, object]]:
    """Every (rule key, value) the table can name in ``node``: each numeric leaf, by dotted key."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from numbers(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for v in node:
            yield from numbers(v, f"{prefix.rstrip('.')}[].")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix.rstrip("."), node


def rule_for(key: str) -> Range | None:
    """The table's range for a dotted key (``a.b``, ``a.b[]``), a ``*`` entry matching any last key."""
    if key in NUMBERS:
        return NUMBERS[key]
    parent, _, _ = key.rpartition(".")
    return NUMBERS.get(f"{parent}.*")


def _check_numbers(cfg: Mapping[str, Any], launcher: Mapping[str, Any]) -> None:
    """Each key in ``NUMBERS`` that the config holds, whatever its type, then how numbers relate."""
    roots = {**cfg, "hydra": {"launcher": launcher}}
    for key, rule in NUMBERS.items():
        dotted = key.removesuffix("[]")
        *parents, last = dotted.split(".")
        node: Any = roots
        for part in parents:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping) or (last != "*" and last not in node):
            continue
        if last == "*":
            for k, v in node.items():
                rule.check(f"{dotted[:-1]}{k}", v)
        elif dotted == key:
            rule.check(key, node[last])
        elif not isinstance(node[last], list):
            raise bad(dotted, node[last], "is not a list", rule.fix())
        else:
            for i, v in enumerate(node[last]):
                rule.check(f"{dotted}[{i}]", v)
    pruner = cfg.get("pruner", {})
    milestones = pruner.get("milestones", [])
    if "milestones" in pruner and not milestones:
        # Every attempt reports its validation at the milestones: none would fail every trial of the search.
        raise bad("pruner.milestones", milestones, "is empty: no trial could report a milestone", "list training steps, like [10, 20, 41, 82]")
    if any(b <= a for a, b in zip(milestones, milestones[1:])):
        raise bad("pruner.milestones", milestones, "is not strictly increasing", "list training steps in increasing order, like [10, 20, 41, 82]")
    steps = cfg.get("train", {}).get("steps")
    # Past the last step no trial reports, so a rule that prunes there never prunes (pruner=none only scores).
    if pruner.get("kind") == "asha" and milestones and steps is not None and milestones[-1] > steps:
        raise bad(
            "pruner.milestones", milestones, f"goes past train.steps={steps}, where no trial reports", f"keep every milestone <= {steps}, or use pruner=none"
        )


# --- the composed config ----------------------------------------------------------------------

_NAMES = (
    "search.revision",
    "split.revision",
    "preprocessing.revision",
    "metric.revision",
    "space.revision",
    "pruner.revision",
    "selection.revision",
    "selection.baseline.name",
)
_OPTIONAL_NAMES = ("resources.account", "resources.qos")
_PATHS = ("search.root", "snapshot.path", "split.path", "checkpoint.dir")


def checked(cfg: Mapping[str, Any], launcher: Mapping[str, Any], check_launcher: Callable[[Mapping[str, Any]], None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The composed job config and launcher group, checked, with memory and time in the contract's
    units (``resources.mem_gb`` in GiB, ``resources.time_limit_min`` in minutes); ``check_launcher``:
    its backend's own checks of the launcher group (``Backend.check_launcher``). Raises UsageError."""
    cfg = _copy(cfg)
    launcher = _copy(launcher)
    for key in _NAMES:
        name(key, _get(cfg, key))
    for key in _OPTIONAL_NAMES:
        if _get(cfg, key) is not None:
            name(key, _get(cfg, key))
    partition = cfg["resources"].get("partition")
    if partition is not None and not _PARTITIONS_RE.fullmatch(text("resources.partition", partition, 256)):
        raise bad("resources.partition", partition, "is not a partition or a list of them", "give names like low or gpu,gpu-low (A-Z a-z 0-9 . _ -)")
    for key in _PATHS:
        path(key, _get(cfg, key))
    if cfg["image"].get("path") is not None:
        path("image.path", cfg["image"]["path"])
    if not _TARGET_RE.fullmatch(cfg["trainer"]["target"]):
        raise bad("trainer.target", cfg["trainer"]["target"], "is not an import target", "give PACKAGE.MODULE:NAME, like mypkg.model:MyTrainer")
    code = cfg["trainer"].get("code", [])
    if not isinstance(code, list):
        raise bad("trainer.code", code, "is not a list", "give package names, like trainer.code=[mylab_utils]")
    for package in code:
        if not isinstance(package, str) or not _MODULE_RE.fullmatch(package):
            raise bad("trainer.code", package, "is not a package name", "give dotted package names, like trainer.code=[mylab_utils]")
    for param in cfg["space"]["params"]:
        if not _IDENT_RE.fullmatch(str(param)):
            raise bad(f"space.params.{param}", param, "is not a parameter name", "use a Python identifier of at most 64 characters")
    _check_prefix(cfg["checkpoint"]["prefix"], cfg["space"]["params"])
    _check_numbers(cfg, launcher)
    cfg["checkpoint"].update(cadence(cfg["checkpoint"], launcher))
    _check_step_seconds_param(cfg.get("train", {}).get("step_seconds_param"), cfg["space"]["params"])
    resources = cfg["resources"]
    # A gang's ranks wait on one another at each step boundary at most this long: a step must be shorter
    # than the scheduler's notice anyway (``worker/signals.py``), so a rank silent longer is hung.
    cfg["checkpoint"]["rank_wait_s"] = float(launcher["signal_delay_s"])
    resources["mem_gb"] = mem_gb("resources.mem_gb", resources["mem_gb"])
    resources["time_limit_min"] = time_min("resources.time_limit_min", resources["time_limit_min"])
    check_launcher(launcher)
    if "pack_size" in launcher:
        pack_option(launcher["pack_size"])
    dispatch_option(launcher.get("dispatch"))
    # Last: the keys a user sets are named above, before a value interpolated from them is.
    _every_text(cfg, "")
    _every_text(launcher, "hydra.launcher.")
    return cast(dict[str, Any], cfg), cast(dict[str, Any], launcher)  # _copy made plain dicts of them


def cadence(checkpoint: Mapping[str, Any], launcher: Mapping[str, Any]) -> dict[str, Any]:
    """``checkpoint.every_steps`` or ``every_s``, never both (a UsageError); neither: ``every_s`` is the
    launcher's ``signal_delay_s``. The notice the scheduler gives before a time limit is the training
    the site already accepts to redo when a job dies without it (a node failure, a kill past the
    grace): a cadence as long loses no more than that, plus one step, and saves as rarely as it can."""
    steps, seconds = checkpoint.get("every_steps"), checkpoint.get("every_s")
    if steps is not None and seconds is not None:
        raise bad(
            "checkpoint.every_s", seconds, f"is given with checkpoint.every_steps={show(steps)}", "give one cadence, steps or seconds, and null the other"
        )
    if steps is None and seconds is None:
        seconds = float(launcher["signal_delay_s"])
    return {"every_steps": steps, "every_s": None if seconds is None else float(seconds)}


def _check_step_seconds_param(param: object, params: Mapping[str, Mapping[str, Any]]) -> None:
    """``train.step_seconds_param`` names a space parameter whose every value is a positive number."""
    if param is None:
        return
    key = "train.step_seconds_param"
    if param not in params:
        raise bad(key, param, "is not a space parameter", f"name one of {sorted(params)}, or leave it unset")
    spec = params[str(param)]
    values = list(spec.get("values") or [spec.get("low"), spec.get("high")])
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        raise bad(
            key, param, "takes a value that is not a positive number", "name a parameter whose every value is > 0 (a step sleeps step_seconds x its value)"
        )


def _check_prefix(prefix: object, params: Mapping[str, Mapping[str, Any]]) -> None:
    key = "checkpoint.prefix"
    prefix = text(key, prefix, 256)
    if not _PATH_RE.fullmatch(prefix.replace("{", "").replace("}", "")):
        raise bad(key, prefix, "holds whitespace or a shell character", PATH_FIX + ", and {placeholders}")
    if prefix.startswith(("/", "~")) or ".." in prefix.split("/"):
        raise bad(key, prefix, "leaves the checkpoint directory", "give a relative template like {trial_id} or {trial_id}/{lr}, without '..'")
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(prefix) if f is not None]
    except ValueError as exc:
        raise bad(key, prefix, f"is not a template ({exc})", "use {trial_id} and {<space parameter>} placeholders") from None
    unknown = sorted(set(fields) - set(params) - {"trial_id"})
    if unknown:
        raise bad(key, prefix, f"names {{{unknown[0]}}}, which is neither trial_id nor a space parameter", f"use {{trial_id}} or one of {sorted(params)}")
    for field in sorted(set(fields) & set(params)):
        for value in params[field].get("values") or ():  # a choice's values become directory names
            if isinstance(value, str):
                name(f"space.params.{field}.values", value)


def _every_text(node: Any, prefix: str) -> None:
    """No string anywhere in the config may hold a control character or a batch directive."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            text(f"{prefix}{k} (key)", str(k), MAX_NAME)
            _every_text(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _every_text(v, f"{prefix.rstrip('.')}[{i}].")
    elif isinstance(node, str):
        text(prefix.rstrip("."), node, MAX_PATH)


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _copy(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def check_shapes(resources: Mapping[str, Any], params: Mapping[str, Mapping[str, Any]]) -> ShapePlan:
    """``resources.shape_by`` and ``resources.shapes``, checked against the space's parameters: the
    search's ``ShapePlan``. Shapes without a ``shape_by`` are refused, as they would be read by nothing."""
    by, shapes = resources.get("shape_by"), resources.get("shapes") or {}
    if by is None:
        if shapes:
            raise bad(
                "resources.shapes",
                shapes,
                "is given without resources.shape_by",
                "name the choice parameter whose values pick a shape: resources.shape_by=<param>",
            )
        return ShapePlan.of(resources)
    spec = params.get(str(by))
    if spec is None or "values" not in spec:  # a choice is the one kind that lists its values
        what = "is not a searched parameter" if spec is None else "is not a choice parameter"
        choices = sorted(p for p, v in params.items() if "values" in v)
        raise bad("resources.shape_by", by, what, f"name one of the space's choice parameters {choices}, or leave it unset")
    if not isinstance(shapes, Mapping) or not shapes:
        raise bad(
            "resources.shapes",
            shapes,
            f"maps no value of {by} to a shape",
            f"give resources.shapes={{VALUE: {{nodes: N, tasks_per_node: T}}}} for values of {by}",
        )
    values = [value_key(v) for v in spec["values"]]
    if len({value_key(k) for k in shapes}) < len(shapes):  # 8 and '8': one value, two shapes
        raise bad("resources.shapes", dict(shapes), f"names one value of {by} twice", "key each value once")
    for key, shape in shapes.items():
        where = f"resources.shapes.{key}"
        if value_key(key) not in values:
            raise bad(where, shape, f"is keyed by a value {by} does not take", f"key shapes by {by}'s values {values}")
        if not isinstance(shape, Mapping) or not shape or set(shape) - {"nodes", "tasks_per_node"}:
            raise bad(where, shape, "is not a shape", "give {nodes: N, tasks_per_node: T}, each a whole number >= 1")
        for field in ("nodes", "tasks_per_node"):
            n = shape.get(field, 1)
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= NUMBERS[f"resources.{field}"].hi:
                raise bad(f"{where}.{field}", n, "is not a positive whole number", NUMBERS[f"resources.{field}"].fix())
    return ShapePlan.of(resources)


def check_mixed(plan: ShapePlan, launcher: Mapping[str, Any], learns: bool, waits: bool) -> None:
    """Trials of several shapes in slots: slots of each shape, each taking only queued trials of its
    shape. Not for a sampler that learns (a slot cannot know the shape of a proposal it has not made),
    nor detached (the first slots of each shape would have to hold all of that shape's trials)."""
    if not plan.mixed or not dispatch_option(launcher.get("dispatch")).slotted(learns):
        return
    if learns or not waits:
        why = "a sampler that learns proposes into slots, and a slot cannot know its next proposal's shape" if learns else "search.wait=false"
        raise bad(
            "resources.shape_by",
            plan.by,
            f"gives trials of {len(plan.all_shapes())} shapes in slots (hydra.launcher.dispatch={launcher.get('dispatch')}) with {why}",
            "set hydra.launcher.dispatch=jobs: each trial a job of its own shape"
            + ("" if learns else ", or let the launch follow its slots (search.wait=true)"),
        )


def check_gang(shape: TrialShape, launcher: Mapping[str, Any], folds: int, backend_refusal: str) -> None:
    """A trial of several ranks (a gang) only where it runs whole: on a backend that starts its ranks
    (``backend_refusal``: why not, "" where it does), in its own job or in slots shaped like it (every
    rank of a slot job runs each trial its rank 0 takes), never packed, and without folds (not built
    for gangs)."""
    if not shape.is_gang:
        return
    key = "resources.nodes" if shape.nodes > 1 and (backend_refusal or shape.tasks_per_node == 1) else "resources.tasks_per_node"
    value = shape.nodes if key == "resources.nodes" else shape.tasks_per_node
    what = f"asks for a trial of {shape.ranks} ranks ({shape.describe()})"
    if backend_refusal:
        raise bad(key, value, f"{what}; {backend_refusal}", "set resources.nodes=1 resources.tasks_per_node=1, or run the search where gangs run")
    if folds > 1:
        raise bad(key, value, f"{what} with a split of {folds} folds; a gang's K fold runs are not built", "use a split without folds, or one rank")
    pack = pack_option(launcher.get("pack_size", 1))
    if pack is not None and pack > 1:
        raise bad(
            "hydra.launcher.pack_size",
            pack,
            f"packs trials of {shape.ranks} ranks; a gang is its own job",
            "set hydra.launcher.pack_size=1 (or auto), or hydra.launcher.dispatch=slots to run them one after another in a job",
        )


# --- the launcher's dispatch options (the scheduler's packing and slots read them) --------------


def pack_option(value: Any) -> int | None:
    """``hydra.launcher.pack_size``: None for auto, else a whole number >= 1 (UsageError otherwise)."""
    if value is None or str(value).strip().lower() == AUTO:
        return None
    if isinstance(value, bool) or not str(value).strip().isdigit() or not 1 <= int(value) <= MAX_PACK:
        raise UsageError(f"hydra.launcher.pack_size={value!r} must be auto or a whole number from 1 to {MAX_PACK}; 1 runs each trial in its own job")
    return int(value)


class Dispatch(Enum):
    """``hydra.launcher.dispatch``: how a launch's trials reach their jobs."""

    JOBS = "jobs"  # each job is handed its trials when submitted (a pack of ``pack_size``)
    SLOTS = "slots"  # each job is a slot that takes trials (and proposals) while it has time
    AUTO = "auto"  # slots for a sampler that learns (its proposals are made as slots free), jobs for a fixed list

    def slotted(self, learns: bool) -> bool:
        return self is Dispatch.SLOTS or (self is Dispatch.AUTO and learns)


def dispatch_option(value: Any) -> Dispatch:
    """``hydra.launcher.dispatch`` (absent in a launch recorded before slots: jobs); UsageError otherwise."""
    if value is None:
        return Dispatch.JOBS
    try:
        return Dispatch(str(value).strip().lower())
    except ValueError:
        raise UsageError(f"hydra.launcher.dispatch={value!r} must be auto, jobs or slots; slots run trials one after another, each taking the next") from None

"""Batch scripts parcel_hpc renders itself, and the one ``sbatch`` shell-out around them.

Owns: the values that fill ``sbatch_templates/*.sbatch`` (``SbatchValues``, validated at birth),
rendering a template, writing the script, the ``sbatch`` argv and the parser of what sbatch prints.
Must not: decide what to run or when (selection, governance and the CLI do that), read the
environment or the clock, or render trial jobs (submitit writes those itself).

Template syntax (a ``string.Template`` that only knows braced lower-case names):
- ``${name}`` is filled in by parcel_hpc. Every other ``$`` (``$0``, ``$VAR``, ``${SLURM_JOB_ID}``,
  ``$(...)``) is left to the shell, so a template reads as the bash it becomes.
- In an ``#SBATCH`` line a value goes in as it is: it was validated to a charset that sbatch's
  directive parser cannot misread (no whitespace, quotes, backslash or ``#``). In any other line it
  goes through ``shlex.quote``, so don't put a placeholder inside shell quotes.
- A line with an optional field that is empty (no partition, account, qos or error file) is dropped
  whole. Such a line must hold no other field, so dropping it cannot lose anything else.
- A name that is not a field, or a field the template needs that was not set, raises UsageError.
  So does an optional value that was set but that the template never uses. Otherwise it would be
  dropped silently, e.g. an account given for a template that has no ``--account`` line.

Every rendered line comes from exactly one template line, and no value can hold a line break. So
rendering can never add an ``#SBATCH`` directive or a command.

Adding a template: write ``sbatch_templates/<name>.sbatch`` from the fields below. A value it needs
that no field has becomes a new ``SbatchValues`` field (default None or empty, validated in
``__post_init__``) plus an entry in ``_FIELDS``. The command that submits the job renders it, like
``scheduled_reconcile.py`` does; tests/test_sbatch.py then asks for golden values for the new template.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import string
import subprocess
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ParcelError, SchedulerUnavailable, UsageError
from .fsio import atomic_write_text

__all__ = [
    "SCRIPT_MODE",
    "TEMPLATES_DIR",
    "SbatchValues",
    "format_time_limit",
    "parse_sbatch_output",
    "render",
    "submit",
    "submit_argv",
    "write_script",
]

# The templates sit next to the package in the source tree, where an admin reviews them.
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "sbatch_templates"
# Not executable: sbatch reads the file, it never execs it. A script that cannot be started with
# ./name.sbatch cannot run its job on a login node by accident.
SCRIPT_MODE = 0o644

MAX_NAME = 64  # characters in a job, partition, account or qos name
MAX_PATH = 1024  # characters in a path (Linux allows 4096; ours are short)
MAX_TIME_MIN = 366 * 24 * 60  # a year and a day: anything longer is a typo
MAX_CPUS = 1024  # per task
MAX_EVERY_MIN = 31 * 24 * 60  # reconcile at least monthly

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NAME_FIX = f"use 1-{MAX_NAME} characters from A-Z a-z 0-9 . _ - starting with a letter or digit"
_PATH_RE = re.compile(r"/[A-Za-z0-9._/+,@=-]*")
_LOG_PATH_RE = re.compile(r"/[A-Za-z0-9._/+,@=%-]*")  # %j, %x, %A, %a: sbatch's file name patterns
_PATH_FIX = "give an absolute, normalised path of letters, digits and . _ / + , @ = - (a symlink with such a name works)"
_DIGEST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]*")
_GRES_RE = re.compile(r"gpu(:[a-z0-9_]{1,32})?:[1-9][0-9]{0,2}")
_MEM_RE = re.compile(r"[1-9][0-9]{0,6}[KMGT]?")
# What a rendered #SBATCH value may be made of; the validators above only ever produce this.
_HEADER_SAFE_RE = re.compile(r"[A-Za-z0-9._/+,@=%:-]+")


def _show(value: object) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:56] + "...'"


def _bad(field: str, value: object, problem: str, fix: str) -> UsageError:
    return UsageError(f"sbatch value {field}={_show(value)} {problem}; {fix}")


def _check_text(field: str, value: object, max_len: int) -> str:
    """The checks every string gets: type, no line break or control char, no #SBATCH, length."""
    if not isinstance(value, str):
        raise _bad(field, value, f"is a {type(value).__name__}, not a string", "pass a str")
    for ch in value:
        if unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp") or (ch.isspace() and ch != " "):
            raise _bad(field, value, f"contains the control or line-break character {ch!r}", "remove it")
    if "#SBATCH" in value.upper():
        raise _bad(field, value, "contains '#SBATCH'", "remove it: a value can never carry a directive")
    if len(value) > max_len:
        raise _bad(field, value, f"is {len(value)} characters long", f"keep it to {max_len}")
    return value


def _check_name(field: str, value: object, *, optional: bool = False) -> str:
    text = _check_text(field, value, MAX_NAME)
    if optional and text == "":
        return text
    if not _NAME_RE.fullmatch(text):
        raise _bad(field, value, "is not a safe name", _NAME_FIX)
    return text


def _check_path(field: str, value: object, *, log: bool = False, optional: bool = False) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    text = _check_text(field, value, MAX_PATH)
    if optional and text == "":
        return text
    if not text.startswith("/"):
        raise _bad(field, value, "is not an absolute path", _PATH_FIX)
    if not (_LOG_PATH_RE if log else _PATH_RE).fullmatch(text):
        allowed = "; sbatch's %j-style patterns are allowed" if log else ""
        raise _bad(field, value, "holds whitespace or a shell character", _PATH_FIX + allowed)
    if os.path.normpath(text) != text or text.startswith("//"):
        raise _bad(field, value, "is not normalised (//, /./, /../ or a trailing /)", f"use {_show(os.path.normpath(text))}")
    return text


def _check_int(field: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int:  # bool is an int subclass and True would render as "True"
        raise _bad(field, value, f"is a {type(value).__name__}, not an int", f"pass a whole number in {lo}..{hi}")
    if not lo <= value <= hi:
        raise _bad(field, value, "is out of range", f"pass a whole number in {lo}..{hi}")
    return value


def format_time_limit(minutes: int) -> str:
    """Minutes as Slurm's ``[D-]HH:MM:SS`` (``90`` -> ``01:30:00``, ``1500`` -> ``1-01:00:00``)."""
    minutes = _check_int("time_limit_min", minutes, 1, MAX_TIME_MIN)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    hms = f"{hours:02d}:{mins:02d}:00"
    return f"{days}-{hms}" if days else hms


@dataclass(frozen=True)
class SbatchValues:
    """Everything a template can ask for. Optional fields default to empty, which drops their line."""

    job_name: str  # --job-name; also what scancel --name finds
    time_limit_min: int  # --time, in minutes
    output: str  # --output, absolute; %j-style patterns allowed
    python: str  # absolute path of the interpreter that has parcel_hpc (the search's venv)
    search_dir: str  # absolute path of the search directory
    search_revision: str  # the search's revision, recorded in --comment
    contract_digest: str  # the frozen contract's digest, recorded in --comment
    mem: str = "4G"  # --mem per node: digits and an optional K/M/G/T (Slurm's default unit is M)
    cpus_per_task: int = 1  # --cpus-per-task
    partition: str = ""  # --partition (a Slurm partition, not the data split); empty: the cluster's default
    account: str = ""  # --account; empty drops the line (the user's default account)
    qos: str = ""  # --qos; empty drops the line
    error: str = ""  # --error, absolute; empty drops the line and stderr joins --output
    reconcile_every_min: int | None = None  # reconcile.sbatch: minutes between runs; 0 = cron drives it
    gres: str = ""  # --gres, like gpu:1; empty drops the line
    selection: int | None = None  # winner_rerun / final_eval: the selection number the job works on

    def __post_init__(self) -> None:
        fix = object.__setattr__
        _check_name("job_name", self.job_name)
        for name in ("partition", "account", "qos"):
            _check_name(name, getattr(self, name), optional=True)
        _check_name("search_revision", self.search_revision)
        digest = _check_text("contract_digest", self.contract_digest, 128)
        if not _DIGEST_RE.fullmatch(digest):
            raise _bad("contract_digest", digest, "is not a digest", "pass the contract's digest, e.g. 'sha256:0a1b...'")
        fix(self, "output", _check_path("output", self.output, log=True))
        fix(self, "error", _check_path("error", self.error, log=True, optional=True))
        fix(self, "python", _check_path("python", self.python))
        fix(self, "search_dir", _check_path("search_dir", self.search_dir))
        format_time_limit(self.time_limit_min)
        mem = _check_text("mem", self.mem, 16)
        if not _MEM_RE.fullmatch(mem):
            raise _bad("mem", mem, "is not a Slurm memory size", "use digits and an optional unit K, M, G or T, like '4G'")
        _check_int("cpus_per_task", self.cpus_per_task, 1, MAX_CPUS)
        if self.reconcile_every_min is not None:
            _check_int("reconcile_every_min", self.reconcile_every_min, 0, MAX_EVERY_MIN)
        if self.gres and not _GRES_RE.fullmatch(_check_text("gres", self.gres, 64)):
            raise _bad("gres", self.gres, "is not a GPU request", "use gpu:N or gpu:TYPE:N, like 'gpu:1' or 'gpu:a100:2'")
        if self.selection is not None:
            _check_int("selection", self.selection, 1, 100_000)


# ---------------------------------------------------------------- placeholders


@dataclass(frozen=True)
class _Field:
    text: Callable[[SbatchValues], str | None]  # None: not set; "": empty
    source: str  # the SbatchValues field it comes from
    optional: bool = False  # empty drops its line


def _plain(name: str, optional: bool = False) -> _Field:
    return _Field(lambda v: getattr(v, name), name, optional)


_FIELDS: dict[str, _Field] = {
    **{n: _plain(n) for n in ("job_name", "mem", "output", "python", "search_dir", "search_revision", "contract_digest")},
    **{n: _plain(n, optional=True) for n in ("partition", "account", "qos", "error", "gres")},
    "cpus_per_task": _Field(lambda v: str(v.cpus_per_task), "cpus_per_task"),
    "time_limit": _Field(lambda v: format_time_limit(v.time_limit_min), "time_limit_min"),
    "reconcile_every_min": _Field(lambda v: None if v.reconcile_every_min is None else str(v.reconcile_every_min), "reconcile_every_min"),
    "selection": _Field(lambda v: None if v.selection is None else str(v.selection), "selection"),
}


class _Template(string.Template):
    # Only ${lower_snake} is ours; $0, $VAR, ${VAR} and $(...) stay for the shell. flags=0 keeps
    # string.Template from matching case-insensitively, which would steal ${SLURM_JOB_ID}.
    flags = 0
    pattern = r"""
    \$(?:
      (?P<escaped>(?!)) |
      (?P<named>(?!)) |
      \{(?P<braced>[a-z][a-z0-9_]*)\} |
      (?P<invalid>(?!))
    )
    """


@dataclass(frozen=True)
class _Line:
    text: str
    header: bool  # an #SBATCH directive
    names: tuple[str, ...]  # the placeholders in it


@dataclass(frozen=True)
class _Parsed:
    name: str
    lines: tuple[_Line, ...]

    @property
    def header_count(self) -> int:
        return sum(line.header for line in self.lines)

    @property
    def sources(self) -> frozenset[str]:
        return frozenset(_FIELDS[n].source for line in self.lines for n in line.names)


def _template_path(template_name: str, templates_dir: Path | None) -> Path:
    stem = template_name.removesuffix(".sbatch")
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", stem):
        raise UsageError(f"template name {_show(template_name)} is not a template; use a file name from sbatch_templates/ like 'reconcile'")
    path = (templates_dir or TEMPLATES_DIR) / f"{stem}.sbatch"
    if not path.is_file():
        known = sorted(p.stem for p in (templates_dir or TEMPLATES_DIR).glob("*.sbatch"))
        raise UsageError(f"template {stem!r} does not exist in {path.parent}; use one of {known}")
    return path


def _parse(path: Path) -> _Parsed:
    """Read a template and check its shape; every problem names the file and line."""
    text = path.read_text(encoding="utf-8")
    where = f"template {path.name}"
    if not text.startswith("#!") or not text.endswith("\n"):
        raise UsageError(f"{where} must start with '#!' and end with a newline; fix the file")
    lines: list[_Line] = []
    in_header = True
    for no, raw in enumerate(text[:-1].split("\n"), start=1):
        if any(unicodedata.category(ch)[0] == "C" and ch != "\t" for ch in raw):
            raise UsageError(f"{where} line {no} holds a control character; remove it")
        stripped = raw.strip()
        header = raw.startswith("#SBATCH")
        if stripped and not stripped.startswith("#"):
            in_header = False
        elif header and not in_header:
            # sbatch stops reading directives at the first command; this one would be ignored.
            raise UsageError(f"{where} line {no}: #SBATCH after the first command is ignored by sbatch; move it up")
        if "#SBATCH" in stripped.upper() and not header:
            raise UsageError(f"{where} line {no}: write directives as '#SBATCH --option' at the start of the line")
        names = tuple(m["braced"] for m in _Template.pattern.finditer(raw) if m["braced"])
        for n in names:
            if n not in _FIELDS:
                raise UsageError(f"{where} line {no} uses ${{{n}}}, which is not a field; use one of {sorted(_FIELDS)}")
            if _FIELDS[n].optional and len(set(names)) > 1:
                raise UsageError(f"{where} line {no} mixes optional ${{{n}}} with other fields; put it on a line of its own")
        lines.append(_Line(raw, header, names))
    return _Parsed(path.name, tuple(lines))


def _unused_values(parsed: _Parsed, values: SbatchValues) -> None:
    for f in dataclasses.fields(values):
        if f.default is dataclasses.MISSING or f.name in parsed.sources:
            continue
        if getattr(values, f.name) != f.default:
            raise UsageError(
                f"{parsed.name} does not use {f.name}, so {f.name}={_show(getattr(values, f.name))} would be ignored; "
                f"leave it at {f.default!r} for this template"
            )


def render(template_name: str, values: SbatchValues, *, templates_dir: Path | None = None) -> str:
    """The script text: each template line filled in, or dropped for an empty optional field."""
    if not isinstance(values, SbatchValues):
        raise UsageError(f"render needs SbatchValues, not {type(values).__name__}; build SbatchValues(...) first")
    parsed = _parse(_template_path(template_name, templates_dir))
    _unused_values(parsed, values)
    out: list[str] = []
    for no, line in enumerate(parsed.lines, start=1):
        filled: dict[str, str] = {}
        for n in line.names:
            field = _FIELDS[n]
            text = field.text(values)
            if text is None:
                raise UsageError(f"{parsed.name} line {no} needs {field.source}, which is not set; set it in SbatchValues")
            if text == "" and field.optional:
                break  # the whole line goes: an empty --account= would be an error, not a default
            if line.header:
                if not _HEADER_SAFE_RE.fullmatch(text):
                    raise ParcelError(f"bug: {field.source} rendered {_show(text)} into an #SBATCH line")
                filled[n] = text
            else:
                filled[n] = shlex.quote(text)
        else:
            out.append(_Template(line.text).substitute(filled))
    script = "\n".join(out) + "\n"
    _check_rendered(parsed, script)
    return script


def _check_rendered(parsed: _Parsed, script: str) -> None:
    """A second line of defence behind validation: the structure is the template's."""
    lines = script[:-1].split("\n")
    directives = sum(line.startswith("#SBATCH") for line in lines)
    if any(ch in script for ch in "\r\0") or len(lines) > len(parsed.lines) or directives > parsed.header_count:
        raise ParcelError(f"bug: rendering {parsed.name} changed its line structure; refusing to write it")


def write_script(path: str | os.PathLike, text: str) -> Path:
    """Write a rendered script atomically, mode 0o644 (see SCRIPT_MODE for why not executable)."""
    path = Path(_check_path("script path", path))
    if not text.startswith("#!") or not text.endswith("\n") or "\0" in text or "\r" in text:
        raise UsageError(f"refusing to write {path}: the text is not a rendered script; pass the output of render()")
    atomic_write_text(path, text, mode=SCRIPT_MODE)
    return path


# ---------------------------------------------------------------- sbatch


def submit_argv(script_path: str | os.PathLike) -> list[str]:
    """``sbatch --parsable SCRIPT``; options stay in the reviewed script, not on the command line."""
    return ["sbatch", "--parsable", _check_path("script path", script_path)]


_JOB_ID_RE = re.compile(r"(?:Submitted batch job )?(?P<id>[0-9]+)(?:;[A-Za-z0-9._-]+| on cluster [A-Za-z0-9._-]+)?")
# sbatch's words for "the controller (or munge, or the config) could not be reached": retry later.
_UNAVAILABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted",
    "temporarily unable to accept job",
    "dns srv lookup failed",
    "could not establish a configuration source",
    "munge encode failed",
    "unable to establish controller",
)


def parse_sbatch_output(text: str) -> str:
    """The job id from sbatch's output: ``--parsable`` gives ``ID`` or ``ID;CLUSTER``, plain gives
    ``Submitted batch job ID``. Warnings are skipped; error text raises (SchedulerUnavailable when
    Slurm could not be reached, UsageError when it refused the job)."""
    ids: list[str] = []
    errors: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("sbatch: warning:"):
            continue
        m = _JOB_ID_RE.fullmatch(line)
        if m:
            ids.append(m["id"])
        else:
            errors.append(line)
    if len(ids) == 1:
        return ids[0]  # the job exists, whatever else was printed
    if len(ids) > 1:
        raise UsageError(f"sbatch printed more than one job id ({', '.join(ids)}); submit one script per call")
    detail = " | ".join(errors)[:300] or "nothing"
    if any(marker in detail.lower() for marker in _UNAVAILABLE):
        raise SchedulerUnavailable(f"sbatch could not reach Slurm: {detail}; check SLURM_CONF and that slurmctld is up, then submit again")
    raise UsageError(f"sbatch did not submit the job: {detail}; fix the script's #SBATCH values and render it again")


def submit(script_path: str | os.PathLike, *, env: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> str:
    """Run ``sbatch --parsable`` on a written script and return the job id (the side-effect edge)."""
    argv = submit_argv(script_path)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=None if env is None else dict(env), timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SchedulerUnavailable("sbatch is not on PATH; run this where the Slurm client is installed") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailable(f"sbatch did not answer within {timeout_s:g} s; check slurmctld, then submit again") from None
    if proc.returncode != 0:
        job_id = parse_sbatch_output(proc.stderr + "\n" + proc.stdout)  # raises on any error text
        raise UsageError(f"sbatch exited {proc.returncode} yet printed job id {job_id}; check squeue before submitting again")
    return parse_sbatch_output(proc.stdout)

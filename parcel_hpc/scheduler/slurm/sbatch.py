"""Batch scripts parcel_hpc renders itself, and the one ``sbatch`` shell-out around them.

Owns: the values that fill ``sbatch_templates/*.sbatch`` at the top of the repository (``SbatchValues``, validated at birth),
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
``scheduled.py`` does; tests/test_sbatch.py then asks for golden values for the new template.
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
from importlib import resources
from pathlib import Path
from typing import cast

from parcel_hpc.errors import ParcelError, SchedulerUnavailable, UsageError
from parcel_hpc.fsio import atomic_write_text
from parcel_hpc.governance import validation as check
from parcel_hpc.scheduler.slurm.calls import count

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

# The templates are package data: sbatch_templates/ at the top of the repository, where an admin reviews them,
# installed as parcel_hpc.scheduler.slurm.templates.
TEMPLATES_DIR = Path(str(resources.files("parcel_hpc.scheduler.slurm.templates")))
# Not executable: sbatch reads the file, it never execs it. A script that cannot be started with
# ./name.sbatch cannot run its job on a login node by accident.
SCRIPT_MODE = 0o644

MAX_CPUS = 1024  # per task
MAX_NODES = 100_000  # a job's nodes: above any cluster's
MAX_EVERY_MIN = 31 * 24 * 60  # reconcile at least monthly

MAX_RENDERED_JOB_NAME = 128  # a revision-derived name plus the search id: sacct and squeue filter on all of it
_SEARCH_ID_RE = re.compile(r"[0-9a-f]{32}|none")
_DIGEST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]*")
_GRES_RE = re.compile(r"gpu(:[a-z0-9_]{1,32})?:[1-9][0-9]{0,2}")
_MEM_RE = re.compile(r"[1-9][0-9]{0,6}[KMGT]?")


def format_time_limit(minutes: int) -> str:
    """Minutes as Slurm's ``[D-]HH:MM:SS`` (``90`` -> ``01:30:00``, ``1500`` -> ``1-01:00:00``)."""
    minutes = check.whole("time_limit_min", minutes, 1, check.MAX_TIME_MIN)
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
    search_id: str  # the search's id (identity.py), recorded in --comment; "none" for a search frozen before ids
    mem: str = "4G"  # --mem per node: digits and an optional K/M/G/T (Slurm's default unit is M)
    cpus_per_task: int = 1  # --cpus-per-task
    nodes: int = 1  # --nodes (winner_rerun: a gang's rerun runs as a gang of the winner's own shape)
    tasks_per_node: int = 1  # --ntasks-per-node: one task a rank
    partition: str = ""  # --partition (a Slurm partition, not the data split); empty: the cluster's default
    account: str = ""  # --account; empty drops the line (the user's default account)
    qos: str = ""  # --qos; empty drops the line
    error: str = ""  # --error, absolute; empty drops the line and stderr joins --output
    reconcile_every_min: int | None = None  # reconcile.sbatch: minutes between runs; 0 = cron drives it
    gres: str = ""  # --gres, like gpu:1; empty drops the line
    selection: int | None = None  # winner_rerun / final_eval: the selection number the job works on
    search_uid: int | None = None  # winner_rerun / final_eval: who owns the search directory (anchor.Owned), checked by the job first
    search_inode: int | None = None  # and which directory it is: a directory swapped under its name has another

    def __post_init__(self) -> None:
        fix = object.__setattr__
        check.name("job_name", self.job_name, max_len=MAX_RENDERED_JOB_NAME)
        if not _SEARCH_ID_RE.fullmatch(check.text("search_id", self.search_id, 32)):
            raise check.bad("search_id", self.search_id, "is not a search id", "pass SearchDir.identity().search_id, or 'none' for a search without one")
        for name in ("partition", "account", "qos"):
            check.name(name, getattr(self, name), optional=True)
        check.name("search_revision", self.search_revision)
        digest = check.text("contract_digest", self.contract_digest, 128)
        if not _DIGEST_RE.fullmatch(digest):
            raise check.bad("contract_digest", digest, "is not a digest", "pass the contract's digest, e.g. 'sha256:0a1b...'")
        fix(self, "output", check.abs_path("output", self.output, patterns=True))
        fix(self, "error", check.abs_path("error", self.error, patterns=True) if self.error else "")
        fix(self, "python", check.abs_path("python", self.python))
        fix(self, "search_dir", check.abs_path("search_dir", self.search_dir))
        format_time_limit(self.time_limit_min)
        mem = check.text("mem", self.mem, 16)
        if not _MEM_RE.fullmatch(mem):
            raise check.bad("mem", mem, "is not a Slurm memory size", "use digits and an optional unit K, M, G or T, like '4G'")
        check.whole("cpus_per_task", self.cpus_per_task, 1, MAX_CPUS)
        check.whole("nodes", self.nodes, 1, MAX_NODES)
        check.whole("tasks_per_node", self.tasks_per_node, 1, MAX_CPUS)
        if self.reconcile_every_min is not None:
            check.whole("reconcile_every_min", self.reconcile_every_min, 0, MAX_EVERY_MIN)
        if self.gres and not _GRES_RE.fullmatch(check.text("gres", self.gres, 64)):
            raise check.bad("gres", self.gres, "is not a GPU request", "use gpu:N or gpu:TYPE:N, like 'gpu:1' or 'gpu:a100:2'")
        if self.selection is not None:
            check.whole("selection", self.selection, 1, 100_000)
        for name in ("search_uid", "search_inode"):
            if getattr(self, name) is not None:
                check.whole(name, getattr(self, name), 0, 2**64 - 1)


# ---------------------------------------------------------------- placeholders


@dataclass(frozen=True)
class _Field:
    text: Callable[[SbatchValues], str | None]  # None: not set; "": empty
    source: str  # the SbatchValues field it comes from
    optional: bool = False  # empty drops its line


def _plain(name: str, optional: bool = False) -> _Field:
    return _Field(lambda v: getattr(v, name), name, optional)


def _number(name: str) -> _Field:
    return _Field(lambda v: str(getattr(v, name)), name)


_FIELDS: dict[str, _Field] = {
    **{n: _plain(n) for n in ("job_name", "mem", "output", "python", "search_dir", "search_revision", "contract_digest", "search_id")},
    **{n: _plain(n, optional=True) for n in ("partition", "account", "qos", "error", "gres")},
    **{n: _number(n) for n in ("cpus_per_task", "nodes", "tasks_per_node")},
    "time_limit": _Field(lambda v: format_time_limit(v.time_limit_min), "time_limit_min"),
    "reconcile_every_min": _Field(lambda v: None if v.reconcile_every_min is None else str(v.reconcile_every_min), "reconcile_every_min"),
    "selection": _Field(lambda v: None if v.selection is None else str(v.selection), "selection"),
    "search_uid": _Field(lambda v: None if v.search_uid is None else str(v.search_uid), "search_uid"),
    "search_inode": _Field(lambda v: None if v.search_inode is None else str(v.search_inode), "search_inode"),
}


class _Template(string.Template):
    # Only ${lower_snake} is ours; $0, $VAR, ${VAR} and $(...) stay for the shell. flags=0 keeps
    # string.Template from matching case-insensitively, which would steal ${SLURM_JOB_ID}.
    # Template.__init_subclass__ compiles ``pattern`` (hence the cast); typeshed types only the result.
    flags = 0  # type: ignore[assignment]  # typeshed wants a RegexFlag; Template only ORs it into re.compile's flags
    pattern = cast(
        re.Pattern[str],
        r"""
    \$(?:
      (?P<escaped>(?!)) |
      (?P<named>(?!)) |
      \{(?P<braced>[a-z][a-z0-9_]*)\} |
      (?P<invalid>(?!))
    )
    """,
    )


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
        raise UsageError(
            f"template name {check.show(template_name)} is not a template; use a file name from parcel_hpc/scheduler/slurm/templates/ like 'reconcile'"
        )
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
                f"{parsed.name} does not use {f.name}, so {f.name}={check.show(getattr(values, f.name))} would be ignored; "
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
                if not check.HEADER_SAFE_RE.fullmatch(text):
                    raise ParcelError(f"bug: {field.source} rendered {check.show(text)} into an #SBATCH line")
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
    path = Path(check.abs_path("script path", path))
    if not text.startswith("#!") or not text.endswith("\n") or "\0" in text or "\r" in text:
        raise UsageError(f"refusing to write {path}: the text is not a rendered script; pass the output of render()")
    atomic_write_text(path, text, mode=SCRIPT_MODE)
    return path


# ---------------------------------------------------------------- sbatch


def submit_argv(script_path: str | os.PathLike) -> list[str]:
    """``sbatch --parsable SCRIPT``; options stay in the reviewed script, not on the command line."""
    return ["sbatch", "--parsable", check.abs_path("script path", script_path)]


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
        count("sbatch")
        proc = subprocess.run(argv, capture_output=True, text=True, env=None if env is None else dict(env), timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SchedulerUnavailable("sbatch is not on PATH; run this where the Slurm client is installed") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailable(f"sbatch did not answer within {timeout_s:g} s; check slurmctld, then submit again") from None
    if proc.returncode != 0:
        job_id = parse_sbatch_output(proc.stderr + "\n" + proc.stdout)  # raises on any error text
        raise UsageError(f"sbatch exited {proc.returncode} yet printed job id {job_id}; check squeue before submitting again")
    return parse_sbatch_output(proc.stdout)

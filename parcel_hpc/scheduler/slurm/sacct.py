"""The sacct shell-out: the field list we export, the argv we build, and the one place that runs it.

Owns: ``SACCT_FIELDS`` (the on-the-wire format every parser and recorded sample agrees on; a
version's per-run columns may follow it: ``version.PER_RUN_FIELDS``), ``build_sacct_argv`` (pure),
``run_sacct`` and ``installed_version`` (the only subprocesses: the version is read once a process). Must not: parse the text
(that is ``parcel_hpc.scheduler.slurm.sacct_parse``), retry, or return a partial answer — a sacct that
fails, times out or complains on stderr raises AccountingError.

Times: sacct prints local wall-clock times without a zone, so ``run_sacct`` runs it with
``TZ=UTC`` and ``SLURM_TIME_FORMAT=standard``; ``parse_sacct`` assumes UTC by default. An
exported dump from elsewhere is parsed with the zone it was written in (``tz=``).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from functools import cache

from parcel_hpc.errors import AccountingError, UsageError
from parcel_hpc.scheduler.slurm.calls import count
from parcel_hpc.scheduler.slurm.version import SlurmVersion
from parcel_hpc.scheduler.states import JobState

# Every name was checked against Debian's slurm-client 22.05.8 sacct binary (its --helpformat
# table). "Restarts" is NOT one: the requeue history comes from --duplicates instead.
SACCT_FIELDS: tuple[str, ...] = (
    "JobID",  # as submitted: 12, 12.batch, 29_3, 29_3.extern, 29_[4-9%2]
    "JobIDRaw",  # SLURM's unique id; the array's last task carries the master id here
    "JobName",
    "State",  # one word, or "CANCELLED by <uid>"
    "ExitCode",  # "<status>:<signal>"; statuses above 128 are stored modulo 128 in 22.05
    "Submit",  # ISO local time (UTC under run_sacct), or Unknown
    "Start",
    "End",
    "ElapsedRaw",  # seconds
    "AllocTRES",  # billing=11,cpu=1,gres/gpu=1,mem=100M,node=1 (empty while pending)
    "NodeList",
    "Partition",
    "Account",
    "QOS",
    "User",
    "Reason",
)
SACCT_FORMAT = ",".join(SACCT_FIELDS)
DEFAULT_TIMEOUT_S = 120.0

_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")
# Names and accounts go into one argv element; sacct splits them on commas.
_NAME = re.compile(r"^[^,\s|]+$")

__all__ = [
    "SACCT_FIELDS",
    "SACCT_FORMAT",
    "DEFAULT_TIMEOUT_S",
    "JobState",
    "build_sacct_argv",
    "installed_version",
    "run_sacct",
]


def build_sacct_argv(
    job_ids: Iterable[int | str],
    *,
    since: _dt.datetime | int | None = None,
    name: str | None = None,
    account: str | None = None,
    all_users: bool = False,
    truncate: bool = False,
    version: SlurmVersion | None = None,
) -> list[str]:
    """The sacct command line for these jobs, every array task and every requeued run.

    With no job ids, lists every job named ``name`` and/or charged to ``account`` since
    ``since`` (required then: without -S sacct silently starts at today's midnight) — how
    ``reconcile`` finds orphans the ledger does not know. ``since`` is an aware datetime or
    epoch seconds; it is written in UTC, matching the ``TZ=UTC`` that ``run_sacct`` sets.
    ``all_users``: every user's jobs (sacct otherwise lists only the caller's, root's excepted).
    ``truncate``: a job that straddles ``since`` counts only its time after it (a month's report
    does not count again what the last month's counted).
    ``version``: the Slurm that answers, whose per-run columns (SLUID, Restarts on 26.05) follow
    SACCT_FIELDS; None asks for SACCT_FIELDS alone, which every version prints alike.
    """
    ids = _job_id_list(job_ids)
    if not ids and name is None and account is None:
        raise UsageError("build_sacct_argv needs job ids, or a name/account to list jobs by; got none")
    if not ids and since is None:
        raise UsageError(
            "listing jobs by name/account needs since= (sacct would otherwise start at today's midnight and miss older jobs); pass the search's creation time"
        )
    # Steps (.batch/.extern/.0) are kept: the batch step's exit code explains a FAILED job.
    fields = SACCT_FORMAT if version is None or not version.per_run_fields else ",".join(SACCT_FIELDS + version.per_run_fields)
    argv = ["sacct", "--parsable2", "--noheader", "--duplicates", f"--format={fields}"]
    if since is not None:
        argv.append(f"--starttime={_slurm_time(since)}")
        # With -S, sacct's default end is "now"; say it so a dump is reproducible from its argv.
        argv.append("--endtime=now")
    if name is not None:
        argv.append(f"--name={_checked_name('name', name)}")
    if account is not None:
        argv.append(f"--accounts={_checked_name('account', account)}")
    if all_users:
        argv.append("--allusers")  # an admin's report: every user's jobs, not only the caller's
    if truncate:
        argv.append("--truncate")
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    return argv


def run_sacct(
    argv: list[str],
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> bytes:
    """Run sacct and return its stdout bytes, or raise AccountingError (never a partial answer).

    ``env`` defaults to this process's environment (it must carry SLURM_CONF on a dev cluster);
    TZ and SLURM_TIME_FORMAT are always overridden so the times parse as UTC ISO.
    """
    if not argv:
        raise UsageError("run_sacct needs an argv; build one with build_sacct_argv")
    run_env = dict(os.environ if env is None else env)
    run_env["TZ"] = "UTC"
    run_env["SLURM_TIME_FORMAT"] = "standard"
    count("sacct")
    try:
        proc = subprocess.run(
            argv,
            env=run_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise AccountingError(
            f"{argv[0]!r} not found on PATH; install slurm-client on this host, or export the accounting elsewhere and pass it with --sacct-file"
        ) from None
    except PermissionError:
        raise AccountingError(f"{argv[0]!r} is not executable; fix its permissions or PATH") from None
    except subprocess.TimeoutExpired:
        raise AccountingError(
            f"sacct did not answer within {timeout:g}s (slurmdbd slow or down?); retry later or pass an exported dump with --sacct-file"
        ) from None
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise AccountingError(
            f"sacct exited {proc.returncode}: {_first_error(stderr)}; check SLURM_CONF and that "
            "slurmdbd is up (sacctmgr show cluster), or pass an exported dump with --sacct-file"
        )
    # sacct sometimes reports a database problem on stderr and still exits 0 with an empty or
    # short answer; an accounting tool must not take that for "no jobs".
    if "error:" in stderr:
        raise AccountingError(
            f"sacct reported an error and exited 0: {_first_error(stderr)}; the answer may be partial, so nothing was read — fix the error above and rerun"
        )
    return proc.stdout


@cache
def installed_version() -> SlurmVersion:
    """The version of the sacct on PATH (which must reach the cluster: SLURM_CONF), read once a process."""
    try:
        proc = subprocess.run(["sacct", "--version"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEFAULT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AccountingError(f"sacct --version failed ({exc}); install slurm-client on this host and check SLURM_CONF") from None
    if proc.returncode != 0:
        raise AccountingError(f"sacct --version exited {proc.returncode}: {_first_error(proc.stderr)}; check SLURM_CONF")
    return SlurmVersion.parse(proc.stdout)


def _job_id_list(job_ids: Iterable[int | str]) -> list[str]:
    if isinstance(job_ids, (str, bytes, int)):
        raise UsageError(f"job_ids must be a collection of ids, got the single value {job_ids!r}")
    seen: dict[str, None] = {}
    for raw in job_ids:
        text = str(raw).strip() if isinstance(raw, str) else str(raw)
        if isinstance(raw, bool) or not _JOB_ID.match(text):
            raise UsageError(f"bad SLURM job id {raw!r}; expected 12, 29_3 or 12+0 as sbatch/submitit print them")
        seen.setdefault(text, None)
    return list(seen)


def _checked_name(what: str, value: str) -> str:
    if not _NAME.match(value):
        raise UsageError(f"bad {what} {value!r} for sacct: it must be non-empty, without commas, spaces or '|'")
    return value


def _slurm_time(since: _dt.datetime | int) -> str:
    if isinstance(since, bool):
        raise UsageError(f"since must be an aware datetime or epoch seconds, got {since!r}")
    if isinstance(since, int):
        moment = _dt.datetime.fromtimestamp(since, _dt.UTC)
    elif isinstance(since, _dt.datetime):
        if since.tzinfo is None or since.utcoffset() is None:
            raise UsageError(
                f"since={since.isoformat()} has no time zone; pass an aware datetime (e.g. datetime.now(timezone.utc)) so sacct's window is not off by hours"
            )
        moment = since.astimezone(_dt.UTC)
    else:
        raise UsageError(f"since must be an aware datetime or epoch seconds, got {type(since).__name__}")
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return "(nothing on stderr)"
    # sacct prints a chain of errors; the last one ("Problem talking to the database: ...") says why.
    errors = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()]
    return (errors or lines)[-1]

"""What the tasks of a job's steps used, as Slurm's accounting measured them (issue 50): a gang's ranks
run as the tasks of one srun step, and slurmd's accounting (``JobAcctGatherType``) samples every task.
sacct keeps, per step, the totals over its tasks (``TotalCPU``: user + system time, exact at the end;
``TRESUsageInTot``), the busiest task's figure and which task and node it was (``TRESUsageInMax``,
``...MaxTask``, ``...MaxNode``): not every task's. GPU use is not read here (a cluster's gpu gather
plugin is optional): each rank's own NVML reading is (``DeviceUse.rank_utilization``).

Owns: the step query's fields and parsing (pure; ``build_steps_argv``, ``parse_steps``).
Must not: decide what a step's figures mean for a trial (``accounting/ranks.py`` does).
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Mapping

from parcel_hpc.errors import AccountingError
from parcel_hpc.scheduler.runs import StepUsage

STEP_FIELDS = (
    "JobID",  # 12.0, 12.batch, 29_3.extern; an allocation row has no step (skipped)
    "Start",
    "NNodes",
    "NTasks",
    "NodeList",
    "ElapsedRaw",
    "TotalCPU",  # [DD-][HH:]MM:SS[.mmm]
    "TRESUsageInTot",  # cpu=00:00:08,mem=54894592,... (bytes under --noconvert)
    "TRESUsageInMax",
    "TRESUsageInMaxNode",  # cpu=n2,mem=n2,...
    "TRESUsageInMaxTask",  # cpu=3,mem=3,...: the task (rank) of the step
)
_SERVICE_STEPS = ("batch", "extern", "interactive")  # the job script's shell, the node's sentinel: no rank runs in them
_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def build_steps_argv(job_ids: Iterable[str]) -> list[str]:
    """The sacct command for every step of every run of these jobs (times in UTC under ``run_sacct``)."""
    ids = sorted(set(job_ids))
    if not ids:
        raise ValueError("build_steps_argv needs job ids")
    return ["sacct", "--parsable2", "--noheader", "--duplicates", "--noconvert", f"--format={','.join(STEP_FIELDS)}", f"--jobs={','.join(ids)}"]


def parse_steps(text: str, source: str = "sacct") -> list[StepUsage]:
    """The steps in which a job's own tasks ran (not its batch or extern step), in sacct's order; a
    line that is not sacct's is an ``AccountingError`` naming it (never a partial answer)."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) != len(STEP_FIELDS):
            raise AccountingError(f"{source}:{number}: {len(cells)} fields, not the {len(STEP_FIELDS)} asked for ({','.join(STEP_FIELDS)})")
        row = dict(zip(STEP_FIELDS, cells))
        job, _, step = row["JobID"].partition(".")
        if not step or step in _SERVICE_STEPS or row["Start"] in ("", "Unknown", "None"):
            continue
        try:
            out.append(_step(job, step, row))
        except ValueError as exc:
            raise AccountingError(f"{source}:{number}: {exc}") from None
    return out


def _step(job: str, step: str, row: Mapping[str, str]) -> StepUsage:
    total, peak = tres(row["TRESUsageInTot"]), tres(row["TRESUsageInMax"])
    max_node, max_task = tres(row["TRESUsageInMaxNode"]), tres(row["TRESUsageInMaxTask"])
    return StepUsage(
        job_id=job,
        step=step,
        start=int(_dt.datetime.fromisoformat(row["Start"]).replace(tzinfo=_dt.UTC).timestamp()),
        nodes=int(row["NNodes"] or 0),
        tasks=int(row["NTasks"] or 0),
        node_list=row["NodeList"],
        elapsed_s=int(row["ElapsedRaw"] or 0),
        cpu_s=cpu_seconds(row["TotalCPU"]) if row["TotalCPU"] else None,
        memory_bytes=_int(total.get("mem")),
        busiest_task=_int(max_task.get("cpu")),
        busiest_node=max_node.get("cpu", ""),
        busiest_cpu_s=cpu_seconds(peak["cpu"]) if peak.get("cpu") else None,
    )


def tres(text: str) -> dict[str, str]:
    """``cpu=00:00:08,mem=5489`` -> {"cpu": "00:00:08", "mem": "5489"}."""
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def cpu_seconds(text: str) -> float:
    """sacct's CPU time (``[DD-][HH:]MM:SS[.mmm]``) in seconds."""
    found = _TIME.match(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a CPU time ([DD-][HH:]MM:SS)")
    days, hours, minutes, seconds = found.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None

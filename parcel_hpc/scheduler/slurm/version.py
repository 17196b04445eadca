"""The Slurm version the SLURM backend talks to, and what differs in what each version prints.

Owns: ``SlurmVersion`` (parsed from ``sacct --version``) and the differences the backend reads by it:
exit statuses above 128 stored whole from 25.11 (``exit 137`` is ``137:0``; before, modulo 128: ``9:0``)
and the per-run ``SLUID`` and ``Restarts`` columns from 26.05. Must not: run anything (``sacct.py``
reads the installed version, once) or parse sacct's rows (``sacct_parse.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parcel_hpc.errors import AccountingError

# 26.05's per-run columns, after SACCT_FIELDS when asked for: SLUID is unique per run (a requeued
# job keeps its JobID), Restarts counts the requeues before the run.
PER_RUN_FIELDS: tuple[str, ...] = ("SLUID", "Restarts")
_VERSION = re.compile(r"\b(\d+)\.(\d+)(?:\.(\d+))?\b")


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int  # 22, 24, 26: the release year
    minor: int  # 05 or 11: the month
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """``slurm 22.05.8`` (sacct --version), ``slurm-wlm 24.11.5`` (slurmd -V) or ``26.05.5``."""
        m = _VERSION.search(text)
        if m is None:
            raise AccountingError(f"cannot read a Slurm version from {text.strip()!r}; sacct --version should print e.g. 'slurm 24.11.5'")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def stores_whole_exit_status(self) -> bool:
        """sacct's ExitCode status is the script's own above 128 (before 25.11: modulo 128)."""
        return (self.major, self.minor) >= (25, 11)

    @property
    def per_run_fields(self) -> tuple[str, ...]:
        """The per-run columns this version's sacct can add to SACCT_FIELDS."""
        return PER_RUN_FIELDS if (self.major, self.minor) >= (26, 5) else ()

"""Where a search's selection, its jobs' results, the final evaluation and the release live.

    <search>/final-plan.json                     the search revision's final evaluation plan, written when it froze
    <search>/final-claim.json                    the one final evaluation of this revision (exclusive); it fixes
                                                 the current selection for good
    <search>/trials/.final-claim.json            the same claim again, where moving it aside takes every trial along
    <search>/final-result.json                   its sealed result (exclusive)
    <search>/selection/journal-*.jsonl           the selection's typed events (ledger.selection)
    <search>/selection/selection-<n>.json        the n-th frozen completed list and its chosen trial (exclusive)
    <search>/selection/<n>/rerun/result.json     the rerun job's result (exclusive, written last): names its run
    <search>/selection/<n>/rerun/run-<id>/       one run of the rerun job: {winner,baseline}/ckpt-*.h5 (the selected
                                                 artifact and the baseline's), records/{rerun,baseline}/ (recorded like trials)
    <search>/selection/<n>/logs/                 the jobs' batch scripts and output
    <search>/release/packet.{json,md,html}       the release packet

Every record is created exclusively and never rewritten; readers never write. Owns paths, not decisions.
The final claim and result sit beside the contract, outside ``selection/``, and no command moves
them: moving ``selection/`` aside and selecting afresh finds the revision's final partition used.
The seal also holds against its owner moving files by hand, as far as files can: the claim is
written twice (beside the contract and inside ``trials/``, where moving it aside leaves no trial
to select) and the selection journal records every allowed final evaluation, and
``evaluate-final`` refuses when any of the three says the final partition was claimed. Only
removing all three (and then losing the search's trials) buys a second look; the files are the
owner's, so that much cannot be made impossible by files alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from parcel_hpc import fsio
from parcel_hpc.data.files import split_paths
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.contract import Contract, digest_of
from parcel_hpc.ledger import JobRole, SearchDir
from parcel_hpc.ledger.journal import writer_name
from parcel_hpc.ledger.selection import SelectionRecord, SelectionWriter, fold_selection, read_selection_events

FINAL_PLAN = "final-plan.json"
FINAL_CLAIM = "final-claim.json"
FINAL_RESULT = "final-result.json"
FINAL_PLAN_FORMAT = "parcel-final-plan/1"


def write_final_plan(search_dir: Path, contract: Contract, split_path: str | os.PathLike, final_digest: str) -> bool:
    """The revision's final evaluation plan, fixed when the search froze; False when it exists already."""
    plan = {
        "format": FINAL_PLAN_FORMAT,
        "search_revision": contract["search_revision"],
        "contract_digest": contract.digest,
        "split_revision": contract["split_revision"],
        "final_path": str(split_paths(Path(os.path.abspath(split_path)).parent, contract["split_revision"])[1]),
        "final_digest": final_digest,
        "metric": contract["metric"],
        "baseline": contract["selection"]["baseline"],
        "selection_revision": contract["selection"]["revision"],
    }
    return fsio.create_exclusive_json(Path(search_dir) / FINAL_PLAN, plan)


@dataclass(frozen=True)
class SelectionStore:
    search: SearchDir

    @property
    def dir(self) -> Path:
        return self.search.path / "selection"

    @property
    def release_dir(self) -> Path:
        return self.search.path / "release"

    def writer(self, role: str) -> SelectionWriter:
        return SelectionWriter(self.dir, role)

    def record(self) -> SelectionRecord:
        return fold_selection(read_selection_events(self.dir, within=self.search.path)) if self.dir.exists() else SelectionRecord()

    # --- the final evaluation plan --------------------------------------------------------------
    def final_plan(self) -> dict[str, Any]:
        path = self.search.path / FINAL_PLAN
        if not path.exists():
            raise UsageError(
                f"{path} does not exist: this search revision froze without a final evaluation plan; "
                "a final evaluation needs a search revision launched with this parcel_hpc"
            )
        plan = self.search.read_json(path)
        if not isinstance(plan, dict) or plan.get("format") != FINAL_PLAN_FORMAT:
            raise CorruptRecord(f"{path} is not a {FINAL_PLAN_FORMAT} file; restore it")
        return plan

    # --- selections -----------------------------------------------------------------------------
    def selection_path(self, n: int) -> Path:
        return self.dir / f"selection-{n}.json"

    def frozen_numbers(self) -> list[int]:
        """Every frozen selection, by its file: the file is the fact, its journal event the history."""
        numbers = (
            n.removeprefix("selection-").removesuffix(".json") for n in self.search.names(self.dir) if n.startswith("selection-") and n.endswith(".json")
        )
        return sorted(int(n) for n in numbers if n.isdigit())

    def current(self) -> int | None:
        """The selection that counts: the one the final evaluation claimed, once claimed (a selection
        frozen after that is void), else the newest."""
        claim = self.final_claim()
        if claim is not None:
            return int(claim["selection"])
        numbers = self.frozen_numbers()
        return numbers[-1] if numbers else None

    def freeze(self, n: int, frozen: dict[str, Any]) -> bool:
        fsio.ensure_dir(self.dir)
        return fsio.create_exclusive_json(self.selection_path(n), frozen)

    def selection(self, n: int) -> dict[str, Any]:
        path = self.selection_path(n)
        if not path.exists():
            raise UsageError(f"{path} does not exist; run `parcel-hpc select {self.search.path}` first")
        return self.search.read_json(path)

    def job_dir(self, n: int, role: JobRole) -> Path:
        return self.dir / str(n) / role.value

    def log_dir(self, n: int) -> Path:
        return self.dir / str(n) / "logs"

    def new_run_dir(self, n: int, role: JobRole) -> Path:
        """A directory of this job run's own: two runs (a requeue, a second ``select``) never share files."""
        return fsio.ensure_dir(self.job_dir(n, role) / f"run-{writer_name('job')}")

    def write_result(self, n: int, role: JobRole, result: dict[str, Any]) -> str:
        """The job's result, once (a requeued job finding it written keeps the first); its digest."""
        path = self.result_path(n, role)
        fsio.ensure_dir(path.parent)
        fsio.create_exclusive_json(path, {**result, "digest": digest_of(result)})
        return cast(dict[str, Any], self.result(n, role))["digest"]  # written just above

    def result_path(self, n: int, role: JobRole) -> Path:
        return self.search.path / FINAL_RESULT if role is JobRole.FINAL else self.job_dir(n, role) / "result.json"

    def result(self, n: int, role: JobRole) -> dict[str, Any] | None:
        path = self.result_path(n, role)
        obj = self.search.read_object(path, "a selection job's result")
        if obj is None:
            return None
        body = {k: v for k, v in obj.items() if k != "digest"}
        if obj.get("digest") != digest_of(body):
            raise CorruptRecord(f"{path} does not match its digest; it was edited after it was written: restore it")
        return obj

    # --- the one final evaluation ---------------------------------------------------------------
    @property
    def final_claim_path(self) -> Path:
        return self.search.path / FINAL_CLAIM

    @property
    def _claim_copy_path(self) -> Path:
        return self.search.trials_dir / f".{FINAL_CLAIM}"

    def claim_final(self, claim: dict[str, Any]) -> bool:
        """Claim the revision's one final evaluation; False when someone claimed it first. The copy
        inside trials/ is written first: a claim beside the contract never stands without it."""
        fsio.ensure_dir(self.search.trials_dir)
        if not fsio.create_exclusive_json(self._claim_copy_path, claim):
            return False
        return fsio.create_exclusive_json(self.final_claim_path, claim)

    def final_claim(self) -> dict[str, Any] | None:
        """The claim, from beside the contract or, moved aside from there, from inside trials/."""
        for path in (self.final_claim_path, self._claim_copy_path):
            found = self.search.read_object(path, "the final evaluation's claim")
            if found is not None:
                return found
        return None

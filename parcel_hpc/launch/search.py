"""A governed search launch: freeze, propose, dedup, admit, commit the budget, then hand the
admitted trials to the Follower (``follow.py``).

Order is the contract with the user: nothing is dispatched before the contract is frozen (or
matched), every proposal is deduplicated and admitted, and the worst-case budget is admitted for
the whole launch; a refusal happens before the first sbatch, never after.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from parcel_hpc import anchor, fence, ownership
from parcel_hpc.budget import BudgetDecision, launch_decision
from parcel_hpc.checkpoints import owner
from parcel_hpc.config import ParcelConf, unknown_keys
from parcel_hpc.console import make_console
from parcel_hpc.data import read_split, refuse_leaking_split
from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.governance.contract import Contract, first_difference, freeze_contract, load_contract
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.launch import display
from parcel_hpc.launch.follow import ACCOUNT_WAIT_S, Follower, SlotPlan, account_decision, admitted, choose_packing, detached_slots, uses_slots
from parcel_hpc.launch.pulse import Pulse
from parcel_hpc.launch.report import LaunchReport
from parcel_hpc.ledger import LauncherState, SearchDir, TrialSpec, TrialState
from parcel_hpc.ledger.summary import counts_by_state
from parcel_hpc.lifecycle import systematic
from parcel_hpc.propose import samplers
from parcel_hpc.propose.proposals import Proposer
from parcel_hpc.propose.space import normalize
from parcel_hpc.propose.specs import (
    BLOCK,
    Ahead,
    build_contract,
    check_policy,
    ensure_writable,
    history_free_specs,
    in_frozen_form,
    plan_for,
    plan_template,
    protected_of,
    sampler_of,
    search_path,
    space_of,
    trial_shapes,
)
from parcel_hpc.scheduler import packing, slots
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings
from parcel_hpc.scheduler.factory import executor_kind
from parcel_hpc.scheduler.registry import BACKENDS, backend_of
from parcel_hpc.selection.baseline import Baseline, BaselineKind
from parcel_hpc.selection.store import write_final_plan
from parcel_hpc.trainer import Devices, TrainingData, code, load_training_data, trainer_class
from parcel_hpc.trainer.params import declared
from parcel_hpc.trainer.preflight import corners, few_examples, preflight
from parcel_hpc.worker import WorkerPlan


def from_hydra(config: DictConfig, grammar: Sequence[str]) -> tuple[dict[str, Any], LauncherSettings]:
    """The composed config as plain values, its space normalized with the sweep ``grammar`` and
    every value validated (before anything is written or frozen), and the launcher's settings."""
    # A composed config and its launcher group are DictConfigs with string keys: to_container makes dicts of them.
    launcher = cast(dict[str, Any], OmegaConf.to_container(config.hydra.launcher, resolve=True, throw_on_missing=True))
    job_cfg = OmegaConf.masked_copy(config, [cast(str, k) for k in config if k != "hydra"])
    cfg = cast(dict[str, Any], OmegaConf.to_container(job_cfg, resolve=True, throw_on_missing=True))
    refuse_unknown_keys(cfg, launcher)
    cfg["space"]["params"] = normalize(cfg["space"]["params"], list(grammar), sections=set(cfg))
    kind = executor_kind(launcher.get("kind"))
    cfg, launcher = validation.checked(cfg, launcher, backend_of(kind).check_launcher)
    del launcher["kind"]
    split_path = Path(cfg["split"]["path"])
    folds = read_split(split_path).fold_count if split_path.is_file() else 1  # a missing file: build_contract says so
    plan = validation.check_shapes(cfg["resources"], cfg["space"]["params"])
    if plan.by:  # keys as the contract pins them: 8 and 'big' as written would not sort in the launch's record
        cfg["resources"]["shapes"] = plan.pinned()["shapes"]
    for shape in plan.all_shapes():
        validation.check_gang(shape, launcher, folds, backend_of(kind).gang_refusal(shape))
    validation.check_mixed(plan, launcher, samplers.from_config(cfg.get("sampler")).learns, bool(cfg["search"]["wait"]))
    # A K-fold trial's attempt runs its K fold runs in turn: its limit (the job's, the packed attempt's, and
    # the budget's worst case, every reader of resources.time_limit_min) is K times a fold run's.
    cfg["resources"]["time_limit_min"] = folds * cfg["resources"]["time_limit_min"]
    return cfg, LauncherSettings(kind, launcher, cfg["resources"], cfg["budget"])


def refuse_unknown_keys(cfg: Mapping[str, Any], launcher: Mapping[str, Any]) -> None:
    """One line (exit 2) for the first key no schema knows, however it came in (Hydra's ``+key=value``
    appends one the schema lacks): nothing reads it, and the search would run as if it were not there."""
    schema = next((b.launcher for b in BACKENDS if b.executor == launcher.get("kind")), None)
    unknown = unknown_keys(cfg, ParcelConf) + (unknown_keys(launcher, schema, "hydra.launcher") if schema else [])
    if unknown:
        key, near = unknown[0]
        raise UsageError(
            f"{key} is not a configuration key, so nothing would read it; "
            + (f"did you mean {near}? " if near else "")
            + "`python -m parcel_hpc.launch -m --cfg job` prints every key"
        )


class SearchLaunch:
    def __init__(
        self, cfg: Mapping[str, Any], dispatcher_factory: Callable[[SearchDir], Dispatcher], console: Console | None = None, poll_s: float = 0.5
    ) -> None:
        self.cfg = cfg
        self.dispatcher_factory = dispatcher_factory
        self.console = console or make_console()
        self.poll_s = poll_s

    def run(self) -> LaunchReport:
        cfg = self.cfg
        started = time.time()
        path = search_path(cfg)
        n_trials = int(cfg["search"]["n_trials"])
        if n_trials < 0:
            raise UsageError(f"search.n_trials={n_trials} must be >= 0")
        # Validates every input file before anything is written; a search not yet frozen is tried by
        # the preflight in the trainer checks' child, its error said where the preflight stands below.
        contract, answers = build_contract(cfg, [preflight_ahead()] if _not_yet_frozen(path) else [])
        preflight_answer = answers[0] if answers else None
        search = SearchDir(path)
        ownership.require_own_search(path, launch=True)  # another user's, or one others may write: refused before reading it
        ownership.require_closed_root(path.parent, allowed=bool(cfg["search"]["allow_renames_in_root"]))  # where others could rename it away
        _refuse_cancelled(search)
        fresh = not (path / "contract.json").exists()
        ours = contract.digest
        if not fresh:
            on_disk = load_contract(path)
            ours = on_disk.digest  # a relaunch that differs is the freeze's refusal (reject:<field>), not another search
            contract = in_frozen_form(contract, on_disk)  # a search frozen by an older version continues
            refuse_held(search)
        ckpt_root = Path(cfg["checkpoint"]["dir"]).absolute()
        if not ckpt_root.is_relative_to(path):  # inside the search (the default), the search's own check covered it
            # Whoever may replace a trial's checkpoint folder decides what it resumes from: yours alone, as a search is.
            ownership.require_own_folder(ckpt_root, "checkpoint.dir")
            ownership.require_closed_root(ckpt_root, allowed=bool(cfg["search"]["allow_renames_in_root"]))
        owner.refuse_foreign(ckpt_root, _dir_owner(search, ours))  # another search's checkpoints: bad input, exit 2
        if fresh:
            check_policy(contract)
            # A split made before splits were checked may let a parcel cross partitions: a new search refuses it.
            refuse_leaking_split(cfg["snapshot"]["path"], read_split(cfg["split"]["path"]))
            preflight_checks(cfg, contract, preflight_answer)
        dispatcher = self.dispatcher_factory(search)
        dispatcher.check()  # an unreachable scheduler is refused before anything is written
        if not cfg["search"]["wait"] and not dispatcher.can_detach:
            raise UsageError(
                f"search.wait=false needs a scheduler: the {dispatcher.name} executor runs trials as children of this process; use "
                + " or ".join(f"hydra/launcher={b.launcher_name}" for b in BACKENDS if b.queues_jobs)
            )
        sampler = sampler_of(contract)
        slotted = uses_slots(dispatcher, sampler)
        if not cfg["search"]["wait"] and sampler.learns and not slotted:
            raise UsageError(
                f"sampler={sampler.name.value} proposes each trial when a slot frees, so its launcher follows the search: drop search.wait=false, "
                "run it in slots that propose themselves (hydra.launcher.dispatch=slots), or draw with sampler=random or sampler=qmc to detach"
            )
        max_trials = int(contract["budget"]["max_trials"])
        if n_trials > max_trials:
            raise GovernanceRefusal(
                Outcome.HOLD_BUDGET,
                f"search.n_trials={n_trials} exceeds budget.max_trials={max_trials}; lower search.n_trials to {max_trials} or start a new search revision with a larger budget",
            )
        account = dispatcher.account_limits()  # an unknown account is refused here, before anything is written
        dispatcher.max_job_minutes()  # and an unknown partition (packing reads the limit later)
        if fresh and n_trials:
            # Hold before freezing: a held first launch must leave the caps free to change.
            first = launch_decision(contract, n_trials, 0, None, trial_shapes(contract, n_trials))
            self._require_budget(first)
            self._require_budget(*account_decision(account, first))
        dry_run = bool(cfg["search"]["dry_run"])
        if dry_run:
            frozen, created = self._dry_freeze(path, contract, fresh)
            if not fresh:
                dispatcher.acts_for(anchor.identify(path))  # what its jobs' command lines would carry
        else:
            ensure_writable(path)
            if fresh:
                for identity in trainers_of(contract):
                    code.freeze(path, identity)  # the copies first: a frozen contract always has its code
            frozen, created = freeze_contract(path, contract)
            for identity in trainers_of(frozen):
                code.freeze(path, identity)  # present unless the launch that froze it died first
            if created or not search.launches():
                # What names this search's jobs on the scheduler. A search launched before ids
                # existed keeps its bare job name: renaming it would hide its queued jobs.
                search.ensure_identity(frozen.digest)
            if created or not search.trial_ids():
                # The revision's final evaluation plan is fixed when its contract froze (or by the next
                # launch, when that one died before proposing anything); never added to a search later.
                write_final_plan(path, frozen, cfg["split"]["path"], read_split(cfg["split"]["path"]).final_digest)
            owner.mark(ckpt_root, _dir_owner(search, frozen.digest))
            # The search's identity, from here on: every job carries it and holds the directory to it,
            # and this launch checks it before each round (a member who renames it away stops it).
            dispatcher.acts_for(anchor.identify(path))
        launch_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        report = LaunchReport(path, launch_id, frozen.digest, dry_run=dry_run, follows=bool(cfg["search"]["wait"]))

        proposer = None
        if sampler.learns:
            proposer = Proposer(search, frozen, n_trials, launch_id)
        # From here on the launch says it is alive (list, status --watch), and last how it left.
        with Pulse(search, launch_id, beating=not dry_run) as pulse:
            to_dispatch, shown, shapes = self._admit_proposals(search, frozen, n_trials, report, proposer)
            to_propose = 0 if proposer is None else (n_trials if dry_run and fresh else proposer.remaining())
            if not to_dispatch and not to_propose:
                self.console.print(display.contract_line(frozen, path, created, dry_run))
                self.console.print(display.nothing_to_do(report))
                pulse.withdraw()  # it dispatched nothing: the launches before it say how the search stands
                if not report.dry_run:
                    search.write_launch(launch_id, report.to_json())
                    if cfg["search"]["wait"]:
                        self.console.print(display.summary(search, time.time() - started))
                        _require_result(search)
                return report
            known = set(search.trial_ids()) | set(to_dispatch)
            # Each admitted trial at its own shape, a learning sampler's proposals to come at the largest.
            decision = launch_decision(frozen, len(to_dispatch) + to_propose, len(known) - len(to_dispatch), None if dry_run and fresh else path, shapes)
            self._require_budget(decision)
            pack = choose_packing(dispatcher, search, len(to_dispatch) + to_propose, sampler)
            if slotted and not cfg["search"]["wait"]:
                pack = detached_slots(pack, len(to_dispatch) + to_propose, dispatcher)  # as the follower sizes them
            verdict, account_text = account_decision(account, decision, pack.size)
            self._require_budget(verdict, account_text)
            self.console.print(display.contract_line(frozen, path, created, dry_run))
            self.console.print(display.commitment_text(decision))
            if account_text:
                self.console.print(account_text, markup=False, highlight=False)
            if report.dry_run:
                self.console.print(display.dry_run_table(shown, len(to_dispatch), frozen))
                if to_propose:
                    self.console.print(display.learning_line(sampler, to_propose, dispatcher.slots(), slotted), markup=False, highlight=False, soft_wrap=True)
                self.console.print(display.worst_case_line(decision))
                n = len(to_dispatch) + to_propose
                minutes = slots.slot_minutes(pack.size, int(frozen["resources"]["time_limit_min"]))
                self.console.print(display.slots_line(pack, n, dispatcher.slots(), minutes) if slotted else display.packing_line(pack, len(to_dispatch)))
                # A slot's job is room for pack.size trials at the limit: the --time its array asks for.
                lengths = [pack.size] * min(dispatcher.slots(), n) if slotted else [len(g) for g in packing.groups(to_dispatch, pack.size)]
                self.console.print(dispatcher.describe(lengths, slotted), soft_wrap=True, markup=False, highlight=False)
                return report
            if to_propose:
                self.console.print(display.learning_line(sampler, to_propose, dispatcher.slots(), slotted), markup=False, highlight=False, soft_wrap=True)
            report.launcher = dispatcher.launch_record()
            search.write_launch(launch_id, report.to_json())
            for tid in to_dispatch:
                # The first plan stands for the trial's life (its checkpoint directory must not move under
                # a retry); resubmit rebuilds tasks from it without the launch's config.
                search.write_plan(tid, plan_for(search.spec(tid), cfg, frozen, path).to_json())
            plans = {tid: WorkerPlan.load(search, tid) for tid in to_dispatch}
            follower = Follower(search, dispatcher, plans, launch_id, frozen, self.console, self.poll_s)
            if slotted:
                # Slots take the admitted trials and, for a sampler that learns, make the proposals.
                fixed = validation.pack_option(dispatcher.settings.params.get("pack_size")) or 0
                slot_plan = SlotPlan(plan_template(cfg, frozen, path), n_trials if proposer is not None else 0, fixed, detached=not cfg["search"]["wait"])
                follower.slotting(slot_plan)
            if proposer is not None and (slotted or cfg["search"]["wait"]):
                follower.proposing(proposer, lambda spec: plan_for(spec, cfg, frozen, path), report)
            follower.dispatch_initial(report)
            report.scheduler_calls = dispatcher.scheduler_calls()
            search.write_launch(launch_id, report.to_json())
            if cfg["search"]["wait"]:
                follower.follow()
                follower.record_runs(wait_s=ACCOUNT_WAIT_S)  # the summary's hours are the scheduler's, once it filed them
                if follower.stop is not None:
                    report.stopped = str(follower.stop.outcome)
                report.scheduler_calls = dispatcher.scheduler_calls()
                # With what it proposed as it went, why it stopped, and what it asked the scheduler.
                search.write_launch(launch_id, report.to_json())
                self.console.print(display.summary(search, time.time() - started, follower.next_step()))
                if report.scheduler_calls:
                    self.console.print(display.calls_line(report.scheduler_calls, time.time() - started), markup=False, highlight=False)
                if follower.stop is not None:
                    # Trials are left queued: the launch stopped before they ended (the pulse says STOPPED).
                    raise GovernanceRefusal(follower.stop.outcome, follower.stop_detail())
                pulse.leaving(LauncherState.ENDED)
                _require_result(search)
            else:
                pulse.leaving(LauncherState.DETACHED)
                self.console.print(display.detached_text(search, report))
                if report.scheduler_calls:
                    self.console.print(display.calls_line(report.scheduler_calls, time.time() - started), markup=False, highlight=False)
            return report

    @staticmethod
    def _dry_freeze(path: Path, contract: Contract, fresh: bool) -> tuple[Contract, bool]:
        """A dry run checks against the frozen contract (or would freeze this one) without writing."""
        if fresh:
            return contract, True
        frozen = load_contract(path)
        name = first_difference(frozen.fields, contract.fields)
        if name is not None:
            raise GovernanceRefusal(Outcome.reject(name), f"{name} differs from the contract frozen in {path}; a changed search needs a new search.revision")
        return frozen, False

    @staticmethod
    def _require_budget(decision: BudgetDecision, text: str = "") -> None:
        """A hold prints its outcome first (stdout), the table (``text``, else the commitment's) on stderr, and exits 3."""
        if not decision.ok:
            print(text or display.commitment_text(decision), file=sys.stderr)
            decision.require()

    def _admit_proposals(
        self, search: SearchDir, contract: Contract, n_trials: int, report: LaunchReport, proposer: Proposer | None
    ) -> tuple[list[str], list[TrialSpec], Counter[TrialShape]]:
        """Dedup and admit every proposal: the ids of the trials that need a dispatch now, the
        first ``display.DRY_RUN_ROWS`` of their specs (what a dry run shows), and how many of them take each shape. A dry run writes
        nothing. A sampler that learns proposes later, as slots free: here only its trials proposed
        before. Proposals are drawn and judged a block at a time, and no spec is kept past its
        judgement: a dry run of a million trials holds their ids, not their specs."""
        ids: list[str] = []
        first: list[TrialSpec] = []
        shapes: Counter[TrialShape] = Counter()
        owners: dict[str, str] = {}
        if not report.dry_run and proposer is not None:
            proposer.finish_orphans(time.time())
        claimed = search.claimed_configs()  # one listing each: a dry run looks up no owner or record that is not there
        proposed_before = set(search.trial_ids())
        for spec in _candidates(search, contract, n_trials, proposer):
            report.proposed += 1
            if not report.dry_run:
                owner = search.claim_config(spec.config_hash, spec.trial_id)
            elif spec.config_hash in claimed:
                owner = owners.setdefault(spec.config_hash, search.config_owner(spec.config_hash) or spec.trial_id)
            else:
                owner = owners.setdefault(spec.config_hash, spec.trial_id)
            if owner != spec.trial_id:
                report.duplicates[spec.trial_id] = owner
                continue
            if not report.dry_run:
                search.write_spec(spec)  # no-op when an earlier launch proposed it
            known = not report.dry_run or spec.trial_id in proposed_before  # a launch has just written its spec
            if known and search.record(spec.trial_id).state.is_finished():
                report.finished_before.append(spec.trial_id)
                continue
            if admitted(spec, contract, report, None if report.dry_run else search.writer(spec.trial_id, "launch")):
                ids.append(spec.trial_id)
                shapes[spec.shape] += 1
                if len(first) < display.DRY_RUN_ROWS:
                    first.append(spec)
        return ids, first, shapes


def _candidates(search: SearchDir, contract: Contract, n_trials: int, proposer: Proposer | None) -> Iterator[TrialSpec]:
    """The launch's proposals in order: a sampler that does not learn draws its ``n_trials`` a block
    at a time; one that learns has only those proposed before (its slots propose the rest)."""
    if proposer is None:
        for start in range(0, n_trials, BLOCK):
            yield from history_free_specs(contract, start, min(n_trials, start + BLOCK))
    else:
        yield from (search.spec(tid) for tid in search.trial_ids())


PREFLIGHT = "the launch's preflight"


def _not_yet_frozen(path: Path) -> bool:
    """Whether a launch will run the preflight; unsure (a folder it may not read) is no: the
    ownership check says why a little later, and the preflight then runs alone if it is needed."""
    try:
        return not (path / "contract.json").exists()
    except OSError:
        return False


def trainers_of(contract: Contract) -> list[Mapping[str, Any]]:
    """Every trainer whose code the search runs: the search's, and a baseline's trainer of its own."""
    own = contract["selection"]["baseline"].get("trainer")
    return [contract["trainer"]] + ([own] if own and own != contract["trainer"] else [])


def preflight_checks(cfg: Mapping[str, Any], contract: Contract, answered: fence.StageAnswer | None = None) -> list[str]:
    """The trainer built, stepped, saved, loaded and asked to predict at the space's corners, and the
    baseline's trainer with its params, on a few examples, before the first freeze
    (``trainer/preflight.py``): exit 2 with the trainer's own message. What it tried, as words.
    The examples are read here; the trainer's code runs in a child fenced from the final partition's
    files: the trainer checks' own when ``answered`` is its answer there (``preflight_ahead``), else one of its own."""
    if answered is not None:
        answer = answered.result()  # the preflight's error, raised here as if it had run here
        if isinstance(answer, dict) and answer.get("contract") == contract.digest and isinstance(answer.get("tried"), list):
            return [str(what) for what in answer["tried"]]  # tried on the contract this launch built
    return cast(list[str], fence.run_fenced(protected_of(cfg), PREFLIGHT, _preflight, contract, _examples(cfg)))


def preflight_ahead() -> Ahead:
    """The preflight as a step of the trainer checks' child (``build_contract``): the examples
    read in this process before that child forks, the trainer's code imported once for both."""

    def prepared(cfg: Mapping[str, Any]) -> Callable[[Contract], dict[str, Any]]:
        data = _examples(cfg)
        return lambda contract: {"contract": contract.digest, "tried": _preflight(contract, data)}

    return PREFLIGHT, prepared


def _examples(cfg: Mapping[str, Any]) -> TrainingData:
    data = few_examples(load_training_data(cfg["snapshot"]["path"], read_split(cfg["split"]["path"]), cfg["preprocessing"], verify_digest=False))
    return replace(data, devices=Devices(int(cfg["resources"]["gpus"])))  # the trials' grant, tried on this machine's CPU


def _preflight(contract: Contract, data: TrainingData) -> list[str]:
    seed = int(contract["train"]["seed"])

    def tried(target: str, trials: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
        cls = trainer_class(target)
        preflight(cls, target, declared(cls, target), trials, seed, data, float(contract["train"].get("resume_tolerance") or 0.0))
        return [what for what, _ in trials]

    ends = corners(space_of(contract)[0])
    said = tried(contract["trainer"]["target"], [(f"the space's {'low' if i == 0 else 'high'} corner", params) for i, params in enumerate(ends)])
    baseline = Baseline.pinned(contract["selection"]["baseline"], contract["trainer"])
    if baseline.kind is BaselineKind.ARTIFACT:
        return said
    tried(baseline.target, [(f"the baseline {baseline.name}'s parameters", baseline.params)])
    return [*said, f"the baseline {baseline.name} ({baseline.target})"]


def _dir_owner(search: SearchDir, contract_digest: str) -> owner.DirOwner:
    identity = search.identity()
    return owner.DirOwner(str(search.path.absolute()), identity.search_id if identity else "", contract_digest)


def _refuse_cancelled(search: SearchDir) -> None:
    cancelled = search.cancellation()
    if cancelled is not None:
        raise GovernanceRefusal(
            Outcome.reject("cancelled"),
            f"{search.path} was cancelled by {cancelled.get('by')} ({cancelled.get('reason')}); a cancelled search stays stopped: start a new search.revision",
        )


def refuse_held(search: SearchDir) -> None:
    """A search whose first trials failed alike stays held: a relaunch (or a resubmit) would only fail them again.
    Decided from the ledger too, for a hold its launcher died before recording."""
    held = search.hold()
    if held is not None:
        raise GovernanceRefusal(Outcome.parse(held["outcome"]), str(held["detail"]))
    found = systematic.decide(search.records(), systematic.threshold(search.contract()["budget"]))
    if found is not None:
        raise GovernanceRefusal(found.outcome, found.text(str(search.path)))


def _require_result(search: SearchDir) -> None:
    """A launch that ends with trials but none completed has no result: it says so and exits 3
    (unless its owner cancelled the search: ``cancel`` said so, and that was the point)."""
    records = list(search.records())
    if records and not any(r.state is TrialState.COMPLETED for r in records) and search.cancellation() is None:
        counts = ", ".join(f"{k}={v}" for k, v in counts_by_state(records).items() if v)
        raise GovernanceRefusal(
            Outcome.HOLD_NO_RESULT, f"no trial of {search.path} completed ({counts}); `parcel-hpc logs {search.path}` shows why each one failed"
        )

"""From a composed config to a contract, trial specs and worker plans (pure except file digests).

Reads the snapshot, split and image only to digest them; refuses missing inputs with one line that
names the file and the fix.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from parcel_hpc import data, fence, fsio, ownership
from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.governance.admission import config_hash
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.image import image_digest
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.governance.release_target import ReleaseTarget
from parcel_hpc.governance.shape import ShapePlan, TrialShape
from parcel_hpc.ledger.records import TrialSpec
from parcel_hpc.lifecycle import systematic
from parcel_hpc.propose import learning, samplers
from parcel_hpc.propose.samplers import SamplerName, SamplerSpec
from parcel_hpc.propose.space import normalize, qmc_points, sample, space_digest
from parcel_hpc.selection.policy import pinned_selection
from parcel_hpc.trainer import trainer_class, trainer_identity
from parcel_hpc.trainer.params import check_space, declared
from parcel_hpc.worker.plan import WorkerPlan

PINNED_RESOURCES = ("gpus", "cpus", "mem_gb", "time_limit_min")


OPTIONAL_TRAIN = ("step_seconds_param", "resume_tolerance")  # pinned only when set: a search without them keeps its digest


def search_path(cfg: Mapping[str, Any]) -> Path:
    root = Path(cfg["search"]["root"]).expanduser()
    revision = validation.name("search.revision", cfg["search"]["revision"])
    return (root / revision).absolute()


def ensure_writable(search_dir: Path) -> None:
    """Create the search directory, or say in one line why it cannot be. A directory another user
    made first, between the launch's door check and here, is refused before anything goes in it."""
    existed = search_dir.exists()
    try:
        fsio.ensure_dir(search_dir)
        if not existed:
            ownership.require_own_search(search_dir, launch=True)
        with tempfile.TemporaryFile(dir=search_dir):
            pass
    except OSError as exc:
        raise UsageError(f"search root {search_dir.parent} is not writable ({exc.strerror}); set search.root to a writable shared directory") from None


TRAINER_CHECKS = "the launch's trainer checks"

# A step of trainer code run in the trainer checks' own fenced child, after them, with the contract
# they complete: made in this process once the inputs are valid (it may read them here, unfenced),
# named for its lines, and given the contract in the child (``launch.search.preflight_ahead``).
Ahead = tuple[str, Callable[[Mapping[str, Any]], Callable[[Contract], Any]]]


def build_contract(cfg: Mapping[str, Any], ahead: Sequence[Ahead] = ()) -> tuple[Contract, list[fence.StageAnswer | None]]:
    """The contract, and an answer for each step of ``ahead``, run in turn (None: not run, as a step
    after one that failed or could not be prepared; run it alone when it is needed). An answer
    raises its own error only when asked, where the step would have run on its own."""
    snap, split_cfg = cfg["snapshot"], cfg["split"]
    snapshot_path = Path(snap["path"])
    if not snapshot_path.is_file():
        raise UsageError(f"snapshot file {snapshot_path} does not exist; create it with `parcel-hpc make-snapshot {snapshot_path.parent}` or set snapshot.path")
    data.validate_snapshot(snapshot_path)
    snapshot_digest = data.snapshot_digest(snapshot_path)
    if snap.get("digest") and snap["digest"] != snapshot_digest:
        raise GovernanceRefusal(Outcome.reject("snapshot_digest"), f"{snapshot_path} has digest {snapshot_digest}, config pins {snap['digest']}")
    split_path = Path(split_cfg["path"])
    if not split_path.is_file():
        raise UsageError(f"split file {split_path} does not exist; create it with `parcel-hpc make-snapshot {split_path.parent}` or set split.path")
    split = data.read_split(split_path)
    if split.revision != split_cfg["revision"]:
        raise UsageError(
            f"split file {split_path} holds revision {split.revision!r}, config says {split_cfg['revision']!r}; point split.path at the right file"
        )
    whats = [TRAINER_CHECKS]
    fields: dict[str, Any] | None = None
    after: list[Callable[[Contract], Any]] = []
    try:
        if ahead:
            fields = _fields(cfg, snapshot_digest, split)
        for what, prepare in ahead:
            after.append(prepare(cfg))
            whats.append(what)
    except Exception:  # said again below, or by the step alone: in the order a launch always said it
        pass

    def stages() -> Iterator[Any]:
        checked = _trainer_checks(cfg)
        yield checked
        if fields is not None and after:
            contract = _contract(fields, checked)
            for step in after:
                yield step(contract)

    # The trainer's code runs here for the first time (its import): in a child fenced from the final
    # partition's files, whose answer is data. A gate or baseline that cannot be applied is bad input
    # now, not after 82 trials at `parcel-hpc select`.
    answers = fence.run_fenced_stages(protected_of(cfg), whats, stages)
    checked = answers[0].result()
    contract = _contract(fields if fields is not None else _fields(cfg, snapshot_digest, split), checked)
    return contract, [*answers[1:], *[None] * (len(ahead) + 1 - len(answers))]


def _fields(cfg: Mapping[str, Any], snapshot_digest: str, split: data.Split) -> dict[str, Any]:
    """The contract's fields but the two the trainer checks answer (its trainer and selection)."""
    space = normalize(cfg["space"]["params"])  # the sweeper already merged the grammar in; idempotent
    sampler = samplers.from_config(cfg.get("sampler"))
    learning.check_options(sampler)
    fields = {
        "search_revision": cfg["search"]["revision"],
        "search_seed": _seed(cfg["search"]["seed"]),
        "snapshot_digest": snapshot_digest,
        "split_digest": split.digest,
        "split_method": split.method.value,
        "split_revision": split.revision,
        "split_snapshot_digest": split.snapshot_digest,
        "metric_revision": cfg["metric"]["revision"],
        "metric": dict(cfg["metric"]),
        "space_revision": cfg["space"]["revision"],
        "space": {"params": space, "digest": space_digest(space)},
        "sampler": sampler.to_json(),
        "preprocessing": dict(cfg["preprocessing"]),
        "image_digest": image_digest(cfg["image"]),
        "image_kind": cfg["image"]["kind"],
        "trainer": None,
        "train": {k: v for k, v in cfg["train"].items() if not (k in OPTIONAL_TRAIN and v is None)},
        "resources": pinned_resources(cfg["resources"]),
        "budget": dict(cfg["budget"]),
        "pruner": dict(cfg["pruner"]),
        "selection": None,
    }
    release = ReleaseTarget.from_config(cfg.get("release")).pinned()
    if release is not None:  # the folder default is left out: contracts frozen before the option compare as they did
        fields["release"] = release
    return fields


def pinned_resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    """What the contract pins of resources: a gang's layout and a shape mapping only when given, so a
    search of one rank and one shape keeps the digest it had before either existed."""
    return {k: resources[k] for k in PINNED_RESOURCES} | TrialShape.of(resources).pinned() | ShapePlan.of(resources).pinned()


def _contract(fields: Mapping[str, Any], checked: Mapping[str, Any]) -> Contract:
    try:
        return Contract({**fields, "trainer": checked["trainer"], "selection": checked["selection"]})
    except ValueError:  # canonical JSON refuses NaN and infinity
        raise UsageError(
            "the composed config holds a non-finite number (nan or inf); quote text values, e.g. values:['nan'], or give a finite number"
        ) from None


def protected_of(cfg: Mapping[str, Any]) -> fence.Protected:
    """What the launch's trainer code is fenced from: the split's final lists and the snapshot."""
    return fence.Protected.of(cfg["split"]["path"], cfg["snapshot"]["path"])


def _trainer_checks(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Trainer code, run fenced: the trainer's identity, the selection group pinned (the baseline's
    trainer imported and its params checked), the space against the trainer's declared parameters."""
    trainer = trainer_identity(cfg["trainer"]["target"], cfg["trainer"].get("code", []))
    selection = pinned_selection(cfg["selection"], trainer)
    cls = trainer_class(trainer["target"])  # imported just above
    check_space(declared(cls, trainer["target"]), normalize(cfg["space"]["params"]), f"{cls.__name__} ({trainer['target']})")
    return {"trainer": trainer, "selection": selection}


def _seed(value: Any) -> int:
    """``search.seed``: the samplers' generators take whole numbers from 0 to 2**32 - 1."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise UsageError(f"search.seed={value!r} must be a whole number from 0 to {2**32 - 1}")
    return value


def check_policy(contract: Contract) -> None:
    """Governance that holds for every search, checked when a contract is first frozen."""
    if data.SplitMethod(contract["split_method"]).leaks_shipments():
        raise GovernanceRefusal(
            Outcome.reject("split_method"),
            f"split {contract['split_revision']} is a {contract['split_method']} split; trials must be split by shipment or by time (split=group_r8, group_kfold_r1, time_r1 or time_kfold_r1)",
        )
    if contract["split_snapshot_digest"] != contract["snapshot_digest"]:
        raise GovernanceRefusal(Outcome.reject("split_digest"), "the split was made from another snapshot; regenerate the split for this snapshot")


def history_free_specs(contract: Contract, start: int, stop: int) -> list[TrialSpec]:
    """Trials ``start..stop-1`` of a sampler that does not learn: each from (search seed, index) alone."""
    name = sampler_of(contract).name.value
    drawn = history_free_params(contract, start, stop)
    return [trial_spec(contract, index, params, {"sampler": name, "index": index}) for index, params in zip(range(start, stop), drawn)]


def history_free_params(contract: Contract, start: int, stop: int) -> list[dict[str, Any]]:
    """The params of trials ``start..stop-1`` of ``sampler=random`` or ``qmc`` (pure)."""
    sampler = sampler_of(contract)
    space, seed = space_of(contract)[0], int(contract["search_seed"])
    if sampler.name is SamplerName.QMC:
        return qmc_points(space, seed, start, stop, sampler.options["qmc_type"], sampler.options["scramble"])
    return [sample(space, seed, index) for index in range(start, stop)]


BLOCK = 10_000  # a fixed-list sampler's proposals are drawn this many at a time (each from its index alone)


def trial_shapes(contract: Contract, n_trials: int) -> Counter[TrialShape]:
    """How many of a fixed-list sampler's first ``n_trials`` take each shape (drawn only for a search
    of several shapes); empty for a sampler that learns: its trials are not known yet."""
    plan = ShapePlan.of(contract["resources"])
    if not plan.mixed:
        return Counter({plan.default: n_trials})
    if sampler_of(contract).learns:
        return Counter()
    out: Counter[TrialShape] = Counter()
    for start in range(0, n_trials, BLOCK):
        out.update(plan.shape_of(params) for params in history_free_params(contract, start, min(n_trials, start + BLOCK)))
    return out


# A contract frozen before samplers were pinned: random from search.seed, its space as the group wrote it.
LEGACY_SAMPLER = {"name": SamplerName.RANDOM.value, "options": {}, "revision": samplers.RANDOM_REVISION}


def sampler_of(contract: Contract) -> SamplerSpec:
    return SamplerSpec.from_json(contract.fields.get("sampler") or LEGACY_SAMPLER)


def space_of(contract: Contract) -> tuple[dict[str, dict[str, Any]], str]:
    """The normalized space the contract pins, and its digest (an older contract's is normalized on reading)."""
    space = contract["space"]
    if "digest" in space:
        return space["params"], space["digest"]
    params = normalize(space["params"])
    return params, space_digest(params)


def in_frozen_form(contract: Contract, frozen: Contract) -> Contract:
    """``contract`` as a search frozen by an older version wrote it, when it is the same search,
    so that search continues; else unchanged."""
    return _before_code_copies(_before_samplers(_before_systematic_failures(contract, frozen), frozen), frozen)


def _before_code_copies(contract: Contract, frozen: Contract) -> Contract:
    """A trainer pinned before its code was copied with the search (target, unit, source digest
    only): compared in that form, so the search continues importing it as it did."""
    trainer, pinned = contract.fields.get("trainer") or {}, frozen.fields.get("trainer") or {}
    if "code" in pinned or "code" not in trainer:
        return contract
    return Contract({**contract.fields, "trainer": {k: v for k, v in trainer.items() if k in pinned}})


def _before_systematic_failures(contract: Contract, frozen: Contract) -> Contract:
    """A budget frozen before ``systematic_failures`` existed stops at the value it then had."""
    budget, pinned = contract.fields.get("budget") or {}, frozen.fields.get("budget") or {}
    if "systematic_failures" in pinned or budget.get("systematic_failures") != systematic.BEFORE_PINNED:
        return contract
    return Contract({**contract.fields, "budget": {k: v for k, v in budget.items() if k != "systematic_failures"}})


def _before_samplers(contract: Contract, frozen: Contract) -> Contract:
    """A search frozen before samplers were pinned (random, the same space once normalized)."""
    if "sampler" in frozen.fields or "sampler" not in contract.fields or sampler_of(contract).name is not SamplerName.RANDOM:
        return contract
    if space_of(contract) != space_of(frozen):
        return contract
    fields = {k: v for k, v in contract.fields.items() if k != "sampler"}
    fields["space"] = frozen["space"]
    return Contract(fields)


def trial_id_of(index: int) -> str:
    return f"t{index:04d}"


def trial_spec(contract: Contract, index: int, params: dict[str, Any], origin: dict[str, Any]) -> TrialSpec:
    """Trial ``index`` of the search with these params (everything else is the contract's)."""
    seed = int(contract["train"]["seed"])
    effective = {"params": params, "seed": seed, "contract_digest": contract.digest}
    return TrialSpec(
        trial_id=trial_id_of(index),
        index=index,
        params=params,
        seed=seed,
        config_hash=config_hash(effective),
        contract_digest=contract.digest,
        image_digest=contract["image_digest"],
        resources=ShapePlan.of(contract["resources"]).trial_resources(params),  # its own shape
        origin=origin,
    )


def plan_for(spec: TrialSpec, cfg: Mapping[str, Any], contract: Contract, search_dir: Path) -> WorkerPlan:
    return WorkerPlan.for_trial(plan_template(cfg, contract, search_dir), spec)


def plan_template(cfg: Mapping[str, Any], contract: Contract, search_dir: Path) -> dict[str, Any]:
    """Every field of a worker plan but the trial's own: what a slot makes a proposal's plan from."""
    ck = cfg["checkpoint"]
    train = contract["train"]
    return dict(
        search_dir=str(search_dir),
        contract_digest=contract.digest,
        snapshot_path=str(Path(cfg["snapshot"]["path"]).absolute()),
        split_path=str(Path(cfg["split"]["path"]).absolute()),
        image=dict(cfg["image"]),
        steps=int(train["steps"]),
        metric=contract["metric"],
        preprocessing=contract["preprocessing"],
        pruner=contract["pruner"],
        checkpoint_root=str(Path(ck["dir"]).absolute()),
        checkpoint_prefix=str(ck.get("prefix", "{trial_id}")),
        every_steps=ck.get("every_steps"),  # one of the two, the other null (governance/validation.checked)
        every_s=ck.get("every_s"),
        keep_last=int(ck["keep_last"]),
        max_retries=int(contract["budget"]["max_retries"]),
        max_preemptions=int(contract["budget"]["max_preemptions"]),
        step_seconds=float(train.get("step_seconds", 0.0)),
        step_seconds_param=str(train.get("step_seconds_param") or ""),
        gpus=int(contract["resources"]["gpus"]),
        cpus=int(contract["resources"]["cpus"]),
        time_limit_min=int(contract["resources"]["time_limit_min"]),
        rank_wait_s=float(ck.get("rank_wait_s", WorkerPlan.rank_wait_s)),  # a config the launch never checked: the default
    )

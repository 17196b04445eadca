"""Entity leaks and time-ordered splits: components, the leak check, periods, and the split files made
from snapshots with re-shipped parcels, declared group columns and capture times."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc.data import (
    SplitMethod,
    assign_group_folds,
    assign_groups,
    json_digest,
    make_assigned_split,
    make_group_kfold_split,
    make_group_split,
    make_random_split,
    make_snapshot,
    make_time_kfold_split,
    make_time_split,
    read_entities,
    read_split,
    refuse_leaking_split,
    snapshot_digest,
    split_leak,
    validate_snapshot,
)
from parcel_hpc.data.entities import components, find_leak, group_leaks_away, shipment_components
from parcel_hpc.data.files import split_paths
from parcel_hpc.data.periods import assign_periods, kfold_fractions
from parcel_hpc.errors import UsageError
from parcel_hpc.testing import parcel_hpc
from parcel_hpc.trainer import load_training_data

SHIPMENTS = st.sampled_from([f"S{i}" for i in range(12)])
PARCELS = st.sampled_from([f"P{i}" for i in range(16)])
FRAMES = st.lists(st.tuples(SHIPMENTS, PARCELS), min_size=1, max_size=60)


def _naive_components(frames: list[tuple[str, str]]) -> list[set[int]]:
    """Frames joined while any two share a shipment or a parcel, by repeated merging."""
    groups = [{i} for i in range(len(frames))]
    merged = True
    while merged:
        merged = False
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                if any(frames[i][0] == frames[j][0] or frames[i][1] == frames[j][1] for i in groups[a] for j in groups[b]):
                    groups[a] |= groups.pop(b)
                    merged = True
                    break
            if merged:
                break
    return groups


def _within(frames, assignment) -> dict[str, set[int]]:
    return {p: {assignment[s] for s, q in frames if q == p} for _, p in frames}


# --- components and leaks -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(frames=FRAMES)
def test_components_join_exactly_the_frames_that_share_a_shipment_or_a_parcel(frames):
    comp = components([[s for s, _ in frames], [p for _, p in frames]])
    found = sorted(sorted(np.flatnonzero(comp == c).tolist()) for c in np.unique(comp))
    assert found == sorted(sorted(g) for g in _naive_components(frames))
    assert comp[0] == 0 and sorted(set(comp.tolist())) == list(range(len(found)))  # numbered by first appearance


@settings(max_examples=60, deadline=None)
@given(frames=FRAMES, seed=st.integers(0, 2**32 - 1))
def test_group_splits_assign_whole_components_so_a_reshipped_parcel_never_crosses(frames, seed):
    shipments = [s for s, _ in frames]
    together = shipment_components(shipments, [[p for _, p in frames]])
    units = len(set(together.values()))
    if units >= 3:
        parts = assign_groups(shipments, seed, (0.7, 0.15, 0.15), together)
        assignment = {s: k for k, part in enumerate(parts) for s in part}
        assert all(len(ks) == 1 for ks in _within(frames, assignment).values())
        assert find_leak([("shipment_id", shipments), ("parcel_id", [p for _, p in frames])], [assignment[s] for s in shipments], ["a", "b", "c"]) is None
    if units - max(1, int(0.15 * units + 0.5)) >= 2:
        final, folds = assign_group_folds(shipments, seed, 2, 0.15, together)
        assignment = {s: k for k, part in enumerate((*folds, final)) for s in part}
        assert sorted(assignment) == sorted(set(shipments)) and all(len(ks) == 1 for ks in _within(frames, assignment).values())
    # Without re-shipped parcels the components are the shipments and the assignment is what it always was.
    alone = {s: s for s in shipments}
    if len(alone) >= 3:
        assert assign_groups(shipments, seed, (0.7, 0.15, 0.15), alone) == assign_groups(shipments, seed, (0.7, 0.15, 0.15))


@settings(max_examples=60, deadline=None)
@given(frames=FRAMES, parts=st.lists(st.integers(0, 2), min_size=12, max_size=12))
def test_find_leak_names_a_crossing_entity_exactly_when_one_exists_and_grouping_it_away_removes_it(frames, parts):
    shipments, parcels = [s for s, _ in frames], [p for _, p in frames]
    assignment = {s: parts[int(s[1:])] for s in shipments}
    columns = [("shipment_id", shipments), ("parcel_id", parcels)]
    leak = find_leak(columns, [assignment[s] for s in shipments], ["train", "validation", "final"])
    crossing = {p: ks for p, ks in _within(frames, assignment).items() if len(ks) > 1}
    assert (leak is None) == (not crossing)
    if leak is not None:
        assert leak.column == "parcel_id" and leak.value == min(crossing)  # a shipment lies in one partition by construction
        assert leak.parts == tuple(["train", "validation", "final"][k] for k in sorted(crossing[leak.value]))
        assert f"parcel_id {leak.value!r} lies in {leak.parts[0]} and " in str(leak)
    grouped = group_leaks_away(assignment, shipment_components(shipments, [parcels]))
    assert find_leak(columns, [grouped[s] for s in shipments], ["train", "validation", "final"]) is None
    assert all(grouped[s] >= assignment[s] for s in assignment)  # training only ever shrinks


# --- periods --------------------------------------------------------------------------------------


@st.composite
def timed_frames(draw):
    """Shipments at increasing times, a few of their parcels shipped again a little later."""
    n = draw(st.integers(4, 14))
    frames = []
    for s in range(n):
        start = s * 100.0 + draw(st.floats(0, 40))
        for p in range(draw(st.integers(1, 3))):
            parcel = draw(st.sampled_from([f"S{s}-P{p}", f"S{max(0, s - 1)}-P0"]))  # some re-shipped from the shipment before
            frames.append((f"S{s:02d}", parcel, start + draw(st.floats(0, 30))))
    return frames


@settings(max_examples=80, deadline=None)
@given(frames=timed_frames(), k=st.integers(2, 3))
def test_time_periods_put_every_training_frame_before_every_frame_validated_on_it(frames, k):
    shipments, parcels, times = ([f[i] for f in frames] for i in range(3))
    together = shipment_components(shipments, [parcels])
    try:
        periods = assign_periods(shipments, times, together, kfold_fractions(k, 0.15))
    except UsageError as exc:
        assert "clean time boundaries" in str(exc)  # too few components to cut
        return
    assert len(periods) == k + 2 and all(periods)
    at = {s: i for i, part in enumerate(periods) for s in part}
    assert sorted(at) == sorted(set(shipments))
    assert all(len(ks) == 1 for ks in _within([(s, p) for s, p, _ in frames], at).values())  # disjoint by every entity
    latest = [max(t for s, _, t in frames if at[s] == i) for i in range(len(periods))]
    earliest = [min(t for s, _, t in frames if at[s] == i) for i in range(len(periods))]
    for i in range(1, len(periods)):
        assert latest[i - 1] <= earliest[i]  # forward chaining: everything before period i is no later than it
    assert earliest[-1] >= max(latest[:-1])  # the final partition is the latest


# --- split files from snapshots -------------------------------------------------------------------


@pytest.fixture(scope="module")
def reshipped(tmp_path_factory) -> str:
    return make_snapshot(tmp_path_factory.mktemp("reshipped"), seed=0, reshipped=4, n_shipments=40).path


def _frames(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        entities = read_entities(f)
    return {name: values for name, values in entities.columns} | {"time": entities.capture_time}


def test_the_generator_ships_parcels_twice_and_every_honest_split_keeps_them_in_one_partition(reshipped, tmp_path):
    cols = _frames(reshipped)
    pairs = {p: set(cols["shipment_id"][cols["parcel_id"] == p]) for p in np.unique(cols["parcel_id"])}
    assert sum(len(s) == 2 for s in pairs.values()) == 4 and max(map(len, pairs.values())) == 2
    with h5py.File(reshipped, "r") as f:
        entities = read_entities(f)
    for make in (make_group_split, make_group_kfold_split):
        split = read_split(make(reshipped, tmp_path, seed=1, revision=make.__name__.replace("_", "-")).split_path)
        assert split_leak(entities, split) is None
    for make in (make_time_split, make_time_kfold_split):
        split = read_split(make(reshipped, tmp_path, revision=make.__name__.replace("_", "-")).split_path)
        assert split_leak(entities, split) is None
    random = read_split(make_random_split(reshipped, tmp_path, seed=1, revision="rnd").split_path)
    assert split_leak(entities, random).column == "shipment_id"


def _sealed(content: dict) -> dict:
    return content | {"digest": json_digest(content)}


def _old_group_split(path, out_dir, revision: str) -> str:
    """A group split as the toolkit wrote it before splits were checked: by shipment alone."""
    cols = _frames(path)
    for seed in range(100):
        train, validation, final = assign_groups(cols["shipment_id"].tolist(), seed, (0.7, 0.15, 0.15))
        at = {s: k for k, part in enumerate((train, validation, final)) for s in part}
        if any(len({at[s] for s in cols["shipment_id"][cols["parcel_id"] == p]}) > 1 for p in np.unique(cols["parcel_id"])):
            break
    common = {"method": "group", "key": "shipment_id", "revision": revision, "snapshot_digest": snapshot_digest(path), "seed": seed}
    final_content = _sealed({"format": "parcel-final/1", **common, "final": list(final)})
    split_content = _sealed(
        {
            "format": "parcel-split/1",
            **common,
            "fractions": [0.7, 0.15, 0.15],
            "train": list(train),
            "validation": list(validation),
            "final_digest": final_content["digest"],
        }
    )
    split_path, final_path = split_paths(out_dir, revision)
    final_path.write_text(json.dumps(final_content))
    split_path.write_text(json.dumps(split_content))
    return str(split_path)


def test_a_split_made_before_the_check_that_leaks_is_refused_in_one_line(reshipped, tmp_path):
    split = read_split(_old_group_split(reshipped, tmp_path, "old_r1"))
    with pytest.raises(UsageError) as err:
        refuse_leaking_split(reshipped, split)
    message = str(err.value)
    assert "leaks: parcel_id 'SHP-" in message and " lies in " in message and "make a new split revision" in message and "\n" not in message


def test_a_users_assignment_that_leaks_is_refused_or_grouped_away_on_request(reshipped, tmp_path):
    cols = _frames(reshipped)
    crossing = next(p for p in np.unique(cols["parcel_id"]) if len(set(cols["shipment_id"][cols["parcel_id"] == p])) == 2)
    first, second = sorted(set(cols["shipment_id"][cols["parcel_id"] == crossing]))
    assignment = {s: "train" for s in np.unique(cols["shipment_id"]).tolist()}
    others = [s for s in sorted(assignment) if s not in (first, second)]
    assignment.update({second: "validation", others[-1]: "final", others[-2]: "validation"})
    with pytest.raises(UsageError, match=rf"parcel_id '{crossing}' lies in train and validation; .*group_leaks=True"):
        make_assigned_split(reshipped, tmp_path, assignment, revision="mine")
    assert not list(tmp_path.glob("*mine*"))  # refused before anything is written
    split = read_split(make_assigned_split(reshipped, tmp_path, assignment, revision="mine", group_leaks=True).split_path)
    assert first in split.validation and second in split.validation and split.method is SplitMethod.GROUP
    with pytest.raises(UsageError, match="has no partition"):
        make_assigned_split(reshipped, tmp_path, {first: "train"}, revision="mine2")


def _with_customers(src: str, dst: Path, customer_of) -> Path:
    dst.mkdir()
    path = Path(shutil.copy(src, dst / "parcels.h5"))
    with h5py.File(path, "r+") as f:
        f.create_dataset("customer_id", data=np.asarray([customer_of(s.decode()) for s in f["shipment_id"][:]], dtype="S"))
        f.attrs["group_columns"] = np.array(["customer_id"], dtype="S")
    return path


def test_a_declared_group_column_is_validated_digested_and_kept_whole(reshipped, tmp_path):
    # Shipments 0 and 39 belong to one customer: a group split keeps them together.
    path = _with_customers(reshipped, tmp_path / "c", lambda s: "C-big" if s in ("SHP-0000", "SHP-0039") else f"C-{s}")
    meta = validate_snapshot(path)
    assert meta.group_columns == ("customer_id",) and meta.has_capture_time
    assert snapshot_digest(path) != snapshot_digest(reshipped)
    with h5py.File(path, "r") as f:
        entities = read_entities(f)
    for seed in range(6):
        split = read_split(make_group_split(path, tmp_path, seed=seed, revision=f"g{seed}").split_path)
        assert split_leak(entities, split) is None
        final = set(json.loads(Path(split_paths(tmp_path, f"g{seed}")[1]).read_text())["final"])
        where = [[s in part for part in (split.train, split.validation, final)] for s in ("SHP-0000", "SHP-0039")]
        assert where[0] == where[1] and sum(where[0]) == 1
    other = _with_customers(reshipped, tmp_path / "d", lambda s: "C-one")
    with h5py.File(other, "r+") as f:
        f["customer_id"][0] = b""
    with pytest.raises(UsageError, match="customer_id row 0 is empty"):
        validate_snapshot(other)
    with h5py.File(other, "r+") as f:
        f.attrs["group_columns"] = np.array(["customer_id", "nope"], dtype="S")
    with pytest.raises(UsageError, match="declares group column 'nope' but has no such dataset"):
        validate_snapshot(other)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda f: f["capture_time"].__setitem__(3, np.nan), "capture_time row 3 is not a finite number"),
        (lambda f: (f.__delitem__("capture_time"), f.create_dataset("capture_time", data=np.zeros(4))), "capture_time has shape (4,)"),
        (
            lambda f: (f.__delitem__("capture_time"), f.create_dataset("capture_time", data=np.asarray(["x"] * len(f["frame"]), dtype="S"))),
            "capture_time has dtype",
        ),
    ],
)
def test_capture_time_is_validated_when_present(reshipped, tmp_path, mutate, expected):
    path = Path(shutil.copy(reshipped, tmp_path / "parcels.h5"))
    with h5py.File(path, "r+") as f:
        mutate(f)
    with pytest.raises(UsageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        validate_snapshot(path)


def test_capture_time_is_optional_and_digested(reshipped, tmp_path):
    path = Path(shutil.copy(reshipped, tmp_path / "parcels.h5"))
    with h5py.File(path, "r+") as f:
        f["capture_time"][0] += 1.0
    assert snapshot_digest(path) != snapshot_digest(reshipped)
    with h5py.File(path, "r+") as f:
        del f["capture_time"]
    assert not validate_snapshot(path).has_capture_time
    with pytest.raises(UsageError, match="has no capture_time dataset; a time split needs"):
        make_time_split(path, tmp_path, revision="t")


def test_a_time_kfold_split_trains_each_fold_on_the_past_only(reshipped, tmp_path):
    split = read_split(make_time_kfold_split(reshipped, tmp_path, folds=3, revision="tk").split_path)
    cols = _frames(reshipped)
    final = set(json.loads(Path(split_paths(tmp_path, "tk")[1]).read_text())["final"])
    when = {s: cols["time"][cols["shipment_id"] == s] for s in np.unique(cols["shipment_id"]).tolist()}
    assert split.method.chains_folds() and split.fold_count == 3 and split.train_only
    assert split.fold(2) == (split.train, split.validation)  # a reader that knows no folds sees the last fold
    for i in range(3):
        train, validation = split.fold(i)
        assert max(when[s].max() for s in train) <= min(when[s].min() for s in validation)
        assert set(train) == set(split.train_only).union(*split.folds[:i])
    assert min(when[s].min() for s in final) >= max(when[s].max() for s in set(split.train) | set(split.validation))


# --- what a time split is for ---------------------------------------------------------------------


def _logistic(x: np.ndarray, y: np.ndarray, steps: int = 400, lr: float = 0.5, l2: float = 1e-3):
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        g = 1.0 / (1.0 + np.exp(-(x @ w + b))) - y
        w -= lr * (x.T @ g / len(y) + l2 * w)
        b -= lr * g.mean()
    return lambda q: q @ w + b


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(score)) + 1
    pos = int(y.sum())
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos)))


def _validation_auc(snapshot: str, split) -> float:
    """A logistic fit over the pinned preprocessing's features (fitted on the train part only)."""
    data = load_training_data(snapshot, split, {"revision": "stats-r1", "pool": 4})
    return _auc(_logistic(data.train.features, data.train.labels.astype(float))(data.validation.features), data.validation.labels)


def _flattery(tmp_path: Path, *drift: str) -> tuple[float, float, float]:
    """(time split, group split, group K-fold's mean over folds) validation AUCs of a snapshot the CLI makes."""
    made = parcel_hpc(["make-snapshot", str(tmp_path), *drift])
    assert made.returncode == 0, made.stderr
    snapshot = str(tmp_path / "parcels.h5")
    kfold = read_split(tmp_path / "split-group_kfold_r1.json")
    out_of_fold = [_validation_auc(snapshot, replace(kfold, train=kfold.fold(i)[0], validation=kfold.fold(i)[1])) for i in range(kfold.fold_count)]
    return (
        _validation_auc(snapshot, read_split(tmp_path / "split-time_r1.json")),
        _validation_auc(snapshot, read_split(tmp_path / "split-group_r8.json")),
        float(np.mean(out_of_fold)),
    )


def test_on_a_drifting_snapshot_a_time_split_scores_lower_than_the_group_split_that_flatters_it(tmp_path):
    """The synthetic drift (new lighting and review policy for the latest shipments): a model trained on
    the past meets it on the next shipments, as in deployment; the group split trains on every period."""
    time_auc, group_auc, kfold_auc = _flattery(tmp_path / "drift", "--drift", "1")
    assert time_auc < group_auc and time_auc < kfold_auc
    # The drift is what opens the gap: the same snapshot without it flatters less.
    still_time, still_group, still_kfold = _flattery(tmp_path / "still")
    assert group_auc - time_auc > still_group - still_time and kfold_auc - time_auc > still_kfold - still_time


def test_make_snapshot_refuses_a_leaking_assignment_in_one_line_and_groups_it_away_when_asked(tmp_path):
    assert parcel_hpc(["make-snapshot", str(tmp_path), "--reshipped", "4", "--drift", "0.5"]).returncode == 0
    cols = _frames(tmp_path / "parcels.h5")
    crossing = next(p for p in np.unique(cols["parcel_id"]) if len(set(cols["shipment_id"][cols["parcel_id"] == p])) == 2)
    later = max(cols["shipment_id"][cols["parcel_id"] == crossing])
    shipments = sorted(set(cols["shipment_id"].tolist()))
    assignment = {s: "final" if s == shipments[-1] else "validation" if s in (later, shipments[-2]) else "train" for s in shipments}
    (tmp_path / "mine.json").write_text(json.dumps(assignment))
    args = ["make-snapshot", str(tmp_path), "--assign", str(tmp_path / "mine.json"), "--revision", "mine_r1"]
    refused = parcel_hpc(args)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1 and f"parcel_id '{crossing}' lies in train and validation" in lines[0], refused.stderr
    assert not (tmp_path / "split-mine_r1.json").exists()
    grouped = parcel_hpc([*args, "--group-leaks"])
    assert grouped.returncode == 0, grouped.stderr
    assert set(read_split(tmp_path / "split-mine_r1.json").validation) >= set(cols["shipment_id"][cols["parcel_id"] == crossing])

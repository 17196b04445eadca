"""parcel_hpc.data: determinism, content digests, schema validation, group splits, partitions, slices."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc.data import (
    PartitionName,
    SplitMethod,
    assign_group_folds,
    assign_groups,
    load_final_partition,
    load_partition,
    make_default_artifacts,
    make_group_kfold_split,
    make_group_split,
    make_random_split,
    make_snapshot,
    read_split,
    snapshot_digest,
    validate_snapshot,
)
from parcel_hpc.errors import CorruptRecord, UsageError

# Golden digest of make_snapshot(seed=0, n_shipments=5). If it changes, the generator draws
# different parcels for the same seed: bump GENERATOR in synthetic.py and update this value.
GOLDEN_SMALL = "sha256:a87cf8f098685a071fe6252203023c7032d7019551a0456eecd378a9e68a610c"


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> dict[str, str]:
    return make_default_artifacts(tmp_path_factory.mktemp("default"), seed=0)


@pytest.fixture(scope="module")
def columns(art) -> dict[str, np.ndarray]:
    with h5py.File(art["snapshot_path"], "r") as f:
        return {name: f[name][:] for name in f}


def _copy(src: str, dst_dir: Path) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(src, dst_dir / "parcels.h5"))


# --- determinism and the content digest ---------------------------------------------------------


def test_same_seed_same_digest_in_different_directories(tmp_path):
    a = make_snapshot(tmp_path / "a", seed=0, n_shipments=5)
    b = make_snapshot(tmp_path / "elsewhere" / "b", seed=0, n_shipments=5)
    assert a.digest == b.digest == snapshot_digest(a.path) == GOLDEN_SMALL
    assert make_snapshot(tmp_path / "c", seed=1, n_shipments=5).digest != a.digest


def test_digest_ignores_path_mtime_and_hdf5_layout(art, tmp_path):
    copy = _copy(art["snapshot_path"], tmp_path / "copy")
    os.utime(copy, (1_000_000_000, 1_000_000_000))
    assert snapshot_digest(copy) == art["snapshot_digest"]
    # Same content written differently: chunked + gzip, reversed dataset order, timestamps on,
    # one integer column big-endian. The file bytes differ; the content does not.
    relaid = tmp_path / "relaid.h5"
    with h5py.File(art["snapshot_path"], "r") as src, h5py.File(relaid, "w") as dst:
        for key, value in src.attrs.items():
            dst.attrs[key] = value
        for name in reversed(list(src)):
            data = src[name][:]
            if name == "frame":
                data = data.astype(data.dtype.newbyteorder(">"))
            ds = dst.create_dataset(name, data=data, chunks=True, compression="gzip", track_times=True)
            for key, value in src[name].attrs.items():
                ds.attrs[key] = value
    assert relaid.read_bytes() != Path(art["snapshot_path"]).read_bytes()
    assert snapshot_digest(relaid) == art["snapshot_digest"]


def test_one_changed_pixel_changes_the_digest(art, tmp_path):
    copy = _copy(art["snapshot_path"], tmp_path)
    with h5py.File(copy, "r+") as f:
        f["images"][7, 3, 4] = (int(f["images"][7, 3, 4]) + 1) % 256
    assert snapshot_digest(copy) != art["snapshot_digest"]


def test_label_names_are_part_of_the_digest(art, tmp_path):
    copy = _copy(art["snapshot_path"], tmp_path)
    with h5py.File(copy, "r+") as f:
        f["camera_class"].attrs["labels"] = np.array([b"cam_x", b"cam_b", b"cam_c"])
    assert snapshot_digest(copy) != art["snapshot_digest"]


def test_make_snapshot_is_idempotent_and_refuses_to_replace_a_different_snapshot(tmp_path):
    first = make_snapshot(tmp_path, seed=3, n_shipments=4)
    again = make_snapshot(tmp_path, seed=3, n_shipments=4)
    assert again.digest == first.digest and again.seconds == 0.0
    with pytest.raises(UsageError, match="already holds a different snapshot"):
        make_snapshot(tmp_path, seed=4, n_shipments=4)
    assert snapshot_digest(first.path) == first.digest
    assert [p.name for p in tmp_path.iterdir()] == ["parcels.h5"]  # no temp file left behind


# --- the generated content ----------------------------------------------------------------------


def test_generated_snapshot_is_valid_and_shaped_as_documented(art, columns):
    meta = validate_snapshot(art["snapshot_path"])
    assert meta.image_shape == (32, 32) and meta.image_dtype == "uint8"
    assert meta.damage_labels == ("none", "crushed_corner", "torn", "wet", "puncture")
    assert meta.camera_labels == ("cam_a", "cam_b", "cam_c")
    assert Path(art["snapshot_path"]).stat().st_size < 4 << 20
    n = meta.n_frames
    assert len(np.unique(columns["shipment_id"])) == 72
    parcels = np.unique(columns["parcel_id"])
    assert n == 3 * len(parcels)
    # every parcel has frames 0, 1, 2 and one damage type, camera and shipment
    for column in ("damage_type", "camera_class", "shipment_id", "needs_review"):
        per_parcel = {}
        for pid, value in zip(columns["parcel_id"], columns[column]):
            per_parcel.setdefault(pid, set()).add(value.item() if hasattr(value, "item") else value)
        assert all(len(v) == 1 for v in per_parcel.values()), column
    counts = np.bincount(columns["damage_type"], minlength=5)
    assert counts[1] < counts[2] and counts[1] > 0  # crushed_corner is the rare one
    disagree = np.mean(columns["needs_review"].astype(bool) != (columns["damage_type"] != 0))
    assert 0 < disagree < 0.06  # label noise: small, present


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    ranks = np.empty(len(score))
    ranks[np.argsort(score, kind="stable")] = np.arange(1, len(score) + 1)
    n_pos = positive.sum()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * (len(score) - n_pos)))


def _logistic(x: np.ndarray, y: np.ndarray, steps: int = 200, lr: float = 0.5, l2: float = 1e-2):
    mu, sd = x.mean(0), x.std(0) + 1e-6
    z = (x - mu) / sd
    w, b = np.zeros(z.shape[1]), 0.0
    for _ in range(steps):
        g = 1.0 / (1.0 + np.exp(-(z @ w + b))) - y
        w -= lr * (z.T @ g / len(y) + l2 * w)
        b -= lr * g.mean()
    return lambda q: ((q - mu) / sd) @ w + b


def test_slices_differ_in_difficulty(columns):
    """Out-of-fold logistic regression (2 folds by shipment): learnable, crushed_corner and cam_c harder."""
    im = columns["images"].astype(np.float64)
    im = (im[:, 0::2, 0::2] + im[:, 1::2, 0::2] + im[:, 0::2, 1::2] + im[:, 1::2, 1::2]) / 4  # 2x2 pooling: 256 features
    x = im.reshape(len(im), -1)
    x = (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + 1e-6)  # per image: removes camera gain
    y = columns["needs_review"].astype(bool)
    fold = np.array([int(s[4:]) % 2 for s in columns["shipment_id"]])
    score = np.empty(len(y))
    for k in (0, 1):
        score[fold == k] = _logistic(x[fold != k], y[fold != k].astype(float))(x[fold == k])
    damage, camera = columns["damage_type"], columns["camera_class"]

    def vs_none(code):
        m = (damage == 0) | (damage == code)
        return _auc(score[m], damage[m] == code)

    def camera_auc(code):
        return _auc(score[camera == code], y[camera == code])

    assert _auc(score, y) > 0.70  # chance is 0.5
    assert vs_none(2) > 0.75  # torn
    assert vs_none(2) - vs_none(1) > 0.15  # crushed_corner is clearly harder than torn
    assert camera_auc(0) - camera_auc(2) > 0.06  # cam_c (noisy, blurred) is harder than cam_a


# --- validation of a user's snapshot ------------------------------------------------------------


def _delete(name):
    def mutate(f):
        del f[name]

    return mutate


def _replace(name, data):
    def mutate(f):
        attrs, new = dict(f[name].attrs), data(f) if callable(data) else data
        del f[name]
        ds = f.create_dataset(name, data=new)
        for key, value in attrs.items():
            ds.attrs[key] = value

    return mutate


def _set_first(name, value):
    def mutate(f):
        f[name][0] = value

    return mutate


def _del_attr(obj_name, attr):
    def mutate(f):
        del (f[obj_name] if obj_name else f).attrs[attr]

    return mutate


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (_delete("camera_class"), "missing dataset 'camera_class'"),
        (_delete("images"), "missing dataset 'images'"),
        (_del_attr("", "schema_version"), "no root attribute 'schema_version'"),
        (_del_attr("damage_type", "labels"), "damage_type has no 'labels' attribute"),
        (_replace("images", np.zeros((5, 32, 32), dtype=np.float64)), "images has dtype float64"),
        (_replace("images", np.zeros((5, 32), dtype=np.uint8)), "images has shape"),
        (_replace("frame", np.zeros(3, dtype=np.int16)), "frame has shape"),
        (_replace("shipment_id", lambda f: [s.decode() for s in f["shipment_id"][:]]), "shipment_id has dtype"),
        (_set_first("damage_type", 9), "damage_type holds 9, outside 0..4"),
        (_set_first("needs_review", 2), "needs_review holds 2"),
        (_set_first("parcel_id", b""), "parcel_id row 0 is empty"),
    ],
)
def test_validate_snapshot_names_the_problem_in_one_line(art, tmp_path, mutate, expected):
    copy = _copy(art["snapshot_path"], tmp_path)
    with h5py.File(copy, "r+") as f:
        mutate(f)
    with pytest.raises(UsageError) as err:
        validate_snapshot(copy)
    message = str(err.value)
    assert expected in message and "\n" not in message


def test_a_users_own_snapshot_validates_splits_and_loads(tmp_path):
    """float32 pixels, bool labels, no seed, chunked, other label names: the format allows all of it."""
    rng = np.random.default_rng(0)
    n = 40
    path = tmp_path / "real.h5"
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = "parcel-snapshot/1"
        f.attrs["generator"] = "acme-export 2.3"
        f.create_dataset("images", data=rng.random((n, 20, 24), dtype=np.float32), chunks=(8, 20, 24))
        f.create_dataset("needs_review", data=rng.random(n) < 0.3)
        f.create_dataset("shipment_id", data=np.asarray([f"1Z{i // 4:08d}" for i in range(n)], dtype="S"))
        f.create_dataset("parcel_id", data=np.asarray([f"P{i // 2}" for i in range(n)], dtype="S"))
        f.create_dataset("frame", data=np.arange(n) % 2)
        for name, labels in (("damage_type", ["ok", "dent"]), ("camera_class", ["dock1", "dock2", "dock3", "dock4"])):
            f.create_dataset(name, data=rng.integers(0, len(labels), n).astype(np.uint8))
            f[name].attrs["labels"] = np.array(labels, dtype="S")
    meta = validate_snapshot(path)
    assert meta.seed is None and meta.image_shape == (20, 24) and meta.camera_labels[3] == "dock4"
    split = read_split(make_group_split(path, tmp_path, seed=1).split_path)
    part = load_partition(path, split, "validation")
    with h5py.File(path, "r") as f:
        assert np.array_equal(part.images, f["images"][:][part.rows])
    assert set(part.shipment_id) == set(split.validation) and set(part.damage_type) <= {"ok", "dent"}


def test_validate_snapshot_refuses_missing_and_non_hdf5_files(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        validate_snapshot(tmp_path / "nope.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(UsageError, match="not an HDF5 file"):
        validate_snapshot(tmp_path / "text.h5")


# --- splits -------------------------------------------------------------------------------------


def _shipments(columns, rows) -> set[str]:
    return {s.decode() for s in columns["shipment_id"][np.asarray(rows, dtype=np.int64)]}


def test_group_split_keeps_every_shipment_in_one_partition(art, columns):
    split = read_split(art["split_path"])
    final = json.loads(Path(art["final_path"]).read_text())["final"]
    assert split.method is SplitMethod.GROUP and split.key == "shipment_id"
    assert split.snapshot_digest == art["snapshot_digest"] and split.digest == art["split_digest"]
    parts = [set(split.train), set(split.validation), set(final)]
    assert all(parts) and not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert set().union(*parts) == {s.decode() for s in np.unique(columns["shipment_id"])}
    assert len(final) >= 10  # a final partition worth evaluating on
    split_text = Path(art["split_path"]).read_text()
    assert not any(f'"{s}"' in split_text for s in final)  # trials are never told the final ids
    assert split.final_digest == art["final_digest"]


def test_random_split_leaks_shipments(art, columns):
    split = read_split(art["random_split_path"])
    assert split.method is SplitMethod.RANDOM and split.method.leaks_shipments()
    assert len(_shipments(columns, split.train) & _shipments(columns, split.validation)) > 5


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), val=st.floats(0.05, 0.4), fin=st.floats(0.05, 0.4))
def test_group_split_property_over_seeds_and_fractions(art, columns, seed, val, fin):
    fractions = (1.0 - val - fin, val, fin)
    with tempfile.TemporaryDirectory() as out:
        info = make_group_split(art["snapshot_path"], out, seed=seed, fractions=fractions, revision="prop")
        split = read_split(info.split_path)
        final = set(json.loads(Path(info.final_path).read_text())["final"])
    parts = [set(split.train), set(split.validation), final]
    assert [len(p) for p in parts] == list(info.counts) and min(info.counts) >= 1
    assert sum(info.counts) == len(set.union(*parts)) == 72  # disjoint and complete
    assert abs(info.counts[1] - val * 72) <= 1 and abs(info.counts[2] - fin * 72) <= 1


@given(ids=st.lists(st.text("ABC-0123", min_size=1, max_size=6), min_size=3, max_size=60), seed=st.integers(0, 2**63 - 1))
def test_assign_groups_is_a_deterministic_partition(ids, seed):
    distinct = set(ids)
    if len(distinct) < 3:
        with pytest.raises(UsageError):
            assign_groups(ids, seed, (0.7, 0.15, 0.15))
        return
    parts = assign_groups(ids, seed, (0.7, 0.15, 0.15))
    assert parts == assign_groups(list(reversed(ids)), seed, (0.7, 0.15, 0.15))  # input order is irrelevant
    assert all(parts) and sum(map(len, parts)) == len(distinct) == len(set().union(*map(set, parts)))


@given(ids=st.lists(st.text("ABC-0123", min_size=1, max_size=6), min_size=1, max_size=60), seed=st.integers(0, 2**63 - 1), k=st.integers(2, 6))
def test_group_folds_are_disjoint_cover_every_non_final_group_once_and_hold_the_final_out(ids, seed, k):
    distinct = set(ids)
    if len(distinct) - max(1, int(0.15 * len(distinct) + 0.5)) < k:
        with pytest.raises(UsageError, match="fewer folds"):
            assign_group_folds(ids, seed, k, 0.15)
        return
    final, folds = assign_group_folds(ids, seed, k, 0.15)
    assert (final, folds) == assign_group_folds(list(reversed(ids)), seed, k, 0.15)  # input order is irrelevant
    if len(distinct) - len(final) > k:
        assert assign_group_folds(ids, seed, k + 1, 0.15)[0] == final  # K never moves the final partition
    assert len(folds) == k and all(folds) and max(map(len, folds)) - min(map(len, folds)) <= 1
    cover = [i for part in folds for i in part]
    assert len(cover) == len(set(cover)) and set(cover) | set(final) == distinct and not set(cover) & set(final)


def test_a_kfold_split_file_gives_each_fold_its_training_part_and_reads_back_as_fold_0(art, columns, tmp_path):
    info = make_group_kfold_split(art["snapshot_path"], tmp_path, seed=3, folds=4, revision="kf")
    split = read_split(info.split_path)
    final = set(json.loads(Path(info.final_path).read_text())["final"])
    assert split.method is SplitMethod.GROUP_KFOLD and split.fold_count == 4
    assert split.fold(0) == (split.train, split.validation)  # a reader that knows no folds sees fold 0
    for i in range(4):
        train, validation = split.fold(i)
        assert not set(train) & set(validation) and not (set(train) | set(validation)) & final
        assert set(train) | set(validation) == {s.decode() for s in np.unique(columns["shipment_id"])} - final
    with pytest.raises(UsageError, match="fold 4 does not exist"):
        split.fold(4)
    assert make_group_kfold_split(art["snapshot_path"], tmp_path, seed=3, folds=4, revision="kf") == info  # idempotent
    with pytest.raises(UsageError, match="immutable"):
        make_group_kfold_split(art["snapshot_path"], tmp_path, seed=3, folds=5, revision="kf")


def test_split_revision_is_immutable(art, tmp_path):
    a = make_group_split(art["snapshot_path"], tmp_path, seed=5, revision="r1")
    assert make_group_split(art["snapshot_path"], tmp_path, seed=5, revision="r1") == a
    with pytest.raises(UsageError, match="immutable"):
        make_group_split(art["snapshot_path"], tmp_path, seed=6, revision="r1")
    for bad in ("../escape", "", "Upper"):
        with pytest.raises(UsageError, match="revision"):
            make_group_split(art["snapshot_path"], tmp_path, seed=5, revision=bad)
    with pytest.raises(UsageError, match="fractions"):
        make_random_split(art["snapshot_path"], tmp_path, seed=5, fractions=(0.5, 0.5, 0.0), revision="r2")


def test_read_split_recomputes_its_digest(art, tmp_path):
    content = json.loads(Path(art["split_path"]).read_text())
    content["train"].append(content["validation"].pop())
    edited = tmp_path / "split-edited.json"
    edited.write_text(json.dumps(content))
    with pytest.raises(CorruptRecord, match="does not match its own digest"):
        read_split(edited)
    with pytest.raises(UsageError, match="not a 'parcel-split/1' file"):
        read_split(art["final_path"])


# --- partitions ---------------------------------------------------------------------------------


def test_load_partition_never_returns_final_shipments(art):
    split = read_split(art["split_path"])
    final = set(json.loads(Path(art["final_path"]).read_text())["final"])
    train = load_partition(art["snapshot_path"], split, "train")
    val = load_partition(art["snapshot_path"], split, PartitionName.VALIDATION)
    assert set(train.shipment_id) == set(split.train) and set(val.shipment_id) == set(split.validation)
    assert not (set(train.shipment_id) | set(val.shipment_id)) & final
    assert train.images.dtype == np.float32 and train.images.shape[1:] == (32, 32)
    assert 0.0 <= train.images.min() and train.images.max() <= 1.0 and train.labels.dtype == bool
    assert set(train.damage_type) <= set(train.damage_labels) and not train.images.flags.writeable
    assert [m.value for m in PartitionName] == ["train", "validation"]
    with pytest.raises(UsageError, match="only the one-time final evaluation"):
        load_partition(art["snapshot_path"], split, "final")


def test_load_final_partition_is_the_only_door(art, columns):
    split = read_split(art["split_path"])
    final = load_final_partition(art["snapshot_path"], art["final_path"], split=split)
    assert set(final.shipment_id) == set(json.loads(Path(art["final_path"]).read_text())["final"])
    assert np.array_equal(final.images * 255.0, columns["images"][final.rows].astype(np.float32))
    with pytest.raises(UsageError, match="is not the final partition of split"):
        load_final_partition(art["snapshot_path"], art["random_final_path"], split=split)


def test_load_partition_refuses_a_snapshot_the_split_was_not_made_from(art, tmp_path):
    other = make_snapshot(tmp_path, seed=9, n_shipments=5)
    with pytest.raises(UsageError, match="was made from"):
        load_partition(other.path, read_split(art["split_path"]), "train")


def test_random_split_partitions_hold_exactly_their_rows(art, columns):
    split = read_split(art["random_split_path"])
    part = load_partition(art["snapshot_path"], split, "validation")
    assert part.rows.tolist() == sorted(split.validation)
    assert np.array_equal(part.parcel_id, np.char.decode(columns["parcel_id"][part.rows], "ascii"))


def test_default_artifacts_are_idempotent(art):
    again = make_default_artifacts(Path(art["snapshot_path"]).parent, seed=0)
    assert again == art

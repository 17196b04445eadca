"""Claims and checkpoints: the pure claim table, then real files, real processes and real SIGKILLs."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from parcel_hpc.checkpoints.claims import (
    CheckpointCollision,
    ClaimIdentity,
    ClaimOutcome,
    ClaimRecord,
    ClaimState,
    TrialIdentity,
    claim_directory,
    decide_claim,
    describe_conflict,
    quarantine_move,
    read_claim,
)
from parcel_hpc.checkpoints.store import CheckpointStore, step_files
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.errors import ParcelError, UsageError

T7 = TrialIdentity("t0007", "sha256:" + "a" * 64, "sha256:" + "c" * 64, "sha256:" + "d" * 64)
T8 = TrialIdentity("t0008", T7.config_hash, T7.contract_digest, T7.snapshot_digest)
T7_OTHER_CONFIG = TrialIdentity("t0007", "sha256:" + "b" * 64, T7.contract_digest, T7.snapshot_digest)
T7_OTHER_CONTRACT = TrialIdentity("t0007", T7.config_hash, "sha256:" + "e" * 64, T7.snapshot_digest)


def ident(trial=T7, attempt=1, job_id="100", host="node1", pid=4242, fold=None) -> ClaimIdentity:
    return ClaimIdentity(trial, job_id, attempt, host, pid, fold=fold)


def record(trial=T7, attempt=1, job_id="100", host="node1", pid=4242, state=ClaimState.HELD, gen=0, fold=None) -> ClaimRecord:
    return ClaimRecord(trial, job_id, attempt, host, pid, "2025-01-01T00:00:00.000Z", state, gen, fold=fold)


# ---------------------------------------------------------------------------- pure decision table

O = ClaimOutcome
TABLE = [
    ("no claim", None, ident(), None, O.CLAIMED),
    ("other trial, even if dead", record(trial=T8), ident(), False, O.FOREIGN_TRIAL),
    ("other trial, released", record(trial=T8, state=ClaimState.RELEASED), ident(), None, O.FOREIGN_TRIAL),
    ("other config", record(trial=T7_OTHER_CONFIG), ident(attempt=2), False, O.FOREIGN_CONFIG),
    ("other contract", record(trial=T7_OTHER_CONTRACT), ident(), None, O.FOREIGN_SEARCH),
    ("the trial's other fold run, released", record(fold=1, state=ClaimState.RELEASED), ident(fold=2), None, O.FOREIGN_FOLD),
    ("a fold run where a trial without folds was", record(), ident(attempt=2, fold=0), False, O.FOREIGN_FOLD),
    ("the same fold run, older attempt, dead", record(fold=3), ident(attempt=2, fold=3, pid=5), False, O.TAKEN_OVER),
    ("newer attempt holds it", record(attempt=3), ident(attempt=2, pid=1), False, O.STALE_ATTEMPT),
    ("newer attempt released it", record(attempt=3, state=ClaimState.RELEASED), ident(attempt=2), None, O.STALE_ATTEMPT),
    ("ourselves again", record(), ident(), True, O.REENTERED),
    ("released by older attempt", record(state=ClaimState.RELEASED), ident(attempt=2, job_id="101"), None, O.REENTERED),
    ("released by same attempt", record(state=ClaimState.RELEASED), ident(pid=7), True, O.REENTERED),
    ("older attempt, dead", record(), ident(attempt=2, pid=5), False, O.TAKEN_OVER),
    ("older attempt, other node", record(), ident(attempt=2, host="node2"), None, O.TAKEN_OVER),
    ("older attempt, alive", record(), ident(attempt=2, pid=5), True, O.LIVE_HOLDER),
    ("same attempt elsewhere, dead", record(), ident(pid=5), False, O.TAKEN_OVER),
    ("same attempt elsewhere, alive", record(), ident(pid=5), True, O.LIVE_HOLDER),
    ("same attempt elsewhere, unknown", record(), ident(host="node2"), None, O.LIVE_HOLDER),
]


@pytest.mark.parametrize("existing,ours,alive,expected", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_decide_claim_table(existing, ours, alive, expected):
    assert decide_claim(existing, ours, holder_alive=alive) is expected


def test_table_covers_every_outcome_and_conflicts_describe_themselves():
    assert {t[-1] for t in TABLE} == set(ClaimOutcome)
    for _, existing, ours, _alive, outcome in TABLE:
        if outcome.is_conflict():
            assert not outcome.resumes()
            assert describe_conflict(outcome, existing, ours)
        elif existing is not None:
            assert outcome.resumes()
            with pytest.raises(ValueError):
                describe_conflict(outcome, existing, ours)


def test_identities_are_validated_at_birth():
    with pytest.raises(UsageError):
        TrialIdentity("../t1", T7.config_hash, T7.contract_digest, T7.snapshot_digest)
    with pytest.raises(UsageError):
        TrialIdentity("t1", "md5:x", T7.contract_digest, T7.snapshot_digest)
    with pytest.raises(UsageError):
        ident(attempt=0)
    with pytest.raises(UsageError):
        ident(pid=0)


# ---------------------------------------------------------------------------- claims on real files


def test_claim_lifecycle_in_one_process(tmp_path):
    d = tmp_path / "a" / "b"
    first = claim_directory(d, ident(), clock=lambda: 0.0)
    assert first.outcome is O.CLAIMED and first.record.time == "1970-01-01T00:00:00.000Z"
    again = claim_directory(d, ident())
    assert again.outcome is O.REENTERED and again.record.generation == 0  # idempotent: nothing written
    assert first.release() is True and first.release() is False
    second = claim_directory(d, ident(attempt=2, job_id="101", pid=99), is_alive=lambda r: pytest.fail("not asked"))
    assert second.outcome is O.REENTERED and second.record.generation == 2
    assert read_claim(d) == second.record
    with pytest.raises(CheckpointCollision) as exc:
        claim_directory(d, ident(attempt=1))
    assert "stale duplicate" in exc.value.reason and exc.value.theirs == second.record.holder
    with pytest.raises(CheckpointCollision):
        claim_directory(d, ident(attempt=3), is_alive=lambda r: True)
    third = claim_directory(d, ident(attempt=3), is_alive=lambda r: False)
    assert third.outcome is O.TAKEN_OVER and third.previous == second.record
    with pytest.raises(CheckpointCollision) as exc:
        claim_directory(d, ident(trial=T8, attempt=9), is_alive=lambda r: False)
    assert isinstance(exc.value, ParcelError) and "t0008" in str(exc.value) and "HINT" in str(exc.value)
    assert sorted(p.name for p in d.iterdir()) == [f"claim-00000{i}.json" for i in range(4)]


def test_a_fold_run_s_claim_names_its_fold_and_no_other_fold_run_of_the_trial_takes_it(tmp_path):
    fold = claim_directory(tmp_path / "f1", ident(fold=1))
    assert read_claim(tmp_path / "f1") == fold.record and fold.record.fold == 1
    assert json.loads((tmp_path / "f1" / "claim-000000.json").read_text())["fold"] == 1
    fold.release()
    with pytest.raises(CheckpointCollision) as exc:
        claim_directory(tmp_path / "f1", ident(attempt=2, fold=2), is_alive=lambda r: False)
    assert exc.value.other_fold and "fold 1 of trial t0007, we are its fold 2" in exc.value.reason
    assert claim_directory(tmp_path / "f1", ident(attempt=2, fold=1)).outcome is O.REENTERED  # its own next attempt resumes
    claim_directory(tmp_path / "plain", ident())
    assert "fold" not in json.loads((tmp_path / "plain" / "claim-000000.json").read_text())  # a trial without folds: as before


def test_background_saves_write_what_was_submitted_and_raise_the_writers_error_at_the_next_save(tmp_path):
    old = claim_directory(tmp_path, ident(attempt=1))
    writer = BackgroundWriter(CheckpointStore(tmp_path, T7, claim=old))
    w = np.arange(1_000_000, dtype=np.float64)
    writer.submit(1, {"w": w}, {}, {"seed": 1}, clock=time.monotonic)
    w += 1  # the caller's own array, changed at once: the checkpoint holds the submitted values
    assert writer.wait() == tmp_path / "ckpt-000001.h5" and not writer.busy
    assert np.array_equal(CheckpointStore(tmp_path, T7).load_latest().params["w"], np.arange(1_000_000, dtype=np.float64))
    with pytest.raises(UsageError, match="step"):
        writer.submit(-1, {"w": w}, {}, {})  # refused before anything is handed to the writer
    claim_directory(tmp_path, ident(attempt=2, host="node2"))  # a requeue on another node
    writer.submit(2, {"w": w}, {}, {})  # checked and copied here; the claim is checked by the writer
    with pytest.raises(CheckpointCollision, match="must stop"):
        writer.wait()
    writer.submit(3, {"w": w}, {}, {})
    with pytest.raises(CheckpointCollision, match="must stop"):
        writer.submit(4, {"w": w}, {}, {})  # the error of save 3, raised at the next save
    assert writer.wait() == tmp_path / "ckpt-000001.h5"  # raised once, then the writer is idle again
    assert [s for s, _ in step_files(tmp_path)] == [1]


def test_a_background_save_copies_what_the_caller_can_still_change_and_takes_a_frozen_array_as_it_is(tmp_path):
    store = CheckpointStore(tmp_path, T7)
    live = np.arange(6.0)
    frozen = live.copy()
    frozen.flags.writeable = False  # what trainer.torch.pack hands out
    window = live[:3]
    window.flags.writeable = False  # read-only, but a view of memory its owner still changes
    arrays = store.prepare(1, {"live": live, "frozen": frozen, "window": window}, {}, {}, copy=True).contents.arrays["params"]
    assert arrays["frozen"] is frozen or arrays["frozen"].base is frozen  # no second copy
    assert not np.shares_memory(arrays["live"], live) and not np.shares_memory(arrays["window"], live)


def test_a_taken_over_attempt_is_fenced_at_its_next_save(tmp_path):
    old = claim_directory(tmp_path, ident(attempt=1))
    store = CheckpointStore(tmp_path, T7, claim=old)
    store.save(1, {"w": np.ones(3)}, {}, {})
    claim_directory(tmp_path, ident(attempt=2, host="node2"))  # a requeue on another node
    with pytest.raises(CheckpointCollision, match="must stop"):
        store.save(2, {"w": np.ones(3)}, {}, {})
    assert [s for s, _ in step_files(tmp_path)] == [1]


# ---------------------------------------------------------------------------- real processes

WORKER = r"""
import json, os, signal, sys
import numpy as np
from parcel_hpc.checkpoints.store import *
from parcel_hpc.checkpoints.claims import *

def trial(tid, cfg):  # "t0007" with cfg "a" is the tests' T7
    return TrialIdentity(tid, "sha256:" + cfg * 64, "sha256:" + "c" * 64, "sha256:" + "d" * 64)

def say(**kw):
    print(json.dumps(kw), flush=True)

mode, ckpt_dir = sys.argv[1], sys.argv[2]
if mode == "claim":  # wait for "go", claim, report, stay alive until stdin closes
    tid, attempt = sys.argv[3], int(sys.argv[4])
    me = ClaimIdentity.here(trial(tid, "a"), job_id="9", attempt=attempt)
    say(ready=True)
    sys.stdin.readline()
    try:
        say(outcome=claim_directory(ckpt_dir, me).outcome.value)
    except CheckpointCollision as exc:
        say(collision=exc.reason)
    sys.stdin.read()
elif mode in ("train", "train-bg"):  # resume, then save a big checkpoint per step until last_step or killed
    attempt, n, last_step = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    me = ClaimIdentity.here(trial("t0007", "a"), job_id="9", attempt=attempt)
    claim = claim_directory(ckpt_dir, me)
    store = CheckpointStore(ckpt_dir, me, keep_last=2, claim=claim)
    ckpt = store.load_latest()
    rng = np.random.default_rng(12345)
    step, acc = 0, 0.0
    if ckpt is not None:
        rng.bit_generator.state = ckpt.rng_state
        step, acc = ckpt.step, float(ckpt.params["acc"])
    say(outcome=claim.outcome.value, resumed_from=step, problems=len(store.problems))
    if mode == "train":
        while step < last_step:
            step += 1
            acc += rng.random()
            say(writing=step)
            store.save(step, {"w": np.arange(n, dtype=np.float64) + step, "acc": np.array(acc)},
                       {"m": np.full(n // 4, step, np.float32)}, rng.bit_generator.state, {"attempt": attempt})
            say(saved=step)
    else:  # each save written by the background writer while the loop goes on
        from parcel_hpc.checkpoints.writer import BackgroundWriter
        writer = BackgroundWriter(store)
        w, m, a = np.arange(n, dtype=np.float64) + step, np.full(n // 4, step, np.float32), np.array(acc)
        first = step + 1
        while step < last_step:
            step += 1
            acc += rng.random()
            w += 1  # the loop changes its own arrays in place while the previous save may still be written
            m[:] = step
            a[...] = acc
            writer.submit(step, {"w": w, "acc": a}, {"m": m}, rng.bit_generator.state, {"attempt": attempt})
            say(writing=step, saved=step - 1 if step > first else None)  # submit returns once the previous one is durable
        writer.wait()
        say(saved=step)
    claim.release()
    say(done=step, acc=acc)
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)

    def start(*args) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(path), *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    return start


def race(worker, ckpt_dir, contenders):
    """Start every contender, release them together, return their reports (all still alive meanwhile)."""
    procs = [worker("claim", ckpt_dir, tid, attempt) for tid, attempt in contenders]
    try:
        for p in procs:
            assert json.loads(p.stdout.readline()) == {"ready": True}
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        return [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)


def test_two_processes_different_trials_exactly_one_wins(tmp_path, worker):
    reports = race(worker, tmp_path / "shared", [("t0001", 1), ("t0002", 1)])
    assert sorted(r.get("outcome", "collision") for r in reports) == ["claimed", "collision"]
    loser = next(r for r in reports if "collision" in r)
    assert "claimed by trial t000" in loser["collision"]


def test_many_processes_race_one_claim(tmp_path, worker):
    reports = race(worker, tmp_path / "foreign", [(f"t{i:04d}", 1) for i in range(5)])
    assert [r.get("outcome") for r in reports].count("claimed") == 1
    assert sum("collision" in r for r in reports) == 4
    # Same trial, same attempt, launched five times: one holder, the live duplicates are refused.
    reports = race(worker, tmp_path / "dup", [("t0007", 1)] * 5)
    assert [r.get("outcome") for r in reports].count("claimed") == 1
    assert all("alive" in r["collision"] for r in reports if "collision" in r)
    assert sum("collision" in r for r in reports) == 4
    assert [p.name for p in (tmp_path / "dup").iterdir() if not p.name.startswith(".")] == ["claim-000000.json"]


def expected_acc(steps: int) -> float:
    rng, acc = np.random.default_rng(12345), 0.0
    for _ in range(steps):
        acc += rng.random()
    return acc


def run_to_end(worker, ckpt_dir, attempt, n, last_step) -> list[dict]:
    p = worker("train", ckpt_dir, attempt, n, last_step)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    return [json.loads(line) for line in out.splitlines()]


def test_same_trial_retry_reenters_and_resumes_at_the_right_step(tmp_path, worker):
    d = tmp_path / "ck"
    first = run_to_end(worker, d, 1, 1000, 5)
    assert first[0] == {"outcome": "claimed", "resumed_from": 0, "problems": 0}
    second = run_to_end(worker, d, 2, 1000, 9)
    assert second[0] == {"outcome": "reentered", "resumed_from": 5, "problems": 0}
    assert [r["saved"] for r in second if "saved" in r] == [6, 7, 8, 9]
    assert second[-1]["done"] == 9 and second[-1]["acc"] == expected_acc(9)  # rng state restored exactly
    ckpt = CheckpointStore(d, T7).load_latest()
    assert ckpt.step == 9 and ckpt.extra == {"attempt": 2} and [s for s, _ in step_files(d)] == [8, 9]


@pytest.mark.parametrize("mode", ["train", "train-bg"])
def test_sigkill_mid_write_always_leaves_a_loadable_checkpoint(tmp_path, worker, mode):
    seed = int.from_bytes(os.urandom(4), "little")
    rnd = random.Random(seed)
    d, n = tmp_path / "ck", 2_000_000  # 16 MB of params per step: the kill lands inside a save
    store = CheckpointStore(d, T7, keep_last=2)
    last_durable = 0
    for attempt in range(1, 6):
        p = worker(mode, d, attempt, n, 10_000)
        start = json.loads(p.stdout.readline())
        assert start["resumed_from"] == last_durable, (seed, start)
        assert start["outcome"] == ("claimed" if attempt == 1 else "taken_over"), (seed, start)
        target = start["resumed_from"] + rnd.randint(2, 4)  # at least one whole save per round
        for line in p.stdout:
            msg = json.loads(line)
            last_durable = msg.get("saved") or last_durable
            if msg.get("writing") == target:
                break
        time.sleep(rnd.uniform(0.0, 0.15))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        p.stdout.close()
        p.stdin.close()
        ckpt = store.load_latest()
        assert ckpt is not None and store.problems == (), (seed, store.problems)
        assert ckpt.step >= last_durable, (seed, ckpt.step, last_durable)  # "saved" is printed after durability
        assert np.array_equal(ckpt.params["w"], np.arange(n, dtype=np.float64) + ckpt.step), seed
        assert float(ckpt.params["acc"]) == expected_acc(ckpt.step), seed
        last_durable = ckpt.step


# ---------------------------------------------------------------------------- checkpoint files


def sample(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {
        "params": {
            "conv1/weight": rng.random((8, 3, 3, 3)).astype(np.float32),
            "conv1/bias": rng.random(8),
            "head.bias": np.arange(5, dtype=">i4"),
            "scale": np.array(2.5),
            "empty": np.zeros((0, 4)),
            "mask": rng.random(10) > 0.5,
            "z": np.array([1 + 2j]),
        },
        "optimizer": {"m/conv1/weight": np.full((8, 3, 3, 3), step, np.float64)},
        "rng_state": rng.bit_generator.state,
        "extra": {"loss": 0.25 * step, "epoch": step},
    }


def assert_same(ckpt, step):
    want = sample(step)
    assert ckpt.step == step
    for section in ("params", "optimizer"):
        got = getattr(ckpt, section)
        assert set(got) == set(want[section])
        for k, v in want[section].items():
            assert got[k].shape == v.shape and got[k].dtype == v.dtype.newbyteorder("<") and np.array_equal(got[k], v), k
    assert ckpt.rng_state == want["rng_state"] and ckpt.extra == want["extra"]


def save(store, step):
    s = sample(step)
    return store.save(step, s["params"], s["optimizer"], s["rng_state"], s["extra"])


def test_roundtrip_restores_arrays_rng_and_metadata(tmp_path):
    store = CheckpointStore(tmp_path, T7)
    assert store.load_latest() is None
    path = save(store, 41)
    assert path.name == "ckpt-000041.h5"
    ckpt = store.load_latest()
    assert_same(ckpt, 41)
    assert ckpt.meta["trial_id"] == "t0007" and ckpt.meta["body_digest"].startswith("xxh3-128:")
    restored, original = np.random.default_rng(), np.random.default_rng()
    restored.bit_generator.state = ckpt.rng_state
    original.bit_generator.state = sample(41)["rng_state"]
    assert restored.random(5).tolist() == original.random(5).tolist()  # continues exactly where it was saved
    with h5py.File(path, "r") as f:  # still a plain HDF5 file for outside tools
        assert f.attrs["config_hash"] == T7.config_hash and f["params/conv1/weight"].shape == (8, 3, 3, 3)


def test_bad_inputs_are_refused_before_writing(tmp_path):
    store = CheckpointStore(tmp_path, T7)
    with pytest.raises(UsageError):
        store.save(1, {"w": np.array(["text"])}, {}, {})
    with pytest.raises(UsageError):
        store.save(1, {"a": np.ones(1), "a/b": np.ones(1)}, {}, {})
    with pytest.raises(UsageError):
        store.save(1, {"w": np.ones(1)}, {}, {"x": float("nan")})
    with pytest.raises(UsageError):
        CheckpointStore(tmp_path, T7, keep_last=0)
    assert list(tmp_path.iterdir()) == []


def test_truncated_file_falls_back_to_previous_good(tmp_path):
    store = CheckpointStore(tmp_path, T7, keep_last=5)
    save(store, 1)
    last = save(store, 2)
    os.truncate(last, last.stat().st_size // 2)
    assert_same(store.load_latest(), 1)
    assert [p.path.name for p in store.problems] == ["ckpt-000002.h5"] and "truncated" in store.problems[0].reason


def test_every_single_bit_flip_is_detected(tmp_path):
    store = CheckpointStore(tmp_path, T7, keep_last=5)
    save(store, 1)
    last = save(store, 2)
    original = last.read_bytes()
    rnd = random.Random(7)
    for pos in rnd.sample(range(len(original)), 80) + list(range(0, 200, 9)):  # all over, and the header
        damaged = bytearray(original)
        damaged[pos] ^= 1 << rnd.randrange(8)
        last.write_bytes(bytes(damaged))
        ckpt = store.load_latest()
        assert_same(ckpt, 1)
        assert len(store.problems) == 1, pos


def test_a_body_read_in_many_chunks_has_the_whole_body_digest_and_each_chunk_is_checked(tmp_path, monkeypatch):
    """Loads hash the body chunk by chunk as it is read; the digest is still xxh3-128 of the whole
    body (files from before and after read alike), and damage in any chunk is found."""
    import xxhash

    from parcel_hpc.checkpoints import format as ckpt_format

    monkeypatch.setattr(ckpt_format, "_CHUNK", 64)
    store = CheckpointStore(tmp_path, T7, keep_last=5)
    save(store, 1)
    last = save(store, 2)
    ckpt = store.load_latest()
    assert_same(ckpt, 2)
    original = last.read_bytes()
    assert ckpt.meta["body_digest"] == "xxh3-128:" + xxhash.xxh3_128(original[ckpt.meta["block"] :]).hexdigest()
    for pos in range(ckpt.meta["block"], len(original), 997):
        damaged = bytearray(original)
        damaged[pos] ^= 0x01
        last.write_bytes(bytes(damaged))
        assert_same(store.load_latest(), 1)
        assert "body digest mismatch" in store.problems[0].reason, pos


def test_an_old_checkpoint_whose_removal_a_crash_undid_is_passed_over_and_pruned_again(tmp_path):
    """Pruning does not fsync the directory: after a crash an old file may be back. It is older than
    the durable new one, so resume never picks it, and the next save removes it."""
    store = CheckpointStore(tmp_path, T7, keep_last=1)
    old = save(store, 1)
    old_bytes = old.read_bytes()
    save(store, 2)
    assert not old.exists()
    old.write_bytes(old_bytes)
    assert_same(store.load_latest(), 2)
    assert store.problems == ()
    save(store, 3)
    assert [s for s, _ in step_files(tmp_path)] == [3]


def test_many_arrays_get_a_larger_header_block_and_load_without_hdf5(tmp_path, monkeypatch):
    """The header indexes every dataset; with hundreds of arrays it outgrows 2 KiB and the user
    block doubles. Loading reads the verified bytes at the indexed offsets: HDF5 is not opened."""
    store = CheckpointStore(tmp_path, T7)
    params = {f"layer{i:03d}/weight": np.full((3, 4), i, np.float32) for i in range(300)}
    params["empty"] = np.zeros((0, 5))
    params["flags"] = np.array([True, False, True])
    params["scalar"] = np.array(2.5)
    store.save(5, params, {}, {"s": 1})
    monkeypatch.setattr("parcel_hpc.checkpoints.format.h5py.File", None)  # any HDF5 open would now fail
    ckpt = store.load_latest()
    assert ckpt.meta["block"] > 2048 and ckpt.meta["block"] & (ckpt.meta["block"] - 1) == 0
    for name, arr in params.items():
        assert ckpt.params[name].dtype == arr.dtype and ckpt.params[name].shape == arr.shape and np.array_equal(ckpt.params[name], arr), name


def test_a_format_v1_checkpoint_still_loads_and_its_damage_is_still_found(tmp_path):
    """Checkpoints written before the fast digest (v1: a tree sha256 of the body) resume as before."""
    from parcel_hpc.checkpoints.format import _HEADER_SIZE, _body_digest, _encode_header, _read_header

    store = CheckpointStore(tmp_path, T7, keep_last=5)
    save(store, 1)
    last = save(store, 2)
    for path in (tmp_path / "ckpt-000001.h5", last):
        with open(path, "r+b") as fh:
            header, block = _read_header(fh)
            assert block == _HEADER_SIZE
            body = bytearray(fh.read())
            for key in ("block", "datasets", "rng_state", "extra", "body_digest"):  # v2's index and digest
                del header[key]
            header.update(format_version=1, body_sha256=_body_digest(body, "sha256t:"))
            fh.seek(0)
            fh.write(_encode_header(header))
    ckpt = store.load_latest()
    assert_same(ckpt, 2)
    assert ckpt.meta["format_version"] == 1 and ckpt.meta["body_sha256"].startswith("sha256t:")
    damaged = bytearray(last.read_bytes())
    damaged[-100] ^= 0x10
    last.write_bytes(bytes(damaged))
    assert_same(store.load_latest(), 1)
    assert "body digest mismatch" in store.problems[0].reason


def test_another_trials_checkpoint_is_a_collision_not_corruption(tmp_path):
    save(CheckpointStore(tmp_path, T8), 3)
    with pytest.raises(CheckpointCollision, match="t0008") as exc:
        CheckpointStore(tmp_path, T7).load_latest()
    assert exc.value.theirs == T8
    other = tmp_path / "cfg"
    save(CheckpointStore(other, T7_OTHER_CONFIG), 1)
    save(CheckpointStore(other, T7), 2)  # ours is newest, but a foreign older file is still found
    with pytest.raises(CheckpointCollision, match="config_hash"):
        CheckpointStore(other, T7).load_latest()


def test_keep_last_keeps_exactly_k_and_abandons_a_future_it_rewound_from(tmp_path):
    store = CheckpointStore(tmp_path, T7, keep_last=3)
    for step in range(1, 8):
        save(store, step)
        assert len(step_files(tmp_path)) == min(step, 3)
    assert [s for s, _ in step_files(tmp_path)] == [5, 6, 7]
    save(store, 5)  # resumed from an older step: 6 and 7 are set aside, not counted, not read
    assert [s for s, _ in step_files(tmp_path)] == [5]
    assert sorted(p.name for p in tmp_path.glob("*.abandoned")) == ["ckpt-000006.h5.abandoned", "ckpt-000007.h5.abandoned"]
    assert_same(store.load_latest(), 5)


def test_save_clears_temp_files_of_a_killed_writer(tmp_path):
    store = CheckpointStore(tmp_path, T7)
    stale = tmp_path / ".ckpt-000003.h5.abcd1234.tmp"
    stale.write_bytes(b"half a checkpoint")
    assert store.load_latest() is None and stale.exists()  # a reader never deletes
    save(store, 4)
    assert not stale.exists()


# ---------------------------------------------------------------------------- collision helpers


def test_quarantine_move_moves_and_never_deletes(tmp_path):
    src = tmp_path / "ckpts" / "t0007"
    claim_directory(src, ident())
    save(CheckpointStore(src, T7), 1)
    before = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    dest = quarantine_move(src, tmp_path / "quarantine", "t0007", "collision with t0008", clock=lambda: 0.0)
    assert not src.exists() and dest.parent == tmp_path / "quarantine"
    assert dest.name.startswith("t0007-19700101T000000Z-")
    after = {p.relative_to(dest / "t0007"): p.read_bytes() for p in (dest / "t0007").rglob("*") if p.is_file()}
    assert after == before
    reason = json.loads((dest / "reason.json").read_text())
    assert reason["reason"] == "collision with t0008" and reason["moved_from"] == str(src)
    again = quarantine_move(tmp_path / "ckpts", tmp_path / "quarantine", "t0007", "second")
    assert again != dest and (dest / "t0007").is_dir()
    with pytest.raises(UsageError):
        quarantine_move(tmp_path / "nothing", tmp_path / "quarantine", "t0007", "x")


# ---------------------------------------------------------------------------- permissions


@pytest.fixture
def umask_zero():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_nothing_created_is_world_writable_under_umask_0(tmp_path, umask_zero):
    root = tmp_path / "deep" / "er"
    ckpt_dir = root / "ck" / "t0007"
    claim = claim_directory(ckpt_dir, ident())
    for step in (1, 2):
        save(CheckpointStore(ckpt_dir, T7, keep_last=1, claim=claim), step)
    claim.release()
    quarantine_move(ckpt_dir, root / "q" / "x", "t0007", "test")
    created = [root.parent, *root.parent.rglob("*")]
    assert len(created) > 10
    for p in created:
        mode = stat.S_IMODE(p.stat().st_mode)
        limit = 0o755 if p.is_dir() else 0o644
        assert mode & ~limit == 0, f"{p} has mode {oct(mode)}"

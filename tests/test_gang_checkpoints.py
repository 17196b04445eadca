"""One checkpoint across a gang's ranks (parcel_hpc.checkpoints.gang): a step counts only once every
rank's part is durable and rank 0's manifest names them all; every rank agrees on the newest complete
step; ranks killed at random instants always leave a complete step whose parts all verify."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from parcel_hpc.checkpoints.gang import DAMAGED, Committed, GangCheckpoints, PartDamaged, PartsMissing, WorldSizeChanged, manifest_name, part_name
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.admission import TrialIdentity
from parcel_hpc.trainer.run import LoopError, Restored
from parcel_hpc.worker.gang import restored_of

T = TrialIdentity("t0003", "sha256:" + "a" * 64, "sha256:" + "c" * 64, "sha256:" + "d" * 64)


def _ranks(tmp_path, world=2, attempt=1, **kw):
    return [GangCheckpoints(tmp_path, T, rank=r, world_size=world, attempt=attempt, **kw) for r in range(world)]


def _part(g, step, value, **extra):
    return g.write_part(g.prepare(step, {"w": np.full(4, value, dtype=np.float32)}, {}, {"seed": step}, extra))


def _save(ranks, step, commit=True):
    for g in ranks:
        _part(g, step, step * 10 + g.rank, mine=g.rank)
    return ranks[0].commit(step, wait_s=0) if commit else None


def _damage_body(path):
    """One byte of a part's body flipped, not its header: only a rank that reads the part can tell."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_each_rank_resumes_its_own_part_of_the_step_rank_0_committed(tmp_path):
    ranks = _ranks(tmp_path, world=3)
    assert ranks[1].load_latest() is None
    manifest = _save(ranks, 41)
    assert manifest.step == 41 and manifest.world_size == 3 and [p.rank for p in manifest.parts] == [0, 1, 2]
    on_disk = json.loads((tmp_path / manifest_name(41)).read_text())
    assert on_disk["trial"]["trial_id"] == "t0003" and on_disk["attempt"] == 1
    for g in ranks:
        restored = g.load_latest()
        assert restored.manifest == manifest and restored.own.step == 41
        assert np.array_equal(restored.own.params["w"], np.full(4, 410 + g.rank, dtype=np.float32))
        assert restored.own.extra["mine"] == g.rank and restored.own.rng_state == {"seed": 41}
    assert ranks[2].read_part(manifest, 0).params["w"][0] == 410  # a trainer that reshards reads any part


def test_a_step_is_not_committed_until_every_rank_wrote_its_part_and_rank_0_committed_it(tmp_path):
    ranks = _ranks(tmp_path)
    _save(ranks, 10)
    _part(ranks[0], 20, 0.0)  # rank 1 never wrote step 20
    clock = iter(range(100)).__next__
    with pytest.raises(PartsMissing, match=r"step 20: no part from rank 1 of 2 after 3 s"):
        ranks[0].commit(20, wait_s=3, clock=clock, sleep=lambda s: None)
    assert not (tmp_path / manifest_name(20)).exists()
    assert all(g.load_latest().manifest.step == 10 for g in ranks)

    _part(ranks[1], 20, 1.0)  # both parts, but rank 0 died before committing
    assert all(g.load_latest().manifest.step == 10 for g in ranks)
    with pytest.raises(Exception, match="rank 0 commits"):
        ranks[1].commit(20, wait_s=0)


def test_a_part_left_by_an_earlier_attempt_is_never_committed_for_this_one(tmp_path):
    first = _ranks(tmp_path, attempt=1)
    _save(first, 10)
    _part(first[1], 20, 1.0)  # the earlier attempt's rank 1 got further before it died
    second = _ranks(tmp_path, attempt=2)
    assert second[0].load_latest().manifest.step == 10
    _part(second[0], 20, 2.0)
    with pytest.raises(PartsMissing, match="no part from rank 1"):
        second[0].commit(20, wait_s=0)
    _part(second[1], 20, 3.0)
    assert second[0].commit(20, wait_s=0).attempt == 2
    assert second[1].load_latest().own.params["w"][0] == 3.0


def test_a_damaged_part_sets_its_step_aside_and_every_rank_then_agrees_on_the_step_before(tmp_path):
    ranks = _ranks(tmp_path)
    _save(ranks, 10)
    _save(ranks, 20)
    _damage_body(tmp_path / part_name(20, 1))
    assert ranks[0].load_latest().manifest.step == 20  # rank 0 read its own part, which is whole
    with pytest.raises(PartDamaged, match="rank 1's part of step 20 is damaged"):
        ranks[1].load_latest()
    assert (tmp_path / (manifest_name(20) + DAMAGED)).exists() and not (tmp_path / manifest_name(20)).exists()
    assert [g.load_latest().manifest.step for g in ranks] == [10, 10]

    (tmp_path / part_name(10, 0)).write_bytes(b"replaced")  # a header that no longer matches: incomplete for everyone
    assert [g.load_latest() for g in ranks] == [None, None]


def test_a_rank_restores_another_rank_s_part_of_its_step_and_a_damaged_one_sets_the_step_aside(tmp_path):
    # A Hugging Face gang's rank 0 alone saves the model and optimizer: every rank restores them from rank 0's part.
    ranks = _ranks(tmp_path)
    _save(ranks, 10)
    _save(ranks, 20)
    restored = restored_of(ranks[1].load_latest(), ranks[1])
    assert restored.step == 20 and restored.state.arrays["w"][0] == 201 and restored.state.scalars == {"mine": 1}
    rank_0 = restored.of_rank(0)
    assert rank_0.step == 20 and rank_0.state.arrays["w"][0] == 200 and rank_0.state.scalars == {"mine": 0}
    _damage_body(tmp_path / part_name(20, 0))
    with pytest.raises(PartDamaged, match="rank 0's part of step 20 is damaged"):
        restored.of_rank(0)
    assert [g.load_latest().manifest.step for g in ranks] == [10, 10]  # the step set aside, as for a rank's own part
    with pytest.raises(LoopError, match="no part of rank 1"):
        Restored(20, restored.state).of_rank(1)  # a trial of one rank


def test_a_reader_outside_the_gang_reads_every_part_of_the_newest_step_and_never_sets_one_aside(tmp_path):
    """The selection's rescore reads a finished gang's parts: any rank's, verified; a damaged one is its
    one line, and the trial's directory is left as it was (a reader is not the gang)."""
    ranks = _ranks(tmp_path, world=3)
    assert Committed.newest(tmp_path, T, 3) is None
    _save(ranks, 10)
    _save(ranks, 20)
    committed = Committed.newest(tmp_path, T, 3)
    assert committed is not None and committed.manifest.step == 20
    assert [committed.part(r).params["w"][0] for r in (2, 0, 1)] == [202, 200, 201] and committed.part(0).extra["mine"] == 0
    with pytest.raises(WorldSizeChanged, match="written by 3 ranks, not the trial's 2"):
        Committed.newest(tmp_path, T, 2)
    _damage_body(tmp_path / part_name(20, 2))
    with pytest.raises(UsageError, match="rank 2's part of step 20 in .* is damaged"):
        committed.part(2)
    assert (tmp_path / manifest_name(20)).exists() and not (tmp_path / (manifest_name(20) + DAMAGED)).exists()


def test_rank_0s_background_writer_commits_the_step_once_every_part_is_there(tmp_path):
    ranks = _ranks(tmp_path)
    writer = BackgroundWriter(ranks[0])
    writer.submit(7, {"w": np.arange(4.0)}, {}, {})  # rank 0's part, then its commit, off the training path
    time.sleep(0.2)
    assert not (tmp_path / manifest_name(7)).exists()  # waiting for rank 1's part
    _part(ranks[1], 7, 5.0)
    assert writer.wait() == tmp_path / part_name(7, 0)
    assert [g.load_latest().own.params["w"][0] for g in ranks] == [0.0, 5.0]


def test_another_world_size_is_refused_in_one_line(tmp_path):
    _save(_ranks(tmp_path, world=4), 30)
    with pytest.raises(WorldSizeChanged) as refused:
        GangCheckpoints(tmp_path, T, rank=0, world_size=2, attempt=2).load_latest()
    assert "\n" not in str(refused.value) and "written by 4 ranks and this attempt has 2" in str(refused.value)


def test_commits_keep_the_newest_steps_and_drop_older_parts_but_never_a_newer_step_in_flight(tmp_path):
    ranks = _ranks(tmp_path, keep_last=2)
    for step in (10, 20, 30):
        _save(ranks, step)
    _save(ranks, 35, commit=False)  # written, never committed: older than the next commit, an orphan
    _part(ranks[1], 50, 0.0)  # a rank ahead, writing a later step
    _save(ranks, 40)
    names = sorted(os.listdir(tmp_path))
    assert names == sorted([manifest_name(30), manifest_name(40), *(part_name(s, r) for s in (30, 40) for r in (0, 1)), part_name(50, 1)])


def test_ranks_killed_at_random_instants_always_leave_a_complete_step_every_rank_agrees_on(tmp_path):
    """Real processes, one a rank, saving step after step (rank 0 committing each); all killed with
    SIGKILL at a random instant, then restarted from what every rank finds: eight times."""
    world = 3
    script = textwrap.dedent(
        f"""
        import sys, numpy as np
        from parcel_hpc.checkpoints.gang import GangCheckpoints
        from parcel_hpc.governance.admission import TrialIdentity
        identity = TrialIdentity(*sys.argv[4:8])
        rank, attempt = int(sys.argv[2]), int(sys.argv[3])
        g = GangCheckpoints(sys.argv[1], identity, rank=rank, world_size={world}, attempt=attempt)
        restored = g.load_latest()
        step = restored.manifest.step if restored else 0
        while True:
            step += 1
            g.write_part(g.prepare(step, {{"w": np.full(300_000, step * 10 + rank, dtype=np.float64)}}, {{}}, {{}}))
            if rank == 0:
                g.commit(step, wait_s=60)
        """
    )
    rng = random.Random(49)
    steps, cut_mid_save = [], 0
    for attempt in range(1, 9):
        procs = [
            subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(r), str(attempt), *T.claim_json().values()], start_new_session=True)
            for r in range(world)
        ]
        time.sleep(rng.uniform(0.3, 1.5))
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)  # each rank is its own session: only the processes this test started
        for p in procs:
            p.wait()
        found = [GangCheckpoints(tmp_path, T, rank=r, world_size=world, attempt=attempt + 1).load_latest() for r in range(world)]
        assert len({f.manifest.step if f else 0 for f in found}) == 1, found
        if found[0] is not None:
            for r, f in enumerate(found):
                assert np.all(f.own.params["w"] == f.manifest.step * 10 + r)
        steps.append(found[0].manifest.step if found[0] else 0)
        cut_mid_save += any(int(m.group(1)) > steps[-1] for name in os.listdir(tmp_path) if (m := re.match(r"\.?ckpt-(\d{6})", name)))
    assert steps == sorted(steps) and steps[-1] > 0, steps  # never backwards, and the gang got somewhere
    assert cut_mid_save, "no kill landed between a part's write and its step's commit"

"""The gang's control channel (parcel_hpc.worker.gang) between real processes: every rank gets the
one decision at every step, a signal on any rank stops them all at the same step, a rank's error
reaches rank 0 with its traceback, and a hung or killed rank is named within the bound."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from parcel_hpc.worker.gang import GangEnv, Leader, RankHung, RankLost

PEER = textwrap.dedent(
    """
    import json, sys, time
    from parcel_hpc.ledger import DeviceUse
    from parcel_hpc.worker.gang import USED, Peer, Report
    port, rank, behaviour, at = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    peer = Peer.connect("127.0.0.1", port, rank, hang_s=10, job="77")
    step = 0
    while True:
        step += 1
        if behaviour == "hang" and step == at:
            time.sleep(60)
        error = None
        if behaviour == "raise" and step == at:
            try:
                raise ValueError(f"rank {rank} diverged")
            except ValueError:
                import traceback
                error = traceback.format_exc()
        decision = peer.exchange(Report(rank, step, signalled=behaviour == "signal" and step == at, error=error))
        print(json.dumps(decision), flush=True)
        if decision["stop"]:
            break
    peer.report(Report(rank, step, kind=USED, use=DeviceUse((f"GPU {rank}",), None, rank / 10, rank)))  # its last word
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gang(behaviours: list[tuple[str, int]]):
    port = _free_port()
    peers = [
        subprocess.Popen([sys.executable, "-c", PEER, str(port), str(rank), b, str(at)], stdout=subprocess.PIPE, text=True, start_new_session=True)
        for rank, (b, at) in enumerate(behaviours, start=1)
    ]
    return port, peers


def _lead(leader: Leader, last: int) -> list[list]:
    gathered = []
    for step in range(1, last + 1):
        reports = leader.gather(step)
        gathered.append(reports)
        stop = "requeue" if any(r.signalled for r in reports) else "failed" if any(r.error for r in reports) else "done" if step == last else None
        leader.send({"step": step, "stop": stop})
        if stop:
            break
    return gathered


def _stop(peers):
    for p in peers:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # only the processes this test started, each its own session
        p.wait()


def test_a_signal_on_any_rank_stops_the_whole_gang_at_the_same_step():
    port, peers = _gang([("run", 0), ("signal", 37), ("run", 0)])
    try:
        leader = Leader.open(port, 4, hang_s=30, job="77")
        gathered = _lead(leader, 100)
        uses = leader.uses(10)  # each rank's reading of its GPUs, its last word
        leader.close()
        assert [(u.devices, u.utilization, u.samples) for u in uses if u is not None] == [((f"GPU {r}",), r / 10, r) for r in (1, 2, 3)]
        assert len(gathered) == 37 and [r.rank for r in gathered[-1]] == [1, 2, 3] and all(r.step == 37 for r in gathered[-1])
        for p in peers:
            decisions = [json.loads(line) for line in p.communicate(timeout=30)[0].splitlines()]
            assert [d["step"] for d in decisions] == list(range(1, 38)) and decisions[-1]["stop"] == "requeue"
            assert p.returncode == 0
    finally:
        _stop(peers)


def test_a_ranks_error_reaches_rank_0_with_its_traceback():
    port, peers = _gang([("raise", 5)])
    try:
        leader = Leader.open(port, 2, hang_s=30, job="77")
        gathered = _lead(leader, 100)
        error = gathered[-1][0].error
        assert len(gathered) == 5 and "Traceback" in error and "ValueError: rank 1 diverged" in error
    finally:
        _stop(peers)


def test_a_hung_rank_is_named_within_the_bound_and_a_killed_one_at_once():
    port, peers = _gang([("run", 0), ("hang", 4)])
    try:
        leader = Leader.open(port, 3, hang_s=2, job="77")
        began = time.monotonic()
        with pytest.raises(RankHung, match=r"rank 2 sent nothing for 2 s at step 4") as hung:
            _lead(leader, 100)
        assert hung.value.rank == 2 and time.monotonic() - began < 2 + 1.5
    finally:
        _stop(peers)

    port, peers = _gang([("run", 0), ("hang", 6)])
    try:
        leader = Leader.open(port, 3, hang_s=30, job="77")
        for step in range(1, 6):
            leader.gather(step)
            leader.send({"step": step, "stop": None})
        os.killpg(peers[1].pid, signal.SIGKILL)  # rank 2, hanging at step 6, is killed: its node went down
        began = time.monotonic()
        with pytest.raises(RankLost, match="rank 2 left the gang at step 6"):
            leader.gather(6)
        assert time.monotonic() - began < 5
        began = time.monotonic()
        assert leader.uses(0.5) == [None, None]  # rank 1 still waits on step 6, rank 2 is gone: none told, within the wait
        assert time.monotonic() - began < 2
    finally:
        _stop(peers)


def test_a_rank_that_never_joins_is_hung_at_step_0():
    port = _free_port()
    with pytest.raises(RankHung, match="rank 1 sent nothing for 1 s at step 0"):
        Leader.open(port, 2, hang_s=1, job="77")


def test_a_gangs_ports_stay_below_linuxs_ephemeral_range_and_above_the_dev_clusters():
    # An outgoing connection takes a local port in 32768-60999 (the default ip_local_port_range): a
    # gang drawn there collided once. The dev clusters' own ports are 16817.. and 19817..(+103).
    gangs = [GangEnv.of_job(job, 0, 2, 0, 1, ["n1", "n2"]) for job in [*map(str, range(1, 20000)), "4242_7", "509", "job-a"]]
    assert min(g.master_port for g in gangs) >= 21000 and max(g.channel_port for g in gangs) <= 32767


def test_jobs_numbered_close_together_never_share_a_port():
    # Jobs running at once on a node were submitted about together: 5,000 in a row hold 10,000 ports.
    held = [p for job in range(987_654, 992_654) for g in [GangEnv.of_job(str(job), 0, 2, 0, 1, ["n1"])] for p in (g.master_port, g.channel_port)]
    assert len(set(held)) == len(held)


def test_a_hello_of_another_job_is_turned_away_and_the_gang_waits_for_its_own():
    # Two jobs drawn one port: the other job's peer is closed at once, never counted as this gang's rank.
    port = _free_port()
    stranger_code = "import sys\nfrom parcel_hpc.worker.gang import Peer, RankLost\npeer = Peer.connect('127.0.0.1', int(sys.argv[1]), 1, hang_s=10, job='other')\ntry:\n    peer.told(10)\nexcept RankLost:\n    print('turned away')\n"
    stranger = subprocess.Popen([sys.executable, "-c", stranger_code, str(port)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    peers = [stranger]
    opened: dict[str, Leader] = {}
    opener = threading.Thread(target=lambda: opened.setdefault("leader", Leader.open(port, 2, hang_s=20, job="77")))
    try:
        opener.start()
        assert stranger.communicate(timeout=30)[0].strip() == "turned away"
        assert opener.is_alive()  # still waiting for its own rank 1
        peers.append(subprocess.Popen([sys.executable, "-c", PEER, str(port), "1", "run", "0"], stdout=subprocess.PIPE, text=True, start_new_session=True))
        opener.join(timeout=30)
        leader = opened["leader"]
        assert [r.rank for r in leader.gather(1)] == [1]
        leader.send({"step": 1, "stop": "requeue"})
        assert json.loads(peers[1].communicate(timeout=30)[0].splitlines()[0])["stop"] == "requeue"
        leader.close()
    finally:
        opener.join(timeout=30)
        _stop(peers)


def test_every_rank_of_a_job_and_its_requeued_run_name_the_same_master_and_port():
    ranks = [GangEnv.of_job("4242_7", r, 4, r % 2, 2, ["n2", "n3"]) for r in range(4)]
    assert {(g.master_addr, g.master_port) for g in ranks} == {("n2", ranks[0].master_port)}
    assert GangEnv.of_job("4242_7", 0, 4, 0, 2, ["n2", "n3"]) == ranks[0]  # the requeued run: the same
    assert GangEnv.of_job("4242_8", 0, 4, 0, 2, ["n2", "n3"]).master_port != ranks[0].master_port
    assert ranks[3].environ() == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n2",
        "MASTER_PORT": str(ranks[0].master_port),
    }
    assert ranks[3].channel_port == ranks[0].master_port + 1


def test_the_first_exception_raised_is_the_gang_s_failure_and_a_rank_gone_silently_is_lost():
    from parcel_hpc.worker.gang import FINAL_PARTITION, Report, first_failure

    consequence = Report(1, 7, error="RuntimeError: Connection closed by peer", cause="exception", at=105.0)
    origin = Report(3, 7, error="ValueError: NaN in the loss", cause="diverged", at=104.2)
    failed = first_failure([Report(2, 7), consequence, origin])
    assert (failed.rank, failed.cause) == (3, "diverged") and "NaN in the loss" in str(failed)
    asked = Report(2, 7, error="asked for the final partition", cause=FINAL_PARTITION, at=109.0)
    assert first_failure([consequence, origin, asked]).rank == 2  # a rejection, whenever it came
    assert first_failure([Report(1, 7), Report(2, 7, signalled=True)]) is None
    assert Report.of(3, origin.to_json()) == origin  # when it was raised travels with it

    # A peer killed without a word (its node gone) while another reported the error that followed: lost.
    port, peers = _gang([("run", 0), ("raise", 4), ("run", 0)])
    try:
        leader = Leader.open(port, 4, hang_s=30, job="77")
        for step in range(1, 4):
            leader.gather(step)
            leader.send({"step": step, "stop": None})
        os.killpg(peers[0].pid, signal.SIGKILL)  # rank 1, silently
        began = time.monotonic()
        said = leader.after_failure(4, grace_s=3)
        assert isinstance(said, RankLost) and said.rank == 1 and time.monotonic() - began < 5
    finally:
        _stop(peers)

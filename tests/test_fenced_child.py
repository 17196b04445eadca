"""One fenced child for trainer code the launch runs more than once (its checks, then its preflight):
each call runs in the same fenced process, so what the first imported is there for the next; a child
that ends before it answers, or reaches for a protected file, is said in one line, and no child
outlives its ``with`` block."""

import os
import sys

import pytest

from parcel_hpc.errors import UsageError
from parcel_hpc.fence import FencedChild, Protected
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome


def _pid_and_loaded(name: str) -> list:
    return [os.getpid(), name in sys.modules]


def _load(name: str) -> int:
    __import__(name)
    return os.getpid()


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _exit(code: int) -> None:
    os._exit(code)


@pytest.fixture
def protected(tmp_path):
    final, snapshot = tmp_path / "final-x.json", tmp_path / "parcels.h5"
    final.write_text("[1]")
    snapshot.write_bytes(b"x")
    split = tmp_path / "split-x.json"
    split.write_text("{}")
    return Protected.of(split, snapshot), snapshot


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped
    return False


def test_calls_run_one_after_another_in_one_fenced_child_and_it_ends_with_the_block(protected, tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fenced_child_probe.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    with FencedChild(protected[0]) as child:
        first = child.call("a test's first call", lambda: _load("fenced_child_probe"))  # the first call: as forked
        pid, loaded = child.call("a test's second call", _pid_and_loaded, "fenced_child_probe")  # the next: pickled to it
        assert pid == first != os.getpid() and loaded  # one child, which kept what the first call imported
    assert _gone(first) and "fenced_child_probe" not in sys.modules


def test_a_child_that_ends_before_it_answers_is_one_line_with_how_it_ended(protected):
    with FencedChild(protected[0]) as child:
        child.call("a test's first call", _pid_and_loaded, "json")
        with pytest.raises(UsageError, match="the trainer's code ended the fenced process before it answered .it exited with status 3."):
            child.call("the launch's preflight", _exit, 3)
        with pytest.raises(UsageError, match="exited with status 4"):  # a next call starts a fresh child
            child.call("again", _exit, 4)


def test_a_reach_for_a_protected_file_in_a_later_call_is_reject_final_partition(protected):
    with FencedChild(protected[0]) as child:
        child.call("a test's first call", _pid_and_loaded, "json")
        with pytest.raises(GovernanceRefusal) as refused:
            child.call("the launch's preflight", _read, str(protected[1]))
    assert refused.value.outcome is Outcome.REJECT_FINAL_PARTITION and "the launch's preflight: trainer code" in refused.value.detail

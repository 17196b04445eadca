"""No traceback, ever: each case the review of issue 43 met is one line on stderr naming the problem
and the fix, and the search is left as it was. A full disk and a read-only mount under ``cancel``, a
trial folder that vanishes under ``status --watch``, a launch record that is a JSON list, an event
at a NaN time; names that would pass for others
(bidi, zero-width, look-alike characters) in ``list``; and advice never to move aside a file that is
not the user's."""

import json
import math
import shutil
import stat
from pathlib import Path

import pytest
from disks import fill, small_tmpfs
from incli import run_cli
from test_read_commands import read_only, tree

from parcel_hpc.console import plain, safe
from parcel_hpc.data import read_split
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import SearchDir

pytestmark = pytest.mark.xdist_group("finished-search")  # one worker runs the session's finished search's users: it is made once


def _copy(search: Path, root: Path, name: str = "copy-r1") -> Path:
    return Path(shutil.copytree(search, root / name, symlinks=True))


def written(root: Path) -> dict[str, tuple]:
    """``tree(root)`` less the folders' modification times: a write that failed may have made and
    removed its temp file (a folder's time moves), never changed a file or left one."""
    return {path: (mode, *rest) if not stat.S_ISDIR(mode) else (mode,) for path, (mode, *rest) in tree(root).items()}


def _one_line(ran, code: int, *words: str) -> None:
    assert ran.code == code and len(ran.error_lines) == 1 and "Traceback" not in ran.err, (ran.code, ran.err)
    for word in words:
        assert word in ran.err, (word, ran.err)


def test_cancel_on_a_full_disk_is_one_line_and_writes_nothing(finished_search, tmp_path):
    with small_tmpfs(tmp_path / "small", "4m") as small:
        search = _copy(finished_search, small)
        filler = fill(small)
        before = written(search)
        ran = run_cli(["cancel", search, "--reason", "full", "--wait", "0"])
        _one_line(ran, 2, "No space left on device", str(search), "free space")
        assert written(search) == before
        filler.unlink()
        assert run_cli(["cancel", search, "--reason", "space again", "--wait", "0"]).code == 0
        assert SearchDir(search).cancellation()["reason"] == "space again"


def test_cancel_on_a_read_only_mount_is_one_line(finished_search, tmp_path):
    search = _copy(finished_search, tmp_path)
    before = tree(search)
    with read_only(search):
        ran = run_cli(["cancel", search, "--reason", "ro", "--wait", "0"])
    _one_line(ran, 2, "Read-only file system", str(search))
    assert tree(search) == before


def test_status_watch_goes_on_when_a_trial_folder_vanishes_while_it_reads(finished_search, tmp_path, monkeypatch):
    search = _copy(finished_search, tmp_path)
    gone = search / "trials" / "t0003"
    listed = SearchDir.trial_ids

    def listed_then_removed(self):
        ids = listed(self)
        shutil.rmtree(gone, ignore_errors=True)  # removed between the listing and the reads
        return ids

    monkeypatch.setattr(SearchDir, "trial_ids", listed_then_removed)
    ran = run_cli(["status", search, "--watch", "--interval", "0.01"])
    assert ran.code == 0 and "Traceback" not in ran.err and not ran.error_lines, ran.err
    assert "t0003" not in ran.out and "(total 3)" in ran.out, ran.out


@pytest.mark.parametrize("record", ["[]", '"a launch"', "7"])
def test_a_launch_record_that_is_not_an_object_is_one_line(finished_search, tmp_path, record):
    # The commands that read launch records: cancel and resubmit take the launcher settings from
    # the latest. (reconcile no longer does: a search's spend is its directory owner's.)
    search = _copy(finished_search, tmp_path)
    launch = next((search / "launches").glob("*.json"))
    launch.write_text(record)
    before = written(search)
    _one_line(run_cli(["resubmit", search, "--dry-run"]), 2, str(launch), "not a launch record")
    assert written(search) == before
    # A cancel stands before it reads the launcher that ran the jobs (cancelled.json is written first).
    _one_line(run_cli(["cancel", search, "--wait", "0"]), 2, str(launch), "not a launch record")


@pytest.mark.parametrize("t", [math.nan, math.inf, -math.inf, 1e300])
def test_export_of_an_event_at_a_time_no_clock_gives_is_one_line(finished_search, tmp_path, t):
    search = _copy(finished_search, tmp_path)
    journal = next((search / "trials" / "t0000").glob("journal-a1-*.jsonl"))
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps({**e, "t": t} if e["kind"] == "started" else e) + "\n" for e in events))
    for argv in (["export", search], ["export", search, "--to", "optuna-journal", tmp_path / "out.journal"], ["status", search]):
        ran = run_cli(argv)
        _one_line(ran, 2, str(journal), "time")


HOSTILE_NAMES = {
    "right-to-left override": "alice\u202egpj.exe",
    "zero-width space": "bo\u200bb",
    "zero-width joiner": "bob\u200d",
    "Cyrillic a in a Latin name": "\u0430lice",
    "fullwidth letters": "\uff41lice",
    "a combining accent": "bob\u0301",
    "no-break space": "bob\u00a0smith",
    "terminal escape": "bob\x1b[0m",
    "bell": "bob\x07",
}


@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES.keys())
def test_a_name_that_would_pass_for_another_is_shown_with_its_characters_escaped(name):
    shown = plain(name)
    assert shown.isascii() and shown != name and "\\" in shown, shown
    assert shown == shown.strip() and "\x1b" not in shown and "\x07" not in shown
    assert safe(name) == shown  # no markup in any of them: the same text
    assert plain("Müller — naïve résumé, 東京, Ελλάδα …") == "Müller — naïve résumé, 東京, Ελλάδα …"  # a real name keeps its letters


def test_list_shows_each_hostile_search_name_escaped_and_apart(finished_search, tmp_path):
    """Searches in a shared root are found by walking it: their folders' names are anyone's."""
    root = tmp_path / "runs"
    for name in ["alice", *HOSTILE_NAMES.values()]:
        _copy(finished_search, root, name)
    ran = run_cli(["list", root])
    assert ran.code == 0, ran.err
    assert {c for c in ran.out if not c.isascii()} <= {chr(c) for c in range(0x2500, 0x2580)}, ran.out  # the table's lines
    for name in HOSTILE_NAMES.values():
        assert plain(name) in ran.out, (name, plain(name))


def test_a_split_file_that_is_no_split_file_is_refused_without_advice_to_move_it(tmp_path):
    for path in (Path("/etc/passwd"), Path("/dev/null")):
        with pytest.raises(UsageError) as refused:
            read_split(path)
        message = str(refused.value)
        assert str(path) in message and "aside" not in message and "remove" not in message, message
        assert "split.path" in message and "make-snapshot" in message, message

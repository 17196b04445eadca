"""Read commands only read: every command the registry marks ``READ_ONLY``, run on a search the
caller cannot write to, gives the same answer and changes no byte; a vanished attempt is resolved
in their view but recorded only by a writer (``parcel-hpc sync``)."""

import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from parcel_hpc.commands import COMMANDS
from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch, parcel_hpc

SAMPLES = Path(__file__).resolve().parent.parent / "parcel_hpc" / "testing" / "samples"


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size, mtime (ns) and content digest."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` bind-mounted read-only over itself (tests run as root, so file modes would not stop a write)."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def finished_search(tmp_path, data_dir, rev: str, *overrides: str) -> Path:
    res = launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *overrides], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    return tmp_path / "runs" / rev


def read_commands(search: Path) -> tuple[str, str]:
    status = parcel_hpc(["status", str(search), "--json"])
    assert status.returncode == 0, status.stderr
    recon = parcel_hpc(["reconcile", str(search), "--sacct-file", str(SAMPLES / "recorded_dev_cluster.txt"), "--json"])
    assert recon.returncode == 0, recon.stderr
    return status.stdout, recon.stdout


# How each read-only command is run on a finished search: a new read command fails the test below
# until it is listed here, and then it is run on a read-only mount like the others.
READ_ARGV = {
    "status": lambda s: ["status", str(s), "--json"],
    "logs": lambda s: ["logs", str(s), "t0000"],
    "list": lambda s: ["list", str(s.parent), "--json"],
    "export": lambda s: ["export", str(s), "--attempts"],
    "report": lambda s: ["report", str(s), "--html", str(s.parent.parent / "report.html")],  # beside the search root
    "proposals": lambda s: ["proposals", str(s), "--replay", "--json"],
    "reconcile": lambda s: ["reconcile", str(s), "--sacct-file", str(SAMPLES / "recorded_dev_cluster.txt"), "--json"],
}


def test_every_read_only_command_of_the_registry_changes_nothing_on_a_read_only_search(tmp_path, data_dir):
    assert set(READ_ARGV) == {c.name for c in COMMANDS if c.load().READ_ONLY}
    search = finished_search(tmp_path, data_dir, "ro-all", "search.n_trials=4")
    before = tree(search)
    before_out = {name: parcel_hpc(argv(search)) for name, argv in READ_ARGV.items()}  # a writable search first
    assert all(r.returncode == 0 for r in before_out.values()), {n: r.stderr for n, r in before_out.items() if r.returncode}
    assert tree(search) == before  # even where it could write, no command did
    with read_only(search):
        for name, argv in READ_ARGV.items():
            again = parcel_hpc(argv(search))
            assert again.returncode == 0, (name, again.stderr)
            if name != "list":  # list says how long ago the search last moved
                assert again.stdout == before_out[name].stdout, name
        journal = parcel_hpc(["export", str(search), "--to", "optuna-journal", str(tmp_path / "ro.journal")])  # Optuna's lock sits beside the file
        assert journal.returncode == 0 and "4 trials added" in journal.stderr, journal.stderr
    assert tree(search) == before


def test_status_and_reconcile_on_a_read_only_search_change_nothing(tmp_path, data_dir):
    search = finished_search(tmp_path, data_dir, "ro", "search.n_trials=6")
    before_out = read_commands(search)
    before = tree(search)
    with read_only(search):
        with pytest.raises(OSError):
            (search / "probe").write_text("x")  # the mount really refuses writes
        assert read_commands(search) == before_out
    assert tree(search) == before
    assert json.loads(before_out[0])["counts"]["completed"] + json.loads(before_out[0])["counts"]["pruned"] == 6


def test_a_vanished_attempt_is_shown_resolved_and_recorded_only_by_sync(tmp_path, data_dir):
    search = finished_search(tmp_path, data_dir, "gone", "search.n_trials=1", "pruner=none")
    sd = SearchDir(search)
    # The worker died before saying how its attempt ended: its process is gone from this host.
    for journal in sd.trial_dir("t0000").glob("journal-a1-*.jsonl"):
        journal.write_text("".join(line + "\n" for line in journal.read_text().splitlines() if '"kind":"ended"' not in line))
    assert sd.record("t0000").state.value == "running"
    before = tree(search)
    with read_only(search):
        shown = json.loads(parcel_hpc(["status", str(search), "--json"]).stdout)
    assert tree(search) == before  # shown, not recorded
    row = shown["trials"][0]
    assert row["state"] == "queued" and "lost" in row["reason"] and "not yet recorded" in row["unrecorded"]
    assert shown["unrecorded_resolutions"] == 1

    synced = parcel_hpc(["sync", str(search)])
    assert synced.returncode == 0, synced.stderr
    assert "t0000: attempt 1 lost (lost)" in synced.stdout
    rec = sd.record("t0000")
    assert rec.state.value == "queued" and rec.attempts[0].how.value == "lost"
    again = json.loads(parcel_hpc(["status", str(search), "--json"]).stdout)
    assert again["unrecorded_resolutions"] == 0 and again["trials"][0]["state"] == "queued"
    assert "recorded 0 resolutions" in parcel_hpc(["sync", str(search)]).stdout  # idempotent


def test_proposals_and_their_replay_on_a_read_only_search_change_nothing(tmp_path, data_dir):
    search = finished_search(tmp_path, data_dir, "ro-tpe", "sampler=tpe", "sampler.n_startup_trials=2", "search.n_trials=4")
    before = tree(search)
    with read_only(search):
        res = parcel_hpc(["proposals", str(search), "--replay", "--json"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.json()["replayed"] == 4 and res.json()["first_difference"] is None
    assert tree(search) == before

"""The final partition's fence: every moment trainer code runs is fenced (a worker's import, ``__init__``
and calls; the launch's trainer checks, preflight and dry run), every way past it that the last
review found is recorded ``reject:final_partition``, and none of them reads the protected file.
Each layer alone is probed too: the audit hook (the only layer where the kernel has no Landlock) and
Landlock (which binds what the hook cannot see: C code and programs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parcel_hpc import fence
from parcel_hpc.fence import kernel
from parcel_hpc.ledger import SearchDir, TrialState
from parcel_hpc.testing import launch
from parcel_hpc.testing.reach import REACH_AT_LAUNCH_ENV, REACH_DIR_ENV, WAYS
from parcel_hpc.testing.trainers import PROTECTED_PATH_ENV

needs_landlock = pytest.mark.skipif(kernel.abi() < kernel.MIN_ABI, reason="this kernel has no Landlock ABI 2: the audit layer stands alone")

# What each way's rejection says (docs/faults-and-inputs.md, "the final partition's fence").
SAID = {
    "import": "trainer code opened {final}",
    "init": "trainer code opened {final}",
    "dir_fd": "trainer code opened final-group_r8.json relative to a folder descriptor",
    "fork_exec": "trainer code started the program /bin/cat",
    "program": "trainer code started the program cat",
    "link": "trainer code made another name for {final}",
    "reset": "trainer code opened {final}",
}


def test_every_way_past_the_fence_in_a_worker_is_rejected_and_reads_nothing(tmp_path, data_dir):
    """One worker runs a pack of seven trials; each tries one way: the module's import, ``__init__``,
    an open relative to a folder descriptor, ``_posixsubprocess.fork_exec``, a program, a hard link,
    and switching the fence's state off before a plain open. Each is rejected, and what each got back
    holds nothing of the file (on main all but the program read it and completed)."""
    final = data_dir / "final-group_r8.json"
    reach = tmp_path / "reach"
    reach.mkdir()
    overrides = [f"search.root={tmp_path}", "search.revision=reach", f"search.n_trials={len(WAYS)}", "pruner=none", f"hydra.launcher.pack_size={len(WAYS)}"]
    res = launch(
        [*overrides, "trainer.target=parcel_hpc.testing.reach:ReachesPastTheFence"],
        cwd=tmp_path,
        data_dir=data_dir,
        env={PROTECTED_PATH_ENV: str(final), REACH_DIR_ENV: str(reach)},
    )
    assert res.returncode == 3 and "hold:no-result" in res.stdout, res.stdout + res.stderr
    secret = final.read_bytes()
    for n, way in enumerate(WAYS):
        got = (reach / f"seen-{n}").read_bytes()
        assert secret[:40] not in got and got.startswith(b"refused: PermissionError"), (way, got[:200])
    search = SearchDir(tmp_path / "reach")
    records = [search.record(tid) for tid in sorted(search.trial_ids())]  # one pack runs them in order: way n is trial n's
    for way, rec in zip(WAYS, records, strict=True):
        assert rec.state is TrialState.REJECTED and rec.detail.startswith("reject:final_partition: "), (way, rec.detail)
        assert SAID[way].format(final=final) in rec.detail, (way, rec.detail)
        assert len(rec.attempts) == 1  # a rejection is final: never retried
    admitted = [e for r in records[1:] for e in search.events(r.trial_id) if e.kind.value == "admitted"]
    assert {e.data.fence.value for e in admitted} == {"kernel" if kernel.abi() >= kernel.MIN_ABI else "audit"}


def test_trainer_code_at_the_launch_is_fenced(tmp_path, data_dir):
    """The launch's preflight and a dry run's trainer checks (its trainer's import): each
    ``reject:final_partition`` at the door, exit 3, one line, nothing written."""
    final = data_dir / "final-group_r8.json"
    env = {PROTECTED_PATH_ENV: str(final)}

    def refused(revision: str, *overrides: str, env: dict) -> str:
        res = launch([f"search.root={tmp_path}", f"search.revision={revision}", "search.n_trials=2", *overrides], cwd=tmp_path, data_dir=data_dir, env=env)
        assert res.returncode == 3 and res.stdout.splitlines()[0] == "reject:final_partition", res.stdout + res.stderr
        assert not (tmp_path / revision).exists()  # refused before anything is written
        assert len(res.stderr.strip().splitlines()) == 1
        return res.stderr

    said = refused("preflight", "trainer.target=parcel_hpc.testing.trainers:OpensProtectedFileWhenBuilt", env=env)
    assert f"the launch's preflight: trainer code opened {final}" in said
    reach = tmp_path / "reach"
    reach.mkdir()
    said = refused(
        "dry",
        "search.dry_run=true",
        "trainer.target=parcel_hpc.testing.reach:ReachesPastTheFence",
        env={**env, REACH_DIR_ENV: str(reach), REACH_AT_LAUNCH_ENV: "1"},
    )
    assert f"the launch's trainer checks: trainer code opened {final}" in said
    assert (reach / "seen-0").read_bytes().startswith(b"refused: PermissionError")


def test_a_protected_file_with_a_second_name_cannot_be_fenced(tmp_path, data_dir):
    """A hard link made before anything is armed is a path neither layer guards: ``arm`` refuses the
    files (``reject:final_partition``) before any trainer code runs, in a worker as at the launch."""
    final = data_dir / "final-group_r8.json"
    protected = fence.Protected.of(data_dir / "split-group_r8.json", data_dir / "parcels.h5")
    assert protected.refusal() == ""
    os.link(final, tmp_path / "copy-of-final.json")
    said = protected.refusal()
    assert said.startswith(f"{final} has 2 names (hard links)") and f"find / -xdev -samefile {final}" in said
    assert str(fence.Unfenceable(said)).startswith("reject:final_partition: ")


PROBE = r"""
import ctypes, json, os, subprocess, sys
from pathlib import Path
from parcel_hpc import fence, fsio
from parcel_hpc.fence import audit, kernel

split, snapshot, layer = sys.argv[1], sys.argv[2], sys.argv[3]
final = os.path.join(os.path.dirname(split), "final-group_r8.json")
protected = fence.Protected.of(split, snapshot)
if layer == "audit":
    fsio.whole_names()  # as fence.arm does
    audit.install(protected, kernel=False)  # as on a kernel without Landlock
else:
    kernel.restrict(protected)  # the kernel layer alone: no hook to record or refuse anything
out = {}

def tried(name, reach):
    try:
        got = reach()
        out[name] = "read " + (got.decode(errors="replace") if isinstance(got, bytes) else str(got))[:60]
    except Exception as exc:
        out[name] = f"refused {type(exc).__name__}"

folder = os.open(os.path.dirname(final), os.O_RDONLY | os.O_DIRECTORY)
tried("open", lambda: Path(final).read_bytes())
tried("symlink", lambda: Path(os.environ["LINKED"]).read_bytes())
tried("hard link made before", lambda: Path(os.environ["HARD"]).read_bytes())
tried("dir_fd", lambda: os.read(os.open("final-group_r8.json", os.O_RDONLY, dir_fd=folder), 99))
tried("dir_fd to another name", lambda: os.read(os.open("split-group_r8.json", os.O_RDONLY, dir_fd=folder), 9))
tried("proc fd", lambda: Path(f"/proc/self/fd/{folder}/final-group_r8.json").read_bytes())
libc = ctypes.CDLL(None, use_errno=True)
tried("ctypes open", lambda: libc.open(final.encode(), os.O_RDONLY) if libc.open(final.encode(), os.O_RDONLY) >= 0 else (_ for _ in ()).throw(OSError(ctypes.get_errno(), "")))
tried("program", lambda: subprocess.run(["cat", final], capture_output=True).stdout or b"(nothing)")
tried("program reading the split", lambda: subprocess.run(["head", "-c", "9", split], capture_output=True).stdout)
with fence.toolkit_programs():
    tried("toolkit's program", lambda: subprocess.run(["true"]).returncode)
    with fence.trainer_code():
        tried("trainer code in the toolkit's window", lambda: subprocess.run(["true"]).returncode)
def toolkit_read(folder_path, name):
    with fsio.Folder.open(folder_path) as held:
        return held.read_bytes(name, 99, 99)

tried("the toolkit's own final-*.json", lambda: toolkit_read(os.path.dirname(os.environ["LINKED"]), "final-plan.json"))
tried("the toolkit reading the final list", lambda: toolkit_read(os.path.dirname(final), "final-group_r8.json"))
tried("the toolkit meeting a link to it", lambda: toolkit_read(os.path.dirname(os.environ["LINKED"]), "linked.json"))
tried("state reset", lambda: (setattr(audit, "PROGRAM_EVENTS", frozenset()), Path(final).read_bytes())[1])
print(json.dumps({"tried": out, "recorded": list(fence.tripped())}))
"""


def _probe(layer: str, data_dir: Path, tmp_path: Path) -> tuple[dict, list]:
    final = data_dir / "final-group_r8.json"
    elsewhere = tmp_path / "elsewhere"  # beside the data folder, not on the way to it
    elsewhere.mkdir()
    (elsewhere / "linked.json").symlink_to(final)
    os.link(final, elsewhere / "hard.json")
    (elsewhere / "final-plan.json").write_text("{}")  # a toolkit record's name, outside the data folder
    env = {**os.environ, "LINKED": str(elsewhere / "linked.json"), "HARD": str(elsewhere / "hard.json")}
    args = [sys.executable, "-c", PROBE, str(data_dir / "split-group_r8.json"), str(data_dir / "parcels.h5"), layer]
    probe = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert probe.returncode == 0, probe.stderr
    answer = json.loads(probe.stdout)
    return answer["tried"], answer["recorded"]


def test_the_audit_layer_alone_judges_by_inode_and_refuses_what_it_cannot_judge(tmp_path, data_dir):
    """Where the kernel has no Landlock: a symbolic link and a hard link reach the same inode (a hard
    link made before anything was armed included), an open relative to a folder descriptor is recorded
    when it names a protected file and refused when it cannot be judged, a program is refused unless
    the toolkit starts it, and changing the layer's module state changes nothing."""
    tried, recorded = _probe("audit", data_dir, tmp_path)
    ways = ("open", "symlink", "hard link made before", "dir_fd", "proc fd", "program", "state reset", "trainer code in the toolkit's window")
    for way in (*ways, "the toolkit reading the final list"):
        assert tried[way] == "refused PermissionError", (way, tried)
    assert tried["dir_fd to another name"] == "refused PermissionError"  # it cannot tell where the folder descriptor leads
    # The toolkit's reads in a held folder name the whole path, so its own records pass and the list does not.
    assert tried["the toolkit's own final-*.json"] == "read {}", tried
    # A record that is a link is damage to the no-follow reader, never a reach of trainer code's.
    assert tried["the toolkit meeting a link to it"] == "refused CorruptRecord", tried
    assert tried["toolkit's program"] == "read 0"
    assert tried["ctypes open"].startswith("read ")  # C code is out of its sight: what the kernel layer is for
    assert sum("opened" in r for r in recorded) == 7 and sum("started the program" in r for r in recorded) == 3


@needs_landlock
def test_the_kernel_layer_alone_binds_c_code_and_programs_and_lets_a_harmless_program_run(tmp_path, data_dir):
    """Landlock without the hook: C code (``ctypes``), a folder descriptor, ``/proc/self/fd`` and a
    program are all refused the protected file by the kernel, while a program that reads nothing
    protected runs: allowing programs (issue 46's compiler) is a policy of the audit layer, not a hole
    in the kernel's. A hard link made before arming is the one way it cannot see (``arm`` refuses it)."""
    tried, recorded = _probe("kernel", data_dir, tmp_path)
    for way in ("open", "symlink", "dir_fd", "proc fd", "ctypes open", "state reset", "the toolkit reading the final list"):
        assert tried[way] == "refused PermissionError", (way, tried)
    assert tried["the toolkit's own final-*.json"] == "read {}", tried
    assert tried["program"] == "read (nothing)"  # cat ran, and was denied the file
    assert tried["program reading the split"] == 'read {\n  "dige'
    assert tried["dir_fd to another name"] == 'read {\n  "dige'
    assert tried["hard link made before"].startswith("read ")  # why arm() refuses a second name
    assert recorded == []  # the kernel tells an unprivileged process nothing: the audit layer records


def test_mount_names_are_every_mount_that_shows_the_file():
    """A bind mount of the data folder is a second way to the same file: its path is fenced too (pure)."""
    mountinfo = "\n".join(
        [
            "27 1 254:0 / / rw - ext4 /dev/vda rw",
            "40 27 254:0 /srv/data /mnt/data\\040copy rw - ext4 /dev/vda rw",
            "41 27 254:0 /etc/hosts /etc/hosts rw - ext4 /dev/vda rw",
            "42 27 0:45 / /scratch rw - tmpfs tmpfs rw",
        ]
    )
    mounts = kernel.parse_mountinfo(mountinfo)
    assert kernel.names("/srv/data/split/final-r8.json", mounts) == ["/srv/data/split/final-r8.json", "/mnt/data copy/split/final-r8.json"]
    assert kernel.names("/scratch/final-r8.json", mounts) == ["/scratch/final-r8.json"]

"""A shared root as three local users see it (issue 32, ownership): root launches real local
searches under a group umask in a setgid team directory; parcel-bob (root's group) attacks them
with plain file operations; parcel-admin (outside the group) reads them. Everything a search
trusts is its owner's alone, a search directory someone else owns or may write is refused at the
door, and the recorded user is the process's uid, whatever $LOGNAME says."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from parcel_hpc.testing import parcel_hpc, subprocess_env
from parcel_hpc.testing.runs import with_suite_cadence
from parcel_hpc.testing.users import ADMIN, BOB, SYSTEM_PYTHON, ensure_users, run_as, team_dir

GROUP_UMASK = 0o002  # what a team sets so that its members share files
ROOT_USER = pwd.getpwuid(os.getuid()).pw_name

# Run as parcel-bob by a system Python (the project's venv need not be readable by other users):
# each path is overwritten in place, replaced by a rename and unlinked; prints errno names.
ATTACK = r"""
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    tried = []
    for how in ("overwrite", "replace", "unlink"):
        try:
            if how == "overwrite":
                with open(path, "r+b") as f:
                    f.write(b"import os; os.system('id')")
            elif how == "replace":
                planted = f"/tmp/.planted-{os.getpid()}"
                with open(planted, "wb") as f:
                    f.write(b"planted")
                try:
                    os.rename(planted, path)
                finally:
                    if os.path.exists(planted):  # a refused rename leaves it: no litter in /tmp
                        os.unlink(planted)
            else:
                os.unlink(path)
            tried.append("done")
        except OSError as exc:
            tried.append(errno.errorcode[exc.errno])
    out[path] = tried
print(json.dumps(out))
"""


def launch(root: Path, rev: str, *overrides: str, data_dir: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={root}", f"search.revision={rev}", *with_suite_cadence(overrides)]
    return subprocess.run(argv, cwd=root.parent, env=subprocess_env(Path(data_dir), env), capture_output=True, text=True, umask=GROUP_UMASK, timeout=600)


def tree(top: Path) -> dict[str, bytes | None]:
    """Every path under ``top`` with a file's bytes (None: a directory), to show nothing changed."""
    return {str(p): (None if p.is_dir() else p.read_bytes()) for p in [top, *top.rglob("*")]}


def one_line_error(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (res.returncode, res.stdout, res.stderr)
    return lines[0]


pytestmark = pytest.mark.xdist_group("shared-roots-local")  # one worker runs the module: the team root's search once, not once a worker


@pytest.fixture(scope="module")
def team_root():
    """A team root under /tmp (pytest's tmp_path is root's alone: bob could not reach into it)."""
    ensure_users()
    top = Path(tempfile.mkdtemp(prefix="parcel-team-", dir="/tmp"))
    os.chmod(top, 0o755)
    yield team_dir(top / "runs")  # 3775: the recommended team root
    shutil.rmtree(top)


@pytest.fixture(scope="module")
def search(team_root, artifacts) -> Path:
    """Root's finished two-trial search in the team root, launched under the group umask."""
    res = launch(team_root, "owned-r1", "search.n_trials=2", "pruner=none", data_dir=artifacts["dir"])
    assert res.returncode == 0, res.stderr
    return team_root / "owned-r1"


def test_a_group_member_cannot_replace_what_the_search_trusts(search):
    targets = [
        next((search / "submitit").rglob("*_submitted.pkl")),
        next((search / "submitit").rglob("*_result.pkl")),
        search / "contract.json",
        search / "identity.json",
        next((search / "trials").rglob("journal-*.jsonl")),
        next((search / "checkpoints").rglob("claim-*.json")),
        next(p for p in (search / "budget").rglob("*") if p.is_file()),
    ]
    before = {p: p.read_bytes() for p in targets}
    res = run_as(BOB, [SYSTEM_PYTHON, "-c", ATTACK, *map(str, targets)], umask=GROUP_UMASK)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {str(p): ["EACCES", "EACCES", "EACCES"] for p in targets}
    assert {p: p.read_bytes() for p in targets} == before


def test_nothing_in_the_search_is_writable_by_group_or_others(search):
    made = [search, *search.rglob("*")]
    assert any(p.name.endswith("_submitted.pkl") for p in made) and any(p.name == "contract.json" for p in made)
    assert len(made) > 40
    offenders = [f"{p} {os.lstat(p).st_mode & 0o7777:04o}" for p in made if not p.is_symlink() and os.lstat(p).st_mode & 0o022]
    assert offenders == []
    unreadable = [str(p) for p in made if not os.lstat(p).st_mode & 0o004]
    assert unreadable == []  # admins read other people's searches


def test_an_admin_outside_the_group_reads_the_search(search, team_root):
    probe = run_as(ADMIN, [sys.executable, "-c", "import parcel_hpc"])
    if probe.returncode != 0:
        pytest.skip(f"{ADMIN} cannot run this checkout's Python ({probe.stderr.strip()[-200:]}); what it reads is checked by the mode walk above")
    status = run_as(ADMIN, [sys.executable, "-m", "parcel_hpc", "status", str(search), "--json"])
    assert status.returncode == 0, status.stderr
    assert sum(json.loads(status.stdout)["counts"].values()) == 2
    listed = run_as(ADMIN, [sys.executable, "-m", "parcel_hpc", "list", str(team_root), "--json"])
    assert listed.returncode == 0, listed.stderr
    assert "owned-r1" in listed.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["cancel", "--reason", "not mine", "--wait", "0"],
        ["resubmit"],
        ["sync"],
        ["select"],
        ["decide", "--accept", "--by", "bob", "--reason", "looks fine"],
        ["evaluate-final"],
        ["release"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_write_command_on_another_users_search_is_one_line(search, argv):
    bob = pwd.getpwnam(BOB).pw_uid
    before = tree(search)
    os.chown(search, bob, -1)  # root runs the command: the search is parcel-bob's
    try:
        res = parcel_hpc([argv[0], str(search), *argv[1:]])
    finally:
        os.chown(search, os.getuid(), -1)
    line = one_line_error(res)
    assert f"{search} is owned by {BOB}" in line and "only its owner writes to it" in line, line
    assert tree(search) == before


def test_a_search_directory_another_user_made_is_refused_before_anything_is_written(team_root, artifacts):
    planted = team_root / "planted-r1"
    made = run_as(BOB, ["sh", "-c", f"mkdir {planted} && chmod 0777 {planted}"], umask=GROUP_UMASK)
    assert made.returncode == 0, made.stderr
    res = launch(team_root, "planted-r1", "search.n_trials=1", data_dir=artifacts["dir"])
    line = one_line_error(res)
    # chmod 0777 keeps the setgid bit the team directory gave it
    assert f"{planted} is owned by {BOB} (mode 2777)" in line and "choose another search.revision" in line, line
    assert os.listdir(planted) == []


def test_a_search_its_group_may_write_is_refused_with_the_chmod_that_fixes_it(team_root, artifacts):
    path = team_root / "widened-r1"
    assert launch(team_root, "widened-r1", "search.n_trials=0", data_dir=artifacts["dir"]).returncode == 0
    for widened in (path, path / "contract.json"):
        os.chmod(widened, os.stat(widened).st_mode | 0o020)
        before = tree(path)
        res = launch(team_root, "widened-r1", "search.n_trials=1", data_dir=artifacts["dir"])
        line = one_line_error(res)
        assert f"{widened} is writable by its group or others" in line and f"chmod -R g-w,o-w {path}" in line, line
        assert tree(path) == before
        cancel = parcel_hpc(["cancel", str(path), "--reason", "widened"])
        assert f"{widened} is writable by its group or others" in one_line_error(cancel)
        os.chmod(widened, os.stat(widened).st_mode & ~0o020)
    assert launch(team_root, "widened-r1", "search.n_trials=0", data_dir=artifacts["dir"]).returncode == 0  # fixed: it goes on


def test_the_recorded_user_is_the_process_uid_not_logname(team_root, artifacts):
    someone_else = {"LOGNAME": BOB, "USER": BOB}
    path = team_root / "who-r1"
    assert launch(team_root, "who-r1", "search.n_trials=0", data_dir=artifacts["dir"], env=someone_else).returncode == 0
    launches = [json.loads(p.read_text()) for p in (path / "launches").glob("*.json")]
    assert [entry["user"] for entry in launches] == [ROOT_USER]
    cancel = parcel_hpc(["cancel", str(path), "--reason", "done"], env=someone_else)
    assert cancel.returncode == 0, cancel.stderr
    assert json.loads((path / "cancelled.json").read_text())["by"] == ROOT_USER


def test_a_searchs_spend_is_its_directory_owners_whatever_its_records_say(search, team_root):
    """Readers attribute a search to the uid that owns its directory (its identity), never to the
    user field of its launch records, which their owner (or a tool of theirs) can write anything into."""

    def spend_by_user() -> dict[str, dict]:
        spent = parcel_hpc(["reconcile", "--root", str(team_root), "--json"])
        assert spent.returncode == 0, spent.stderr
        report = json.loads(spent.stdout)
        ours = next(s for s in report["searches"] if s["path"] == str(search))
        assert ours["user"] == ROOT_USER
        return {t["key"]: t for t in report["by_user"]}

    # the figures themselves may be 0 h (two trials can end within one second on a fast machine):
    # what must not move is whose they are
    honest = spend_by_user()
    assert list(honest) == [ROOT_USER] and honest[ROOT_USER]["lines"] >= 2, honest  # each trial ran at least once
    records = sorted((search / "launches").glob("*.json"))
    before = {p: p.read_bytes() for p in records}
    try:
        for p in records:
            p.write_text(json.dumps({**json.loads(p.read_text()), "user": BOB}))
        assert spend_by_user() == honest
        listed = parcel_hpc(["list", str(team_root), "--json"])
        assert listed.returncode == 0, listed.stderr
        row = next(s for s in json.loads(listed.stdout)["searches"] if s["path"] == str(search))
        assert row["owner"] == ROOT_USER and row["users"] == [BOB]  # the recorded name, shown as what it is: a name
    finally:
        for p, data in before.items():
            p.write_bytes(data)

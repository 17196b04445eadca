"""A search's identity, checked by everyone who acts for it (issue 43, part A), on the local
executor with real users: root owns the searches, parcel-bob is a member of the team that may
write the root. A live search renamed away in a 2775 root and replaced by bob's copy (his pickles,
a .pyc in the frozen code) runs nothing of his: the launch stops in one line, a job started for it
refuses the directory before submitit unpickles anything, and the worker already running records
into the search, never into the copy. A root members may rename in is refused unless the team
accepts it knowingly; so is another user's open checkpoint.dir; and bytecode planted in a search's
own code copy is refused before anything of it is imported."""

import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from parcel_hpc import ownership
from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import finish, launch, start_launch, wait_for
from parcel_hpc.testing.runs import descendants
from parcel_hpc.testing.users import BOB, ensure_users, exchange_line, planted_pickle, run_as, team_dir
from parcel_hpc.trainer.code import snapshot_dir

GROUP_UMASK = 0o002
MODEL = """\
import os, time
from parcel_hpc.trainer.numpy_mlp import NumpyMLP


class Model(NumpyMLP):
    def step(self):
        time.sleep(float(os.environ.get("MY_STEP_S", "0")))
        return super().step()
"""


@pytest.fixture(scope="module")
def team(artifacts):
    """A place under /tmp that bob can reach (pytest's tmp_path is root's alone): the data, a lab
    with the user's own trainer package, and where a member's code would leave its mark."""
    ensure_users()
    top = Path(tempfile.mkdtemp(prefix="parcel-identity-", dir="/tmp"))
    os.chmod(top, 0o755)
    shutil.copytree(artifacts["dir"], top / "data")
    (top / "lab" / "my_models").mkdir(parents=True)
    (top / "lab" / "my_models" / "__init__.py").write_text("from my_models.model import Model\n")
    (top / "lab" / "my_models" / "model.py").write_text(MODEL)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def own_model(top: Path, root: Path, rev: str, *more: str) -> list[str]:
    return [f"search.root={root}", f"search.revision={rev}", "trainer.target=my_models:Model", "pruner=none", *more]


def env_of(top: Path, step_s: float = 0.0) -> dict[str, str]:
    return {"PYTHONPATH": str(top / "lab"), "MY_STEP_S": str(step_s)}


def planted_bytecode(top: Path, marker: Path) -> Path:
    """A .pyc a member plants beside a module of a code copy: unchecked-hash bytecode, which Python's
    own import loads without looking at the source beside it."""
    source = top / "payload" / "evil.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text(f"open({str(marker)!r}, 'w').write('bytecode ran')\nfrom parcel_hpc.trainer.numpy_mlp import NumpyMLP as Model\n")
    out = top / "payload" / "evil.pyc"
    py_compile.compile(str(source), cfile=str(out), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
    os.chmod(source.parent, 0o755)
    os.chmod(out, 0o644)
    return out


def pyc_name() -> str:
    return f"model.{sys.implementation.cache_tag}.pyc"


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def tree(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def test_a_live_search_swapped_in_a_2775_root_runs_nothing_of_the_members(team):
    root = team_dir(team / "swap-runs", mode=0o2775)
    marker = team / "member-code-ran"
    args = own_model(
        team, root, "live-r1", "search.n_trials=3", "hydra.launcher.parallelism=1", "hydra.launcher.pack_size=1", "search.allow_renames_in_root=true"
    )
    proc = start_launch(args, cwd=team, data_dir=team / "data", env=env_of(team, 0.05))
    search = SearchDir(root / "live-r1")
    wait_for(lambda: (search.path / "contract.json").exists() and search.trial_ids() and search.record("t0000").state.value == "running", 120, "t0000 to run")
    worker = next(pid for pid in descendants(proc.pid) if b"parcel_hpc.worker.gate" in Path(f"/proc/{pid}/cmdline").read_bytes())
    argv = Path(f"/proc/{worker}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    environ = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{worker}/environ").read_bytes().rstrip(b"\0").split(b"\0") if b"=" in kv)
    digest = search.contract()["trainer"]["source_digest"]
    evil_pkl = team / "payload" / "evil.pkl"
    bytecode = planted_bytecode(team, marker)
    evil_pkl.write_bytes(planted_pickle(f"touch {marker}"))
    os.chmod(evil_pkl, 0o644)

    # The member: a copy of the live search with their pickles and bytecode, exchanged with the search
    # in one rename (renameat2 RENAME_EXCHANGE): the search lives on under the copy's name.
    theirs = Path(f"{search.path}.theirs")
    copy_code = snapshot_dir(theirs, digest) / "my_models"
    swap = (
        f"set -e; cp -r {search.path} {theirs}; mkdir -p {copy_code}/__pycache__; cp {bytecode} {copy_code}/__pycache__/{pyc_name()}; "
        f"find {theirs}/submitit -name '*_submitted.pkl' -exec cp {evil_pkl} {{}} ';'; {exchange_line(search.path, theirs)}"
    )
    res = run_as(BOB, ["sh", "-c", swap], umask=GROUP_UMASK)
    assert res.returncode == 0, res.stderr
    copied = tree(search.path / "trials")

    # A job started for the search now (a retry, a later trial): the same command line the running one has.
    started = subprocess.run([a.decode() for a in argv], env={k.decode(): v.decode() for k, v in environ.items()}, capture_output=True, text=True, timeout=120)
    assert started.returncode == 2, started.stdout + started.stderr
    line = one_error_line(started.stderr)
    assert f"{search.path} is not the search directory this process acts for: it is owned by {BOB} now" in line, line

    # The launch: one line, exit 2, before it reads or writes anything more of the copy.
    res = finish(proc, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert f"{search.path} is no longer the search directory this process acts for: it is owned by {BOB} now" in line, line

    # The worker that was running holds the search itself: it goes on there, and writes nothing into the copy.
    moved = SearchDir(theirs)  # the search itself, under the name the copy had
    wait_for(lambda: moved.record("t0000").state.is_finished(), 120, "the running trial to end in the search itself")
    assert moved.record("t0000").state.value == "completed"
    assert tree(search.path / "trials") == copied
    assert not marker.exists(), marker.read_text()


def test_a_root_others_may_rename_in_is_refused_unless_accepted_knowingly(team):
    args = ("search.n_trials=1", "search.dry_run=true")
    unsticky = team_dir(team / "open-runs", mode=0o2775)
    refused = launch(own_model(team, unsticky, "r1", *args), cwd=team, data_dir=team / "data", env=env_of(team))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = one_error_line(refused.stderr)
    assert f"{unsticky} is writable by its group or others without the sticky bit (mode 2775)" in line and "search.allow_renames_in_root=true" in line
    assert "chmod +t" in line and os.listdir(unsticky) == []
    # A folder above the root counts as much as the root: it can rename the root itself.
    below = team / "open-runs" / "mine"
    below.mkdir()
    above = launch(own_model(team, below, "r1", *args), cwd=team, data_dir=team / "data", env=env_of(team))
    assert above.returncode == 2 and f"{unsticky} is writable by its group or others without the sticky bit" in one_error_line(above.stderr)

    # Accepted: with search.allow_renames_in_root=true (the swap test's root), and at 3775 (the bytecode test's).


def test_open_to_renames_judges_the_folder_and_every_folder_above_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "a" / "b"
    b.mkdir(parents=True)
    assert ownership.open_to_renames(b / "not-yet") is None
    os.chmod(a, 0o777)
    assert ownership.open_to_renames(b / "not-yet") == (a, 0o777)
    os.chmod(a, 0o1777)  # sticky: only an entry's owner renames it
    assert ownership.open_to_renames(b) is None
    (tmp_path / "link").symlink_to(b)
    os.chmod(a, 0o775)
    assert ownership.open_to_renames(tmp_path / "link") == (a, 0o775)  # where a link leads counts too


def test_another_users_open_checkpoint_dir_is_refused(team):
    theirs = team_dir(team / "scratch") / "bob-checkpoints"
    made = run_as(BOB, ["sh", "-c", f"mkdir {theirs} && chmod 0777 {theirs}"], umask=GROUP_UMASK)
    assert made.returncode == 0, made.stderr
    root = team / "ckpt-runs"
    res = launch(own_model(team, root, "r1", "search.n_trials=1", f"checkpoint.dir={theirs}"), cwd=team, data_dir=team / "data", env=env_of(team))
    assert res.returncode == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert f"checkpoint.dir {theirs}: {theirs} is owned by {BOB} (mode 2777)" in line and "give a folder of your own" in line, line
    assert os.listdir(theirs) == [] and not root.exists()


def test_bytecode_planted_in_a_searchs_code_copy_is_refused_before_it_is_imported(team):
    root = team_dir(team / "pyc-runs")  # 3775: the recommended team root is accepted
    marker = team / "copy-bytecode-ran"
    args = own_model(team, root, "r1", "search.n_trials=1", "train.steps=10")
    first = launch(args, cwd=team, data_dir=team / "data", env=env_of(team))
    assert first.returncode == 0, first.stdout + first.stderr
    search = SearchDir(root / "r1")
    copy = snapshot_dir(search.path, search.contract()["trainer"]["source_digest"])
    planted = copy / "my_models" / "__pycache__" / pyc_name()
    planted.parent.mkdir()
    shutil.copyfile(planted_bytecode(team, marker), planted)
    again = launch(own_model(team, root, "r1", "search.n_trials=2", "train.steps=10"), cwd=team, data_dir=team / "data", env=env_of(team))
    assert again.returncode == 3 and "reject:trainer" in again.stdout.splitlines(), again.stdout + again.stderr
    assert f"({copy}) holds my_models/__pycache__/{pyc_name()}, which is not in its digest" in again.stderr, again.stderr
    assert search.record("t0000").state.value == "completed"  # the copy whole, its trial ran from it
    assert search.record("t0001").state.value == "queued" and not marker.exists()  # queued for a copy whole again

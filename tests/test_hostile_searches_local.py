"""A shared root with hostile searches in it, as the admins' read commands meet it (issue 32):
a FIFO journal, a journal linked to /dev/zero, a huge line, a link out of the search to a file only
root may read, markup and terminal escapes in names, a spec naming ``../..``. Each damaged search
is listed with its problem while the good one is shown: never a hang, a traceback or the memory of
the file, and nothing printed carries a control sequence or a secret."""

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parcel_hpc.errors import exit_on_error
from parcel_hpc.testing import launch, subprocess_env

ESC = "\x1b"
SECRET = "TOPSECRET-parcel"


pytestmark = pytest.mark.xdist_group("hostile-searches-local")  # one worker runs the module: the good search once, not once a worker


@pytest.fixture(scope="module")
def good(tmp_path_factory, artifacts) -> Path:
    """One finished two-trial search, copied to make each hostile one."""
    top = tmp_path_factory.mktemp("hostile")
    res = launch([f"search.root={top / 'runs'}", "search.revision=good-r1", "search.n_trials=2", "pruner=none"], cwd=top, data_dir=artifacts["dir"])
    assert res.returncode == 0, res.stderr
    return top / "runs" / "good-r1"


def _journal(search: Path) -> Path:
    return next((search / "trials" / "t0000").glob("journal-a1-*.jsonl"))


def _copy(good: Path, root: Path, name: str) -> Path:
    return Path(shutil.copytree(good, root / name, symlinks=True))


def _hostile_root(good: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A root holding the good search and one of each kind of damage; each name's expected problem."""
    root = tmp_path / "runs"
    _copy(good, root, "good-r1")
    fifo = _journal(_copy(good, root, "fifo-r1"))
    fifo.unlink()
    os.mkfifo(fifo)
    zero = _journal(_copy(good, root, "zero-r1"))
    zero.unlink()
    zero.symlink_to("/dev/zero")
    with _journal(_copy(good, root, "huge-r1")).open("ab") as f:
        f.write(b'{"kind": "' + b"a" * (60 * 2**20) + b'"}\n')  # 60 MB in one line, under the file limit
    with _journal(_copy(good, root, "vast-r1")).open("ab") as f:
        f.truncate(2**30)  # 1 GiB of NULs, sparse: one line as long as the file
    leak = _copy(good, root, "leak-r1") / "trials" / "t0000" / "spec.json"
    leak.unlink()
    leak.symlink_to(_secret(tmp_path))
    (_copy(good, root, "mark-r1") / "trials" / f"[red]x{ESC}[2J{ESC}]0;pwned\x07").mkdir()
    return root, {
        "fifo-r1": "is not a regular file",
        "zero-r1": "is a symbolic link",
        "huge-r1": "has a line over the",
        "vast-r1": "over the 67108864-byte limit of a record file",
        "leak-r1": "is a symbolic link",
        "mark-r1": "which is not a trial id",
    }


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only"
    secret.write_text(json.dumps({"trial_id": SECRET}))
    secret.chmod(0o600)
    return secret


def _read_command(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``parcel-hpc ARGV`` with a timeout; its peak RSS in MiB (a wrapper reads the child's rusage)."""
    wrapper = (
        "import resource, subprocess, sys; "
        "p = subprocess.run([sys.executable, '-m', 'parcel_hpc', *sys.argv[1:]]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, file=sys.stderr); sys.exit(p.returncode)"
    )
    res = subprocess.run([sys.executable, "-c", wrapper, *argv], cwd=cwd, env=subprocess_env(None, None), capture_output=True, text=True, timeout=120)
    *stderr, rss = res.stderr.rstrip("\n").split("\n")
    return subprocess.CompletedProcess(res.args, res.returncode, res.stdout, "\n".join(stderr)), int(rss)


def test_list_shows_the_good_search_and_each_hostile_ones_problem(good, tmp_path):
    root, problems = _hostile_root(good, tmp_path)
    res, rss_mib = _read_command(["list", str(root), "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    found = {Path(s["path"]).name: s for s in json.loads(res.stdout)["searches"]}
    assert sum(found["good-r1"]["counts"].values()) == 2 and not found["good-r1"].get("problem")
    for name, problem in problems.items():
        assert problem in found[name]["problem"], (name, found[name])
    assert SECRET not in res.stdout + res.stderr
    alone, base_mib = _read_command(["list", str(good.parent), "--json"], tmp_path)
    assert alone.returncode == 0, alone.stderr
    # Bounded reads: a 60 MB line is dropped after its first 4 MiB, a 1 GiB file is never read.
    assert rss_mib < base_mib + 40, f"list of the hostile root peaked at {rss_mib} MiB, the good search alone at {base_mib} MiB"
    table, _ = _read_command(["list", str(root)], tmp_path)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    assert ESC not in table.stdout and "\x07" not in table.stdout and SECRET not in table.stdout


def test_reconcile_of_the_root_reports_the_others_and_names_each_unreadable_search(good, tmp_path):
    root, problems = _hostile_root(good, tmp_path)
    res, _ = _read_command(["reconcile", "--root", str(root)], tmp_path)
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    for name, problem in problems.items():
        assert f"not read: {root / name}:" in out and problem in out, name
    assert "good-r1" in out and ESC not in res.stdout and SECRET not in res.stdout


def test_markup_and_escapes_in_a_user_name_are_printed_as_text(good, tmp_path):
    search = _copy(good, tmp_path / "runs", "user-r1")
    for path in (search / "launches").glob("*.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "user": f"ev[/]il{ESC}]0;pwned\x07{ESC}[2J"}))
    res, _ = _read_command(["reconcile", "--root", str(search.parent)], tmp_path)
    assert res.returncode == 0, res.stderr
    # The spend is the directory owner's (the recorded name is no one's to be charged), and nothing of the name reaches the terminal raw.
    assert pwd.getpwuid(os.getuid()).pw_name in res.stdout and ESC not in res.stdout and "\x07" not in res.stdout
    listed, _ = _read_command(["list", str(search.parent), "--json"], tmp_path)
    assert listed.returncode == 0 and ESC not in listed.stdout and "\x07" not in listed.stdout, listed.stderr
    (row,) = json.loads(listed.stdout)["searches"]
    assert row["users"] == [f"ev[/]il{ESC}]0;pwned\x07{ESC}[2J"]  # shown as written, as a name, in JSON's own escapes


@pytest.mark.parametrize("command", ["status", "export", "reconcile"])
def test_one_command_on_a_hostile_search_is_one_line_naming_the_file(good, tmp_path, command):
    search = _copy(good, tmp_path / "runs", "leak-r1")
    spec = search / "trials" / "t0000" / "spec.json"
    spec.unlink()
    spec.symlink_to(_secret(tmp_path))
    res, _ = _read_command([command, str(search)], tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and f"{spec} is a symbolic link" in lines[0], res.stderr
    assert SECRET not in res.stdout + res.stderr


def test_a_spec_naming_a_path_out_of_the_search_is_refused_and_cancel_writes_nothing_outside(good, tmp_path):
    search = _copy(good, tmp_path / "runs", "escape-r1")
    spec = search / "trials" / "t0001" / "spec.json"
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "trial_id": "../../../../escaped"}))
    around = {p: sorted(os.listdir(p)) for p in (tmp_path, tmp_path / "runs", search.parent.parent.parent)}
    res = subprocess.run(
        [sys.executable, "-m", "parcel_hpc", "cancel", str(search), "--reason", "x", "--wait", "0"],
        env=subprocess_env(None, None),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "is not usable as a file name" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert {p: sorted(os.listdir(p)) for p in around} == around


@pytest.mark.parametrize("interval", ["nan", "inf", "-1", "0", "soon"])
def test_a_watch_interval_that_is_not_a_positive_number_is_refused_by_the_parser(good, interval):
    res = subprocess.run(
        [sys.executable, "-m", "parcel_hpc", "status", str(good), "--watch", "--interval", interval],
        env=subprocess_env(None, None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "is not a number of seconds > 0" in lines[0], res.stderr


def test_a_permission_error_anywhere_is_one_line_naming_the_path(capsys):
    with pytest.raises(SystemExit) as ended, exit_on_error():
        raise PermissionError(13, "Permission denied", "/shared/runs/bob-r1/trials")
    lines = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(lines) == 1 and "/shared/runs/bob-r1/trials: permission denied" in lines[0]


def test_list_passes_over_what_it_may_not_enter():
    """/proc holds folders even root may not list (``/proc/1/fdinfo`` of another namespace, ...)."""
    res = subprocess.run(
        [sys.executable, "-m", "parcel_hpc", "list", "/proc", "--json"], env=subprocess_env(None, None), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["searches"] == []

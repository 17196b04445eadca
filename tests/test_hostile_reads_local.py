"""Every read of a search goes through the one bounded, no-follow, regular-file reader (issue 43): a
symbolic link anywhere below the search directory is refused, never followed (a linked sub-folder of
a record folder, submitit's folder, a log file); ``logs`` reads its output files as records are read
(a FIFO cannot hang it, /dev/zero is never read, a huge log costs only its tail); and ``export --to
optuna-journal`` judges the file it opened, never a path it checked before."""

import json
import os
import shutil
from pathlib import Path

import pytest
from incli import run_cli
from test_read_commands import READ_ARGV

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord
from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.scheduler.registry import backend_of

pytestmark = pytest.mark.xdist_group("finished-search")  # one worker runs the session's finished search's users: it is made once

SECRET = "TOPSECRET-parcel"


def _copy(search: Path, root: Path, name: str) -> Path:
    return Path(shutil.copytree(search, root / name, symlinks=True))


def _secret_copy(folder: Path, to: Path) -> Path:
    """A copy of ``folder`` elsewhere whose every file holds the secret, readable by root only."""
    shutil.copytree(folder, to, symlinks=True)
    for f in to.rglob("*"):
        if f.is_file():
            f.write_text(json.dumps({"trial_id": SECRET, "t": SECRET}) + "\n")
            f.chmod(0o600)
    return to


# Where a link is planted, and the read commands that read there (every one reads trials/ and launches/).
READERS = {
    "budget/journal": ["status", "list", "export", "report", "reconcile"],
    "prune_decisions/10": ["status"],
    "submitit/local": ["logs"],
    "launches": list(READ_ARGV),
    "trials/t0001": list(READ_ARGV),
}


@pytest.mark.parametrize("below", READERS)
def test_a_link_anywhere_below_the_search_is_refused_by_every_read_command(finished_search, tmp_path, below):
    search = _copy(finished_search, tmp_path / "runs", "linked-r1")
    _secret_copy(search / below, tmp_path / "elsewhere")
    shutil.rmtree(search / below)
    (search / below).symlink_to(tmp_path / "elsewhere")
    named = f"{search / below} is a symbolic link"
    for name in READERS[below]:
        ran = run_cli(READ_ARGV[name](search))
        assert SECRET not in ran.out + ran.err, name
        if name == "list":  # a search that does not read is listed with its problem
            (row,) = json.loads(ran.out)["searches"]
            assert ran.code == 0 and named in row["problem"], (name, row)
        elif name == "logs" and below == "submitit/local":  # it says what it could not read, and goes on
            assert ran.code == 0 and named in ran.out, ran.out
        else:
            assert ran.code == 2 and len(ran.error_lines) == 1 and named in ran.err, (name, ran.code, ran.err)


def test_the_reader_refuses_a_link_in_any_component_below_the_search_and_follows_the_path_to_it(tmp_path):
    search = tmp_path / "real-search"
    record = search / "trials" / "t0000" / "sub" / "record.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"ok": true}')
    (tmp_path / "by-link").symlink_to(search)  # the user may name the search by a link: it is theirs to name
    via_link = tmp_path / "by-link" / record.relative_to(search)
    assert fsio.read_json(via_link, within=tmp_path / "by-link") == {"ok": True}
    for depth in range(1, 5):  # trials, trials/t0000, trials/t0000/sub, the record itself
        part = search.joinpath(*record.relative_to(search).parts[:depth])
        moved = tmp_path / f"moved-{depth}"
        part.rename(moved)
        part.symlink_to(moved)
        with pytest.raises(CorruptRecord, match=f"^{part} is a symbolic link"):
            fsio.read_json(record, within=search)
        part.unlink()
        moved.rename(part)
    with pytest.raises(CorruptRecord, match="names no file inside the search"):
        fsio.read_bytes(search / "trials" / ".." / "trials" / "t0000" / "sub" / "record.json", within=search)
    with pytest.raises(FileNotFoundError) as missing:
        fsio.read_bytes(search / "trials" / "t0009" / "spec.json", within=search)
    assert missing.value.filename == str(search / "trials" / "t0009")
    (search / "trials" / "t0001").write_text("a file where a trial's folder belongs")
    with pytest.raises(CorruptRecord, match="t0001 is not a folder"):
        fsio.read_bytes(search / "trials" / "t0001" / "spec.json", within=search)


def test_logs_reads_its_output_files_as_records_are_read(finished_search, tmp_path):
    """The review's three: a link to a file only root may read, a FIFO, /dev/zero; and a log larger
    than any record, of which only the tail is read."""
    search = _copy(finished_search, tmp_path / "runs", "logs-r1")
    record = next(r for r in SearchDir(search).records() if r.state.value == "failed")
    failed, (out, err) = record.trial_id, backend_of(Executor("local")).job_logs(SearchDir(search), record.attempts[-1].job_id)
    secret = tmp_path / "root-only"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    out.unlink()
    out.symlink_to(secret)
    err.unlink()
    os.mkfifo(err)
    ran = run_cli(["logs", search, failed], timeout_s=60)
    assert ran.code == 0 and SECRET not in ran.out + ran.err, ran
    assert f"{out} is a symbolic link" in ran.out and f"{err} is not a regular file (a FIFO)" in ran.out, ran.out
    assert "RuntimeError: injected fault" in ran.out  # the traceback from the ledger is still shown
    out.unlink()
    out.symlink_to("/dev/zero")
    err.unlink()
    with err.open("wb") as f:  # 8 GiB, sparse, its last line a word
        f.truncate(8 * 2**30)
        f.seek(0, os.SEEK_END)
        f.write(b"\nthe last line of a vast log\n")
    ran = run_cli(["logs", search, failed], timeout_s=60)
    assert ran.code == 0 and f"{out} is a symbolic link" in ran.out, ran.out
    assert "the last line of a vast log" in ran.out and f"{err}, its last" in ran.out, ran.out[-2000:]

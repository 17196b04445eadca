"""Every read command on damaged search trees (issue 43): a real small finished search, copied per
example and damaged at random (a file truncated or bit-flipped, swapped for a FIFO, a link, a
folder or a huge sparse file, deleted; JSON of the wrong type, NaN and infinities, deep nesting, bad
UTF-8, ids with escapes), then every ``READ_ONLY`` command run on it in this process. Each exits
with one of its documented codes, prints no traceback and at most one error line, never hangs (a
time limit per command), never reads out of the search, and writes nothing: the tree is the same,
byte for byte, after the commands as before them.

Bounded: a fixed number of examples, drawn from a fixed seed (``derandomize``), no deadline (the
time limit is per command, generous, and a hang is what it catches). The report's figures are
left undrawn (``no_figures``): drawing is not reading, and takes seconds an example."""

import contextlib
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from incli import Hung, run_cli
from test_read_commands import READ_ARGV

from parcel_hpc import fsio
from parcel_hpc.report import page, plots

pytestmark = pytest.mark.xdist_group("finished-search")  # one worker runs the session's finished search's users: it is made once

SECRET = "TOPSECRET-parcel"
# The exit codes each read command documents (proposals --replay: 1 when a proposal does not re-derive).
CODES = {"status": {0, 2}, "logs": {0, 2}, "list": {0}, "export": {0, 2}, "report": {0, 2}, "proposals": {0, 1, 2}, "reconcile": {0, 2, 4}}
BUG = "an error of parcel_hpc"  # what the last-resort line says: never for damaged input
EXAMPLES = 40
# What no read command reads, left undamaged so every example damages records: checkpoints, the
# job pickles submitit keeps (submitit/ itself is read: logs), the trainer's frozen code.
UNREAD = {"checkpoints", "code"}


@pytest.fixture(scope="module")
def place(finished_search, tmp_path_factory) -> dict:
    """Where each example's copy goes (one path: the commands' output names it alike), the paths
    below the search a damage may hit, and a file only root may read, outside the search."""
    top = tmp_path_factory.mktemp("fuzz")
    secret = top / "root-only"
    secret.write_text(json.dumps({"trial_id": SECRET, "t": 1.0}) + "\n")
    secret.chmod(0o600)
    paths = sorted(str(p.relative_to(finished_search)) for p in finished_search.rglob("*") if p.parts[len(finished_search.parts)] not in UNREAD)
    return {"copy": top / "runs" / "finished-r1", "paths": paths, "secret": secret, "base": finished_search}


HOSTILE_VALUES = st.sampled_from(
    [None, [], {}, "", "x", -1, 0, 2**70, 1e308, float("nan"), float("inf"), -float("inf"), True, "\x1b]0;pwned\x07\u202e", "../../../etc", [[[[[]]]]]]
)


@st.composite
def damages(draw, paths: list[str]) -> list[tuple]:
    """One to three damages: (kind, path below the search, the values a kind needs)."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        kind = draw(
            st.sampled_from(["truncate", "flip", "fifo", "link_out", "link_zero", "folder", "huge", "delete", "json", "deep", "bad_utf8", "escape_name"])
        )
        out.append((kind, path, draw(st.integers(0, 2**31)), draw(HOSTILE_VALUES)))
    return out


def damage(search: Path, kind: str, rel: str, n: int, value, secret: Path) -> None:
    target = search / rel
    if not os.path.lexists(target):
        return  # an earlier damage removed it (or a folder above it)
    is_dir = target.is_dir() and not target.is_symlink()
    if kind in ("fifo", "link_out", "link_zero", "folder", "delete", "escape_name"):
        if kind == "escape_name":
            target.rename(target.with_name(f"{target.name}\x1b[2J\u200b"))
            return
        shutil.rmtree(target) if is_dir else target.unlink()
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "link_out":
            target.symlink_to(secret)
        elif kind == "link_zero":
            target.symlink_to("/dev/zero")
        elif kind == "folder":
            target.mkdir()
        return
    if is_dir or not target.is_file() or target.stat().st_size > 2**20:
        return  # the bytes of a folder, or of a file already made huge
    data = target.read_bytes()
    if kind == "truncate":
        data = data[: n % (len(data) + 1)]
    elif kind == "flip":
        if data:
            at = n % len(data)
            data = data[:at] + bytes([data[at] ^ (1 << (n % 8))]) + data[at + 1 :]
    elif kind == "huge":
        with target.open("r+b") as f:
            f.truncate(fsio.MAX_RECORD_BYTES + 1 + n % 4096)  # sparse: costs no disk
        return
    elif kind == "deep":
        data = b"[" * 100_000 + b"]" * 100_000 + b"\n"
    elif kind == "bad_utf8":
        at = n % (len(data) + 1)
        data = data[:at] + b"\xff\xfe\xc3" + data[at:]
    elif kind == "json":
        data = _json_edited(data, n, value)
    target.write_bytes(data)


def _json_edited(data: bytes, n: int, value) -> bytes:
    """The JSON (or one line of the JSON lines) with a value put at one of its keys, or the whole
    record replaced by it; written with NaN and infinities as Python's json writes them."""
    lines = data.splitlines(keepends=True) or [b"{}\n"]
    i = n % len(lines)
    try:
        record = json.loads(lines[i])
    except ValueError:
        return data  # not JSON: the other kinds damage it
    if isinstance(record, dict) and record and n % 3:
        key = sorted(record)[n % len(record)]
        record[key] = value
    else:
        record = value
    lines[i] = json.dumps(record).encode() + (b"\n" if lines[i].endswith(b"\n") or len(lines) > 1 else b"")
    return b"".join(lines)


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size, modification time and (for a regular file of
    at most a MiB) its content's digest; a FIFO is never opened, a link never followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            small = stat.S_ISREG(st_.st_mode) and st_.st_size <= 2**20
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if small else os.readlink(p) if stat.S_ISLNK(st_.st_mode) else ""
            out[str(p.relative_to(root))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns, digest)
    return out


def no_figures() -> contextlib.ExitStack:
    """The report's figures left undrawn while the block runs (each ``*_figure`` of report/plots.py
    gives none, and none is encoded): drawing is not reading, and costs seconds an example."""
    stack = contextlib.ExitStack()
    for name in (n for n in dir(plots) if n.endswith("_figure")):
        stack.enter_context(mock.patch.object(plots, name, lambda *args, **kwargs: None))
    stack.enter_context(mock.patch.object(page, "png_of", lambda fig: ""))
    return stack


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_read_command_on_a_damaged_search_is_one_line_at_most_and_writes_nothing(place, data):
    search = place["copy"]
    shutil.rmtree(search.parent, ignore_errors=True)
    shutil.copytree(place["base"], search, symlinks=True)
    for kind, rel, n, value in data.draw(damages(place["paths"])):
        damage(search, kind, rel, n, value, place["secret"])
    before = tree(search)
    with no_figures():
        for name, argv in READ_ARGV.items():
            try:
                ran = run_cli(argv(search), timeout_s=60)
            except Hung:
                pytest.fail(f"{name} hung on the damaged search")
            said = ran.out + ran.err
            assert ran.code in CODES[name], (name, ran.code, ran.err[-2000:])
            assert "Traceback" not in ran.err and BUG not in ran.err, (name, ran.err[-3000:])
            assert len(ran.error_lines) <= 1, (name, ran.err[-3000:])
            assert SECRET not in said, name
    assert tree(search) == before

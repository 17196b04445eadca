"""What the toolkit writes for other programs: CSV cells a spreadsheet cannot run (OWASP's rule),
Markdown a viewer cannot run or follow, and output files written only over regular files."""

import csv
import io
import os
from pathlib import Path

import pyarrow as pa
import pytest

from parcel_hpc.documents import csv_cell, csv_cells, markdown_text
from parcel_hpc.testing import parcel_hpc


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("http://evil","x")', '\'=HYPERLINK("http://evil","x")'),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "\\rx"),  # a carriage return is shown escaped: a terminal would rewrite the line with it
        ("-3", "-3"),  # one plain number is read as that number, never as a formula
        ("+1.5e-3", "+1.5e-3"),
        ("alice", "alice"),
        ("", ""),
        (-0.5, -0.5),  # typed numbers stay numbers
        (None, None),
    ],
)
def test_csv_cells_that_a_spreadsheet_would_run_get_a_quote(cell, written):
    assert csv_cell(cell) == written


@pytest.mark.parametrize(
    ("text", "absent"),
    [
        ("<script>alert(1)</script>", "<script>"),
        ('<img src=x onerror="alert(1)">', "<img"),
        ("[click](javascript:alert(1))", "](javascript:"),
        ("![x](data:text/html;base64,AAAA)", "data:"),
        ("a\n[ref]: javascript:alert(1)", "\n"),
        ("`code` | cell", " | "),
    ],
)
def test_markdown_text_escapes_html_links_and_schemes(text, absent):
    out = markdown_text(text)
    assert absent not in out and "\n" not in out
    assert "javascript:" not in out.lower() and "<" not in out


def test_markdown_text_keeps_plain_values_readable():
    assert markdown_text("sha256:abc parcel_hpc.trainer.numpy_mlp:NumpyMLP https://x.org") == "sha256:abc parcel_hpc.trainer.numpy_mlp:NumpyMLP https://x.org"


@pytest.mark.parametrize("kind", ["dir", "fifo", "symlink", "device"])
def test_export_never_replaces_what_is_not_a_regular_file(tmp_path, kind):
    target = tmp_path / "out.csv"
    if kind == "dir":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to("/dev/full")
    else:
        target = Path("/dev/full")  # the case: as root, the device must survive
    before = os.lstat(target)
    res = parcel_hpc(["export", str(tmp_path / "no-search"), "-o", str(target)])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "regular file" in res.stderr or "symbolic link" in res.stderr, res.stderr
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)


def test_reconcile_html_into_an_unwritable_place_is_one_line(tmp_path):
    from test_reconcile import _search, sample

    dump = tmp_path / "dump.txt"
    dump.write_bytes(sample("requeue_duplicates.txt"))
    res = parcel_hpc(["reconcile", str(_search(tmp_path).path), "--sacct-file", str(dump), "--html", "/proc/report.html"])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "--html /proc/report.html" in res.stderr


def test_reconcile_csv_neutralizes_a_hostile_node_name(tmp_path):
    from test_reconcile import _search, sample

    sd = _search(tmp_path)
    dump = tmp_path / "dump.txt"
    dump.write_bytes(sample("requeue_duplicates.txt").replace(b"|vm|", b'|=HYPERLINK("http://evil")|'))
    res = parcel_hpc(["reconcile", str(sd.path), "--sacct-file", str(dump), "--csv"])
    assert res.returncode in (0, 4), res.stderr
    nodes = {row["node"] for row in csv.DictReader(io.StringIO(res.stdout))}
    assert nodes and all(not n.startswith("=") for n in nodes), nodes
    assert '\'=HYPERLINK("http://evil")' in nodes, nodes


def test_reconcile_csv_carries_no_raw_control_or_bidi_character(tmp_path):
    from test_reconcile import _search, sample

    sd = _search(tmp_path)
    dump = tmp_path / "dump.txt"
    dump.write_bytes(sample("requeue_duplicates.txt").replace(b"|vm|", "|vm\x1b]0;pwned\x07\u202e|".encode()))
    res = parcel_hpc(["reconcile", str(sd.path), "--sacct-file", str(dump), "--csv"])
    assert res.returncode in (0, 4), res.stderr
    assert not any(c in res.stdout for c in "\x1b\x07\u202e"), res.stdout[:2000]
    nodes = {row["node"] for row in csv.DictReader(io.StringIO(res.stdout))}
    assert "vm\\x1b]0;pwned\\x07\\u202e" in nodes, nodes


def test_a_csv_cell_shows_control_and_bidi_characters_escaped():
    assert csv_cell("=cmd\x1b[2J\u202e") == "'=cmd\\x1b[2J\\u202e"
    assert csv_cell("two\nlines\tand a tab") == "two\nlines\tand a tab"  # a quoted cell holds them
    column = pa.array(["vm\x07", "plain", None, "=x\u200b"])
    assert csv_cells(column).to_pylist() == ["vm\\x07", "plain", None, "'=x\\u200b"]

"""scripts/newer-slurm.sh's refusals, which need no Debian root (the tier itself: docs/dev-cluster.md)."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "newer-slurm.sh"


def test_an_unknown_version_is_one_line_and_exit_2():
    proc = subprocess.run(["bash", str(SCRIPT), "23.02"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "usage: scripts/newer-slurm.sh 24.11|26.05 [--record] [pytest args...]: unknown VERSION '23.02'; pick 24.11 (trixie) or 26.05 (sid)"
    ]


def test_a_root_with_something_mounted_under_it_is_never_deleted(tmp_path):
    root = tmp_path / "root"
    (root / "keep").mkdir(parents=True)
    (root / "keep" / "file").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "keep")], check=True)
    try:
        (root / "keep" / "file").write_text("x")
        proc = subprocess.run(
            ["bash", str(SCRIPT), "24.11"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NEWER_SLURM_ROOT": str(root)},
        )
        assert proc.returncode == 2 and "something is still mounted under" in proc.stderr
        assert (root / "keep" / "file").read_text() == "x"
    finally:
        subprocess.run(["umount", str(root / "keep")], check=True)

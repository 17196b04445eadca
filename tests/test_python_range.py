"""The Pythons parcel_hpc runs on (3.11 to 3.13: Hydra 1.3.8 fails on 3.14, hydra issue 3121), said
once in parcel_hpc.errors.PYTHON_RANGE and kept equal in pyproject.toml and scripts/_env.sh; outside
it, every entry point and the setup script refuse in one line, exit 2."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from parcel_hpc.errors import PYTHON_RANGE, UsageError, require_supported_python

REPO = Path(__file__).resolve().parents[1]
FAKE_314 = "import sys; sys.version_info = (3, 14, 0, 'final', 0); "


def test_the_range_is_the_same_in_pyproject_and_the_setup_script():
    (low_major, low_minor), (high_major, high_minor) = PYTHON_RANGE
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={low_major}.{low_minor},<{high_major}.{high_minor}"
    env_sh = (REPO / "scripts" / "_env.sh").read_text()
    assert f"({low_major}, {low_minor}) <= sys.version_info[:2] < ({high_major}, {high_minor})" in env_sh


@pytest.mark.parametrize("version", [(3, 11, 0), (3, 13, 5)])
def test_3_11_to_3_13_run(version):
    require_supported_python(version)


@pytest.mark.parametrize("version", [(3, 10, 14), (3, 14, 0), (4, 0, 0)])
def test_others_are_refused_with_the_fix(version):
    with pytest.raises(UsageError, match=r"runs on Python 3\.11 to 3\.13, not .*hydra issue 3121.*PYTHON=python3\.13"):
        require_supported_python(version)


@pytest.mark.parametrize("module", ["parcel_hpc.cli", "parcel_hpc.launch.__main__"])
def test_entry_points_refuse_3_14_in_one_line_exit_2(module):
    # Imported first: the libraries' own import-time version checks see the real Python.
    entry = f"import {module} as entry; {FAKE_314}sys.argv = ['x', '--help']; entry.main()"
    proc = subprocess.run([sys.executable, "-c", entry], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert re.fullmatch(r"error: parcel_hpc runs on Python 3\.11 to 3\.13, not 3\.14\.0 .*\n", proc.stderr), proc.stderr


def test_the_setup_script_refuses_3_14_in_one_line_exit_2(tmp_path):
    shim = tmp_path / "python3.14"
    shim.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "Python 3.14.0"; exit 0; }}\nexec {sys.executable} -c "{FAKE_314}exec(sys.argv[1])" "$2"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PYTHON": str(shim), "PARCEL_VENV": str(tmp_path / "venv")}
    proc = subprocess.run(["bash", "-c", f"source {REPO / 'scripts' / '_env.sh'}"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and not (tmp_path / "venv").exists()
    assert proc.stderr.splitlines() == [
        "parcel_hpc runs on Python 3.11 to 3.13, not Python 3.14.0 (Hydra 1.3.8 fails on 3.14: hydra issue 3121); set PYTHON=python3.13 or older"
    ]

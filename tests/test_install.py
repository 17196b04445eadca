"""The package as users get it: a wheel (not the editable checkout) installed apart, then a search run
from another directory, its config and batch templates read from package data; the entry points'
documented forms (``-m --cfg job``) and a closed stdout ending quietly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parcel_hpc.testing import parcel_hpc

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.xdist_group("install")  # one worker runs the module: the wheel built and installed once, not once a worker


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``pip install`` of a wheel built from this tree into its own folder (its dependencies are the
    test environment's); PYTHONPATH puts it ahead of the editable checkout."""
    where = tmp_path_factory.mktemp("site")
    wheels = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "parcel_hpc"  # a copy: building writes build/ and egg-info beside the sources
    shutil.copytree(ROOT, source, ignore=_not_sources)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(source)]
    subprocess.run(build, check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheels.glob("parcel_hpc-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(where), str(wheel)], check=True, capture_output=True, timeout=300
    )
    return where


def _not_sources(folder: str, names: list[str]) -> list[str]:
    """What the wheel is not built from: the checkout's own folders (runs/, data/, the venv) at its
    top only (parcel_hpc/data is a package), and build leftovers anywhere."""
    top = {".git", ".venv", "runs", "data", "build", "multirun", "outputs"} if Path(folder) == ROOT else set()
    return [n for n in names if n in top or n == "__pycache__" or n.endswith(".egg-info") or n.startswith(".peers")]


def _env(site: Path, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARCEL_", "SLURM_"))}
    return env | {"PYTHONPATH": str(site), "PARCEL_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def test_the_installed_package_runs_a_search_from_another_directory(installed, artifacts, tmp_path):
    env = _env(installed, Path(artifacts["dir"]))
    where = subprocess.run(
        [sys.executable, "-c", "import parcel_hpc, hydra_plugins.parcel_hpc_plugins as p; print(parcel_hpc.__file__, p.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(path.startswith(str(installed)) for path in where.stdout.split()), where.stdout  # not the checkout
    for data in ("conf/config.yaml", "conf/sampler/tpe.yaml", "scheduler/slurm/templates/reconcile.sbatch", "py.typed", "release/templates/packet.html.j2"):
        assert (installed / "parcel_hpc" / data).is_file(), data
    run = subprocess.run(
        [sys.executable, "-m", "parcel_hpc.launch", "-m", "search.n_trials=4"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    status = subprocess.run(
        [sys.executable, "-m", "parcel_hpc", "status", "runs/parcel-search-r1", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    counts = json.loads(status.stdout)["counts"]
    assert counts["completed"] + counts["pruned"] == 4, counts


def test_a_users_own_config_directory_adds_options(installed, artifacts, tmp_path):
    """``--config-dir`` (Hydra's flag) adds a folder of the user's groups to the package's."""
    (tmp_path / "mine" / "space").mkdir(parents=True)
    (tmp_path / "mine" / "space" / "narrow_r1.yaml").write_text(
        "revision: narrow-r1\nparams:\n  lr: {type: loguniform, low: 0.01, high: 0.05}\n  hidden: {type: choice, values: [0, 16]}\n  l2: {type: loguniform, low: 1.0e-5, high: 1.0e-3}\n  batch_size: {type: choice, values: [64]}\n"
    )
    env = _env(installed, Path(artifacts["dir"]))
    argv = [
        sys.executable,
        "-m",
        "parcel_hpc.launch",
        "-m",
        "--config-dir",
        str(tmp_path / "mine"),
        "space=narrow_r1",
        "search.n_trials=2",
        "search.dry_run=true",
    ]
    run = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if "│ t000" in line]
    assert len(rows) == 2 and all("batch_size=64" in r for r in rows), run.stdout  # the user's space, not space_r4


def test_every_package_directory_ships():
    """pyproject.toml lists its packages (conf/ and sbatch_templates/ are mapped into the package
    from the top of the repository): every package directory of the tree is listed, and only those."""
    import tomllib

    from setuptools import find_namespace_packages

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_namespace_packages(str(ROOT), include=["parcel_hpc", "parcel_hpc.*", "hydra_plugins", "hydra_plugins.*"]))
    found = {p for p in found if (ROOT / p.replace(".", "/") / "__init__.py").is_file() or p == "hydra_plugins"}  # the namespace Hydra scans
    assert set(tool["packages"]) == found | set(tool["package-dir"]), set(tool["packages"]) ^ (found | set(tool["package-dir"]))
    assert all((ROOT / d / "__init__.py").is_file() for d in tool["package-dir"].values())


def test_the_documented_print_the_config_form_works(tmp_path):
    for argv in (["-m", "--cfg", "job"], ["--cfg", "job"], ["-m", "--cfg", "job", "lr=tag(log,interval(0.003,0.3))", "search.seed=3"]):
        run = subprocess.run([sys.executable, "-m", "parcel_hpc.launch", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (argv, run.stderr)
        assert run.stdout.startswith("snapshot:") and "search:" in run.stdout, run.stdout[:200]
        assert ("seed: 3" in run.stdout) == ("search.seed=3" in argv) and ("the sweeper's" in run.stderr) == ("search.seed=3" in argv)
    assert not (tmp_path / "runs").exists()


def test_a_closed_stdout_ends_quietly(tmp_path):
    """``parcel-hpc ... | head``: the reader leaves early; no BrokenPipeError traceback, exit 0."""
    for argv, code in ((["--help"], 0), (["status", str(tmp_path / "nothing")], 2)):
        proc = subprocess.Popen([sys.executable, "-m", "parcel_hpc", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # nobody reads: the first write meets a closed pipe
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code and b"Traceback" not in err, (argv, proc.returncode, err)
    # A refusal whose outcome line meets the closed pipe still runs to its end and keeps its exit code
    # (scripts read it), buffered or not, however much it prints.
    for printed, code in (("'hold:x'", 3), ("'hold:x' * 100_000", 3)):
        script = f"import parcel_hpc.commands.status as s, parcel_hpc.cli as c; s.run = lambda a: print({printed}) or 3; c.main(['status', '.'])"
        for unbuffered in ("", "1"):
            env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
            proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            proc.stdout.close()
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == code and b"Traceback" not in err, (printed, unbuffered, proc.returncode, err)


def test_bad_arguments_are_one_line(tmp_path):
    res = parcel_hpc(["statu", "x"])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "invalid choice: 'statu'" in res.stderr, res.stderr

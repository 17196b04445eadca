"""A real ``mlflow server`` for a test: a SQLite backend store and a local artifact root under the
test's directory, on a free loopback port; stopped (its whole process group) after."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(workdir: Path) -> Iterator[str]:
    executable = Path(sys.executable).parent / "mlflow"
    if not executable.exists():
        if os.environ.get("CI") or os.environ.get("PARCEL_REQUIRE_SLURM"):  # scripts/test.sh installs it
            pytest.fail("mlflow is not installed: scripts/test.sh installs the test extra")
        pytest.skip("mlflow is not installed (pip install -e '.[test]')")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    argv = [
        str(executable),
        "server",
        "--backend-store-uri",
        f"sqlite:///{workdir / 'mlflow.db'}",
        "--artifacts-destination",
        str(workdir / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    # mlflow leaves a db_init_lock file in the temporary directory: keep it in the test's own. Its server-side
    # jobs (a runner and eight huey consumers, each a Python process polling the store) serve none of what
    # parcel_hpc asks of a tracking server and registry: off, as a deployment without them runs.
    env = {**os.environ, "TMPDIR": str(workdir), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with started(argv, workdir / "server.log", f"{uri}/health", env=env):
        yield uri


@contextmanager
def started(argv: list[str], log_path: Path, ready: str, env: dict[str, str] | None = None) -> Iterator[None]:
    """``argv`` running (its own process group, its output in ``log_path``) once ``ready`` answers 200; stopped after."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, cwd=log_path.parent, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.5)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)

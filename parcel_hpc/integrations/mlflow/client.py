"""A client bound to one tracking URI, never MLflow's global tracking state; the one line a server
that does not answer is.

MLflow's own defaults are unfit for a command that must answer in one line: an unreachable server is
retried for minutes, a client given no registry URI opens ``./mlflow.db`` in the working directory,
and a run's URL is printed on stdout (where a command's outcome comes first). ``connect`` binds both
URIs to the one given, sets those knobs for this process (a command is one process) and asks the
server once; any failure is ``UsageError`` naming the URI (exit 2), before anything is written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.release_target import scrubbed, shown

INSTALL = "pip install 'parcel_hpc[mlflow]'"


def connect(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (tracking and registry), checked to answer."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # one try: a down server is said at once
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # stdout is the command's: its outcome comes first
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise UsageError(f"MLflow is not installed; {INSTALL}") from None
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    with answering(uri, "is not a tracking URI MLflow can use"):
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    with answering(uri, "is unreachable"):
        client.search_experiments(max_results=1)
        client.search_registered_models(max_results=1)
    return client


@contextmanager
def answering(uri: str, what: str, after: str = "") -> Iterator[None]:
    """Any MLflow or connection failure inside as one line naming the server (exit 2)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except (MlflowException, OSError) as exc:
        reason = scrubbed(" ".join(str(exc).split()), uri)
        if "Caused by" in reason:  # requests' retry chain: the last cause is the one that says why
            reason = reason.rsplit("Caused by", 1)[1].strip(" :()'\"")
        raise UsageError(f"MLflow at {shown(uri)} {what} ({reason[:200]}){after}; check the server and MLFLOW_TRACKING_URI (or release.tracking_uri)") from None

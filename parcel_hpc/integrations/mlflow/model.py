"""A registry entry as an MLflow model: the files MLflow's ``save_model`` writes for it.

The entry is an MLflow model directory with one flavor, ``python_function``, whose loader is
``parcel_hpc.release.pyfunc`` (it reads the entry's own files: no data travels with the flavor).
What it records: the signature (a float32 tensor of raw frames ``(-1, H, W)`` in; the probability that
each needs a damage review, float64 ``(-1,)``, out), the environment (``requirements.txt``,
``python_env.yaml``, ``conda.yaml``: parcel_hpc and the distributions the contract pins for the
trainer's code, at their pinned versions, and MLflow, which adds itself) and an input example (a few
validation frames the rerun kept: never the final partition's). ``mlflow.pyfunc.save_model`` writes
them into a scratch folder; they come back as text, for ``folder.write_entry`` to write whole and list.
Must not: write into the entry itself, or run the model.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parcel_hpc.errors import UsageError
from parcel_hpc.integrations.mlflow.client import INSTALL

LOADER = "parcel_hpc.release.pyfunc"  # the module MLflow imports to load the model: its _load_pyfunc(entry)


def requirements(trainer: Mapping[str, Any], parcel_hpc_version: str) -> list[str]:
    """What serving the model needs installed (pure): parcel_hpc at the version that ran the selection,
    then each distribution the contract pins for the trainer's code, at its pinned version."""
    pinned = {str(name): str(version) for name, version in dict(trainer.get("distributions") or {}).items() if version}
    return [f"parcel-hpc=={parcel_hpc_version}"] + [f"{name}=={pinned[name]}" for name in sorted(pinned) if name.lower().replace("_", "-") != "parcel-hpc"]


def model_files(frame_shape: Sequence[int], example: np.ndarray, pinned: list[str]) -> dict[str, str]:
    """The MLflow model's files (name to text) for frames of ``frame_shape`` (H, W), with ``example`` as
    its input example and ``pinned`` its requirements; ``UsageError`` when MLflow is not installed."""
    try:
        import mlflow.pyfunc  # the mlflow extra; imported here only, as the rest of this package does
        from mlflow.models import ModelSignature
        from mlflow.types import Schema, TensorSpec
    except ImportError:
        raise UsageError(f"MLflow is not installed, and a registered model is an MLflow model (MLmodel, its environment and example); {INSTALL}") from None
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines are not the command's to print
    height, width = (int(n) for n in frame_shape)
    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, height, width))]),  # raw frames, 0..1
        outputs=Schema([TensorSpec(np.dtype(np.float64), (-1,))]),  # the probability that each needs a review
    )
    with tempfile.TemporaryDirectory(prefix="parcel-model-") as scratch:
        path = Path(scratch) / "model"
        mlflow.pyfunc.save_model(path, loader_module=LOADER, signature=signature, input_example=np.asarray(example, np.float32), pip_requirements=pinned)
        written = sorted(path.rglob("*"))
        if any(not p.is_file() for p in written):
            raise UsageError(f"MLflow {mlflow.__version__} wrote folders into the model ({', '.join(p.name for p in written if not p.is_file())}); {INSTALL}")
        return {p.name: p.read_text() for p in written}

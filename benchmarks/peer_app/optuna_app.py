"""The peer's side of the Optuna benchmark: hydra-optuna-sweeper (TPE) over hydra-submitit-launcher's
``submitit_local`` (optuna_conf/config.yaml), each job scoring one trial with our search's objective.

    python optuna_app.py -m snapshot_dir=DATA hydra.sweep.dir=DIR hydra.sweeper.sampler.seed=0 hydra.sweeper.n_trials=82 hydra.sweeper.n_jobs=2

Runs in the peer's environment (benchmarks/.peers-optuna), where ``parcel_hpc`` is importable but
its dependencies and Hydra plugins are not (peer_optuna.peer_python_optuna). Each job also writes
``result.json`` into its own output directory: the sweeper keeps the return values only in memory.
"""

import json
import time
from collections.abc import Mapping
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

CONF = Path(__file__).resolve().parents[2] / "parcel_hpc" / "conf"  # our search's config groups: the objective reads its pins there
PARAMS = ("lr", "hidden", "l2", "batch_size")
RESULT = "result.json"


def objective(params: Mapping, snapshot_dir: Path) -> float:
    """The final validation miss-cost our worker records for a trial with ``params`` (no pruning, no
    checkpoints: neither changes it), by the same calls as worker/attempt.py and worker/training.py."""
    from parcel_hpc.data import read_split
    from parcel_hpc.governance.metric import MissCost
    from parcel_hpc.trainer import build_params, load_training_data
    from parcel_hpc.trainer.base import checked_probabilities, finite_metrics
    from parcel_hpc.trainer.numpy_mlp import NumpyMLP

    train = OmegaConf.load(CONF / "config.yaml").train
    metric = OmegaConf.load(CONF / "metric" / "miss_cost_r3.yaml")
    snapshot = snapshot_dir / Path(OmegaConf.load(CONF / "snapshot" / "parcels_v1.yaml").path).name
    split = read_split(snapshot_dir / Path(OmegaConf.load(CONF / "split" / "group_r8.yaml").path).name)
    data = load_training_data(snapshot, split, OmegaConf.load(CONF / "preprocessing" / "stats_r1.yaml"))
    trainer = NumpyMLP()
    trainer.build(build_params(trainer, params), int(train.seed), data)
    steps = int(train.steps)
    for step in range(1, steps + 1):
        finite_metrics(trainer.step(), step)  # a non-finite loss fails the trial (Diverged), as in our worker
    scores = checked_probabilities(trainer.predict("validation"), len(data.validation), "validation", steps)
    return MissCost(metric.revision, float(metric.miss_cost), float(metric.review_cost))(scores, data.validation.labels)


@hydra.main(version_base=None, config_path="optuna_conf", config_name="config")
def main(cfg: DictConfig) -> float:
    started = time.time()
    hc = HydraConfig.get()
    params = {name: cfg[name] for name in PARAMS}
    record = {"trial": hc.job.get("num", 0), "params": params, "value": None, "error": None, "started": started}
    try:
        record["value"] = objective(params, Path(cfg.snapshot_dir))
        return record["value"]
    except Exception as exc:  # the sweeper tells the study FAIL; the record keeps the trial's place
        record["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        record["ended"] = time.time()
        Path(hc.runtime.output_dir, RESULT).write_text(json.dumps(record))


if __name__ == "__main__":
    main()

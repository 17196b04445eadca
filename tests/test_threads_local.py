"""The worker binds what it was granted (issue 49): a trial granted 2 CPUs computes with 2 threads
(torch's intra-op pool, OpenMP, MKL and OpenBLAS), whatever the machine has."""

import json

import pytest

from parcel_hpc.testing import launch
from parcel_hpc.trainer import threads
from parcel_hpc.worker.training import STEP_HOOK_ENV

torch_trainers = pytest.importorskip("parcel_hpc.testing.torch_trainers")


def test_a_worker_granted_2_cpus_computes_with_2_threads(tmp_path, data_dir):
    (tmp_path / "seen").mkdir()  # beside the data, whose folder the worker's fence keeps it from writing in
    seen = tmp_path / "seen" / "threads.json"
    env = {STEP_HOOK_ENV: "parcel_hpc.testing.torch_trainers:record_threads", torch_trainers.THREADS_FILE_ENV: str(seen), "OMP_NUM_THREADS": "1"}
    overrides = ["search.n_trials=1", "pruner=none", "train.steps=3", "resources.cpus=2", "trainer.target=parcel_hpc.testing.torch_trainers:Resumes"]
    overrides += ["~space.params.hidden", "~space.params.l2", "space.params.batch_size.values=[8]"]
    res = launch([f"search.root={tmp_path / 'runs'}", "search.revision=th-r1", *overrides], cwd=tmp_path, data_dir=data_dir, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(seen.read_text()) == {"torch": 2, "env": dict.fromkeys(threads.THREAD_ENV, "2")}


def test_bind_sets_every_pool_and_never_less_than_one():
    env: dict[str, str] = {}
    threads.bind(3, env)
    assert env == dict.fromkeys(threads.THREAD_ENV, "3")
    threads.bind(0, env)
    assert env == dict.fromkeys(threads.THREAD_ENV, "1")

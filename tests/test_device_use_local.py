"""What each attempt used of its GPUs, end to end on the local executor: the worker reads the
driver's NVML library (here tests/fakes/fake_nvml.c, built into a real shared library and found the
way the driver's is), journals the device, its utilization and the frameworks the trainer loaded,
and status, export and reconcile show allocated, used and idle GPU-hours in jobstats' words. A CPU
search records "cpu" and shows no GPU line; the arithmetic and the sampler are checked alone too."""

import csv
import io
import json
import time
from pathlib import Path

import pyarrow.csv as pacsv
import pytest

from parcel_hpc.accounting.spend import GpuUse
from parcel_hpc.ledger import DeviceUse, SearchDir
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.worker.devices import Nvml, UtilizationSampler, device_use, mean_utilization


def test_gpu_hours_split_into_used_and_idle_and_an_unread_attempt_is_neither():
    quarter = DeviceUse(("H200",), utilization=0.25, samples=8)
    assert GpuUse.of(2.0, quarter) == GpuUse(2.0, 0.5, 0.0) and GpuUse.of(2.0, quarter).idle == pytest.approx(1.5)
    unread = GpuUse.of(1.0, DeviceUse(("H200",))) + GpuUse.of(3.0, None)
    assert unread == GpuUse(4.0, 0.0, 4.0) and unread.idle == 0.0
    assert GpuUse.of(0.0, DeviceUse(("cpu",))) == GpuUse()
    total = GpuUse.of(2.0, quarter) + GpuUse.of(1.0, None)
    assert total.line() == "allocated 3.0000 GPU-h: used 0.5000, idle 1.5000, 1.0000 without a utilization reading"
    # A line's columns: unknown, never 0, where an hour had no reading; a CPU line used and idled nothing.
    assert GpuUse.of(2.0, quarter).columns() == (0.5, 1.5) and unread.columns() == (None, None) and GpuUse().columns() == (0.0, 0.0)
    assert GpuUse.of_line(2.0, 0.5) == GpuUse.of(2.0, quarter) and GpuUse.of_line(3.0, None) == GpuUse.of(3.0, None)


@pytest.mark.parametrize(
    "use,wrong",
    [
        (dict(devices=("H200",), utilization=37.0, samples=1), "fraction in 0..1"),
        (dict(devices=("H200",), utilization=0.5), "mean of its samples"),
        (dict(devices=("H200",), samples=3), "mean of its samples"),
        (dict(devices=()), "names its devices"),
        (dict(devices=("H200",), peak_memory_bytes=-1), "peak memory is bytes"),
    ],
)
def test_a_device_use_is_validated_at_birth(use, wrong):
    with pytest.raises(ValueError, match=wrong):
        DeviceUse(**use)


def test_the_sampler_reads_the_granted_devices_by_index_or_uuid_and_is_inert_without_nvml(nvml_dir):
    assert Nvml.load(str(nvml_dir / "no-such-libnvidia-ml.so.1")) is None  # no driver: no NVML, no error
    nvml = Nvml.load(str(nvml_dir / "libnvidia-ml.so.1"))
    assert nvml is not None
    sampler = UtilizationSampler(["0", "GPU-fake-1", "GPU-not-there"], nvml=nvml, period_s=0.02).start()
    time.sleep(0.15)
    sampler.stop()
    assert sampler.names == ["Fake GPU 0", "Fake GPU 1"]  # the unknown UUID has no handle: not sampled
    assert len(sampler.readings) >= 4 and mean_utilization(sampler.readings) == 0.37
    quiet = UtilizationSampler([]).start()  # no GPU granted: no NVML, no thread
    quiet.stop()
    assert quiet.nvml is None and quiet.readings == [] and mean_utilization(quiet.readings) is None
    use = device_use(0, None)
    assert use.devices == ("cpu",) and use.utilization is None


def _search(root: Path, revision: str) -> SearchDir:
    return SearchDir(root / revision)


def test_a_gpu_search_records_what_each_attempt_used_and_every_read_command_shows_it(tmp_path, data_dir, nvml_dir):
    env = {"CUDA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": str(nvml_dir), "FAKE_NVML_UTILIZATION": "40"}
    res = launch(
        [f"search.root={tmp_path}", "search.revision=gpu", "search.n_trials=2", "resources.gpus=1", "pruner=none"],
        cwd=tmp_path,
        data_dir=data_dir,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    search = _search(tmp_path, "gpu")
    for r in search.records():
        (a,) = r.attempts
        assert a.gpus == 1 and a.device_use is not None
        # At least the reading taken as the sampler stops: an attempt shorter than a period has one too.
        assert a.device_use.devices == ("Fake GPU 0",) and a.device_use.utilization == 0.4 and a.device_use.samples >= 1
        assert a.device_use.peak_memory_bytes is None and a.device_use.frameworks is None  # numpy: no torch, no CUDA

    status = json.loads(parcel_hpc(["status", str(search.path), "--json"], cwd=tmp_path).stdout)
    use = status["spend"]["gpu_use"]
    assert use["allocated"] > 0 and use["used"] == pytest.approx(0.4 * use["allocated"], abs=2e-6) and use["unread"] == 0
    assert use["idle"] == pytest.approx(use["allocated"] - use["used"], abs=2e-6)
    assert all(t["device_use"]["devices"] == ["Fake GPU 0"] for t in status["trials"])
    human = parcel_hpc(["status", str(search.path)], cwd=tmp_path).stdout
    assert "GPUs: allocated " in human and "on Fake GPU 0" in human

    out = tmp_path / "trials.csv"
    assert parcel_hpc(["export", str(search.path), "-o", str(out), "--format", "csv"], cwd=tmp_path).returncode == 0
    rows = pacsv.read_csv(out).to_pylist()
    for row in rows:
        assert row["device"] == "Fake GPU 0" and row["gpu_utilization"] == pytest.approx(0.4)  # a trial's: weighted by its attempts' GPU-hours
        assert row["gpu_hours_used"] == pytest.approx(0.4 * row["gpu_hours"]) and row["gpu_hours_idle"] == pytest.approx(0.6 * row["gpu_hours"])
    report = parcel_hpc(["reconcile", str(search.path)], cwd=tmp_path)
    assert "GPUs (the ledger's hours, the workers' utilization): allocated" in report.stdout, report.stdout + report.stderr
    lines = list(csv.DictReader(io.StringIO(parcel_hpc(["reconcile", str(search.path), "--csv"], cwd=tmp_path).stdout)))
    assert len(lines) == 2 and all(line["device"] == "Fake GPU 0" and float(line["gpu_utilization"]) == 0.4 for line in lines)
    for line in lines:  # the scheduler's allocated hours, split by the worker's reading
        gpu_hours, used, idle = (float(line[k]) for k in ("gpu_hours", "gpu_hours_used", "gpu_hours_idle"))
        assert used == pytest.approx(0.4 * gpu_hours) and idle == pytest.approx(gpu_hours - used)


def test_a_cpu_search_records_the_cpu_and_shows_no_gpu_line(tmp_path, data_dir):
    res = launch([f"search.root={tmp_path}", "search.revision=cpu", "search.n_trials=1", "resources.gpus=0", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    (a,) = _search(tmp_path, "cpu").record("t0000").attempts
    assert a.device_use == DeviceUse(("cpu",))
    status = json.loads(parcel_hpc(["status", str(tmp_path / "cpu"), "--json"], cwd=tmp_path).stdout)
    assert status["gpu_line"] == "" and status["spend"]["gpu_use"]["allocated"] == 0
    assert status["trials"][0]["device_use"]["devices"] == ["cpu"] and status["trials"][0]["device_use"]["utilization"] is None
    out = tmp_path / "attempts.csv"
    assert parcel_hpc(["export", str(tmp_path / "cpu"), "--attempts", "-o", str(out)], cwd=tmp_path).returncode == 0
    (row,) = pacsv.read_csv(out).to_pylist()
    assert row["device"] == "cpu" and row["gpu_hours"] == 0 and row["gpu_utilization"] is None and row["gpu_peak_memory_bytes"] is None
    assert row["gpu_hours_used"] == 0 and row["gpu_hours_idle"] == 0  # no GPU-hour to read: none used, none idle

"""One reading of a device list for every reader: the scheduler's grant, the local pool, the trainer, NVML."""

from __future__ import annotations

import pytest

from parcel_hpc.gpus import nvml_key, visible_devices
from parcel_hpc.scheduler.local.backend import LocalBackend
from parcel_hpc.scheduler.local.dispatcher import machine_gpus
from parcel_hpc.scheduler.slurm.backend import SlurmBackend
from parcel_hpc.trainer.data import Devices

UUID = "GPU-5ad1e7c2-8f3b-4e0a-9c1d-2b7f6e4a1c0d"
MIG = "MIG-0c3b1f7e-6a2d-5e9f-8b4c-1d0e7a6f3b2c"


@pytest.mark.parametrize(
    ("listing", "seen"),
    [
        (None, ()),
        ("", ()),
        ("0", ("0",)),
        (" 0 , 2 ", ("0", "2")),
        ("0,1,", ("0", "1")),
        ("-1", ()),  # hides every device
        ("0,-1,1", ("0",)),  # CUDA stops at the first entry that names no device
        ("NoDevFiles", ()),  # what Slurm sets where a job was granted none
        ("1,1", ()),  # a device named twice: CUDA (and torch) sees none
        ("0,00", ()),
        ("02,1", ("2", "1")),
        (f"{UUID},GPU-0a", (UUID, "GPU-0a")),
        (f"{UUID},{UUID}", ()),
        (f"{UUID},0", (UUID,)),  # the first entry sets the kind: ids, then an index ends the list
        (f"{MIG},{UUID}", (MIG,)),
        ("0,GPU-5ad1e7c2", ("0",)),
        ("0,,1", ("0",)),
        ("\u00b2", ()),  # a digit that is no ASCII digit names no device
    ],
)
def test_a_device_list_is_read_as_cuda_reads_it(listing, seen):
    assert visible_devices(listing) == seen


@pytest.mark.parametrize("listing", ["0,-1,1", "NoDevFiles", "1,1", " 0 , 2 ", "03"])
def test_every_reader_counts_the_same_devices(listing):
    seen = visible_devices(listing)
    assert Devices.from_env(None, listing).visible == seen
    assert LocalBackend().started({"CUDA_VISIBLE_DEVICES": listing}, "h", 1, None).gpus == len(seen)
    slurm = SlurmBackend().started({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": listing}, "h", 1, None)
    assert slurm is not None and slurm.gpus == len(seen)
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": listing}) == tuple(int(d) for d in seen)


def test_a_visible_device_is_found_by_index_or_by_uuid():
    assert nvml_key("0") == 0 and nvml_key(" 3") == 3
    assert nvml_key(UUID) == UUID and nvml_key(MIG) == MIG

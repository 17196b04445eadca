"""``python -m parcel_hpc.testing.fakeslurm TOOL ARGS...``: what the wrappers in a fake cluster's
``bin/`` run (the state directory from ``PARCEL_FAKE_SLURM``); ``slurmctld DIR`` is the controller."""

import os
import sys

from parcel_hpc.testing.fakeslurm.controller import serve
from parcel_hpc.testing.fakeslurm.state import Store
from parcel_hpc.testing.fakeslurm.tools import main

if sys.argv[1] == "slurmctld":
    serve(Store(sys.argv[2]))
else:
    sys.exit(main(sys.argv[1], Store(os.environ["PARCEL_FAKE_SLURM"]), sys.argv[2:]))

"""Exclusive checkpoints: claims on per-trial directories and the checkpoint files in them.

claims.py   create-exclusive claims (NFS-safe), the claim decision table (pure), quarantine moves
store.py    atomic, self-verifying checkpoints (the binary layout, h5py-readable) in a claimed directory
"""

KEEP_LAST = 2  # checkpoints kept per trial unless the checkpoint group says otherwise (the one default)

"""Exclusive checkpoints: claims on per-trial directories and the checkpoint files in them.

claims.py   create-exclusive claims (NFS-safe), the claim decision table (pure), quarantine moves
store.py    one trial's checkpoints in its claimed directory: atomic saves, pruning, the newest verified load
format.py   one checkpoint file's bytes: an HDF5 file behind a self-hashing header and array index
writer.py   saves written off the training path: one writer thread, at most one save in flight
gang.py     one checkpoint across a gang's ranks: a part per rank, committed by rank 0's manifest
owner.py    which search a checkpoint.dir belongs to: another search's is refused at the launch
"""

KEEP_LAST = 2  # checkpoints kept per trial unless the checkpoint group says otherwise (the one default)

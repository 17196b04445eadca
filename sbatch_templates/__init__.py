"""The batch scripts parcel_hpc renders itself (``scheduler/slurm/sbatch.py`` fills them), at the top
of the repository where an admin reviews them; installed as the package data of
``parcel_hpc.scheduler.slurm.templates``."""

"""Acting from the login node: the alert watcher (``ckptdash watch``) and SLURM's side of a run."""

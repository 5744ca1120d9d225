"""Checkpoints written and recorded: the one save path and everything around it.

The atomic, checksummed save and its events (saving), in the background (async_save), saves
written by someone else's code (publish, written), which saves resume training (artifacts),
and a checkpoint that does not fit the model (misfit).
"""

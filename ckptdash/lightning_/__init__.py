"""Internals of :mod:`ckptdash.lightning` (not a public API): the CheckpointIO wrappers that
record every save, what Lightning's call stack tells about fit(), the resume and signal
takeovers. Import the callback from :mod:`ckptdash.lightning`."""

"""The dashboard inside Jupyter: the embedded document, the comms opened while a cell runs, and the
subshell that lets a click act while the kernel is busy."""

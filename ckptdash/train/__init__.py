"""The training side: :class:`~ckptdash.Monitor` (monitor.py) and its configuration
(config.py) at the top, and a folder per idea beneath: the session engine (engine/), an
attempt's start (starting/) and end (ending/), checkpoints (checkpoints/), the experiment
loggers' one run (tracking/), and what a job watches in itself (health/)."""

"""The session engine: the step boundary, its cadence, the cross-rank check and what it decides.

:class:`~ckptdash.train.engine.session.Session` is shared by :class:`~ckptdash.Monitor` and
the framework doors; the modules beside it are the parts of one boundary: when a check runs
(cadence), what it takes in (intake, commands), what the ranks agree on (decision, over dist),
the line printed at the start (announce), and the thread that paces a callback (ticker).
"""

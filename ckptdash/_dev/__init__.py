"""Development fixtures, kept apart from the product: no runtime module imports them.

* :mod:`ckptdash._dev.testing` — a fake trainer that answers commands, a served dashboard in
  a subprocess and a headless Chromium: what the browser, notebook and security tests (and
  ``benchmarks/``, ``scripts/screenshot.py``) drive.
* :mod:`ckptdash._dev.sample` — writes a believable run directory (attempts, saves, a
  preemption) for the analysis notebook, the docs' screenshots and the benchmarks.
* :mod:`ckptdash._dev.demo_train` — the small CPU training job ``ckptdash demo`` starts
  in a subprocess (``python -m ckptdash._dev.demo_train``).

They ship inside the package because the demo and an installed test suite need them at
runtime, but they are not a supported interface and may change without notice.
"""

"""``panel serve ckptdash`` from the repository root: the package folder is a Panel directory app.

    panel serve ckptdash --args runs/exp1     # a run directory or a folder of runs
    panel serve ckptdash                      # $CKPTDASH_RUN_DIR, else ./runs

Panel's own options (``--port``, ``--address``, ``--oauth-provider`` …) apply as
usual. This is Panel's server, without ckptdash's gate: no token and no Host allowlist,
so any user of the machine can drive it. ``ckptdash serve`` is the same app with those
(see ``ckptdash/dash/access.py``); prefer it on a shared login node.
"""

import sys

import panel as pn

from ckptdash.dash.app import Dashboard, default_path

pn.extension("tabulator", inline=True)
path = sys.argv[1] if len(sys.argv) > 1 else default_path()
Dashboard(path).servable(title=f"ckptdash · {path}")

"""``panel serve ckptdash`` from the repository root: the package folder is a Panel directory app.

    panel serve ckptdash --args runs/exp1     # a run directory or a folder of runs
    panel serve ckptdash                      # $CKPTDASH_RUN_DIR, else ./runs

Panel's own options (``--port``, ``--address``, ``--oauth-provider`` …) apply as usual.
This is Panel's server, without ckptdash's gate (no token, no Host allowlist): anyone who
can reach the port can open the page. So the page only watches unless Panel itself asks
for a login (``--basic-auth`` or ``--oauth-provider``): its controls (Save now, Stop,
requeue, resume pin, SLURM hold/release/cancel) are off and say why. ``ckptdash serve`` is
the same app behind a token (``ckptdash/dash/access.py``); prefer it on a shared machine.
"""

import sys

import panel as pn

from ckptdash.dash.access import panel_serve_lock
from ckptdash.dash.app import Dashboard, DashOptions, default_path

pn.extension("tabulator", inline=True)
path = sys.argv[1] if len(sys.argv) > 1 else default_path()
options = DashOptions(controls_off=panel_serve_lock(pn.config, pn.state.user))
Dashboard(path, options=options).servable(title=f"ckptdash · {path}")

"""Write the page a notebook shows for ``ckptdash.dashboard(RUN)``: Panel's inline JavaScript
(what ``pn.extension(inline=True)`` publishes) followed by the widget's HTML output, exactly as
the notebook front end puts both into its page.

    python -m tests.security.widget_page RUN_DIR OUT.html

Run in a process of its own: it changes Panel's global notebook state.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def main(run_dir: str, out: str) -> None:
    import IPython.display
    import panel as pn
    from panel.io import notebook

    from ckptdash.dash.app import Dashboard
    from ckptdash.dash.feed.hub import FollowerHub

    outputs: list[str] = []

    def publish(data: dict[str, Any], metadata: Any = None, **kwargs: Any) -> None:
        # A notebook puts text/html in the page as it is and runs application/javascript.
        if "text/html" in data:
            outputs.append(data["text/html"])
        elif "application/javascript" in data:
            outputs.append(f"<script>{data['application/javascript']}</script>")

    IPython.display.publish_display_data = publish
    pn.extension("tabulator", inline=True)
    notebook.load_notebook(inline=True)
    hub = FollowerHub()
    dashboard = Dashboard(run_dir, hub=hub, first_read_s=10.0)
    try:
        data, _ = dashboard._repr_mimebundle_()
    finally:
        dashboard.close()
        hub.close()
    outputs.append(data["text/html"])
    Path(out).write_text("<!doctype html><html><body>" + "\n".join(outputs) + "</body></html>")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

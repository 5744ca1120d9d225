"""Event text stays text where the dashboard turns data into markup without a browser: the
widget's inlined JSON, the guard on a rendered widget, the timeline's tooltips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptdash.dash.notebook.embed import check_bundle, script_safe_json
from ckptdash.dash.views.timeline import timeline_data
from ckptdash.errors import CkptDashError
from tests.security.hostile import FOLDER_PAYLOAD, PAYLOADS, write_hostile_run


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A run whose every event string is a payload (see tests/security/hostile.py)."""
    return write_hostile_run(tmp_path)


def test_tooltips_hold_only_escaped_event_text(hostile: Path) -> None:
    """The timeline's tooltips show ``desc`` as HTML (for its line breaks): every one is the
    event text escaped, so the payloads are text there too (``title`` is escaped by Bokeh)."""
    from ckptdash.dash.feed.snapshot import SnapshotBuilder
    from ckptdash.state.reading import load_state

    snap = SnapshotBuilder(str(hostile)).take(
        load_state(hostile), sightings=0, settings=None, settings_error="", settings_key=()
    )
    descs = [d for cols in timeline_data(snap).values() for d in cols["desc"]]
    assert any("&lt;script&gt;" in d for d in descs)
    for desc in descs:
        assert "<" not in desc.replace("<br>", ""), desc


def test_script_safe_json_is_the_same_json() -> None:
    """The escaped JSON decodes to the same value and holds no character that HTML reads."""
    value = {"p": [*PAYLOADS, FOLDER_PAYLOAD, "&amp; \u2028"]}
    text = script_safe_json(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert not set("<>&\u2028\u2029") & set(text)


def test_a_widget_whose_script_could_end_early_is_refused() -> None:
    """Should Panel ever render the widget without the script-safe JSON, the widget refuses
    to show (with a message saying which Panel to install) instead of running the text."""
    safe = {
        "text/html": '<div id="w"></div>\n<script type="application/javascript">'
        'var d = {"p": "\\u003c/script\\u003e"};</script>'
    }
    assert check_bundle((safe, {})) == (safe, {})
    for inner in ("</script><script>x()", "<!--", "</SCRIPT >"):
        bad = {"text/html": f'<div></div><script>var d = "{inner}";</script>'}
        with pytest.raises(CkptDashError, match="Panel version"):
            check_bundle((bad, {}))

"""The notebooks in notebooks/ run top to bottom in a real Jupyter kernel (this venv's
python, through ipykernel), as a user runs them, and do what they say."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from ckptdash.state.reading import load_state

pytestmark = pytest.mark.notebook
NOTEBOOKS = Path(__file__).parents[2] / "notebooks"
KERNEL = "ckptdash-test-venv"


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec of our own that starts this interpreter, whatever kernels the machine
    has (a fresh clone's venv may have none, or a `python3` from another Python)."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", str(NOTEBOOKS.parent))
    return KERNEL


def execute(name: str, cwd: Path, kernel: str) -> Any:
    """Run every cell of notebooks/NAME in ``cwd``; returns the executed notebook."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=kernel,
        timeout=240,
        startup_timeout=120,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    return nb


def _js(output: Any) -> bool:
    return "application/javascript" in output.get("data", {})


def _text(cell: Any) -> str:
    out = []
    for o in cell.get("outputs", []):
        out.append(o.get("text", ""))
        out.append(o.get("data", {}).get("text/plain", ""))
    return "".join(out)


@pytest.mark.parametrize("name", ["quickstart.ipynb", "analysis.ipynb"])
def test_committed_notebooks_have_no_outputs(name: str) -> None:
    """The notebooks are committed with their outputs cleared."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_quickstart_trains_and_its_dashboard_renders_offline(
    tmp_path: Path, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quickstart runs without errors and without a red line (no stderr output): cell 1
    shows the dashboard with its JavaScript inline (no CDN), cell 2's training leaves a
    finished attempt with checkpoints in the run directory, cell 3 prints the status of that
    attempt."""
    monkeypatch.setenv("CKPTDASH_QUICKSTART_STEPS", "60")
    nb = execute("quickstart.ipynb", tmp_path, kernel)
    (run,) = sorted((tmp_path / "runs").iterdir())
    state = load_state(run)
    assert [(a.outcome, a.step) for a in state.attempts.values()] == [("finished", 60)]
    assert any(c.trigger == "periodic" for c in state.checkpoints.values())
    loaders = [o["data"]["application/javascript"] for o in nb.cells[1].outputs if _js(o)]
    # Bokeh's and Panel's JavaScript itself (megabytes), not <script src=...> to a CDN.
    assert max(map(len, loaders)) > 1_000_000
    assert "Bokeh" in loaders[0]
    assert "finished (completed)" in _text(nb.cells[3])
    # Nothing red: no warning, no framework chatter, and ckptdash's own start-up line on
    # stdout (a kernel draws stderr as a warning).
    stderr = [
        o["text"] for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr"
    ]
    assert stderr == []
    assert "ckptdash: SIGUSR2 -> " in _text(nb.cells[2])


def test_analysis_opens_a_run_after_the_fact(tmp_path: Path, kernel: str) -> None:
    """Without CKPTDASH_RUN_DIR the analysis notebook writes the sample run and shows its
    status, timeline, goodput (badput by cause), metrics plot and checkpoint table without
    errors."""
    nb = execute("analysis.ipynb", tmp_path, kernel)
    text = "".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "stopped (preempted)" in text
    assert "signal" in text
    assert "badput by cause (s): {'startup'" in text


def test_analysis_reads_the_run_named_by_the_environment(
    tmp_path: Path, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CKPTDASH_RUN_DIR set, the analysis notebook shows that run (and writes none)."""
    from ckptdash._dev.sample import write_sample_run

    run = tmp_path / "mine"
    write_sample_run(run)
    monkeypatch.setenv("CKPTDASH_RUN_DIR", str(run))
    nb = execute("analysis.ipynb", tmp_path, kernel)
    assert str(run) in _text(nb.cells[1])
    assert f"run {load_state(run).run_id}" in _text(nb.cells[2])

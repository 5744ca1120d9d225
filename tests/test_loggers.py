"""The framework-free logger pieces: derived ids, the CSV rewrite, dropping what a logger cannot
replace, reading back the recorded logger runs, and how ``ckptdash status`` names them."""

from __future__ import annotations

import os
import time
import types
from pathlib import Path
from typing import Any

import pytest

from ckptdash.cli.status import render_status
from ckptdash.events import LoggerAttached, RunStarted, encode
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state
from ckptdash.train.tracking import loggers, wandb_compat


def test_the_derived_id_is_stable_and_safe_for_every_logger() -> None:
    """Every attempt of a run gets the same id, made only of letters, digits, - and _."""
    assert loggers.derived_id("3f2a91c0d4e1") == "ckptdash-3f2a91c0d4e1"
    assert loggers.derived_id("my run/2") == "ckptdash-my-run-2"
    assert loggers.purge_step(None) == 0 and loggers.purge_step(0) == 0
    assert loggers.purge_step(30) == 31


def test_csv_keeps_only_the_rows_before_the_first_redone_step(tmp_path: Path) -> None:
    """The rewritten file keeps its header and the rows before the step logged again, in
    place of the old one (no temp file left); a missing file is left missing."""
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,loss,step\n0,0.5,0\n0,0.4,1\n0,,2\n1,0.3,3\n")
    assert loggers.truncate_csv(path, 2) == ["epoch", "loss", "step"]
    assert path.read_text().splitlines() == ["epoch,loss,step", "0,0.5,0", "0,0.4,1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]
    assert loggers.truncate_csv(tmp_path / "none.csv", 0) is None
    assert not (tmp_path / "none.csv").exists()


class _Logger:
    def __init__(self) -> None:
        self.logged: list[int | None] = []

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.logged.append(step)


def test_drop_until_skips_the_logged_steps_then_takes_itself_off() -> None:
    """Steps up to the last one logged before are not sent again; the first later step goes
    through and the logger's own method is back (nothing more per step)."""
    logger = _Logger()
    drop = loggers.DropUntil(logger, 12)
    for step in (11, 12, 13, 14):
        logger.log_metrics({"loss": 1.0}, step)
    assert logger.logged == [13, 14] and drop.dropped == 2
    assert "log_metrics" not in logger.__dict__


def test_drop_until_on_a_module_function_puts_the_function_back() -> None:
    """A framework that calls a module's function (the HF Trainer's ``wandb.log``,
    ``mlflow.log_metrics``) is dropped for the same steps, read by ``step_of``; a call without
    a step goes through; past the last dropped step the module holds its own function again."""
    module = types.ModuleType("fake_wandb")
    logged: list[dict[str, Any]] = []

    def log(data: dict[str, Any], step: int | None = None) -> None:
        logged.append(data)

    module.log = log  # type: ignore[attr-defined]
    drop = loggers.DropUntil(module, 7, "log", lambda a, kw: a[0].get("train/global_step"))
    module.log({"train/global_step": 6})
    module.log({"train/global_step": 7})
    module.log({"summary": 1})  # no step: goes through, the wrapper stays
    module.log({"train/global_step": 7})
    module.log({"train/global_step": 8})
    assert logged == [{"summary": 1}, {"train/global_step": 8}] and drop.dropped == 3
    assert module.log is log


def test_recorded_loggers_reads_the_newest_of_each_name_leniently(run_dir: RunDir) -> None:
    """The newest record of each logger wins; a record of another run, a corrupt line and a
    torn last line are skipped, never raised."""
    with EventWriter(run_dir, attempt=0) as w:
        w.emit(LoggerAttached, logger="mlflow", id="first")
        w.emit(LoggerAttached, logger="wandb", id="w")
    with EventWriter(run_dir, attempt=1) as w:
        w.emit(LoggerAttached, logger="mlflow", id="second")
        path = w.path
    stranger = LoggerAttached(t=time.time() + 5, run="other", attempt=1, logger="mlflow", id="x")
    with open(path, "ab") as f:
        f.write(b'{"kind":"logger_attached", broken\n' + encode(stranger))
        f.write(b'{"kind":"logger_attached","logger":"mlflow","id":"torn"')
    found = loggers.recorded_loggers(run_dir)
    assert {n: e.id for n, e in found.items()} == {"mlflow": "second", "wandb": "w"}


def test_status_names_each_logger_run(run_dir: RunDir) -> None:
    """``ckptdash status`` prints one line per logger: name, id, where, the attempt and step
    it continued from, and what became of the redone steps."""
    with EventWriter(run_dir, attempt=1) as w:
        w.emit(RunStarted)
        w.emit(LoggerAttached, step=30, logger="tensorboard", id="ckptdash-a", location="/tb/a",
               redone="replaced")  # fmt: skip
        w.emit(LoggerAttached, step=30, logger="mlflow", id="9f", named=True)
    text = render_status(run_dir, load_state(run_dir))
    assert (
        "logger  tensorboard ckptdash-a in /tb/a, attempt 1 from step 30, later steps replaced"
        in text
    )
    assert "logger  mlflow 9f (named by the user), attempt 1 from step 30" in text


def test_own_wandb_service_leaves_another_processs_service_after_the_first_attempt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the first attempt, a ``WANDB_SERVICE`` of another process is taken out of the
    environment (W&B then starts the attempt's own service) with one line on stderr; this
    process's own service, a first attempt, or a connection already made is left alone (the
    last with a line saying what to do)."""
    other = "3-1-unix-/tmp/wandb-1-2-3/socket"
    monkeypatch.setattr(wandb_compat, "service_connected", lambda: False)
    monkeypatch.setenv("WANDB_SERVICE", other)
    assert loggers.own_wandb_service(again=False) is None
    assert os.environ["WANDB_SERVICE"] == other
    monkeypatch.setenv("WANDB_SERVICE", f"3-{os.getpid()}-unix-/tmp/wandb-x/socket")
    assert loggers.own_wandb_service(again=True) is None and os.environ["WANDB_SERVICE"]
    monkeypatch.setenv("WANDB_SERVICE", other)
    monkeypatch.setattr(wandb_compat, "service_connected", lambda: True)
    connected = loggers.own_wandb_service(again=True)
    assert connected is not None and "already connected" in connected
    assert os.environ["WANDB_SERVICE"] == other
    monkeypatch.setattr(wandb_compat, "service_connected", lambda: False)
    line = loggers.own_wandb_service(again=True)
    assert line is not None and "started by process 1" in line
    assert "WANDB_SERVICE" not in os.environ
    assert capsys.readouterr().err.splitlines() == [connected, line]

"""What a session's check takes in: each signal's action (the user's over the scheduler's, one
spelling), and a launcher agent gone, taken once with the strongest configured action."""

from __future__ import annotations

import os
import signal

from ckptdash.train.ending import agent
from ckptdash.train.engine.intake import SignalIntake, Taken


def test_the_users_meaning_wins_and_every_name_is_spelt_signame() -> None:
    """Grid Engine's USR1 (record only) under the user's ``usr1: terminate``; names in any
    spelling become ``SIGNAME``; a signal added later never replaces a configured one."""
    intake = SignalIntake({"SIGUSR1": "ignore"}, {"usr1": "terminate", "USR2": "requeue"})
    assert intake.actions == {"SIGUSR1": "terminate", "SIGUSR2": "requeue"}
    assert intake.may_requeue
    intake.add("usr2", "terminate")
    intake.add("SIGHUP", "terminate")
    assert intake.actions == {"SIGUSR1": "terminate", "SIGUSR2": "requeue", "SIGHUP": "terminate"}
    assert not SignalIntake({}, {"SIGTERM": "terminate"}).may_requeue


def test_a_delivered_signal_is_taken_with_its_action() -> None:
    """A signal the record-only handler saw comes out of ``take`` once, with its action."""
    intake = SignalIntake({}, {"SIGUSR2": "requeue"})
    intake.recorder.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        (got,) = intake.take()
    finally:
        intake.recorder.uninstall()
    assert (got.name, got.action) == ("SIGUSR2", "requeue")
    assert intake.take() == []


def test_a_launcher_agent_gone_is_taken_once_with_the_strongest_action() -> None:
    """When this process's parent is no longer the agent it started under, ``take`` says so
    once, as ``launcher-exited`` with the strongest configured action; the start-up line names
    the agent."""
    intake = SignalIntake({}, {"SIGTERM": "terminate", "SIGUSR2": "requeue"})
    assert intake.agent_plan() == ""  # no launcher here
    gone = agent.LauncherAgent("torchrun", pid=os.getppid() + 1_000_000)  # not our parent
    intake.agent_watch = agent.AgentWatch(gone)
    (got,) = intake.take()
    assert isinstance(got, Taken) and (got.name, got.action) == (agent.AGENT_EXITED, "requeue")
    assert intake.take() == []
    assert intake.agent_plan().startswith("; torchrun (pid ")

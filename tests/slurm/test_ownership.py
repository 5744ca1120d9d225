"""On a real SLURM: ckptdash acts only on the acting user's own job (issue 22, point 3).

A run whose log names another account's job — a pending job of `nobody` here, submitted by
root with ``sbatch --uid`` — is refused by ``ckptdash requeue --hold/--cancel-pending`` and by
``ckptdash watch --on hung=cancel``: the job is still pending afterwards, untouched.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from ckptdash import events
from ckptdash.ops.watch import Watch, parse_rules
from ckptdash.rundir.writer import EventWriter
from tests.slurm.harness import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def test_a_log_naming_another_users_job_is_refused(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """SLURM says the job runs as nobody: `requeue --hold`, `--cancel-pending --yes` and
    `--suspend`'s mirror exit 2 saying so, the watch records a refused cancel; the job stays
    pending and held, its Requeue flag unchanged."""
    c = slurm_cluster
    job = c.run(
        "sbatch", "--parsable", "--uid=nobody", "--gid=nogroup", "--hold", "--chdir=/tmp",
        "--output=/dev/null", "--wrap", "sleep 600",
    ).stdout.strip().split(";")[0]  # fmt: skip
    try:
        owner = c.job(job)["UserId"]
        assert owner.startswith("nobody("), owner
        run = tmp_path / "looks-hung"
        t0 = time.time() - 3600
        with EventWriter(run, attempt=0, host="node1") as w:
            w.emit(events.RunStarted, t=t0, scheduler="slurm", job_id=job)
            for i in range(1, 30):
                w.emit(events.Pulse, t=t0 + i, step=5)
        for argv in (["--hold"], ["--cancel-pending", "--yes"], ["--suspend"]):
            refused = c.ckptdash("requeue", str(run), *argv, check=False)
            assert refused.returncode == 2, (argv, refused.stdout, refused.stderr)
            assert f"slurm job {job} belongs to nobody" in refused.stderr, refused.stderr
        log = io.StringIO()
        watch = Watch(
            run, overrides={"hung_after_s": 60}, rules=parse_rules(["hung=cancel"]), log=log
        )
        try:
            (fired,) = [f for f in watch.poll() if f.action is not None]
        finally:
            watch.close()
        assert fired.action is not None
        assert fired.action[1] is False
        assert "belongs to nobody" in fired.action[2]
        assert "FAILED" in log.getvalue()
        after = c.job(job)
        assert (after["JobState"], after["Reason"]) == ("PENDING", "JobHeldUser"), after
        assert after["Requeue"] == "1"
    finally:
        c.run("scancel", job, check=False)

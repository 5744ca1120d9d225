"""Any scheduler ckptdash has no module for: a requeue command template.

``{job_id}`` in the template is replaced by ``CKPTDASH_JOB_ID`` (or the variable named by
``job_id_env``), e.g. ``"brequeue {job_id}"`` (LSF) or ``"qrerun {job_id}"`` (PBS). The
command's exit status is all ckptdash can judge it by; a scheduler whose command exits 0 when
it refuses needs a module of its own (as Grid Engine's ``qmod -rj`` has).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ckptdash.schedulers.base import RequeueResult, Scheduler, run_command


class CommandScheduler(Scheduler):
    """A user-supplied requeue command template (``TrainConfig.requeue_command``)."""

    name = "command"

    def __init__(
        self,
        template: str,
        job_id_env: str = "CKPTDASH_JOB_ID",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(environ)
        self.template = template
        self.job_id_env = job_id_env

    @property
    def job_id(self) -> str | None:
        return self.env.get(self.job_id_env)

    @property
    def can_requeue(self) -> bool:
        return True

    def requeue(self) -> RequeueResult:
        argv = [part.replace("{job_id}", self.job_id or "") for part in shlex.split(self.template)]
        return run_command(argv)

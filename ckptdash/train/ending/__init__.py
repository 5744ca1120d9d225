"""How an attempt ends, and what it leaves its scheduler.

The signals that ask for the end (recorded by handlers, passed on by a launcher, a launcher
agent gone), the requeue and the exit status a scheduler reruns a job by, submitit's result,
a failing script's exception, and the crash loop that stops requeueing.
"""

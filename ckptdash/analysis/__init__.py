"""Pure judgements over a replayed run (no I/O, no Panel): health alerts, goodput and badput by
cause, what preemptions cost and the checkpoint interval that would cost least."""

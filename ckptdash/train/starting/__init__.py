"""What an attempt settles at its start, before the first step.

One job per run directory (guard, over the log's replay: logview), what crashed attempts left
behind (recovery), which attempt this is (attempts), a fresh start that lasts (fresh), and the
resume choice every rank agrees on (resuming).
"""

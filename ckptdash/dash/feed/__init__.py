"""The dashboard's feed, in plain Python (no Panel): follow a run directory's files, share one
follower per directory between sessions, and hand out immutable snapshots."""

"""The training side: the session engine, signals, schedulers, saving and Monitor."""

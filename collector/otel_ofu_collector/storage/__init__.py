"""What the collector keeps on disk: the write-ahead of the open windows' accepted requests (``write_ahead.py``),
what it shares with the spool of undelivered outputs (``sqlite_files.py``: a damaged file moved aside, a WAL
checked), and the lock that keeps one collector per spool (``spool_lock.py``)."""

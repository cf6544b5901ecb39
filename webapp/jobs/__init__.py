"""Jobs: the store (SQLite), the queue (huey), the sandbox (bubblewrap + rlimits) and the worker."""

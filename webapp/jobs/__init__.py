"""Jobs: the store (SQLite or PostgreSQL), the queue (huey), the worker that runs each job in the sandbox
(webapp/machine/sandbox.py), submission, storage and the shared tuning database."""

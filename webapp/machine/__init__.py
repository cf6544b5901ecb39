"""This machine as the jobs share it: the sandbox that jails a job's untrusted work (sandbox.py) and
the timing slot that lets one job time at a time (timing_slot.py)."""

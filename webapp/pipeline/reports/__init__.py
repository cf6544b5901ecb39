"""What a job's results say, written from what the stages found: the facts the page states, the
Model Explorer files, the device code's split by language."""

from __future__ import annotations

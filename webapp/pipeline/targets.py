"""Moved to webapp.targets (one module per kind of target)."""

from webapp.targets import host_target, make_target, target_json  # noqa: F401

"""The device pool's status for the web (`/api/devices` and the form's status line): the boards the
tracker has per key, asked over its wire protocol in plain Python, and the pool's own state from
devices/pool.json (written by webapp.devices.pool). No TVM."""

from __future__ import annotations

import json
import threading
import time

from webapp.config import Config
from webapp.devices.tracker import TrackerError, pool_of, tracker_summary

# The form asks on every load: a tracker that does not answer at once is reported down, not waited for.
STATUS_TIMEOUT_S = 0.5


def read_status(config: Config) -> dict:
    """devices/pool.json, or {} before a pool has written it."""
    try:
        return json.loads((config.devices_dir / "pool.json").read_text())
    except (OSError, ValueError):
        return {}


def pool_status(config: Config) -> dict:
    """The tracker (up or not, and why not), the pool's state and message, the boards per key (free,
    busy, requests waiting), the emulated boards, and `summary`: all of it in one line."""
    pool = read_status(config)
    status = {
        "tracker": config.tracker,
        "tracker_up": False,
        "message": None,
        "state": pool.get("state", "not started"),
        "pool_message": pool.get("message"),
        "keys": {},
        "emulated_boards": pool.get("boards", []),
    }
    try:
        status["keys"] = pool_of(tracker_summary(config.tracker, STATUS_TIMEOUT_S))
        status["tracker_up"] = True
    except TrackerError as exc:
        status["message"] = str(exc)
    status["summary"] = summary_line(status)
    return status


RECENT_S = 2.0  # the front page's pool status may be this old: one tracker call serves every request
_recent: dict = {}
_recent_lock = threading.Lock()


def recent_pool_status(config: Config) -> dict:
    """pool_status, asked of the tracker at most once in RECENT_S by this process (the tracker answers
    one call at a time: 50 front pages at once waited for it in turn, up to 0.9 s)."""
    with _recent_lock:
        key = (config.tracker, str(config.devices_dir))
        at, status = _recent.get(key, (0.0, None))
        if status is None or time.monotonic() - at > RECENT_S:
            status = pool_status(config)
            _recent[key] = (time.monotonic(), status)
        return status


def summary_line(status: dict) -> str:
    """E.g. "rpi4: 1 board (1 free) · rpi5: 1 board (0 free, 1 busy) · emulated boards ready"."""
    if not status["tracker_up"]:
        return f"tracker not running at {status['tracker']}"
    parts = [
        f"{key}: {p['boards']} board{'s' if p['boards'] != 1 else ''} ({p['free']} free"
        + (f", {p['busy']} busy" if p["busy"] else "")
        + (f", {p['waiting']} job{'s' if p['waiting'] != 1 else ''} waiting" if p["waiting"] else "")
        + ")"
        for key, p in status["keys"].items()
    ] or ["no boards registered"]
    state, message = status["state"], status["pool_message"]
    if state == "ready":
        parts.append("emulated boards ready" if status["emulated_boards"] else message or "ready")
    elif state in ("preparing", "failed"):
        parts.append(f"{state} ({message})" if message else state)
    elif state == "stopped":
        parts.append("the pool was stopped")
    return " · ".join(parts)

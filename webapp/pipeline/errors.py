class StageError(Exception):
    """A failure the user can act on; its message is shown as is (no traceback)."""

from __future__ import annotations

import sys
from pathlib import Path

from webapp.pipeline.errors import near_limit

try:
    from webapp.pipeline.runner import run
except Exception:
    if near_limit():  # the sandbox names the limit from this line (sandbox.describe_exit)
        sys.exit("Out of memory: the compiler's libraries do not fit in the job's memory limit.")
    raise

run(Path(sys.argv[1]))

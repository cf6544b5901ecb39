import sys
from pathlib import Path

from webapp.pipeline.runner import run

run(Path(sys.argv[1]))

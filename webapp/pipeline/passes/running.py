"""A pass instrument that tells webapp.pipeline.steps which TVM pass runs now: the pipeline's own
passes, not the hundreds FoldConstant runs inside itself (depth <= 3: pipeline > sequential > pass)."""

from __future__ import annotations

import tvm

from webapp.pipeline.steps import set_step


@tvm.instrument.pass_instrument
class RunningPass:
    def __init__(self):
        self.depth = 0

    def run_before_pass(self, mod, info):
        self.depth += 1
        if self.depth <= 3 and info.name not in ("sequential", "_pipeline"):
            set_step(info.name)

    def run_after_pass(self, mod, info):
        self.depth -= 1

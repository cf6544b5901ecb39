"""A pass instrument that tells webapp.pipeline.steps which TVM pass runs now: the pipeline's own
passes, not the hundreds FoldConstant runs inside itself (depth <= 3: pipeline > sequential > pass).
Once the outermost pass ends, the step named before it is back."""

from __future__ import annotations

import tvm

from webapp.pipeline import steps


@tvm.instrument.pass_instrument
class RunningPass:
    def __init__(self):
        self.depth, self.outer = 0, ""

    def enter_pass_ctx(self) -> None:
        self.depth, self.outer = 0, steps.now

    def exit_pass_ctx(self) -> None:
        steps.set_step(self.outer)

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self.depth += 1
        if self.depth <= 3 and info.name not in ("sequential", "_pipeline"):
            steps.set_step(info.name)

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self.depth -= 1

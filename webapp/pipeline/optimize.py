"""Optimize stage: the Relax pipeline for the target, run pass by pass, keeping the IR after each pass."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import relax

# Passes whose module we keep for the graph views.
FUSION_PASS = "FuseTIR"
# Ops whose legalization computes the output shape with a shape function of its own (canonical()).
SHAPE_FUNCTION_OPS = ("relax.dynamic_strided_slice",)


@dataclass
class PassRecord:
    index: int
    name: str
    seconds: float
    changed: bool
    file: str | None  # relative to the job folder; None when the IR did not change


@dataclass
class Optimized:
    lowered: tvm.IRModule  # ready for tvm.compile(..., relax_pipeline=None)
    fused: tvm.IRModule  # after operator fusion, before lowering to the VM: the graph after fusion
    passes: list[PassRecord]


def relax_script(mod: tvm.IRModule) -> str:
    """TVMScript of the Relax functions only (the kernels' TIR is shown per kernel)."""
    funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    return tvm.IRModule(funcs).script()


@tvm.instrument.pass_instrument
class CaptureTopLevelPasses:
    """Records the module after each top-level pass.

    FoldConstant builds and runs TIR internally, which reports hundreds of nested passes:
    only passes at depth <= 3 (pipeline > sequential > pass) are the pipeline's own.
    """

    def __init__(self):
        self.depth = 0
        self.started: list[float] = []
        self.snapshots: list[tuple[str, float, tvm.IRModule]] = []

    def run_before_pass(self, mod, info):
        self.depth += 1
        self.started.append(time.perf_counter())

    def run_after_pass(self, mod, info):
        depth, started = self.depth, self.started.pop()
        self.depth -= 1
        if depth <= 3 and info.name not in ("sequential", "_pipeline"):
            # a copy: a later Python pass (dlight's, for GPUs) may change this module in place
            self.snapshots.append((info.name, time.perf_counter() - started, mod.clone()))


def canonical(mod: tvm.IRModule) -> tvm.IRModule:
    """Batch norm after a convolution folded into its weights and a bias, any other batch norm
    decomposed into plain arithmetic (which fuses into the kernel before it): the form both the float
    pipeline and quantization (webapp.pipeline.quantize) start from."""
    if not batch_norm_in_training_mode(mod):  # both passes compute any batch norm as in inference
        mod = relax.transform.FoldBatchnormToConv2D()(mod)
        mod = relax.transform.DecomposeOpsForInference()(mod)
    # FoldConstant tries each op by legalizing it; a dynamic_strided_slice's legalization emits a
    # shape function that FoldConstant (a function pass) never adds to the module, leaving a call to
    # an undefined function. Legalized first, there is nothing of it left for FoldConstant to try.
    mod = relax.transform.LegalizeOps(
        skip_ops=[op for op in tvm.ir.Op.list_op_names() if op not in SHAPE_FUNCTION_OPS]
    )(mod)
    return relax.transform.FoldConstant()(mod)


def batch_norm_in_training_mode(mod: tvm.IRModule) -> bool:
    """Whether a batch norm normalizes by the batch's own statistics (ONNX training_mode=1)."""
    batch_norm, found = tvm.ir.Op.get("relax.nn.batch_norm"), []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(batch_norm) and expr.attrs.training:
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def optimize(mod: tvm.IRModule, target: tvm.target.Target, job_dir: Path, report=lambda f: None) -> Optimized:
    pass_dir = job_dir / "views" / "passes"
    pass_dir.mkdir(parents=True, exist_ok=True)
    capture = CaptureTopLevelPasses()
    with target, tvm.transform.PassContext(opt_level=3, instruments=[capture]):
        lowered = relax.get_default_pipeline(target)(canonical(mod))

    passes, previous, fused = [], relax_script(mod), None
    for i, (name, seconds, snapshot) in enumerate(capture.snapshots):
        report((i + 1) / len(capture.snapshots))
        text = relax_script(snapshot)
        changed = text != previous
        file = None
        if changed:
            file = f"views/passes/{i:02d}_{name}.py"
            (job_dir / file).write_text(text)
        passes.append(PassRecord(i, name, seconds, changed, file))
        previous = text
        if name == FUSION_PASS:
            fused = snapshot
    return Optimized(lowered=lowered, fused=fused if fused is not None else lowered, passes=passes)

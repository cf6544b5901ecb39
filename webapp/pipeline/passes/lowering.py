"""TVM's default TIR lowering, with the kernels' local buffers on the stack.

The default rules keep a register tile's accumulators in a "local" buffer (TVM's own x86 and Arm
schedules do the same). TVM's LowerTVMBuiltin puts on the stack only "global" buffers under 1 KB:
every "local" buffer, whatever its size, is taken from the runtime's workspace pool, by a call to
TVMBackendAllocWorkspace and one to TVMBackendFreeWorkspace at each iteration of the loop that holds
it (each tile of a convolution), and LLVM, which cannot see through the pool's pointer, stores the
accumulators to it and loads them back. On the stack they stay in registers. Measured here (2
threads, each kernel timed warm in turn, min of 7 medians): ResNet-50 int8's 1x1 convolution over 64
channels 0.1435 ms against 0.171, its 7x7 stem 0.377 against 0.394.

Builds name the pipeline registered here (`PIPELINE`) instead of TVM's "default".
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

from webapp.targets import tir_rewrites

PIPELINE = "playground"
STACK_LIMIT_BYTES = 64 * 1024  # a larger local buffer stays in the workspace pool (threads' stacks are 8 MB)


def on_stack(alloc: tirx.AllocBuffer) -> tirx.AllocBuffer:
    buffer = alloc.buffer
    if buffer.scope() != "local" or not all(isinstance(d, tirx.IntImm) for d in buffer.shape):
        return alloc
    size = buffer.dtype.itemsize * math.prod(int(d.value) for d in buffer.shape)  # lanes included
    if size > STACK_LIMIT_BYTES:
        return alloc
    annotations = {**dict(alloc.annotations or {}), "disable_lower_builtin": tirx.IntImm("int32", 1)}
    return tirx.AllocBuffer(buffer, annotations)


@tirx.transform.prim_func_pass(opt_level=0, name="LocalBuffersOnStack")
def local_buffers_on_stack(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    return tvm_ffi.structural_map(func, [(tirx.AllocBuffer, on_stack)])


# Arm's convert to integer rounding toward minus infinity: one instruction for the floor and the
# conversion that requantization ends with (floor(x * multiplier + zero point + 1/2), then int32)
FCVTMS = "llvm.aarch64.neon.fcvtms"
FLOOR = tvm.ir.Op.get("tirx.floor")


def fcvtms(cast: tirx.Cast) -> tvm.ir.Expr:
    """int32(floor(x)) of float32 as one `fcvtms` (4 lanes an instruction), where LLVM makes a
    `frintm` and an `fcvtzs`: the same result in every case (both saturate beyond int32, NaN gives 0),
    one instruction fewer per vector of every int8 layer's requantization. Under QEMU each of the
    three is a call, frintm the dearest: measured here (QEMU 7.2 cortex-a76 on the 2-core EPYC, 8 of
    each in a loop, ns each): frintm 57, fcvtzs 40, fcvtms 41, fmla 38, scvtf 11, sdot 11, smax 0.9."""
    value, dtype = cast.value, cast.ty.dtype
    if not (
        isinstance(value, tvm.ir.Call)
        and value.op.same_as(FLOOR)
        and str(value.ty.dtype).startswith("float32")
        and str(dtype).startswith("int32")
        and (dtype.lanes == 1 or dtype.lanes % 4 == 0)
    ):
        return cast
    x = value.args[0]
    if dtype.lanes == 1:
        return tirx.call_llvm_pure_intrin("int32", f"{FCVTMS}.i32.f32", x)
    # a vector of 8 or 16 in fours (LLVM splits no target intrinsic), the value bound once
    var = tirx.Var("to_floor", str(value.ty.dtype))

    def lanes(vectors, indices):
        return tirx.Shuffle(vectors, [tirx.IntImm("int32", i) for i in indices])

    quarters = [
        tirx.call_llvm_pure_intrin("int32x4", f"{FCVTMS}.v4i32.v4f32", lanes([var], range(i, i + 4)))
        for i in range(0, dtype.lanes, 4)
    ]
    return tirx.Let(var, x, quarters[0] if dtype.lanes == 4 else lanes(quarters, range(dtype.lanes)))


# The rewrites a kind of target names (Target.tir_rewrites), by name
TIR_REWRITES = {"floor_to_int": lambda func: tvm_ffi.structural_map(func, [(tirx.Cast, fcvtms)])}


@tirx.transform.prim_func_pass(opt_level=0, name="TargetRewrites")
def target_rewrites(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    """The TIR rewrites the kernel's target names (webapp.targets.tir_rewrites)."""
    target = func.attrs.get("target") if func.attrs else None
    for name in tir_rewrites(target) if target is not None else ():
        func = TIR_REWRITES[name](func)
    return func


def _pipeline():
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    pipeline, finalize_host, finalize_device = default_s_tir_pipeline()

    def host_passes():
        return tvm.transform.Sequential([local_buffers_on_stack, target_rewrites, finalize_host()])

    return pipeline, host_passes, finalize_device


tvm.tirx.compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline)

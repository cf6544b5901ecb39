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
def local_buffers_on_stack(func, _mod, _ctx):
    return tvm_ffi.structural_map(func, [(tirx.AllocBuffer, on_stack)])


def _pipeline():
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    pipeline, finalize_host, finalize_device = default_s_tir_pipeline()

    def host_passes():
        return tvm.transform.Sequential([local_buffers_on_stack, finalize_host()])

    return pipeline, host_passes, finalize_device


tvm.tirx.compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline)

"""A build's memory, read from its lowered module: its parameters (the constants the VM passes to the
kernels, weights included, each counted once), its activations (the storage blocks TVM's static memory
planning allocates for the tensors between kernels: R.vm.alloc_storage, reused across the run), and the
largest workspace one kernel allocates for its own intermediates (its global-scope buffers, which the
runtime takes from its workspace pool at each call). The library's size is its file's."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def footprint(lowered: tvm.IRModule) -> dict | None:
    """The build's memory; None where reading it failed (a build never fails of it)."""
    try:
        return read_footprint(lowered)
    except Exception as exc:
        print(f"memory footprint left out: {type(exc).__name__}: {exc}")
        return None


def read_footprint(lowered: tvm.IRModule) -> dict:
    constants: dict = {}
    storages: list[int] = []

    def visit(expr) -> None:
        tensor = getattr(expr, "value", None) if isinstance(expr, tvm.ir.expr.Constant) else None
        if tensor is not None and hasattr(tensor, "shape") and hasattr(tensor, "dtype"):
            elements = int(np.prod([int(d) for d in tensor.shape], dtype=np.int64))
            constants[expr] = elements * tvm.runtime.DataType(str(tensor.dtype)).bits // 8
        elif isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.vm.alloc_storage":
            size = expr.args[0]
            if isinstance(size, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm) for v in size.values):
                storages.append(int(np.prod([int(v) for v in size.values], dtype=np.int64)))

    for func in lowered.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    workspace = {name: kernel_workspace(func) for name, func in kernel_items(lowered)}
    largest = max(workspace, key=workspace.__getitem__, default=None)
    return {
        "params_bytes": sum(constants.values()),
        "params": len(constants),
        "activations_bytes": sum(storages),
        "storages": len(storages),
        "workspace_bytes": workspace[largest] if largest else 0,
        "workspace_kernel": largest if largest and workspace[largest] else None,
    }


def kernel_items(lowered: tvm.IRModule) -> list[tuple[str, tvm.tirx.PrimFunc]]:
    return [(gv.name_hint, f) for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def kernel_workspace(func: tvm.tirx.PrimFunc) -> int:
    """Bytes of a kernel's global-scope intermediate buffers with static shapes: those its root block
    allocates, where the schedules put them (read from the TIR, not from its printed text: printing
    every kernel of every build cost seconds a job)."""
    block = getattr(func.body, "block", None)
    total = 0
    for buffer in getattr(block, "alloc_buffers", None) or []:
        static = all(isinstance(d, tvm.tirx.IntImm) for d in buffer.shape)
        if buffer.scope() not in ("global", "") or not static:
            continue
        elements = int(np.prod([int(d) for d in buffer.shape], dtype=np.int64))
        total += elements * tvm.runtime.DataType(str(buffer.dtype)).bits // 8
    return total

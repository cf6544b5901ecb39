"""Each layer's output against ONNX Runtime's: where, layer by layer, a float build's numbers leave the
reference's. TVM's side is the imported module with every binding made an output of main
(`exposed`), built by TVM's own pipeline for this machine's CPU and run on the job's input: each
source layer's output is the last binding the importer made for it (importers.SourceLayers). ONNX
Runtime's side is the model with each node's first output made a graph output. The layers are matched
by name (an ONNX node's) and shape, in the order the model computes them; the first whose SQNR falls
below the tolerance is where the error first grows. The graph viewer colours by it
(reports/graphs.reference_error_graphs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from webapp.pipeline.stages.fidelity import fidelity
from webapp.targets import Target


def onnx_layer_outputs(path: Path, inputs: dict[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
    """Each ONNX node's first output, by ONNX Runtime, by the node's name (a name two nodes share, or
    none, is left out: it names no one layer)."""
    import onnx

    from webapp.pipeline.stages.bench import onnxruntime_runner

    model = onnx.load(str(path))
    names = [n.name for n in model.graph.node]
    outputs = {o.name for o in model.graph.output}
    wanted = {}
    for node in model.graph.node:
        if node.name and names.count(node.name) == 1 and node.output and node.output[0]:
            wanted[node.output[0]] = node.name
            if node.output[0] not in outputs:
                model.graph.output.append(onnx.ValueInfoProto(name=node.output[0]))
    got = onnxruntime_runner(model.SerializeToString(), inputs, threads)()  # in the graph's output order
    return {wanted[o.name]: a for o, a in zip(model.graph.output, got, strict=True) if o.name in wanted}


def tvm_layer_outputs(mod: tvm.IRModule, layer_of: dict[str, str], inputs: dict[str, np.ndarray]) -> dict:
    """Each source layer's output as TVM's operators compute it (the last binding of the layer in the
    imported main), in the order main computes them."""
    from webapp.targets import host

    by_layer: dict[str, np.ndarray] = {}
    for key, value in binding_values(mod, inputs, host())[0].items():
        layer = layer_of.get(key.split("#")[0])
        if layer is not None:
            by_layer.pop(layer, None)  # the last binding of the layer, at the place of its last
            by_layer[layer] = value
    return by_layer


def layer_errors(
    mod: tvm.IRModule,
    layer_of: dict[str, str],
    onnx_path: Path,
    inputs: dict,
    threads: int,
    tolerance_db: float,
) -> dict:
    """The layers both compute (by name and shape), each with its fidelity against ONNX Runtime's, and
    the first below the tolerance (`first_off`: its name, SQNR and cosine; None where none is) and the
    lowest, as result.json keeps them."""
    ours = tvm_layer_outputs(mod, layer_of, inputs)
    theirs = onnx_layer_outputs(onnx_path, inputs, threads)
    rows = []
    for layer, value in ours.items():
        ref = theirs.get(layer)
        if ref is None or ref.shape != value.shape:
            continue
        f = fidelity([value], [ref], classifier=False)
        sqnr = f.get("sqnr_db")
        off = sqnr < tolerance_db if sqnr is not None else f.get("max_abs_err", 0) > 0
        shown = {k: f.get(k) for k in ("sqnr_db", "cosine", "max_abs_err")}
        rows.append({"layer": layer, "off": bool(off), **shown})
    first = next((r for r in rows if r["off"]), None)
    lowest = min((r for r in rows if r["sqnr_db"] is not None), key=lambda r: r["sqnr_db"], default=None)
    return {
        "reference": "onnxruntime",
        "tolerance_db": tolerance_db,
        "layers": rows,
        "compared": len(rows),
        "of": len(ours),
        "first_off": first and {k: first[k] for k in ("layer", "sqnr_db", "cosine")},
        "lowest": lowest and {"layer": lowest["layer"], "sqnr_db": lowest["sqnr_db"]},
    }


def run_module(mod: tvm.IRModule, inputs: dict[str, np.ndarray], host: Target) -> list[np.ndarray]:
    """The module built by TVM's default pipeline for this machine's CPU and run once on `inputs`."""
    from webapp.pipeline.stages.bench import flatten_outputs

    executable = tvm.compile(mod, target=host.tvm)
    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    return flatten_outputs(vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs.values()]))


def binding_values(
    mod: tvm.IRModule, inputs: dict[str, np.ndarray], host: Target
) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, str | None]]]:
    """Each tensor binding's value in main, run on `inputs` (`exposed`, built by run_module), by key in the
    order main computes them, and the keys' (places, kernels) as `exposed` gives them."""
    shown, keys = exposed(mod)
    outs = run_module(shown, inputs, host)
    return dict(zip(keys, outs[len(outs) - len(keys) :], strict=True)), keys


def exposed(mod: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, tuple[int, str | None]]]:
    """The module with its main returning (its outputs, *each tensor its bindings make), and those
    bindings' keys -> (their places among main's bindings, the kernel each calls). A key is the
    binding's name, with "#k" after it for the k-th repeat of a name (TVM's fused main has two "lv")."""
    flat = relax.transform.ToNonDataflow()(tvm.IRModule({"main": mod["main"]}))["main"]
    bb, keys, values, seen = relax.BlockBuilder(), {}, [], dict[str, int]()
    with bb.function("main", list(flat.params), attrs=dict(flat.attrs or {})):
        bindings = [binding for block in flat.body.blocks for binding in block.bindings]
        for place, binding in enumerate(bindings):
            bb.emit_normalized(binding)
            name = binding.var.name
            seen[name] = seen.get(name, -1) + 1
            if isinstance(binding.var.ty, relax.TensorType):
                keys[f"{name}#{seen[name]}" if seen[name] else name] = (place, kernel_called(binding.value))
                values.append(binding.var)
        bb.emit_func_output(relax.Tuple([flat.body.body, *values]))
    out = mod.clone()
    out.update_func(out.get_global_var("main"), bb.get()["main"])
    return out, keys


def kernel_called(value: relax.Expr) -> str | None:
    """The kernel a binding's value calls (R.call_tir's function), if it calls one."""
    if isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return str(value.args[0].name_hint)
    return None

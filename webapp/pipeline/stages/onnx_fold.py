"""An ONNX graph's shape arithmetic folded before TVM imports it, once its input shapes (and any input
values the user gave) are fixed. Exporters such as Paddle2ONNX, TF2ONNX and the TorchScript exporter
compute a Reshape's target from Shape, Gather, Concat... at run time; TVM 0.27's importer refuses many
such graphs ("Reshape requires the input new shape to be Shape") or imports shape values that fail
later. With the shapes known, onnxslim (a maintained ONNX simplifier) computes all of it into
constants, and folds an If whose condition became a constant (Silero VAD's branch on its sample
rate) into the branch taken. Only its constant folding and dead-node removal run: the layers keep
their nodes and names. The weights (initializers of WEIGHT_BYTES or more) are shown to it as inputs of
their shape: it folds the shape arithmetic around them without copying them (it copies every constant
it holds several times: a 2 GB model's fold peaked at 13.7 GB, and took a minute) and without computing
on them, which TVM's own constant folding does."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.unpack import WEIGHT_BYTES, tensor_bytes
from webapp.pipeline.steps import step

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnx

    from webapp.pipeline.stages.prequantized import PreQuantized

# What makes a graph worth folding: shape arithmetic and branches
FOLD_OPS = {"Shape", "Size", "If"}
# onnxslim's other optimizations fuse and merge nodes (MatMul + Add into Gemm...): not ours to do
SKIPPED = ["graph_fusion", "subexpression_elimination", "weight_tying"]
GIVEN_SUFFIX = ".given"


def with_values(model: onnx.ModelProto, given: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The model with each given input read from a constant by every node; the input stays in the
    graph's inputs, unread, so every runtime is called with the same inputs."""
    from onnx import numpy_helper

    for name, value in given.items():
        constant = name + GIVEN_SUFFIX
        model.graph.initializer.append(numpy_helper.from_array(value, constant))
        for node in all_nodes(model.graph):  # a branch's nodes read the graph's inputs too
            for i, read in enumerate(node.input):
                if read == name:
                    node.input[i] = constant
        for out in model.graph.output:
            if out.name == name:  # an input passed straight out: an Identity of its constant
                raise StageError(
                    f"Input {name!r} is also an output of the model: it cannot be given a value."
                )
    return model


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The graph's nodes and those of its branches and loop bodies, at any depth."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from all_nodes(sub)


def fold_onnx(
    model: onnx.ModelProto,
    shapes: dict[str, list[int]],
    given: dict[str, np.ndarray],
    pre: PreQuantized | None = None,
) -> tuple[onnx.ModelProto, dict]:
    """(the folded model, what folding did, for the page), or the model as it was and why not. A
    pre-quantized model (`pre`, prequantized.PreQuantized) is folded once its quantization was read
    (its weights are then float constants, its quantized tensors clips): its layers' inputs follow."""
    import onnxslim

    started = time.perf_counter()
    before = Counter(n.op_type for n in model.graph.node)
    inputs = list(model.graph.input)
    model = with_values(model, given)
    weights = hide_weights(model)
    try:
        with step("onnxslim: the ONNX graph's shape arithmetic folded"):
            folded = onnxslim.slim(
                model,
                input_shapes=[  # a scalar has nothing to fix, a given input is no longer read
                    f"{name}:{','.join(map(str, shape))}"
                    for name, shape in shapes.items()
                    if shape and name not in given
                ],
                skip_optimizations=SKIPPED,
            )
    except Exception as e:  # noqa: BLE001 - the model is imported as it was
        message = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
        return restored(model, weights, inputs), {
            "tool": "onnxslim",
            "error": message,
            "seconds": time.perf_counter() - started,
        }
    folded = restored(folded, weights, inputs)
    after = Counter(n.op_type for n in folded.graph.node)
    if pre is not None:
        pre.inputs = {n.name: list(n.input) for n in folded.graph.node}
    return folded, {
        "tool": f"onnxslim {onnxslim.__version__}",
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "removed": {op: n - after.get(op, 0) for op, n in sorted(before.items()) if n > after.get(op, 0)},
        "added": {op: n - before.get(op, 0) for op, n in sorted(after.items()) if n > before.get(op, 0)},
        "given": sorted(given),
        "seconds": round(time.perf_counter() - started, 3),
    }


def hide_weights(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The model's weights (initializers of WEIGHT_BYTES or more) taken out of it, each declared an input
    of its shape in their place (restored() puts them back)."""
    from onnx import helper

    weights = [t for t in model.graph.initializer if tensor_bytes(t) >= WEIGHT_BYTES]
    if not weights:
        return []
    names = {t.name for t in weights}
    rest = [t for t in model.graph.initializer if t.name not in names]
    del model.graph.initializer[:]  # the weights' messages live on in `weights`, not copied
    model.graph.initializer.extend(rest)
    declared = {i.name for i in model.graph.input}  # old exporters list the weights as inputs too
    hidden = [t for t in weights if t.name not in declared]
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in hidden)
    return weights


def restored(
    model: onnx.ModelProto, weights: list[onnx.TensorProto], inputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    """The model with its hidden weights back as initializers and its inputs those it had (`inputs`: an
    input onnxslim dropped as unread, a given one, stays an input)."""
    names = {t.name for t in weights} - {i.name for i in inputs}
    kept = [i for i in model.graph.input if i.name not in names]
    present = {i.name for i in kept}
    kept += [spec for spec in inputs if spec.name not in present]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(weights)  # a copy of each (protobuf's way), then these go
    return model


def fold_text(folded: dict) -> str:
    """The passes view's page of the fold: what it removed and added, op by op."""
    if "error" in folded:
        return f"# {folded['tool']} could not fold this model: {folded['error']}\n"
    given = f" and the given inputs {', '.join(folded['given'])}" if folded["given"] else ""
    lines = [
        f"# The ONNX graph before TVM's import: its shape arithmetic folded by {folded['tool']}",
        f"# with the input shapes fixed{given}",
        f"# {folded['nodes_before']} nodes -> {folded['nodes_after']} nodes in {folded['seconds']:.2f} s",
        "",
        "removed:",
        *[f"  {op}: {n}" for op, n in folded["removed"].items()],
    ]
    if folded["added"]:
        lines += ["added (a branch's nodes, taken in place of its If):"]
        lines += [f"  {op}: {n}" for op, n in folded["added"].items()]
    return "\n".join(lines) + "\n"


def branch_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs the condition of an If still depends on (after folding): the values a user
    can give so that the branch folds."""
    producer = {out: node for node in model.graph.node for out in node.output}
    inputs = {i.name for i in model.graph.input}
    found: list[str] = []
    for node in model.graph.node:
        if node.op_type != "If":
            continue
        todo, seen = [node.input[0]], set()
        while todo:  # iteratively: a condition may sit behind a long chain
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in inputs and name not in found:
                found.append(name)
            todo += [i for i in producer[name].input if i] if name in producer else []
    return found

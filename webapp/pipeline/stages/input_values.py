"""Values a model's integer inputs can take, read from how the model uses them: token ids and
indices below the size of the table they index, Slice starts at 0 and ends at the dimension's size.
Random integers elsewhere (0 to 9) made a built model fail at its first run (a Slice whose end came
before its start, an id past the embedding's rows), and with it the benchmark. And the values a user
gives an input (input_values), checked against its declared type and shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.unpack import WEIGHT_BYTES, tensor_bytes

if TYPE_CHECKING:
    import onnx
    from torch.export import ExportedProgram

# Ops that pass an integer tensor's values on unchanged (followed from an input to where it is used)
ONNX_SAME_VALUES = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"}
TORCH_SAME_VALUES = {
    "_to_copy",
    "to",
    "view",
    "reshape",
    "unsqueeze",
    "squeeze",
    "expand",
    "clone",
    "contiguous",
}


@dataclass
class Values:
    """What an integer input holds: random in [0, high), or the values `fill` (one per element of
    its last axis); `why` says which use of the input decided it."""

    high: int | None = None
    fill: list[int] | None = None
    why: str = ""
    given: list | float | int | None = None  # the whole value, as the user gave it (input_values)

    def narrower(self, other: Values) -> Values:
        if self.fill is not None or self.given is not None:
            return self
        if other.fill is not None or (
            other.high is not None and (self.high is None or other.high < self.high)
        ):
            return other
        return self


def onnx_input_values(model: onnx.ModelProto, inputs: list[str]) -> dict[str, Values]:
    """Integer graph input name -> its Values, for the inputs whose use says (after ONNX shape
    inference, which gives the shapes of the tensors they index)."""
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a model shape inference fails on: the declared shapes only
        pass
    graph = model.graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    constants = {  # an index's axes: never a weight, which may not even be read yet
        t.name: numpy_helper.to_array(t) for t in graph.initializer if tensor_bytes(t) < WEIGHT_BYTES
    }
    for v in [*graph.value_info, *graph.input, *graph.output]:
        dims = v.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes.setdefault(v.name, [d.dim_value for d in dims])
    users: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node, i))

    def values_of(name: str, seen: int = 0) -> Values:
        found = Values()
        for node, i in users.get(name, []):
            if node.op_type in ONNX_SAME_VALUES and i == 0 and seen < 8:
                found = found.narrower(values_of(node.output[0], seen + 1))
            elif node.op_type in ("Gather", "GatherElements") and i == 1:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                data = shapes.get(node.input[0])
                if data:
                    found = found.narrower(
                        Values(high=data[axis], why=f"indexes {node.name or node.output[0]}")
                    )
            elif node.op_type == "Slice" and i in (1, 2, 4):
                data = shapes.get(node.input[0])
                axes: np.ndarray | list[int] | None = (
                    constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
                )
                if data is None:
                    continue
                axes = list(range(len(data))) if axes is None else [int(a) % len(data) for a in axes]
                fill = {1: [0] * len(axes), 2: [data[a] for a in axes], 4: [1] * len(axes)}[i]
                what = {1: "starts", 2: "ends", 4: "steps"}[i]
                found = found.narrower(Values(fill=fill, why=f"the {what} of {node.name or node.output[0]}"))
        return found

    return {name: v for name in inputs if (v := values_of(name)).high is not None or v.fill is not None}


def torch_input_values(ep: ExportedProgram, inputs: list[str]) -> dict[str, Values]:
    """The same for a torch.export program: ids into an embedding or index_select."""
    nodes = {n.name: n for n in ep.graph.nodes}

    def shape(node) -> list[int] | None:
        val: Any = getattr(node, "meta", {}).get("val")  # a fake tensor, or None (then the except below)
        try:
            return [int(d) for d in val.shape]
        except Exception:
            return None

    def values_of(node, seen: int = 0) -> Values:
        found = Values()
        for user in node.users:
            name = getattr(user.target, "__name__", str(user.target)).split(".")[0]
            args = list(user.args)
            if name in TORCH_SAME_VALUES and args and args[0] is node and seen < 8:
                found = found.narrower(values_of(user, seen + 1))
            elif name == "embedding" and len(args) > 1 and args[1] is node:
                table = shape(args[0])
                if table:
                    found = found.narrower(Values(high=table[0], why=f"indexes the embedding {args[0].name}"))
            elif name == "index_select" and len(args) > 2 and args[2] is node:
                table = shape(args[0])
                if table:
                    found = found.narrower(Values(high=table[int(args[1])], why=f"indexes {args[0].name}"))
        return found

    return {
        name: v for name in inputs if (v := values_of(nodes[name])).high is not None or v.fill is not None
    }


def given_values(inputs: list, input_values: dict) -> dict[str, np.ndarray]:
    """The inputs the user gave a value (a sample rate, a sequence length), as arrays of the input's
    dtype, checked against the shape the model declares (`inputs`: importers.TensorSpec)."""
    specs = {s.name: s for s in inputs}
    out = {}
    for name, value in input_values.items():
        spec = specs[name]
        try:
            array = np.asarray(value, dtype=spec.dtype)
        except (ValueError, TypeError, OverflowError) as e:
            raise StageError(f"input_values gives {name!r} a value not of its type {spec.dtype}: {e}") from e
        if array.ndim != len(spec.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(spec.shape, array.shape, strict=False)
        ):
            raise StageError(
                f"input_values gives {name!r} the shape {list(array.shape)}, but the model declares "
                f"{spec.shape}."
            )
        out[name] = array
    return out

"""Import stage: an ONNX or torch.export (.pt2) file into a Relax IRModule."""

from __future__ import annotations

import ast
import json
import math
import pickle
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm import relax

from webapp.catalog import code_file
from webapp.options import MAX_INPUT_ELEMENTS, MAX_RANK, over_shape_limits
from webapp.pipeline.errors import StageError, error_message
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.stages import unpack
from webapp.pipeline.stages.input_values import Values, given_values, onnx_input_values, torch_input_values
from webapp.pipeline.stages.lm_inputs import DEFAULT_STEP, default_shapes
from webapp.pipeline.stages.onnx_fold import FOLD_OPS, branch_inputs, fold_onnx
from webapp.pipeline.stages.onnx_ops import check_onnx_ops_supported, more_operators
from webapp.pipeline.stages.prequantized import dequantized, is_prequantized
from webapp.pipeline.stages.pt2 import concat, load_pt2, pt2_signature, user_inputs
from webapp.pipeline.steps import step
from webapp.targets import target_json

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnx
    from torch.export import ExportedProgram

    from webapp.pipeline.stages.prequantized import PreQuantized


@dataclass
class TensorSpec:
    name: str
    shape: list  # ints; a string for a dimension with no fixed size
    dtype: str
    values: Values | None = None  # an integer input's values, where the model's use of it says

    def to_json(self) -> dict:
        out = {"name": self.name, "shape": self.shape, "dtype": self.dtype}
        return out | ({"values": vars(self.values)} if self.values else {})


PREQUANTIZED_SHOWN = ("form", "layers", "in_float", "requantized", "dynamic")  # in the result JSON


@dataclass
class ImportedModel:
    mod: tvm.IRModule
    framework: str  # "onnx" or "pytorch"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    param_count: int
    framework_ops: dict[str, int] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)  # Relax var name -> the source layer it came from
    modules: dict[str, str] = field(default_factory=dict)  # source layer -> its module path, where known
    # a model quantized by another tool: its form, its scales by Relax var name, what runs in float
    prequantized: dict | None = None
    warnings: list[str] = field(default_factory=list)  # what a checker found that did not stop it
    folded: dict | None = None  # the ONNX graph's shape arithmetic folded before import (fold_onnx)

    def to_json(self) -> dict:
        pre = self.prequantized
        return {
            "framework": self.framework,
            "warnings": self.warnings,
            "folded": self.folded,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "param_count": self.param_count,
            "framework_ops": self.framework_ops,
        } | ({"prequantized": {k: pre[k] for k in PREQUANTIZED_SHOWN if k in pre}} if pre else {})


def import_model(
    path: Path, input_shapes: dict[str, list[int]] | None = None, input_values: dict | None = None
) -> ImportedModel:
    if path.stat().st_size == 0:
        raise StageError("The model file is empty.")
    if path.suffix == ".pt2":
        if input_values:
            raise StageError(
                "Input values are taken for ONNX models; a .pt2 file's inputs are all tensors it is run on."
            )
        return import_pt2(path, input_shapes or {})
    return import_onnx(path, input_shapes or {}, input_values or {})


def fixed_shapes(inputs: list[TensorSpec], input_shapes: dict[str, list[int]]) -> dict[str, list[int]]:
    """Every input's concrete shape (fixed_shape). The inputs with a dynamic dimension and no size
    given fail together: one message, and the shapes to resubmit with (1 for each dynamic dimension)."""
    missing = {
        s.name: [d if isinstance(d, int) else 1 for d in s.shape]
        for s in inputs
        if s.name not in input_shapes and any(not isinstance(d, int) for d in s.shape)
    }
    if missing:
        names = ", ".join(repr(n) for n in missing)
        shapes = ", ".join(str(s.shape) for s in inputs if s.name in missing)
        many = len(missing) > 1
        raise StageError(
            f"Input{'s' if many else ''} {names} ha{'ve' if many else 's'} a dynamic dimension "
            f"(shape{'s' if many else ''} {shapes}). Give {'their sizes' if many else 'its size'} with "
            f"input_shapes, for example {json.dumps(missing)}.",
            resubmit={"input_shapes": {**input_shapes, **missing}},
        )
    return {s.name: fixed_shape(s, input_shapes) for s in inputs}


def fixed_shape(spec: TensorSpec, input_shapes: dict[str, list[int]]) -> list[int]:
    """The concrete shape of one graph input, from the model or from the user's input_shapes (a
    dynamic dimension without one is fixed_shapes' to refuse)."""
    given = input_shapes.get(spec.name)
    if given is not None:
        if len(given) != len(spec.shape) or any(
            isinstance(d, int) and d != g for d, g in zip(spec.shape, given, strict=False)
        ):
            raise StageError(
                f"input_shapes gives {spec.name!r} the shape {list(given)}, but the model declares "
                f"{spec.shape}."
            )
        return [int(g) for g in given]
    if over_shape_limits(spec.shape):
        elements = math.prod(spec.shape)
        raise StageError(
            f"Input {spec.name!r} has the shape {spec.shape} ({elements:,} elements); this server takes at "
            f"most {MAX_RANK} dimensions and {MAX_INPUT_ELEMENTS:,} elements an input."
        )
    return list(spec.shape)


def check_input_names(inputs: list[TensorSpec], input_shapes: dict) -> None:
    unknown = sorted(set(input_shapes) - {i.name for i in inputs})
    if unknown:
        raise StageError(
            f"input_shapes names {unknown}, which the model does not have; its inputs are "
            f"{[i.name for i in inputs]}."
        )


# ---------------------------------------------------------------- ONNX


def onnx_value_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    """A graph input's or output's spec; a sequence, map or optional value has no shape, and its kind
    ("sequence", ...) for dtype."""
    import onnx

    kind = value.type.WhichOneof("value") or "value"
    if kind != "tensor_type":
        return TensorSpec(value.name, [], kind.removesuffix("_type"))
    tensor_type = value.type.tensor_type
    shape = [
        d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
        for d in tensor_type.shape.dim
    ]
    return TensorSpec(
        value.name, shape, str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    )


def import_onnx(path: Path, input_shapes: dict, input_values: dict) -> ImportedModel:
    model, warnings = load_onnx(path)
    inputs, given = onnx_inputs(model, default_shapes(model, input_shapes), input_values)
    outputs = [onnx_value_spec(v) for v in model.graph.output]
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    pre = None
    if is_prequantized(set(ops)):  # quantized by another tool: a float model and its scales
        unpack.load_weights(model, path)
        model, pre = dequantized(model)
    for node in model.graph.node:  # an unnamed node is its output tensor, as viewers show it
        node.name = node.name or node.output[0]
    shapes = {s.name: s.shape for s in inputs}
    folded = None
    if given or FOLD_OPS & set(ops):
        model, folded = fold_onnx(model, shapes, given, pre)
    with unpack.weights_read_in_place(path):  # not before: a 2 GB model's checks and fold ran without
        model, folded, (mod, layers) = to_relax(model, inputs, pre, shapes, given, folded, warnings)
    layer_of = layers.of_vars(mod)
    param_count = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    imported = ImportedModel(mod, "onnx", inputs, relax_outputs(mod, outputs), param_count, ops, layer_of)
    imported.warnings = warnings
    imported.folded = folded
    imported.modules = onnx_modules(model)
    if pre is not None:
        imported.prequantized = prequantized_by_var(pre, layers.tensors(), layer_of)
    return imported


def load_onnx(path: Path) -> tuple[onnx.ModelProto, list[str]]:
    """The uploaded ONNX model, its weights left in their external data files where it keeps them there
    (load_weights reads them), and the checker's warning where it finds it not valid."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        raise StageError(
            f"This is not a readable ONNX model (the file may be truncated or corrupt): {e}"
        ) from e
    if not model.graph.node:
        raise StageError("The ONNX file holds no graph (no nodes): it may be truncated or not an ONNX model.")
    external = unpack.external_data(model, path)  # its files came with it (a .zip upload), or it fails
    unpack.load_weights(model, path, below=unpack.WEIGHT_BYTES)  # shapes and indices; weights once folded
    warnings = []
    try:
        onnx.checker.check_model(str(path) if external else model)  # over 2 GB, only by its path
    except onnx.checker.ValidationError as e:  # ONNX Runtime and TVM run many such files: a warning
        first_line = str(e).strip().splitlines()[0]
        warnings.append(f"ONNX's checker finds the model not valid: {first_line}")
    return model, warnings


def onnx_inputs(
    model: onnx.ModelProto, input_shapes: dict, input_values: dict
) -> tuple[list[TensorSpec], dict[str, np.ndarray]]:
    """The model's inputs (not its weights), their shapes fixed and their values where given or the model
    bounds them (an index's table); the values given for inputs the model is built with."""
    # Many exporters list the weights as graph inputs too: the real inputs are the rest.
    initializers = {t.name for t in model.graph.initializer}
    inputs = [onnx_value_spec(v) for v in model.graph.input if v.name not in initializers]
    for v in model.graph.input:
        if v.name not in initializers and v.type.WhichOneof("value") != "tensor_type":
            kind = (v.type.WhichOneof("value") or "value").removesuffix("_type")
            raise StageError(f"Input {v.name!r} is a {kind}, not a tensor: only tensor inputs are supported.")
    check_input_names(inputs, input_shapes | input_values)
    given = given_values(inputs, input_values)
    fixed = fixed_shapes(inputs, input_shapes | {n: list(v.shape) for n, v in given.items()})
    for spec in inputs:
        spec.shape = fixed[spec.name]
    integer = [s.name for s in inputs if s.dtype.startswith(("int", "uint"))]
    used = onnx_input_values(model, integer) if integer else {}  # one shape inference for all of them
    for spec in inputs:
        spec.values = used.get(spec.name)
        if spec.name in given:
            spec.values = Values(given=given[spec.name].tolist(), why="the model is built with this value")
    return inputs, given


def to_relax(
    model: onnx.ModelProto,
    inputs: list[TensorSpec],
    pre: PreQuantized | None,
    shapes: dict,
    given: dict[str, np.ndarray],
    folded: dict | None,
    warnings: list[str],
) -> tuple[onnx.ModelProto, dict | None, tuple[tvm.IRModule, SourceLayers]]:
    """The ONNX model into Relax: (model, its folding, (module, layers)); on a failure, once more with its
    shape arithmetic folded; the failure said with what the user can do (give a branch's input)."""
    try:
        return model, folded, onnx_to_relax(model, inputs, pre)
    except Exception as e:
        retried = None
        if folded is None:  # shape arithmetic the importer cannot take, folded
            model, folded = fold_onnx(model, shapes, given, pre)
            try:
                retried = onnx_to_relax(model, inputs, pre) if "error" not in folded else None
            except Exception:  # noqa: BLE001 - the first failure says more
                pass
        if retried is None:
            if isinstance(e, StageError):
                raise
            detail = f"; {warnings[0]}" if warnings else ""
            branching = [n for n in branch_inputs(model) if n not in given]
            if branching:
                example = "{" + ", ".join(f'"{n}": <its value>' for n in branching) + "}"
                detail += (
                    f". The model branches (ONNX If) on the input{'s' if len(branching) > 1 else ''} "
                    f"{', '.join(map(repr, branching))}: give its value with input_values, e.g. {example}, "
                    "and the branch taken is folded before import"
                )
            raise StageError(f"TVM could not import the model ({error_message(e)}){detail}") from e
        return model, folded, retried


def onnx_to_relax(
    model: onnx.ModelProto, inputs: list[TensorSpec], pre: PreQuantized | None
) -> tuple[tvm.IRModule, SourceLayers]:
    """(the Relax module, its SourceLayers) of an ONNX model whose inputs have the given specs."""
    from tvm.relax.frontend.onnx import from_onnx

    ops = {node.op_type for node in model.graph.node}
    check_onnx_ops_supported(sorted(ops))
    # A branch (If, Loop, Scan) is converted into the same block builder: nothing is emitted early there.
    layers = SourceLayers(emit=not {"If", "Loop", "Scan"} & ops, clip_op=pre is not None)
    with step("TVM's ONNX importer"), layers.onnx(), more_operators():
        mod = from_onnx(
            model,
            shape_dict={s.name: s.shape for s in inputs},
            dtype_dict={s.name: s.dtype for s in inputs},
            keep_params_in_input=False,
        )
    return mod, layers


def onnx_modules(model: onnx.ModelProto) -> dict[str, str]:
    """ONNX node name -> the PyTorch module path it was exported from ("encoder.layer.0.attention"):
    the dynamo exporter's name scopes (node metadata), else the TorchScript exporter's node name
    ("/encoder/layer.0/attention/MatMul"). Nodes of other exporters have none."""
    out = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        path = scope_path(meta.get("pkg.torch.onnx.name_scopes"))
        if not path and node.name.startswith("/"):
            path = ".".join(p for p in node.name.split("/")[:-1] if p)
        if path:
            out[node.name] = path
    return out


def scope_path(scopes: str | None) -> str:
    """The module path in the dynamo exporter's name scopes of a node, "['', 'm', 'm.encoder',
    'm.encoder.layer.0', 'scaled_dot_product_attention']" -> "m.encoder.layer.0": the chain of
    nested modules (each scope its parent's path and one more name), the node's own name last."""
    try:
        names = ast.literal_eval(scopes) if scopes and len(scopes) < 20_000 else []
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    path = ""
    for name in names[:-1] if isinstance(names, list) else []:
        if not isinstance(name, str) or not name:
            continue
        if path and not name.startswith(path + "."):
            break
        path = name
    return path


def prequantized_by_var(pre: PreQuantized, tensors: dict[str, str], layer_of: dict[str, str]) -> dict:
    """A PreQuantized's scales by Relax var name: each quantized tensor's var, and for the weights
    every var of the layer (a convolution, a matmul) whose weight input has scales."""
    weights = {}
    for var, layer in layer_of.items():
        scales = next((pre.weights[t] for t in pre.inputs.get(layer, []) if t in pre.weights), None)
        if scales is not None:
            weights[var] = scales.tolist()
    acts = {tensors[t]: p for t, p in pre.acts.items() if t in tensors}
    layers = len({layer_of[v] for v in weights})
    out = {"form": pre.form, "acts": acts, "weights": weights, "layers": layers, "in_float": pre.in_float}
    counts = {"requantized": pre.requantized, "dynamic": pre.dynamic}
    return out | {k: n for k, n in counts.items() if n}


class SourceLayers:
    """Which source layer (an ONNX node's name, a PyTorch module's path) each binding of the imported
    Relax function came from. The importer converts one layer at a time, so the bindings after one
    layer's output and up to the next one's are that next layer's: an ONNX layer's output is emitted
    as soon as it is converted to mark that place (unless `emit` is False: a model with branches is
    converted into the same block builder). The vars keep the importer's names ("lv12"): the names
    of the kernels' blocks, which tuning records name, come from them."""

    def __init__(self, emit: bool = True, clip_op: bool = False):
        self.emit, self.clip_op = emit, clip_op
        self.outputs: dict[str, str] = {}  # the var holding a layer's output -> the layer
        self.modules: dict[str, str] = {}  # a PyTorch layer -> its module path
        self.importer = None  # TVM's ONNX importer, once it converts a node (its tensor -> expr map)

    def mark(self, bb: relax.BlockBuilder, expr: relax.Expr, layer: str) -> relax.Expr:
        if self.emit and isinstance(expr, relax.Call) and isinstance(expr.ty, relax.TensorType):
            expr = bb.emit(expr)
        for field_ in expr.fields if isinstance(expr, relax.Tuple) else [expr]:
            if isinstance(field_, relax.Var):
                self.outputs.setdefault(field_.name, layer)
        return expr

    @contextmanager
    def onnx(self) -> Iterator[None]:
        from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

        convert = ONNXGraphImporter._convert_operator

        def converted(importer, op_name, inputs, attrs, opset):
            self.importer = importer
            if (
                op_name == "Clip"
                and self.clip_op
                and all(isinstance(b, tvm.ir.Constant) for b in inputs[1:3])
            ):
                # relax.clip, not TVM's two TE kernels: one op, which the quantizer takes as a layer's
                # activation (a pre-quantized model's clip to its 8-bit range)
                lo, hi = (float(b.value.numpy()) for b in inputs[1:3])
                sym = importer.bb.normalize(relax.op.clip(inputs[0], lo, hi))
            else:
                sym = convert(importer, op_name, inputs, attrs, opset)
            return self.mark(importer.bb, sym, attrs.get("tvm_custom", {}).get("name") or op_name)

        ONNXGraphImporter._convert_operator = converted
        try:
            yield
        finally:
            ONNXGraphImporter._convert_operator = convert

    @contextmanager
    def pytorch(self) -> Iterator[None]:
        from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

        create = ExportedProgramImporter.create_convert_map

        def layer(node) -> str:
            stack = list((node.meta.get("nn_module_stack") or {}).values())
            path = stack[-1][0] if stack else ""
            if not path:
                return node.name
            self.modules[f"{path} ({node.name})"] = path
            return f"{path} ({node.name})"

        def created(importer):
            def wrap(convert):
                return lambda node, *rest: self.mark(
                    importer.block_builder, convert(node, *rest), layer(node)
                )

            converters = create(importer) | {"cat.default": concat(importer)}
            return {key: wrap(convert) for key, convert in converters.items()}

        ExportedProgramImporter.create_convert_map = created
        try:
            yield
        finally:
            ExportedProgramImporter.create_convert_map = create

    def tensors(self) -> dict[str, str]:
        """ONNX tensor name -> the name of the Relax var holding it (after an ONNX import)."""
        nodes = getattr(self.importer, "_nodes", {})
        return {name: expr.name for name, expr in nodes.items() if isinstance(expr, relax.Var)}

    def of_vars(self, mod: tvm.IRModule) -> dict[str, str]:
        """{var name of main: its layer}."""
        body, out, pending = mod["main"].body, {}, []
        for block in body.blocks if isinstance(body, relax.SeqExpr) else []:
            for binding in block.bindings:
                pending.append(binding.var.name)
                layer = self.outputs.get(binding.var.name)
                if layer is not None:
                    out.update(dict.fromkeys(pending, layer))
                    pending = []
        return out


# ---------------------------------------------------------------- PyTorch .pt2


def import_pt2(path: Path, input_shapes: dict) -> ImportedModel:
    import torch

    if not zipfile.is_zipfile(path):
        raise StageError("This .pt2 file is not a zip archive: it is not a torch.export.save() file.")
    try:
        ep = load_pt2(path)
    except pickle.UnpicklingError as e:
        lines = str(e).strip().splitlines() or [""]
        detail = next((line for line in lines if "Unsupported" in line), lines[0]).strip()
        raise StageError(
            "This .pt2 file holds pickled Python objects other than tensors; unpickling them would run "
            "code from the file, so it was refused. Export the model with plain tensor weights "
            f"(torch.export.save). ({detail[:300]})"
        ) from e
    except Exception as e:  # torch raises many kinds here; all mean "not a readable ExportedProgram"
        raise StageError(
            "This file is not a torch.export ExportedProgram (write one with torch.export.save): "
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        ) from e

    inputs = pt2_inputs(ep)
    check_input_names(inputs, input_shapes)
    sig = pt2_signature(ep)  # a generating model: one decode step where no lengths are given
    fixed = fixed_shapes(inputs, (sig.shapes(**DEFAULT_STEP) if sig else {}) | input_shapes)

    from tvm.relax.frontend.torch import from_exported_program

    layers = SourceLayers(emit=False)  # the converters emit their results themselves
    with layers.pytorch():
        mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
    mod = bind_symbolic_dims(mod, fixed)
    layer_of = layers.of_vars(mod)
    integer = [s.name for s in inputs if s.dtype.startswith(("int", "uint"))]
    values = torch_input_values(ep, integer) if integer else {}
    for spec in inputs:
        spec.shape, spec.values = fixed[spec.name], values.get(spec.name)
    param_count = sum(int(t.numel()) for t in ep.state_dict.values()) + sum(
        int(t.numel()) for t in ep.constants.values() if isinstance(t, torch.Tensor)
    )
    ops: dict[str, int] = {}
    for node in ep.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            ops[name] = ops.get(name, 0) + 1
    imported = ImportedModel(mod, "pytorch", inputs, relax_outputs(mod, []), param_count, ops, layer_of)
    imported.modules = layers.modules
    return imported


def pt2_inputs(ep: ExportedProgram) -> list[TensorSpec]:
    return [TensorSpec(name, shape, dtype) for name, dtype, shape in user_inputs(ep)]


def bind_symbolic_dims(mod: tvm.IRModule, shapes: dict[str, list[int]]) -> tvm.IRModule:
    """Replace the symbolic dimensions of main's inputs with the sizes the user gave."""
    bindings = {}
    for param in mod["main"].params:
        if param.name not in shapes or not isinstance(param.ty, relax.TensorType):
            continue
        for dim, size in zip(param.ty.shape.values, shapes[param.name], strict=False):
            if isinstance(dim, tvm.tirx.Var):
                bindings[dim.name] = size
    return relax.transform.BindSymbolicVars(bindings)(mod) if bindings else mod


# ---------------------------------------------------------------- shared


def type_spec(name: str, ty: tvm.ir.Type) -> list[TensorSpec]:
    if isinstance(ty, relax.TupleType):
        return [s for i, f in enumerate(ty.fields) for s in type_spec(f"{name}[{i}]", f)]
    if isinstance(ty, relax.TensorType):
        shape = (
            [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values]
            if ty.shape
            else []
        )
        return [TensorSpec(name, shape, str(ty.dtype))]
    return [TensorSpec(name, [], str(ty))]


def relax_outputs(mod: tvm.IRModule, declared: list[TensorSpec]) -> list[TensorSpec]:
    """Output specs from main's return type, named as the model declares them where it does."""
    specs = type_spec("output", mod["main"].ret_ty)
    for spec, decl in zip(specs, declared, strict=False):
        spec.name = decl.name
    return specs


def import_stage(ctx: Context, report: Report) -> Given[ImportedModel]:
    """The model as Relax (a causal LM with its KV cache: one decode step), its imported IR kept."""
    if ctx.job.archive is not None:  # an .onnx with its external data files, as one upload
        unpack.unpack(ctx.job.archive, ctx.job.model.parent)
    model = import_model(ctx.job.model, ctx.options.input_shapes, ctx.options.input_values)
    (ctx.dir / "views").mkdir(exist_ok=True)
    (ctx.dir / code_file("relax-imported")).write_text(model.mod.script())
    return Given(
        model,
        dict(
            model=model.to_json() | ({"weights": ctx.job.weights} if ctx.job.weights else {}),
            target={
                "preset": ctx.target.name,
                "title": ctx.target.title,
                "description": ctx.target.description,
                "tvm": target_json(ctx.target.tvm),
                # its int8 kernels' precondition on the weights (a reproducer draws them within it)
                "int8_pair_limit": ctx.target.int8_pair_limit(),
            },
        ),
    )

"""A torch.export (.pt2) upload: read without running pickled code from it, its `torch.cat`s as TVM's
importer cannot take them, and, where it is a generating language model, the ONNX form of it that
ONNX Runtime runs beside TVM in the generate stage.

A .pt2 generator is a module called as Hugging Face's exporters call a causal LM: `input_ids`, perhaps
`attention_mask` and `position_ids`, and each layer's cached keys and values as a list of tensors (the
`cache` argument of webapp/pipeline/examples.py's GeneratorStep, or `past_key_values`), their lengths
dynamic. A Hugging Face model exported with its DynamicCache as the input is not one: its .pt2 holds
the pickled cache (refused on load), and torch 2.13 cannot decompose its program ("Constant tensor
lifted_tensor_4 is not in the constants dictionary"), which both TVM and the ONNX exporter need."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.lm_inputs import Signature, signature_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.export import ExportedProgram


def load_pt2(path: Path) -> ExportedProgram:
    """torch.export.load with every unpickling restricted to tensors and plain containers: torch
    2.13 loads a .pt2's weights and constants with weights_only=False, and retries its sample inputs
    that way when the safe load fails, so a pickled payload in an upload would run. Here each such
    load is weights_only=True, and plain pickle.loads refuses."""
    import torch
    from torch.export.pt2_archive import _package

    def tensors_only(*args, **kwargs):
        return safe_load(*args, **{**kwargs, "weights_only": True})

    def no_pickle(*args, **kwargs):
        raise pickle.UnpicklingError("a pickled Python object (not a tensor) in the .pt2 file")

    safe_load, package_pickle = torch.load, _package.pickle
    # a stand-in for the pickle module, with its loads
    torch.load, _package.pickle = tensors_only, type("NoPickle", (), {"loads": staticmethod(no_pickle)})  # type: ignore[assignment]
    saved_pickle_obj, torch._C._pickle_load_obj = torch._C._pickle_load_obj, no_pickle
    try:
        return torch.export.load(str(path))
    finally:
        torch.load, _package.pickle, torch._C._pickle_load_obj = safe_load, package_pickle, saved_pickle_obj


def concat(importer: Any) -> Callable:
    """TVM's converter of `torch.cat` for `importer`, without the empty 1-D tensors torch's legacy rule
    lets a cat take beside tensors of any rank (a DynamicCache's layer starts as `torch.tensor([])` and
    is concatenated with its first keys), which Relax's concat refuses ("Concat expects all input
    tensors to have same ndim")."""
    from tvm import relax

    def empty(arg: Any) -> bool:
        value = getattr(arg, "meta", {}).get("val")
        return value is not None and tuple(value.shape) == (0,)

    def cat(node: Any) -> relax.Expr:
        parts = [importer.env[a] for a in node.args[0] if not empty(a)]
        axis = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if len(parts) == 1:
            return parts[0]
        return importer.block_builder.emit(relax.op.concat(parts, axis=axis))

    return cat


def user_inputs(ep: ExportedProgram) -> list[tuple[str, str, list]]:
    """(name, dtype, shape) of each input the program is called with, in order; a dimension not fixed as
    its symbol's name."""
    names = set(ep.graph_signature.user_inputs)
    out = []
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in names:
            continue
        val = node.meta.get("val")
        if val is None or not hasattr(val, "shape"):
            raise StageError(f"Input {node.name!r} is not a tensor; only tensor inputs are supported.")
        shape = [int(d) if str(d).lstrip("-").isdigit() else str(d) for d in val.shape]
        out.append((node.name, str(val.dtype).replace("torch.", ""), shape))
    return out


def pt2_signature(ep: ExportedProgram) -> Signature | None:
    """The program's Signature if it is a generator, else None."""
    outputs = next(n for n in ep.graph.nodes if n.op == "output").args[0]
    logits = getattr(outputs[0], "meta", {}).get("val") if outputs else None
    width = str(logits.shape[-1]) if logits is not None and len(logits.shape) else ""  # symbolic: a name
    weights = [*ep.state_dict.values(), *ep.constants.values()]
    return signature_of(
        user_inputs(ep),
        sum(t.numel() * t.element_size() for t in weights if hasattr(t, "numel")),
        int(width) if width.isdigit() else 2,
    )


@functools.cache
def generator_signature(path: Path) -> Signature | None:
    """pt2_signature() of a .pt2 file, read once a process; None for one that is not a generator or not
    readable (the import stage says why)."""
    try:
        return pt2_signature(load_pt2(path))
    except Exception:  # noqa: BLE001 - torch raises many kinds on a file it cannot read
        return None


def generator_onnx(path: Path, out: Path) -> Path:
    """A .pt2 generator as an .onnx at `out` (its weights in a data file beside it), its lengths kept
    dynamic, written once."""
    import torch

    from webapp.pipeline.examples import written_atomically

    if not out.exists():
        ep = load_pt2(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        written_atomically(
            out, lambda partial: torch.onnx.export(ep, (), str(partial), dynamo=True, external_data=True)
        )
    return out


def flat_module(ep: ExportedProgram) -> Any:
    """The program's module called with its inputs flat, as the graph's placeholders take them (a list
    argument, a generator's cache, as its tensors in turn): a torch.nn.Module."""
    import torch
    from torch.utils import _pytree

    spec = ep.call_spec.in_spec

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.program = ep.module()

        def forward(self, *flat: Any) -> Any:
            if spec is None:
                return self.program(*flat)
            args, kwargs = _pytree.tree_unflatten(list(flat), spec)
            return self.program(*args, **kwargs)

    return Flat()

"""Inspect stage: what the compiler made, as files the result page shows.

- the computation graph before and after fusion (JSON and a Graphviz SVG, shapes on the edges);
- the TIR of every kernel, and its slice of the generated LLVM IR and assembly;
- the whole LLVM IR / assembly module, and operator statistics.
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import tvm
from tvm import relax

from webapp.pipeline.reports.device_code import write_device_code
from webapp.pipeline.stages.optimize import relax_script

DEVICE_VIEWS = (".device", ".ptx", ".sass")  # views/kernels/<kernel>.<view> of a GPU build

CALL_TIR_OPS = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed")


# ---------------------------------------------------------------- graph


def type_json(ty) -> dict:
    if isinstance(ty, relax.TensorType):
        shape = None
        if ty.shape is not None and hasattr(ty.shape, "values"):
            shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values]
        return {"kind": "tensor", "shape": shape, "dtype": str(ty.dtype)}
    if isinstance(ty, relax.TupleType):
        return {"kind": "tuple", "fields": [type_json(f) for f in ty.fields]}
    return {"kind": "other", "text": str(ty)}


def relax_graph(mod: tvm.IRModule, func_name: str = "main") -> dict:
    """The dataflow graph of one Relax function: nodes (inputs, ops or kernels, output) and edges.

    Constants (the weights) are not nodes: their shapes are listed on the node that uses them. An op
    computed from constants alone (the importer's reshape of a bias, say) is folded into them the same
    way, and listed under "constant_ops".
    """
    func = mod[func_name]
    nodes: list[dict] = []
    edges: list[dict] = []
    producer: dict = {}
    constant_vars: set = set()
    constant_ops: list[str] = []

    def add_node(**node) -> str:
        node["id"] = f"n{len(nodes)}"
        nodes.append(node)
        return node["id"]

    def sources(expr):
        if isinstance(expr, relax.Tuple):
            for field in expr.fields:
                yield from sources(field)
        elif expr in producer:
            src = producer[expr]
            if isinstance(src, list):
                yield from src
            else:
                yield src

    for param in func.params:
        producer[param] = (add_node(kind="input", label=param.name, type=type_json(param.ty)), param.ty)

    for block in func.body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in producer:
                src = producer[value.tuple_value]
                producer[var] = src if isinstance(src, tuple) else src[int(value.index)]
                producer[var] = (producer[var][0], var.ty)
                continue
            if isinstance(value, relax.Tuple):
                producer[var] = list(sources(value))
                continue
            if isinstance(value, relax.Var) and value in producer:
                producer[var] = producer[value]
                continue
            if not isinstance(value, relax.Call):
                continue
            op, args = value.op, list(value.args)
            if isinstance(op, tvm.ir.Op) and op.name in CALL_TIR_OPS:
                label, kind = args[0].name_hint, "kernel"
                args = list(args[1].fields) if isinstance(args[1], relax.Tuple) else [args[1]]
            elif isinstance(op, tvm.ir.Op):
                label, kind = op.name.removeprefix("relax."), "op"
            elif isinstance(op, tvm.ir.GlobalVar):
                label, kind = op.name_hint, "kernel"
            else:
                label, kind = str(op), "op"
            inputs = list(sources(relax.Tuple(args)))
            if not inputs and any(isinstance(a, tvm.ir.Constant) or a in constant_vars for a in args):
                constant_vars.add(var)
                constant_ops.append(label)
                continue
            weights = [type_json(a.ty) for a in args if isinstance(a, tvm.ir.Constant) or a in constant_vars]
            nid = add_node(kind=kind, label=label, var=var.name, type=type_json(var.ty), weights=weights)
            for src_id, src_ty in inputs:
                edges.append({"src": src_id, "dst": nid, "type": type_json(src_ty)})
            producer[var] = (nid, var.ty)

    out = add_node(kind="output", label="output", type=type_json(func.ret_ty))
    for src_id, src_ty in sources(func.body.body):
        edges.append({"src": src_id, "dst": out, "type": type_json(src_ty)})
    return {"nodes": nodes, "edges": edges, "constant_ops": constant_ops}


def shape_text(t: dict) -> str:
    if t.get("kind") == "tensor":
        dims = "×".join(str(d) for d in (t["shape"] or [])) or "scalar"
        return dims if t["dtype"] == "float32" else f"{dims} {t['dtype']}"
    if t.get("kind") == "tuple":
        return "(" + ", ".join(shape_text(f) for f in t["fields"]) + ")"
    return t.get("text", "")


NODE_STYLE = {
    "input": 'shape=oval, style=filled, fillcolor="#d7ecff"',
    "output": 'shape=oval, style=filled, fillcolor="#d7ecff"',
    "op": 'shape=box, style="rounded,filled", fillcolor="#fff3c4"',
    "kernel": 'shape=box, style="rounded,filled", fillcolor="#d9f2d9"',
}


def graph_dot(graph: dict, title: str) -> str:
    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        "digraph G {",
        f"  graph [rankdir=TB, fontname=Helvetica, fontsize=12, label={q(title)}, labelloc=t];",
        "  node [fontname=Helvetica, fontsize=11];",
        '  edge [fontname=Helvetica, fontsize=9, color="#666666"];',
    ]
    for n in graph["nodes"]:
        label = n["label"]
        if n["kind"] in ("input", "output"):
            label += "\n" + shape_text(n["type"])
        elif n.get("weights"):
            label += "\nw: " + ", ".join(shape_text(w) for w in n["weights"][:2])
        lines.append(f"  {n['id']} [id={q(n['id'])}, label={q(label)}, {NODE_STYLE[n['kind']]}];")
    for e in graph["edges"]:
        lines.append(f"  {e['src']} -> {e['dst']} [label={q(' ' + shape_text(e['type']))}];")
    lines.append("}")
    return "\n".join(lines)


def render_svg(dot_source: str, out: Path) -> bool:
    """Graphviz `dot -Tsvg`; returns False (and the page shows the JSON graph only) if dot is missing."""
    try:
        subprocess.run(
            ["dot", "-Tsvg", "-o", str(out)],
            input=dot_source.encode(),
            check=True,
            capture_output=True,
            timeout=300,
        )
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def op_counts(graph: dict) -> dict[str, int]:
    """How often each op or kernel is called, those folded into the weights included."""
    counts: dict[str, int] = {}
    labels = [n["label"] for n in graph["nodes"] if n["kind"] in ("op", "kernel")] + graph["constant_ops"]
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# ---------------------------------------------------------------- generated code


class CodeIndex:
    """Where each function of a module's LLVM IR and assembly starts, found in one pass over each
    text (a search per kernel over the whole text took most of the inspect stage on DenseNet-121)."""

    def __init__(self, ll: str, asm: str):
        self.ll, self.asm = ll, asm
        self.ll_starts = {m.group(1): m.start() for m in re.finditer(r"^define[^\n]*?@([^\s(]+)\(", ll, re.M)}
        self.asm_starts = {m.group(1): m.start() for m in re.finditer(r"^([^\s:#]+):\n", asm, re.M)}

    def llvm_function(self, name: str) -> str:
        start = self.ll_starts.get(name)
        if start is None:
            return ""
        end = self.ll.find("\n}", start)
        return self.ll[start : end + 2 if end >= 0 else len(self.ll)]

    def asm_function(self, name: str) -> str:
        start = self.asm_starts.get(name)
        if start is None:
            return ""
        end = re.compile(r"^\.Lfunc_end\d+:", re.M).search(self.asm, start)
        return self.asm[start : end.end() if end else len(self.asm)]

    def kernel_code(self, kernel: str) -> tuple[str, str]:
        """A kernel's LLVM IR and assembly: its compute body, the parallel loop bodies it hands to
        the thread pool (where the hot loops are), and its packed-call wrapper."""
        names = [f"{kernel}_compute_", f"__tvm_ffi_{kernel}", kernel]
        ll_parts = [t for t in (self.llvm_function(n) for n in names) if t]
        asm_parts = [t for t in (self.asm_function(n) for n in names) if t]
        lambdas = sorted(set(re.findall(r"@(__tvm_parallel_lambda[.\d]*)\b", "\n".join(ll_parts))))
        ll_parts += [self.llvm_function(n) for n in lambdas]
        asm_lambdas = sorted(set(re.findall(r"(\.L__tvm_parallel_lambda[.\d]*)\b", "\n".join(asm_parts))))
        asm_parts += [self.asm_function(n) for n in asm_lambdas]
        return "\n\n".join(t for t in ll_parts if t), "\n\n".join(t for t in asm_parts if t)


def host_code_module(executable) -> tvm.runtime.Module | None:
    for m in executable.mod.imports:
        if m.kind == "llvm":
            return m
    return None


# ---------------------------------------------------------------- the stage


def draw_graphs(imported: tvm.IRModule, fused: tvm.IRModule, job_dir: Path, fusion=None) -> dict:
    """The graphs before and after fusion (JSON and SVG), as soon as optimize has fused the model;
    with `fusion` (optimize.Fusion) each imported node names its layer and kernel, and each call in
    the fused graph its layers."""
    views, files = job_dir / "views", job_dir / "files"
    views.mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)
    graphs, drawn = {}, {"imported": relax_graph(imported), "fused": relax_graph(fused)}
    if fusion:
        link_graphs(drawn["imported"], drawn["fused"], fusion)
    for key, title in (("imported", "Imported (before fusion)"), ("fused", "After operator fusion")):
        graph = drawn[key]
        (views / f"graph-{key}.json").write_text(json.dumps(graph))
        svg_ok = render_svg(graph_dot(graph, title), files / f"graph-{key}.svg")
        graphs[key] = {
            "nodes": len(graph["nodes"]),
            "edges": len(graph["edges"]),
            "svg": f"graph-{key}.svg" if svg_ok else None,
            "json": f"graph-{key}.json",  # in views/, served as /r/<id>/graph-<key>.json
            "ops": op_counts(graph),
        }
    return graphs


def link_graphs(imported: dict, fused: dict, fusion) -> None:
    """Each imported node names its source layer, its kernel and the fused node (the kernel call)
    computing it; each fused node names the source layers of its call."""
    call_of = {}  # an imported var -> the id of the fused node computing it
    for node in fused["nodes"]:
        if "var" in node:
            node["layers"] = fusion.site_layers(node["var"])
            call_of.update(dict.fromkeys(fusion.sites.get(node["var"], []), node["id"]))
    calls = {n["id"]: n for n in fused["nodes"]}
    by_layer = {layer: n for n in fused["nodes"] for layer in n.get("layers", [])}
    inputs = {}
    for e in imported["edges"]:
        inputs.setdefault(e["dst"], []).append(e["src"])
    nodes = {n["id"]: n for n in imported["nodes"]}
    for node in imported["nodes"]:  # in the order of the model
        if "var" not in node:
            continue
        var = node["var"]
        node.update(layer=fusion.layer_of.get(var), kernel=fusion.kernel_of.get(var), call=call_of.get(var))
        # A binding the fusion does not name (a quantized layer's float ops, replaced by integer
        # ones): the call computing its layer, else the one computing its input (a fused epilogue).
        call = by_layer.get(node["layer"]) if node["call"] is None else None
        if call is None and node["call"] is None:
            call = next(
                (calls[nodes[i]["call"]] for i in inputs.get(node["id"], []) if nodes[i].get("call")), None
            )
        if call is not None:
            node.update(kernel=call["label"], call=call["id"])


def overlay_graphs(job_dir: Path, annotate) -> None:
    """views/graph-*.json rewritten with annotate(imported, fused) (either may be None)."""
    paths = [job_dir / "views" / f"graph-{key}.json" for key in ("imported", "fused")]
    graphs = [json.loads(p.read_text()) if p.is_file() else None for p in paths]
    annotate(*graphs)
    for path, graph in zip(paths, graphs, strict=True):
        if graph is not None:
            path.write_text(json.dumps(graph))


def time_graphs(job_dir: Path, kernels: list[dict]) -> None:
    """Each kernel call of the graphs gains its time (ms) and share of the kernels' time, once the
    benchmark has timed the kernels: a kernel's figures over its calls (the calls of one kernel are
    alike); an imported node has those of the call computing it."""
    timed = {k["name"]: k for k in kernels if k.get("ms") is not None and k.get("calls")}

    def annotate(imported, fused):
        per_call = {}
        for node in fused["nodes"] if fused else []:
            k = timed.get(node["label"]) if node["kind"] == "kernel" else None
            if k is not None:
                node.update(ms=k["ms"] / k["calls"], share=k["share"] / k["calls"])
                per_call[node["id"]] = node
        for node in imported["nodes"] if imported else []:
            call = per_call.get(node.get("call"))
            if call is not None:
                node.update(ms=call["ms"], share=call["share"])

    overlay_graphs(job_dir, annotate)


def error_graphs(
    job_dir: Path, layer_errors: list[dict], worst: str | None, layer_of: dict[str, str]
) -> None:
    """Each node of a quantized layer gains the layer's SQNR against fp32 (sqnr_db, from the quantize
    stage's layer_errors; a kernel call the lowest of its layers'), and the nodes of the layer where
    the SQNR falls the most (the quantization summary's worst layer) are marked "worst"."""
    sqnr: dict[str, float] = {}
    worst_sources: set[str] = set()
    for row in layer_errors:
        sources = {layer_of[v] for v in row.get("vars", []) if v in layer_of}
        if row.get("sqnr_db") is not None:
            sqnr.update({s: min(sqnr.get(s, row["sqnr_db"]), row["sqnr_db"]) for s in sources})
        if row["layer"] == worst:
            worst_sources |= sources

    def annotate(imported, fused):
        for node in [*(imported or {}).get("nodes", []), *(fused or {}).get("nodes", [])]:
            sources = [node["layer"]] if node.get("layer") else node.get("layers", [])
            values = [sqnr[s] for s in sources if s in sqnr]
            if values:
                node["sqnr_db"] = min(values)
            if worst_sources & set(sources):
                node["worst"] = True

    overlay_graphs(job_dir, annotate)


def inspect_build(
    imported: tvm.IRModule,
    fused: tvm.IRModule,
    lowered: tvm.IRModule,
    executable,
    job_dir: Path,
    labels: dict[str, str],
    tvm_target,
    report=lambda f: None,
    graphs: dict | None = None,
    fusion=None,
) -> dict:
    """The code views and kernel table of the build the page shows; `graphs` when draw_graphs already
    drew its graphs (after optimize). For a GPU build also its device code
    (webapp.pipeline.reports.device_code); the LLVM IR and assembly are then the host side's, which
    launches the kernels."""
    views, files = job_dir / "views", job_dir / "files"
    (views / "kernels").mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)

    graphs = graphs or draw_graphs(imported, fused, job_dir, fusion)
    layers = fusion.layers() if fusion else {}
    report(0.4)

    host = host_code_module(executable)
    ll = host.inspect_source("ll") if host is not None else ""
    asm = host.inspect_source("s") if host is not None else ""
    (files / "module.ll").write_text(ll)
    (files / "module.s").write_text(asm)
    report(0.6)

    kernels = []
    code = CodeIndex(ll, asm)
    names = {gv.name_hint for gv in fused.get_global_vars()}
    for gv, func in sorted(lowered.functions_items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        kernel_ll, kernel_asm = code.kernel_code(name)
        (views / "kernels" / f"{name}.tir.py").write_text(func.script())
        (views / "kernels" / f"{name}.ll").write_text(kernel_ll)
        (views / "kernels" / f"{name}.s").write_text(kernel_asm)
        kernels.append(
            {
                "name": name,
                "schedule": labels.get(name, "naive"),
                "asm_lines": kernel_asm.count("\n"),
                "calls": graphs["fused"]["ops"].get(name, 0),
                # counted on the kernel before scheduling: the counter cannot read tensorized code
                "flop": kernel_flop(fused[name] if name in names else func),
                "dtypes": kernel_dtypes(func),
                "layers": layers.get(name.removesuffix("_weight_prepack"), []),
            }
        )
    report(0.8)
    device = write_device_code(host, tvm_target, [k["name"] for k in kernels], job_dir)
    sass = (files / device["sass"]).read_text() if device and device.get("sass") else ""
    for k in kernels if device else []:
        resources = device["kernels"][k["name"]].get("resources")
        k.update({"device_functions": device["kernels"][k["name"]]["functions"]})
        k.update({"gpu": resources} if resources else {})
    report(0.9)

    (views / "optimized.py").write_text(relax_script(lowered))
    (views / "bytecode.txt").write_text(executable.as_text())
    write_ir_zip(job_dir)
    return {
        "graphs": graphs,
        "kernels": kernels,
        "code_sizes": {"llvm_ir_bytes": len(ll), "asm_bytes": len(asm)},
        "model_flop": sum(k["flop"] * k["calls"] for k in kernels),
        "instructions": instruction_counts(asm) | instruction_counts(sass, COUNTED_SASS, SASS_MNEMONIC),
        "dtype_census": dtype_census(lowered),
    } | ({"device_code": device} if device else {})


# Instructions worth counting in the assembly: integer dot products (x86 VNNI, AVX-512BW / AVX2
# multiply-adds, Arm dot product) and float fused multiply-adds.
COUNTED_INSTRUCTIONS = {
    "vpdpbusd": "uint8 x int8 dot product, 4 per lane (AVX-512 VNNI / AVX-VNNI)",
    "vpdpwssd": "int16 x int16 dot product, 2 per lane (VNNI)",
    "vpmaddubsw": "uint8 x int8 multiply-add to int16 (AVX2 / AVX-512BW)",
    "vpmaddwd": "int16 multiply-add to int32",
    "sdot": "int8 dot product, 4 per lane (Arm dot product)",
    "udot": "uint8 dot product, 4 per lane (Arm dot product)",
    "vfmadd": "float fused multiply-add (x86 FMA)",
    "fmla": "float fused multiply-add (Arm NEON)",
}


ASM_MNEMONIC = r"^\s+([a-z][a-z0-9]*)"
# The same in NVIDIA's SASS (nvdisasm), for a CUDA build: dp4a, float FMA, tensor-core MMA.
COUNTED_SASS = {
    "IDP.4A": "int8 dot product of 4 pairs into int32 (dp4a)",
    "FFMA": "float fused multiply-add",
    "HMMA": "tensor-core matrix multiply-add (fp16/tf32)",
    "IMMA": "tensor-core matrix multiply-add (int8)",
}
SASS_MNEMONIC = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)"


def instruction_counts(
    text: str, counted=COUNTED_INSTRUCTIONS, mnemonic: str = ASM_MNEMONIC
) -> dict[str, int]:
    """Occurrences of each counted mnemonic (and its variants) in the assembly (or the SASS)."""
    mnemonics = re.findall(mnemonic, text, re.M)
    counts = {name: sum(1 for m in mnemonics if m.startswith(name)) for name in counted}
    return {name: n for name, n in counts.items() if n}


def kernel_dtypes(func: tvm.tirx.PrimFunc) -> str:
    """A kernel's signature by dtype: its inputs' dtypes -> its outputs' (the last parameter)."""
    dtypes = [str(p.dtype) for p in func.params if hasattr(p, "dtype")]
    return f"{' x '.join(dict.fromkeys(dtypes[:-1]))} -> {dtypes[-1]}" if dtypes else ""


def dtype_census(lowered: tvm.IRModule) -> dict:
    """The kernels counted by signature (input dtypes -> output dtype), and the tensors the kernels
    read and write counted by element type: where the arithmetic happens in int8, int32 or float32."""
    tensors: dict[str, int] = {}
    kernels: dict[str, int] = {}
    for _, func in lowered.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            for p in func.params:
                if hasattr(p, "dtype"):
                    tensors[str(p.dtype)] = tensors.get(str(p.dtype), 0) + 1
            sig = kernel_dtypes(func)
            kernels[sig] = kernels.get(sig, 0) + 1
    return {"tensors": tensors, "kernels": kernels}


def kernel_flop(func: tvm.tirx.PrimFunc) -> float:
    """Floating-point operations of one call (TVM's estimate: multiply-add counts as two). A Winograd
    kernel counts the direct convolution it computes (webapp.pipeline.passes.winograd.direct_flop): its
    GFLOP/s is then the effective rate, comparable with a direct kernel's, and a model's count does
    not depend on which algorithm ran."""
    from webapp.pipeline.passes.winograd import direct_flop

    direct = direct_flop(func)
    if direct is not None:
        return direct
    try:
        return float(tvm.s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # the estimator rejects some scheduled loops; the count is informative only
        return 0.0


def write_ir_zip(job_dir: Path) -> None:
    """Every IR text of the job in one download."""
    with zipfile.ZipFile(job_dir / "files" / "ir.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted((job_dir / "views").rglob("*")):
            if path.is_file() and path.suffix in (".py", ".ll", ".s", ".txt", *DEVICE_VIEWS):
                z.write(path, path.relative_to(job_dir / "views"))
        for path in sorted((job_dir / "files").glob("device.*")):
            z.write(path, path.name)
        for name in ("module.ll", "module.s"):
            z.write(job_dir / "files" / name, name)

"""The model's graphs, before and after fusion: nodes and edges with shapes and dtypes as JSON, drawn
as SVG by Graphviz, linked layer to kernel, and coloured later by each kernel's time or each
quantized layer's error."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import tvm
from tvm import relax

if TYPE_CHECKING:
    from webapp.pipeline.stages.optimize import Fusion

CALL_TIR_OPS = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed")


def type_json(ty: tvm.ir.Type) -> dict:
    if isinstance(ty, relax.TensorType):
        shape = None
        if ty.shape is not None and hasattr(ty.shape, "values"):
            shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values]
        return {"kind": "tensor", "shape": shape, "dtype": str(ty.dtype)}
    if isinstance(ty, relax.TupleType):
        return {"kind": "tuple", "fields": [type_json(f) for f in ty.fields]}
    return {"kind": "other", "text": str(ty)}


def tensor_sources(expr: relax.Expr, producer: dict) -> Iterator[tuple[str, tvm.ir.Type]]:
    """The (node id, type) of each tensor `expr` is made of (a tuple's fields, each)."""
    if isinstance(expr, relax.Tuple):
        for field in expr.fields:
            yield from tensor_sources(field, producer)
    elif expr in producer:
        src = producer[expr]
        if isinstance(src, list):
            yield from src
        else:
            yield src


def call_label(call: relax.Call) -> tuple[str, str, list]:
    """(label, kind, arguments) of a call in the graph: a kernel's (call_tir) its name and its tensor
    arguments, an op's its name without "relax."."""
    op, args = call.op, list(call.args)
    if isinstance(op, tvm.ir.Op) and op.name in CALL_TIR_OPS:
        args = list(args[1].fields) if isinstance(args[1], relax.Tuple) else [args[1]]
        return call.args[0].name_hint, "kernel", args
    if isinstance(op, tvm.ir.Op):
        return op.name.removeprefix("relax."), "op", args
    if isinstance(op, tvm.ir.GlobalVar):
        return op.name_hint, "kernel", args
    return str(op), "op", args


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
        return tensor_sources(expr, producer)

    for param in func.params:
        producer[param] = (add_node(kind="input", label=param.name, type=type_json(param.ty)), param.ty)

    for place, binding in enumerate(b for block in func.body.blocks for b in block.bindings):
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
        label, kind, args = call_label(value)
        inputs = list(sources(relax.Tuple(args)))
        if not inputs and any(isinstance(a, tvm.ir.Constant) or a in constant_vars for a in args):
            constant_vars.add(var)
            constant_ops.append(label)
            continue
        weights = [type_json(a.ty) for a in args if isinstance(a, tvm.ir.Constant) or a in constant_vars]
        nid = add_node(
            kind=kind, label=label, var=var.name, binding=place, type=type_json(var.ty), weights=weights
        )
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
    "layer": 'shape=box, style="rounded,filled", fillcolor="#e4e0f7"',
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
        elif n["kind"] == "layer":
            label += f"\n{n['ops']} ops in {len(n['calls'])} kernel calls"
        elif n.get("weights"):
            label += "\nw: " + ", ".join(shape_text(w) for w in n["weights"][:2])
        lines.append(f"  {n['id']} [id={q(n['id'])}, label={q(label)}, {NODE_STYLE[n['kind']]}];")
    for e in graph["edges"]:
        lines.append(f"  {e['src']} -> {e['dst']} [label={q(' ' + shape_text(e['type']))}];")
    lines.append("}")
    return "\n".join(lines)


MAX_DRAWN_NODES = 1500  # Graphviz lays out a graph this size in about a minute; 2,000 took over 4
# dot's own layout, if it takes no longer; then the quick one (QUICK_LAYOUT). Measured here on 19 graphs
# of the corpus's jobs under 500 nodes: all but two took 0.01-0.16 s (354 nodes), the two of
# ddddocr's recognizer (282 and 294 nodes, ~540 edges: its LSTM) did not finish in 12 s
FULL_LAYOUT_S = 2
QUICK_FROM_NODES = 500  # a graph this large goes to the quick layout at once (dot's took > 10 s on 1,243)
DRAW_TIMEOUT_S = 90
# dot's network simplex cut to one pass over the nodes, edges drawn straight: an LSTM recognizer's fused
# graph (282 nodes, ddddocr's) took 164 s in dot's own layout, 18 s with the one pass, 0.5 s with
# straight edges too; its 1,243 imported nodes 5 s.
QUICK_LAYOUT = ["-Gnslimit=1", "-Gnslimit1=1", "-Gsplines=line"]


def render_svg(graph: dict, title: str, out: Path) -> str | None:
    """Graphviz `dot -Tsvg` of a graph: dot's own layout where it takes at most FULL_LAYOUT_S on a graph
    under QUICK_FROM_NODES, else the quick one. None when drawn, else why not (the page then links the
    graph's JSON): too many nodes to lay out in time, dot took too long, or dot is missing."""
    if len(graph["nodes"]) > MAX_DRAWN_NODES:
        return (
            f"{len(graph['nodes']):,} nodes, more than the {MAX_DRAWN_NODES:,} Graphviz lays out in a "
            "minute or two: not drawn"
        )
    source = graph_dot(graph, title).encode()
    layouts: list[tuple[list[str], float]] = (
        [([], FULL_LAYOUT_S)] if len(graph["nodes"]) < QUICK_FROM_NODES else []
    )
    for options, timeout in [*layouts, (QUICK_LAYOUT, DRAW_TIMEOUT_S)]:
        try:
            command = ["dot", "-Tsvg", *options, "-o", str(out)]
            subprocess.run(command, input=source, check=True, capture_output=True, timeout=timeout)
            return None
        except subprocess.TimeoutExpired:
            continue
        except (OSError, subprocess.SubprocessError):
            return "Graphviz was not available to draw this graph"
    return f"Graphviz took more than {DRAW_TIMEOUT_S} s to lay it out: not drawn"


def op_counts(graph: dict) -> dict[str, int]:
    """How often each op or kernel is called, those folded into the weights included."""
    counts: dict[str, int] = {}
    labels = [n["label"] for n in graph["nodes"] if n["kind"] in ("op", "kernel")] + graph["constant_ops"]
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# The title drawn in each graph (webapp.catalog.GRAPHS has the keys, in order, and the tabs' titles)
TITLES = {
    "layers": "By layer (the model's modules, repeated blocks folded)",
    "imported": "Imported (before fusion)",
    "fused": "After operator fusion",
}


def draw_graphs(
    imported: tvm.IRModule,
    fused: tvm.IRModule,
    job_dir: Path,
    fusion: Fusion | None = None,
    modules: dict | None = None,
) -> dict:
    """The graphs before and after fusion (JSON and SVG), as soon as optimize has fused the model;
    with `fusion` (optimize.Fusion) each imported node names its layer and kernel, and each call in
    the fused graph its layers. With the layers' module paths (`modules`, ImportedModel.modules) each
    imported node names its module and block, and a third graph folds the model by block."""
    views, files = job_dir / "views", job_dir / "files"
    views.mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)
    graphs, drawn = {}, {"imported": relax_graph(imported), "fused": relax_graph(fused)}
    if fusion:
        link_graphs(drawn["imported"], drawn["fused"], fusion)
    folded = layer_graph(drawn["imported"], modules or {})
    if folded is not None:
        drawn = {"layers": folded, **drawn}
    keys = [key for key in TITLES if key in drawn]
    with ThreadPoolExecutor(len(keys)) as pool:  # one dot process a graph, at once
        svgs = {k: pool.submit(render_svg, drawn[k], TITLES[k], files / f"graph-{k}.svg") for k in keys}
    for key in keys:
        graph, not_drawn = drawn[key], svgs[key].result()
        (views / f"graph-{key}.json").write_text(json.dumps(graph))
        graphs[key] = {
            "nodes": len(graph["nodes"]),
            "edges": len(graph["edges"]),
            "svg": f"graph-{key}.svg" if not_drawn is None else None,
            **({"not_drawn": not_drawn} if not_drawn else {}),
            "json": f"graph-{key}.json",  # in views/, served as /r/<id>/graph-<key>.json
            "ops": op_counts(graph),
        }
    return graphs


def blocks_of(paths: set[str]) -> dict[str, str]:
    """Module path -> the block it folds into: a repeated block (the path up to its first numbered
    part: "encoder.layer.3.attention" -> "encoder.layer.3"), else the outermost module that holds no
    repeated block ("embeddings.word_embeddings" -> "embeddings", "lm_head")."""
    numbered = {}
    for path in paths:
        parts = path.split(".")
        at = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        if at is not None:
            numbered[path] = ".".join(parts[: at + 1])
    holders = {".".join(b.split(".")[:i]) for b in numbered.values() for i in range(1, b.count(".") + 1)}
    blocks = {}
    for path in paths:
        if path in numbered:
            blocks[path] = numbered[path]
            continue
        prefixes = [".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 2)]
        blocks[path] = next((prefix for prefix in prefixes if prefix not in holders), path)
    return blocks


def layer_graph(imported: dict, modules: dict[str, str]) -> dict | None:
    """The imported graph folded by block (blocks_of): a node per block, in the model's order, with
    its operator count, kernels and kernel calls, and an edge where data crosses from one block to
    another. An op of no known module is in the block of its first input's. None when fewer than half
    the ops have a module (an exporter that keeps no module paths) or they make one block only."""
    ops = [n for n in imported["nodes"] if n["kind"] in ("op", "kernel")]
    known = {n["id"]: modules[n["layer"]] for n in ops if modules.get(n.get("layer"))}
    if not ops or len(known) * 2 < len(ops):
        return None
    blocks = blocks_of(set(known.values()))
    inputs: dict[str, list[str]] = {}
    for e in imported["edges"]:
        inputs.setdefault(e["dst"], []).append(e["src"])
    block_of: dict[str, str] = {}  # imported node id -> block ("" for inputs and outputs)
    for n in imported["nodes"]:
        if n["kind"] in ("input", "output"):
            block_of[n["id"]] = ""
        elif n["id"] in known:
            block_of[n["id"]] = blocks[known[n["id"]]]
        else:
            block_of[n["id"]] = next((block_of[i] for i in inputs.get(n["id"], []) if block_of.get(i)), "")
        if n["id"] in known:
            n.update(module=known[n["id"]], block=block_of[n["id"]])
    if len({b for b in block_of.values() if b}) < 2:
        return None
    nodes: list[dict] = []
    id_of: dict[str, str] = {}  # imported node id -> its node here
    node_of: dict[str, dict] = {}  # block -> its node here
    for n in imported["nodes"]:
        block = block_of[n["id"]]
        if not block:  # an input or output, or an op of no block: a node of its own
            nodes.append({**n, "id": f"n{len(nodes)}", "first": n["id"]})
            id_of[n["id"]] = nodes[-1]["id"]
            continue
        if block not in node_of:
            node_of[block] = {"id": f"n{len(nodes)}", "kind": "layer", "label": block, "first": n["id"]}
            node_of[block].update(ops=0, kernels=[], calls=[])
            nodes.append(node_of[block])
        node = node_of[block]
        id_of[n["id"]] = node["id"]
        node["ops"] += 1
        node["type"] = n.get("type")  # the block's last op's output
        if n.get("kernel") and n["kernel"] not in node["kernels"]:
            node["kernels"].append(n["kernel"])
        if n.get("call") and n["call"] not in node["calls"]:
            node["calls"].append(n["call"])
    edges, seen = [], set()
    for e in imported["edges"]:
        src, dst = id_of[e["src"]], id_of[e["dst"]]
        if src != dst and (src, dst) not in seen:
            seen.add((src, dst))
            edges.append({"src": src, "dst": dst, "type": e["type"]})
    return {"nodes": nodes, "edges": edges, "constant_ops": []}


def kernel_blocks(job_dir: Path) -> dict[str, list[str]]:
    """Kernel -> the blocks of the folded graph (views/graph-layers.json) that call it, in order; {}
    for a model with no such graph."""
    path = job_dir / "views" / "graph-layers.json"
    out: dict[str, list[str]] = {}
    for node in json.loads(path.read_text())["nodes"] if path.is_file() else []:
        for kernel in node.get("kernels", []):
            if node["label"] not in out.setdefault(kernel, []):
                out[kernel].append(node["label"])
    return out


def link_graphs(imported: dict, fused: dict, fusion: Fusion) -> None:
    """Each imported node names its source layer, its kernel and the fused node (the kernel call)
    computing it; each fused node names the source layers of its call."""
    call_of = {}  # an imported var -> the id of the fused node computing it
    for node in fused["nodes"]:
        if "binding" in node:  # by place: a fused main's var names repeat
            node["layers"] = fusion.site_layers(node["binding"])
            call_of.update(dict.fromkeys(fusion.sites.get(node["binding"], []), node["id"]))
    calls = {n["id"]: n for n in fused["nodes"]}
    by_layer = {layer: n for n in fused["nodes"] for layer in n.get("layers", [])}
    inputs: dict[str, list[str]] = {}
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


def overlay_graphs(job_dir: Path, annotate: Callable[..., None]) -> None:
    """views/graph-*.json rewritten with annotate(imported, fused, layers) (any may be None)."""
    paths = [job_dir / "views" / f"graph-{key}.json" for key in ("imported", "fused", "layers")]
    graphs = [json.loads(p.read_text()) if p.is_file() else None for p in paths]
    annotate(*graphs)
    for path, graph in zip(paths, graphs, strict=True):
        if graph is not None:
            path.write_text(json.dumps(graph))


def time_graphs(job_dir: Path, kernels: list[dict]) -> None:
    """Each kernel call of the graphs gains its time (ms) and share of a run, once the
    benchmark has timed the kernels: a kernel's figures over its calls (the calls of one kernel are
    alike); an imported node has those of the call computing it, a block (the folded graph) those
    of its kernel calls summed."""
    timed = {k["name"]: k for k in kernels if k.get("ms") is not None and k.get("calls")}

    def annotate(imported, fused, layers=None):
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
        for node in layers["nodes"] if layers else []:
            calls = [per_call[c] for c in node.get("calls", []) if c in per_call]
            if calls:
                node.update(ms=sum(c["ms"] for c in calls), share=sum(c["share"] for c in calls))

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

    def annotate(imported, fused, layers=None):
        for node in [*(imported or {}).get("nodes", []), *(fused or {}).get("nodes", [])]:
            sources = [node["layer"]] if node.get("layer") else node.get("layers", [])
            values = [sqnr[s] for s in sources if s in sqnr]
            if values:
                node["sqnr_db"] = min(values)
            if worst_sources & set(sources):
                node["worst"] = True
        for block in (layers or {}).get("nodes", []):  # a block: its layers' lowest, its worst
            inside = [n for n in (imported or {}).get("nodes", []) if n.get("block") == block["label"]]
            values = [n["sqnr_db"] for n in inside if n.get("sqnr_db") is not None]
            if values:
                block["sqnr_db"] = min(values)
            if any(n.get("worst") for n in inside):
                block["worst"] = True

    overlay_graphs(job_dir, annotate)


def reference_error_graphs(job_dir: Path, rows: list[dict], first_off: str | None) -> None:
    """Each node of a layer compared with ONNX Runtime (stages/layer_error.py) gains the layer's SQNR
    against it (ref_sqnr_db; null where they agree exactly, ref_exact), a kernel call or a block the
    lowest of its layers'; the nodes of the first layer below the tolerance are marked ref_first."""
    by_layer = {r["layer"]: r for r in rows}

    def mark(node: dict, sources: list[str]) -> None:
        found = [by_layer[s] for s in sources if s in by_layer]
        if not found:
            return
        values = [r["sqnr_db"] for r in found if r["sqnr_db"] is not None]
        node["ref_sqnr_db"] = min(values) if values else None
        node["ref_exact"] = not values
        if first_off in sources:
            node["ref_first"] = True

    def annotate(imported, fused, layers=None):
        for node in [*(imported or {}).get("nodes", []), *(fused or {}).get("nodes", [])]:
            mark(node, [node["layer"]] if node.get("layer") else node.get("layers", []))
        for block in (layers or {}).get("nodes", []):
            inside = [n for n in (imported or {}).get("nodes", []) if n.get("block") == block["label"]]
            mark(block, [n["layer"] for n in inside if n.get("layer")])

    overlay_graphs(job_dir, annotate)

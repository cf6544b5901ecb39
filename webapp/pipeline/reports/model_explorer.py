"""The job's graphs for Google's Model Explorer: its graph JSON (ModelExplorerGraphs: {"graphs": [Graph]},
the shape of model_explorer.graph_builder) and node-data JSON (ModelNodeData: {graph id: GraphNodeData},
node_data_builder), the time and error overlays included. Written once, at the end of the job, from the
graph JSON the page shows (views/graph-*.json): the same facts, in the other viewer's format."""

from __future__ import annotations

import json
from pathlib import Path

GRAPHS_FILE = "model-explorer-graphs.json"
OVERLAYS = {  # file -> (node key, what it is, gradient from the lowest value to the highest)
    "model-explorer-time.json": ("ms", "ms per kernel call", ["#fff7bc", "#cc181e"]),
    "model-explorer-sqnr.json": ("sqnr_db", "SQNR against fp32, dB", ["#cc181e", "#fff7bc"]),
    # each fp32 layer against ONNX Runtime's (a bisecting job's: stages/layer_error.py; exact ones left out)
    "model-explorer-reference.json": ("ref_sqnr_db", "SQNR against ONNX Runtime, dB", ["#cc181e", "#fff7bc"]),
}


def namespace(layer: str | None) -> str:
    """The module path of an ONNX node ("/stages/stages.14/body/Conv" -> "stages/stages.14/body"), for
    Model Explorer's collapsible groups; a PyTorch layer ("stages.14.body (conv2d)") by its dots."""
    if not layer:
        return ""
    if "/" in layer:
        return "/".join(p for p in layer.split("/")[:-1] if p)
    path = layer.split(" (")[0]
    return "/".join(path.split(".")[:-1]) if "." in path else ""


def common_namespace(layers: list[str]) -> str:
    parts = [namespace(layer).split("/") for layer in layers if namespace(layer)]
    if not parts:
        return ""
    common = []
    for level in zip(*parts, strict=False):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return "/".join(common)


def shape_text(t: dict) -> str:
    if t.get("kind") == "tensor":
        return "x".join(str(d) for d in (t.get("shape") or [])) or "scalar"
    if t.get("kind") == "tuple":
        return "(" + ", ".join(shape_text(f) for f in t["fields"]) + ")"
    return t.get("text", "")


def graph(key: str, g: dict) -> dict:
    inputs: dict[str, list[dict]] = {}
    for e in g["edges"]:
        edges = inputs.setdefault(e["dst"], [])
        edges.append(
            {"sourceNodeId": e["src"], "sourceNodeOutputId": "0", "targetNodeInputId": str(len(edges))}
        )
    nodes = []
    for n in g["nodes"]:
        attrs = {
            "kind": n["kind"],
            "var": n.get("var"),
            "source layer": n.get("layer"),
            "kernel": n.get("kernel"),
        }
        attrs["source layers"] = ", ".join(n.get("layers") or []) or None
        attrs["weights"] = ", ".join(shape_text(w) for w in n.get("weights") or []) or None
        attrs["ms per call"] = f"{n['ms']:.4f}" if n.get("ms") is not None else None
        attrs["SQNR against fp32, dB"] = f"{n['sqnr_db']:.1f}" if n.get("sqnr_db") is not None else None
        t = n.get("type") or {}
        nodes.append(
            {
                "id": n["id"],
                "label": n["label"],
                "namespace": n["module"].replace(".", "/")  # a module path the exporter kept
                if n.get("module")
                else namespace(n.get("layer"))
                if key == "imported"
                else common_namespace(n.get("layers") or []),
                "attrs": [{"key": k, "value": str(v)} for k, v in attrs.items() if v is not None],
                "incomingEdges": inputs.get(n["id"], []),
                "outputsMetadata": [
                    {
                        "id": "0",
                        "attrs": [
                            {"key": "shape", "value": shape_text(t)},
                            {"key": "dtype", "value": str(t.get("dtype", ""))},
                        ],
                    }
                ],
            }
        )
    return {"id": key, "nodes": nodes}


def write_model_explorer(job_dir: Path) -> list[str]:
    """files/model-explorer-*.json from views/graph-*.json; returns the files written."""
    graphs = {}
    for key in ("imported", "fused"):
        path = job_dir / "views" / f"graph-{key}.json"
        if path.is_file():
            graphs[key] = json.loads(path.read_text())
    if not graphs:
        return []
    files = job_dir / "files"
    (files / GRAPHS_FILE).write_text(json.dumps({"graphs": [graph(k, g) for k, g in graphs.items()]}))
    written = [GRAPHS_FILE]
    for name, (field, _, colours) in OVERLAYS.items():
        data = {}
        for key, g in graphs.items():
            results = {n["id"]: {"value": n[field]} for n in g["nodes"] if n.get(field) is not None}
            if results:
                gradient = [{"stop": 0, "bgColor": colours[0]}, {"stop": 1, "bgColor": colours[1]}]
                data[key] = {"results": results, "gradient": gradient}
        if data:
            (files / name).write_text(json.dumps(data))
            written.append(name)
    return written

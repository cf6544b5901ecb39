"""The layer -> kernel map the graph, the kernel table and the quantization views read, on models whose
right answer is known: every layer maps to the kernel call that computes it, every kernel lists the
layers it computes, and exactly one node is the worst quantized layer."""

from __future__ import annotations

import io
import json

import pytest
import torch

from tests.conftest import wait_for_job


class CNN(torch.nn.Module):
    """Three conv + ReLU blocks of different widths (8, 24, 40 channels), pooled, a classifier."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(i, o, 3, padding=1) for i, o in ((3, 8), (8, 24), (24, 40))
        )
        self.fc = torch.nn.Linear(40, 10)

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x))
        return self.fc(x.mean((2, 3)))


class Encoder(torch.nn.Module):
    """BERT-style: token embeddings, two encoder layers, a head."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, ids):
        return self.head(self.layers(self.emb(ids)))


def run(client, module, example, **form) -> tuple[dict, dict, dict]:
    """The job of `module` exported to ONNX: its result and its two graphs."""
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(module.eval(), (example,), buf, dynamo=False, opset_version=17)
    data = {"target": "x86-host", "model": (io.BytesIO(buf.getvalue()), "model.onnx"), **form}
    resp = client.post("/api/jobs", data=data, content_type="multipart/form-data")
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "done", job.get("error")
    graphs = [
        json.loads(client.get(f"/r/{job['id']}/graph-{key}.json").get_data()) for key in ("imported", "fused")
    ]
    return job["results"], *graphs


def consistent(results: dict, fused: dict) -> None:
    """A kernel called once lists the layers its call in the fused graph lists."""
    calls = {}
    for node in fused["nodes"]:
        if node.get("kind") == "kernel":
            calls.setdefault(node["label"], []).append(node)
    for kernel in results["kernels"]:
        if len(calls.get(kernel["name"], [])) == 1:
            assert kernel["layers"] == calls[kernel["name"]][0]["layers"], kernel["name"]


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_each_convolution_maps_to_its_own_kernel_call(client, quantize):
    results, imported, fused = run(client, CNN(), torch.randn(1, 3, 16, 16), quantize=quantize)
    calls = {n["id"]: n for n in fused["nodes"]}
    convs = [n for n in imported["nodes"] if n.get("label") == "nn.conv2d"]
    assert len(convs) == 3
    called = [calls[n["call"]] for n in convs]
    assert all("conv2d" in c["label"] for c in called), [c["label"] for c in called]
    order = [fused["nodes"].index(c) for c in called]
    assert order == sorted(set(order)), order  # three calls, in the model's order
    for conv, call in zip(convs, called, strict=True):
        relu = next(n for n in imported["nodes"] if n.get("label") == "nn.relu" and n["call"] == call["id"])
        assert call["layers"] == [conv["layer"], relu["layer"]]  # the conv and its ReLU, nothing else
    consistent(results, fused)
    if quantize == "int8":
        worst = [n for n in fused["nodes"] if n.get("worst")]
        assert len(worst) == 1, [n["label"] for n in worst]


def test_an_encoder_maps_embeddings_attention_and_feed_forward_layers(client):
    results, imported, fused = run(client, Encoder(), torch.randint(0, 1000, (1, 16)))
    calls = {n["id"]: n for n in fused["nodes"]}
    for kernel in results["kernels"]:  # an embedding lookup computes a Gather, not the matmuls
        if kernel["name"].startswith("take"):
            assert kernel["layers"] and all("Gather" in layer for layer in kernel["layers"]), kernel
    matmuls = [n for n in imported["nodes"] if n.get("label") == "matmul"]
    assert len(matmuls) == 2 * 6 + 1  # a layer: in projection, two in attention, out, two linears
    for node in matmuls:
        assert "matmul" in calls[node["call"]]["label"], (node["layer"], calls[node["call"]]["label"])
        assert node["layer"] in calls[node["call"]]["layers"]
    linear = [n["layer"] for n in imported["nodes"] if "linear1/MatMul" in (n.get("layer") or "")]
    assert len(set(linear)) == 2 and all(  # the two encoder layers' first linears: two calls
        sum(layer in (n.get("layers") or []) for n in fused["nodes"]) == 1 for layer in set(linear)
    )
    consistent(results, fused)


def test_module_paths_fold_into_blocks():
    """Numbered blocks fold at their number; the modules around them at the outermost level that
    holds no block; the dynamo exporter's scopes give the chain of nested modules."""
    from webapp.pipeline.reports.graphs import blocks_of
    from webapp.pipeline.stages.importers import scope_path

    paths = {
        "model.embeddings.word_embeddings",
        "model.embeddings",
        "model.encoder.layer.0.attention.self",
        "model.encoder.layer.0",
        "model.encoder.layer.11.output.dense",
        "model.pooler",
    }
    assert blocks_of(paths) == {
        "model.embeddings.word_embeddings": "model.embeddings",
        "model.embeddings": "model.embeddings",
        "model.encoder.layer.0.attention.self": "model.encoder.layer.0",
        "model.encoder.layer.0": "model.encoder.layer.0",
        "model.encoder.layer.11.output.dense": "model.encoder.layer.11",
        "model.pooler": "model.pooler",
    }
    scopes = "['', 'm', 'm.encoder', 'm.encoder.layer.0', 'm.encoder.layer.0.attention', 'linear']"
    assert scope_path(scopes) == "m.encoder.layer.0.attention"
    assert scope_path("['', 'm', 'linear_3']") == "m"
    assert scope_path("not a list") == "" and scope_path(None) == ""


class SplitAttention(torch.nn.Module):
    """GPT-2's attention: one projection split into query, key and value, four heads."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(64, 192), torch.nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = (t.reshape(1, 16, 4, 16).transpose(1, 2) for t in self.qkv(x).split(64, dim=2))
        attention = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        return self.out(attention.transpose(1, 2).reshape(1, 16, 64))


def test_query_key_and_value_split_apart_map_to_their_layers(client):
    """The kernels after a split (a kernel with a tuple of results: GPT-2's query, key and value)
    list their source layers as any other: the heads' transposes, the softmax, the attention's
    matmuls (they listed none, and the graph folded by block lost them)."""
    results, _, fused = run(client, SplitAttention(), torch.randn(1, 16, 64))
    assert [k["name"] for k in results["kernels"] if not k["layers"]] == []
    assert any(
        "softmax" in k["name"] and any("Softmax" in x for x in k["layers"]) for k in results["kernels"]
    )
    consistent(results, fused)

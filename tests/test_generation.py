"""A causal language model, uploaded as Hugging Face's exporters write it (its KV cache as inputs and
outputs), is timed as it generates: prefill and decode at every point, TVM against ONNX Runtime, with
the memory-bandwidth bound; and a model without a cache is not."""

from __future__ import annotations

import io
import re
import time
from urllib.parse import urlparse

import onnx
import pytest
import torch
from onnx.numpy_helper import to_array

from tests.conftest import tiny_llama, wait_for_job
from webapp.pipeline.rules import weight_only
from webapp.pipeline.stages import generation, lm_inputs


def test_the_roles_of_a_generating_models_inputs_are_read_from_its_names_and_shapes(tiny_lm):
    sig = lm_inputs.signature(onnx.load(str(tiny_lm)))
    assert sig is not None
    assert sig.cache == {
        f"past_key_values.{layer}.{kind}": 2 for layer in range(2) for kind in ("key", "value")
    }
    shapes = sig.shapes(tokens=16, past=0)  # a prompt of 16 tokens, the cache empty
    assert shapes["input_ids"] == shapes["position_ids"] == [1, 16]
    assert shapes["attention_mask"] == [1, 16]
    assert shapes["past_key_values.1.value"] == [1, 2, 0, 16]
    assert sig.vocabulary == 256  # the logits' last axis
    values = sig.values(tokens=1, past=128)  # one token after 128
    assert values["attention_mask"].shape == (1, 129) and values["attention_mask"].all()
    assert values["position_ids"].tolist() == [[128]]
    assert values["past_key_values.0.key"].shape == (1, 2, 128, 16)
    assert 0 <= values["input_ids"].min() and values["input_ids"].max() < 256


def test_a_model_without_a_cache_is_not_a_generator(example_files):
    assert lm_inputs.signature(onnx.load(str(example_files / "transformer-block.onnx"))) is None


@pytest.mark.parametrize("k", [512, 576])  # whole groups of 128, and a partial last one (SmolLM2's width)
def test_the_weight_only_kernels_compute_the_matmul_of_their_dequantized_weights_at_every_tile(k):
    """Each scheme's kernel against x @ W' (W' its weights dequantized in numpy), at each tile width a
    target takes: AVX-512's 4 vectors, AVX2's and NEON's 2 (their registers hold half), 1."""
    import numpy as np
    import tvm

    from webapp.targets import get

    assert [weight_only.tile_vectors(get(t), 1536) for t in ("x86-avx512", "x86-avx2", "rpi5")] == [4, 2, 2]
    assert weight_only.tile_vectors(get("x86-avx512"), 48) == 1  # 3 vectors of columns: no wider tile
    rng = np.random.default_rng(0)
    n = 128
    w, x = rng.standard_normal((k, n)).astype("float32"), rng.standard_normal((1, k)).astype("float32")
    dev = tvm.cpu()
    for scheme in weight_only.SCHEMES.values():
        values, scales = weight_only.quantize_weight(w, scheme)
        expected = x @ weight_only.dequantized(values, scales, k, scheme)
        for vectors in (4, 2, 1):
            kernel = weight_only.weight_only_kernel(1, k, n, scheme, vectors).with_attr(
                "global_symbol", "main"
            )
            built = tvm.compile(tvm.IRModule({"main": kernel}), target=get("x86-host").tvm)
            out = tvm.runtime.tensor(np.zeros((1, n), "float32"), dev)
            built["main"](*(tvm.runtime.tensor(a, dev) for a in (x, values, scales)), out)
            np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.slow
def test_an_uploaded_causal_lm_is_timed_as_it_generates_and_its_page_draws_it(client, tiny_lm):
    with open(tiny_lm, "rb") as f:
        job = client.post(
            "/api/jobs", data={"model": (f, "tiny-llama.onnx"), "target": "x86-host"}
        ).get_json()
    result = wait_for_job(client, job["id"])
    assert result["status"] == "done", result["error"]
    assert {s["name"]: s["status"] for s in result["stages"]}["generate"] == "done"
    r = result["results"]
    # the job's other stages ran one decode step: a token after 128 cached ones (no input_shapes needed)
    shapes = {i["name"]: i["shape"] for i in r["model"]["inputs"]}
    assert shapes["input_ids"] == [1, 1] and shapes["past_key_values.0.key"] == [1, 2, 128, 16]
    # its grouped-query attention takes the 2 query heads of a group as rows against the group's keys,
    # read transposed where they are (passes/grouped_attention.py): no repeated copy of the cache
    assert any("grouped_scores" in k["name"] for k in r["kernels"]), [k["name"] for k in r["kernels"]]
    assert not any("broadcast_to" in k["name"] for k in r["kernels"])
    g = r["generation"]
    assert [(p["phase"], p["tokens"], p["past"]) for p in g["points"]] == [
        *(("prefill", n, 0) for n in generation.PREFILL_TOKENS),
        *(("decode", 1, n) for n in generation.DECODE_CONTEXT),
    ]
    assert g["runtimes"] == ["tvm", "onnxruntime"]  # an upload has no PyTorch model
    for p in g["points"]:  # TVM computes ONNX Runtime's logits at every length it was built for
        assert p["logits_sqnr_db"] > 80, p
    # TVM in float at every point, and with its weights quantized at the decode points
    assert g["variants"] == ["fp32", *weight_only.SCHEMES]
    decode = [p for p in g["points"] if p["phase"] == "decode"]
    assert len(g["rows"]) == 2 * len(g["points"]) + len(weight_only.SCHEMES) * len(decode)
    for p in decode:
        v = p["variants"]
        assert v["fp32"]["model_bytes"] == g["weight_bytes"] and v["fp32"]["logits_sqnr_db"] is None
        # the logits against float: int8 above 30 dB SQNR, int4 above 10 (random weights, 2 layers)
        assert v["int8-g128"]["logits_sqnr_db"] > 30 and v["int4-g32"]["logits_sqnr_db"] > 10, v
        assert (
            v["int4-g32"]["logits_sqnr_db"] > v["int4-g128"]["logits_sqnr_db"] - 1
        )  # smaller groups, no worse
        # the matmuls' weights read a token: a quarter of float's in int8, an eighth in int4, and the scales
        # (a tenth more here: a group for each 64 values)
        floats = v["fp32"]["streamed_bytes"]
        assert floats / 4 < v["int8-g128"]["streamed_bytes"] < floats / 4 * 1.1
        assert floats / 8 < v["int4-g32"]["streamed_bytes"] < v["int8-g128"]["streamed_bytes"]
        assert v["int4-g128"]["streamed_bytes"] < v["int4-g32"]["streamed_bytes"]
    assert g["bandwidth"]["read_gb_s"] > 0.5 and g["bandwidth"]["triad_gb_s"] > 0.5
    assert g["weight_bytes"] == sum(to_array(t).nbytes for t in onnx.load(str(tiny_lm)).graph.initializer)
    for row in g["rows"]:
        if row["phase"] == "decode" and row["variant"] == "fp32":
            assert row["tokens_per_s"] == pytest.approx(1000 / row["median_ms"], rel=1e-3)
            cache = 2 * 2 * 2 * row["past"] * 16 * 4  # layers, key and value, heads, tokens, size, bytes
            # the matmuls' weights (not the embedding table, of which a step reads one row) and the cache
            floats = next(p for p in decode if p["past"] == row["past"])["variants"]["fp32"]["streamed_bytes"]
            assert floats == 4 * (2 * (64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3) + 64 * 256)
            assert row["bytes_per_token"] == floats + cache
            assert row["bound_share"] == pytest.approx(
                row["bytes_per_token"] / (g["bandwidth"]["read_gb_s"] * 1e9) / (row["median_ms"] / 1e3),
                abs=6e-4,  # stated to 3 decimals
            )
        elif row["phase"] == "prefill":
            assert row["ttft_ms"] == row["median_ms"]
    # greedy decoding with the decode build of 128 cached tokens: TVM fp32 chooses ONNX Runtime's tokens
    greedy = next(p["greedy"] for p in decode if p["past"] == 128)
    assert len(greedy["prompt"]) == 8 and len(greedy["tokens"]["onnxruntime"]) == 64
    assert greedy["agreement"]["fp32"] == {"same_share": 1.0, "first_difference": None}
    assert set(greedy["agreement"]) == set(g["variants"])
    html = client.get(f"/r/{job['id']}").get_data(as_text=True)
    section = html[html.index('id="generation"') :]
    section = section[: section.index("</section>")]
    assert 'id="generation-decode"' in section and 'id="generation-prefill"' in section
    lines = re.findall(r'<polyline points="[\d., ]+" class="line ([\w -]+)"', section)
    assert sorted(lines) == sorted(
        ["tvm", "onnxruntime"] * 2 + ["bound"] + [f"tvm q-{v}" for v in weight_only.SCHEMES]
    )
    assert section.count('<tr class="variant">') == 4
    assert section.count('<tr class="prefill">') == 3 and section.count('<tr class="decode">') == 3
    assert f"{g['bandwidth']['read_gb_s']} GB/s" in section
    assert "the same token at 100% of the steps" in section
    # an upload has no Hugging Face checkpoint for ONNX Runtime GenAI's builder: the page says so
    assert "checkpoint" in g["genai"]["why_not"] and "ONNX Runtime GenAI is not run" in section
    genai_drawn(client.application, r, lm_inputs.onnx_signature(tiny_lm))
    generated_on_its_page(client, job["id"], g)


@pytest.mark.slow
def test_an_uploaded_pt2_generator_is_timed_through_its_onnx_form_and_generates_on_its_page(
    client, tiny_lm_pt2
):
    with open(tiny_lm_pt2, "rb") as f:
        job = client.post("/api/jobs", data={"model": (f, "tiny-llama.pt2"), "target": "x86-host"}).get_json()
    result = wait_for_job(client, job["id"])
    assert result["status"] == "done", result["error"]
    assert {s["name"]: s["status"] for s in result["stages"]}["generate"] == "done"
    r = result["results"]
    # the job's other stages ran one decode step of the .pt2 itself (no input_shapes needed), TVM against
    # PyTorch running the program (its cache argument a list, fed flat)
    shapes = {i["name"]: i["shape"] for i in r["model"]["inputs"]}
    assert shapes["input_ids"] == [1, 1] and shapes["attention_mask"] == [1, 129]
    assert shapes["cache_3"] == [1, 2, 128, 16]
    assert {row["runtime"] for row in r["benchmarks"]} >= {"tvm", "pytorch"}, r.get("unavailable")
    g = r["generation"]
    assert "torch.onnx.export" in g["builds"] and g["generate"]["model"] == "generator/generator.onnx"
    assert g["runtimes"] == ["tvm", "onnxruntime"]
    assert len(g["points"]) == len(generation.POINTS) and not [p for p in g["points"] if "error" in p]
    for p in g["points"]:  # TVM computes ONNX Runtime's logits at every length
        assert p["logits_sqnr_db"] > 80, p
    decode = next(p for p in g["points"] if p["phase"] == "decode")["variants"]
    assert decode["int4-g32"]["streamed_bytes"] < decode["fp32"]["streamed_bytes"] / 4  # matmuls quantized
    html = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert "written as ONNX by torch.onnx.export" in html
    generated_on_its_page(client, job["id"], g)


def wait_for_run(client, api_url: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(urlparse(api_url).path).get_json()
        if run["status"] in ("done", "failed"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"the run did not finish in {timeout} s: {run}")


def generated_on_its_page(client, job_id: str, g: dict) -> None:
    """The decode builds the job kept generate from a prompt of token ids, then of text with a
    tokenizer.json: each runtime greedily, the tokens Hugging Face's own generate() chooses."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    kept = g["generate"]
    assert kept["slots"] == 128 and set(kept["libraries"]) == set(g["variants"])
    assert kept["vocabulary"] == 256
    html = client.get(f"/r/{job_id}").get_data(as_text=True)
    assert f'action="/r/{job_id}/generate"' in html and 'max="127"' in html
    prompt = [5, 17, 200, 3]
    posted = client.post(f"/api/jobs/{job_id}/generate", data={"prompt": "5 17, 200 3", "new_tokens": "12"})
    assert posted.status_code == 202, posted.get_data(as_text=True)
    run = wait_for_run(client, posted.get_json()["api_url"])
    assert run["status"] == "done", run
    rows = {row["runtime"]: row for row in run["runtimes"]}
    assert set(rows) == {f"TVM {v}" for v in g["variants"]} | {"onnxruntime"}
    with torch.no_grad():  # the uploaded model's own weights (tiny_llama is seeded), decoded by transformers
        expected = tiny_llama().generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert rows["onnxruntime"]["tokens"] == expected[0, len(prompt) :].tolist()
    assert rows["TVM fp32"]["tokens"] == rows["onnxruntime"]["tokens"]
    fp32 = rows["TVM fp32"]
    assert fp32["against"] == {"reference": "onnxruntime", "same_share": 1.0, "first_difference": None}
    assert rows["TVM int4-g32"]["against"]["reference"] == "TVM fp32"
    assert len(fp32["step_ms"]) == 11 and fp32["first_token_ms"] > 0 and fp32["median_ms"] > 0
    assert fp32["tokens_per_s"] == pytest.approx(1000 / fp32["median_ms"], rel=1e-2)
    page = client.get(urlparse(posted.get_json()["url"]).path).get_data(as_text=True)
    assert page.count('class="generated"') == len(rows) and "<code>5 17 200 3</code>" in page
    chips = re.findall(r'<span class="tok">(\d+)<small>([\d.]+)</small></span>', page)
    assert [int(t) for t, _ in chips[: len(fp32["tokens"])]] == fp32["tokens"]
    # text, with a word-level tokenizer of the model's 256 words: the same prompt, its tokens as words
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    data = {"prompt": "w5 w17 w200 w3", "new_tokens": "12"}
    data["tokenizer"] = (io.BytesIO(tokenizer.to_str().encode()), "tokenizer.json")
    posted = client.post(f"/api/jobs/{job_id}/generate", data=data)
    run = wait_for_run(client, posted.get_json()["api_url"])
    assert run["prompt"] == prompt and run["prompt_text"] == "w5 w17 w200 w3", run
    words = " ".join(f"w{t}" for t in rows["onnxruntime"]["tokens"])
    assert {row["runtime"]: row["text"] for row in run["runtimes"]}["TVM fp32"] == words
    # what cannot run says why: words without a tokenizer, too many tokens, a token past the vocabulary
    said = client.post(f"/r/{job_id}/generate", data={"prompt": "hello", "new_tokens": "4"})
    assert said.status_code == 400 and "tokenizer.json" in said.get_data(as_text=True)
    said = client.post(f"/api/jobs/{job_id}/generate", data={"prompt": "1 2", "new_tokens": "128"})
    assert said.status_code == 400 and "1 to 127 new tokens" in json.dumps(said.get_json())
    posted = client.post(f"/api/jobs/{job_id}/generate", data={"prompt": "1 256", "new_tokens": "4"})
    run = wait_for_run(client, posted.get_json()["api_url"])
    assert run["status"] == "failed" and "Token 256 is outside the model's vocabulary of 256" in run["error"]


def genai_drawn(app, r: dict, sig) -> None:
    """The page of an example's job, whose rows have ONNX Runtime GenAI's (float and int4): here its rows
    are ONNX Runtime's times, and half of them for int4, through the stage's rates()."""
    from tests.test_pages import write_job

    g = r["generation"]
    kept = ("runtime", "variant", "phase", "tokens", "past", "median_ms", "p90_ms", "runs", "streamed_bytes")
    timed = [{k: v for k, v in row.items() if k in kept} for row in g["rows"]]
    ort = [row for row in timed if row["runtime"] == "onnxruntime"]
    genai_rows = [row | {"runtime": "onnxruntime-genai", "streamed_bytes": 4000} for row in ort] + [
        row
        | {"runtime": "onnxruntime-genai", "variant": "int4-g32", "median_ms": row["median_ms"] / 2}
        | {"streamed_bytes": 600}
        for row in ort
        if row["phase"] == "decode"
    ]
    rows = generation.rates(timed + genai_rows, g["points"], sig, g["bandwidth"]["read_gb_s"])
    about = {v: {"model_bytes": 9e6, "streamed_bytes": b} for v, b in (("fp32", 4000), ("int4-g32", 600))}
    g = g | {"rows": rows, "runtimes": ["tvm", "onnxruntime", "onnxruntime-genai"]}
    g["genai"] = {"build_s": 12.5, "variants": about}
    job_id = write_job(app, r | {"generation": g}, options={"example": "llama", "target": "x86-host"})
    html = app.test_client().get(f"/r/{job_id}").get_data(as_text=True)
    section = html[html.index('id="generation"') :]
    section = section[: section.index("</section>")]
    lines = re.findall(r'<polyline points="[\d., ]+" class="line ([\w -]+)"', section)
    assert lines.count("onnxruntime-genai") == 2 and lines.count("onnxruntime-genai q-int4-g32") == 1
    assert section.count('<tr class="variant genai">') == 1 and "built in 12.5 s" in section
    tvm_int4 = [row for row in rows if row["runtime"] == "tvm" and row["variant"] == "int4-g32"]
    said = ", ".join(
        f"<strong>{row['speedup_vs_onnxruntime_genai']:.2f}×</strong> at cache {row['past']}"
        for row in tvm_int4
    )
    assert said in section


def test_onnxruntime_genai_builds_a_checkpoint_in_float_and_int4_and_runs_each_point(tmp_path):
    """ONNX Runtime GenAI's builder makes its models of the Hugging Face checkpoint: its float model
    gives the checkpoint's logits, its int4 one streams under a sixth of the float bytes, and a runner of
    each point (a prompt on an empty cache; one token after a cache of 64, rewound between calls) runs
    again and again."""
    import numpy as np
    import onnxruntime_genai as og

    from webapp.pipeline.stages import genai

    model = tiny_llama()
    folders = genai.build(model, tmp_path, threads=1)
    assert set(folders) == {"fp32", "int4-g32"} and not (tmp_path / "checkpoint").exists()
    assert genai.streamed_bytes(folders["int4-g32"]) < genai.streamed_bytes(folders["fp32"]) / 6
    models = genai.load(folders)
    prompt = np.arange(3, 11, dtype=np.int32)
    params = og.GeneratorParams(models["fp32"])
    params.set_search_options(max_length=16)
    generator = og.Generator(models["fp32"], params)
    generator.append_tokens(prompt)
    with torch.no_grad():
        expected = model(torch.from_numpy(prompt[None].astype(np.int64))).logits[0, -1].numpy()
    np.testing.assert_allclose(np.asarray(generator.get_logits()).reshape(-1), expected, atol=1e-4)
    for variant in folders:
        for tokens, past in ((16, 0), (1, 64)):
            run = genai.runner(models[variant], tokens, past, vocabulary=256)
            run()
            run()

"""What the result page states beyond the raw measurements (speedups, the reason for no speedup, the
worst layer, sweep rows, records used, the board a job ran on), computed once from the results and
stored in result.json, so that the page and its JSON twin say the same thing. Plain Python: no TVM.

`derive` works on partial results (the runner calls it after each stage): a summary appears once the
measurements it rests on exist. It reads only the pipeline's own keys, never its own output, so
calling it again on its result changes nothing.
"""

from __future__ import annotations

from statistics import median
from typing import Any, cast

from webapp.naming import natural_key, speed_words
from webapp.pipeline.reports import lint

# Below this speedup a quantized build is "no faster" than fp32, and the page says why.
NO_SPEEDUP_BELOW = 1.1
DOT_PRODUCT_INSTRUCTIONS = ("vpdpbusd", "sdot", "smmla", "IDP.4A")  # IDP.4A: CUDA dp4a, in the SASS
EMULATED_NOTE = (
    "Emulated under QEMU, which translates every Arm instruction into x86 ones: these times compare "
    "fp32 with the quantized build on the same board, run for run; they are not predictions of a real "
    "Raspberry Pi's times."
)


# a fidelity row's fields as a board job's facts repeat them
FIDELITY_FIELDS = ("variant", "tuned", "reference", "max_abs_err", "cosine", "sqnr_db", "error", "degenerate")


def derive(results: dict) -> dict:
    """Keys to merge into result.json at the end of the job (and after each stage, from what is known)."""
    facts: dict[str, dict | None] = {}
    if results.get("benchmarks"):
        facts["benchmark_summary"] = benchmark_summary(results)
    if results.get("quantization"):
        facts["quantization_summary"] = quantization_summary(results)
    if results.get("sweep"):
        facts["sweep_summary"] = sweep_summary(results)
    if results.get("tuning"):
        facts["tuning_summary"] = tuning_summary(results)
    if results.get("kernels"):
        facts["kernel_summary"] = kernel_summary(results)
        facts["lint"] = lint.summary(results)
    if results.get("device"):
        facts["device_summary"] = device_summary(results, facts.get("quantization_summary"))
    if results.get("target"):
        facts["headline"] = headline(results, facts)
    return facts


def tvm_row(results: dict, variant: str, tuned: bool) -> dict | None:
    return next(
        (
            b
            for b in results.get("benchmarks", [])
            if b["runtime"] == "tvm"
            and b["variant"] == variant
            and b["tuned"] == tuned
            and b.get("median_ms")
        ),
        None,
    )


def tvm_ms(results: dict, variant: str, tuned: bool) -> float | None:
    row = tvm_row(results, variant, tuned)
    return row["median_ms"] if row else None


def paired_ratio(num: dict, den: dict) -> dict:
    """num's time over den's from the rounds in which the two were timed side by side (stages/timing.py:
    round i of each within the same second or two, so a slow spell of the machine falls on both): the
    median of the rounds' ratios, and the lowest and highest of them; for rows without rounds alike (a
    board's, a result from before rounds), the ratio of their medians alone."""
    a, b = num.get("rounds_ms") or [], den.get("rounds_ms") or []
    if a and len(a) == len(b) and all(b):
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        return {"ratio": median(ratios), "low": min(ratios), "high": max(ratios), "rounds": len(ratios)}
    return {"ratio": num["median_ms"] / den["median_ms"], "low": None, "high": None, "rounds": 0}


def uncertainty(results: dict, pair: dict, subject: str, other: str) -> dict | None:
    """Where the timing was disturbed every time it was timed (stages/timing.py: measure_watched), how
    uncertain a ratio from it is: half the range of its rounds' ratios, as a share of it, and the words
    the headline says it in; None for an undisturbed timing."""
    conditions = results.get("conditions") or {}
    if not conditions.get("disturbed"):
        return None
    times = len(conditions.get("timings") or []) or 1
    why = f"timed {times} time{'s' if times != 1 else ''}, never undisturbed ({conditions['disturbed']})"
    if pair["low"] is None:
        return {"plus_minus": None, "text": f"Uncertain: {why}"}
    plus_minus = (pair["high"] - pair["low"]) / 2 / pair["ratio"]
    return {
        "plus_minus": plus_minus,
        "text": f"Uncertain by ±{plus_minus:.0%}: {why}; its {pair['rounds']} rounds put {subject} at "
        f"{pair['low']:.2f}× to {pair['high']:.2f}× {other}'s speed",
    }


def benchmark_summary(results: dict) -> dict:
    """The fastest run, each run's time against it (rows in the order of `benchmarks`), and what the
    tuning records gained over the default rules."""
    rows = [b for b in results["benchmarks"] if b.get("median_ms")]
    fastest = min(rows, key=lambda b: b["median_ms"]) if rows else None
    untuned, tuned = tvm_ms(results, "fp32", False), tvm_ms(results, "fp32", True)
    return {
        "fastest": {k: fastest[k] for k in ("runtime", "variant", "tuned", "median_ms")} if fastest else None,
        "rows": [
            {
                "runtime": b["runtime"],
                "variant": b["variant"],
                "tuned": b["tuned"],
                "median_ms": b.get("median_ms"),
                "vs_fastest": b["median_ms"] / fastest["median_ms"]
                if b.get("median_ms") and fastest
                else None,
            }
            for b in results["benchmarks"]
        ],
        # TVM fp32 on the default rules alone / with the tuning records: > 1 when the records help
        "tuned_speedup": untuned / tuned if untuned and tuned else None,
    }


# what a quantized build pays besides its arithmetic, said by each why_no_speedup line for a target
# without a dot product
CONVERSIONS = (
    "the conversions of activations to 8 bits and back around the layers that stay in float cost as much "
    "again on a small model"
)


def why_no_speedup(results: dict, variant: str, fp32_ms: float, quant_ms: float) -> str:
    """What was measured (the quantized build N times slower than fp32, or about as fast) and why:
    what the generated code multiplies with, as the instruction counts of the assembly show."""
    ratio = quant_ms / fp32_ms
    measured = (
        f"{variant} took {quant_ms:.3g} ms against fp32's {fp32_ms:.3g} ms, {ratio:.2f}× as long"
        if ratio > 1.05
        else f"{variant} took {quant_ms:.3g} ms against fp32's {fp32_ms:.3g} ms, about as long"
    )
    instructions = results.get("instructions") or {}
    pairs = instructions.get("vpmaddubsw", 0)
    if pairs and not any(instructions.get(name, 0) for name in DOT_PRODUCT_INSTRUCTIONS):
        return (
            f"{measured}. This target has no integer dot-product instruction (AVX-512 VNNI vpdpbusd): "
            f"its int8 kernels multiply 8-bit pairs with vpmaddubsw ({pairs} in the assembly), then add "
            "them with vpmaddwd and an add, three instructions where vpdpbusd takes one, with the weights' "
            f"step coarser where a pair of them could pass vpmaddubsw's 16-bit sum; {CONVERSIONS}"
        )
    widening = instructions.get("smull", 0)
    if widening and instructions.get("sadalp", 0) and not instructions.get("sdot", 0):
        return (
            f"{measured}. This Arm core has no dot product (sdot): its int8 kernels multiply with smull "
            f"({widening} in the assembly) and smlal, 8 products into 16 bits each, then add pairs of "
            "those into 32 bits with sadalp: three instructions for 16 multiply-adds where sdot takes one "
            f"and float FMAs four; {CONVERSIONS}"
        )
    if not any(instructions.get(name, 0) for name in DOT_PRODUCT_INSTRUCTIONS):
        widened = instructions.get("vpmaddwd", 0) + instructions.get("vpmaddubsw", 0)
        how = (
            f" ({widened} vpmaddwd / vpmaddubsw in the assembly: 16-bit products, then added in pairs)"
            if widened
            else ""
        )
        return (
            f"{measured}. The generated code has no integer dot-product instruction (vpdpbusd / sdot / "
            f"dp4a): this target lacks AVX-512 VNNI or Arm dot product, so the 8-bit values are widened "
            f"before they are multiplied{how}, which takes more instructions per multiply-add than the "
            "float kernels' FMAs, on top of converting activations to 8 bits and back"
        )
    return (
        f"{measured}. The integer kernels use the dot-product instruction, but this model is small: "
        "converting activations to 8 bits and back around the layers that stay in float costs about "
        "as much as the arithmetic saved (the kernel table under Code shows which kernels are integer)"
    )


def worst_layer(layer_errors: list[dict]) -> dict | None:
    """The layer where the SQNR against fp32 falls the most from the layer before it (the errors
    accumulate layer after layer), or None when it never falls. The first layer is compared with
    nothing, and so is a layer after an exact one (its SQNR is infinite, stored as null)."""
    worst, previous = None, None
    for row in layer_errors:
        sqnr = row.get("sqnr_db")
        if sqnr is not None and previous is not None and sqnr < previous:
            drop = previous - sqnr
            if worst is None or drop > worst["drop_db"]:
                worst = {"layer": row["layer"], "from_db": previous, "to_db": sqnr, "drop_db": drop}
        previous = sqnr
    return worst


def layer_slower(row: dict, variant: str) -> dict:
    """One layer the quantized variant made slower (a row of quantization.layer_speed): its times, and
    why from what its two kernels are (`why`, the same for every layer of a form)."""
    timed = (
        f"{row['quant_ms'] * 1e3:.1f} µs in {variant} against {row['fp32_ms'] * 1e3:.1f} µs in float, "
        f"{row['ratio']:.2f}× as long"
    )
    if row["form"] in ("depthwise conv2d", "grouped conv2d"):
        why = (
            f"a {row['form']} sums its products within a channel (or a few), where no dot-product or "
            f"pair-multiply instruction applies, so its integer kernel ({row['quant_schedule']}) widens the "
            "8-bit values before it multiplies them: more instructions per multiply-add than the float "
            "kernel's FMAs"
        )
    else:
        why = f"its integer kernel is {row['quant_schedule']}, the float one {row['fp32_schedule']}"
    return {"layer": row["layer"], "form": row["form"], "timed": timed, "why": why}


# Why the build did not try the layers that were slower in float (layer_speed's "not_tried")
NOT_TRIED: dict[str | None, str] = {
    "all_slower": (
        "no layer was faster quantized: the build keeps them quantized, as asked; the float build is "
        "model-fp32.so, timed against this one above"
    ),
    "sweep": "a sweep compares each bit-width whole, so none of its variants keeps a layer in float",
    "prequantized": "the model came quantized by another tool, and its layers run as it quantized them",
    "layer_precision": "the job sets each layer's precision (layer_precision), and the build keeps it",
    "board": (
        "the build is made before the board is reached (its sandbox has no way to the device pool), so "
        "it cannot try them in float and time that on the board"
    ),
}
# How a layer's kernels were timed (layer_speed's "method")
TIMED_HOW = {
    "profile": "within whole-model runs of both builds",
    "alone": "alone, on random inputs of its shapes (time_evaluator), in both builds",
}


def layer_speed_summary(speed: dict, variant: str) -> dict:
    """The layers the quantized variant made slower, each with why, and what the build did with them."""
    fallback = speed.get("fallback") or {}
    slower = [layer_slower(row, variant) for row in speed.get("slower", [])]
    return {
        "device": speed.get("device"),
        "how": TIMED_HOW[speed.get("method", "profile")],
        "timed": speed.get("timed", 0),
        "quantized_layers": speed.get("quantized_layers", 0),
        "slower": slower,
        # each reason once, with the layers it explains
        "reasons": [
            {"why": why, "layers": [s["layer"] for s in slower if s["why"] == why]}
            for why in dict.fromkeys(s["why"] for s in slower)
        ],
        "kept_float": bool(fallback.get("kept")),
        "not_tried": NOT_TRIED.get(speed.get("not_tried")),
        "quant_ms": fallback.get("quant_ms"),
        "mixed_ms": fallback.get("mixed_ms"),
        "min_gain": fallback.get("min_gain"),
        "error": speed.get("error"),
    }


def quantization_summary(results: dict) -> dict:
    """The speedup over TVM fp32 (or why there is none), the accuracy change, and the worst layer."""
    q = results["quantization"]
    variant = q["variant"]
    fp32, quant = tvm_row(results, "fp32", False), tvm_row(results, variant, False)
    fp32_ms, quant_ms = fp32 and fp32["median_ms"], quant and quant["median_ms"]
    pair = paired_ratio(fp32, quant) if fp32 and quant else None
    speedup = pair["ratio"] if pair else None
    accuracy = {a["variant"]: a["top1"] for a in results.get("accuracy", []) if not a["tuned"]}
    fp32_top1, quant_top1 = accuracy.get("fp32"), accuracy.get(variant)
    errors = q.get("layer_errors") or []
    return {
        "variant": variant,
        "fp32_ms": fp32_ms,
        "quant_ms": quant_ms,
        "speedup": speedup,  # fp32's time over the quantized build's, of rounds timed side by side
        "uncertain": uncertainty(results, pair, variant, "TVM fp32") if pair else None,
        "why_no_speedup": why_no_speedup(results, variant, cast(float, fp32_ms), cast(float, quant_ms))
        if speedup is not None and speedup < NO_SPEEDUP_BELOW
        else None,
        "fp32_top1": fp32_top1,
        "quant_top1": quant_top1,
        "top1_change_points": 100 * (quant_top1 - fp32_top1)
        if fp32_top1 is not None and quant_top1 is not None
        else None,
        "worst_layer": worst_layer(errors),
        "layer_speed": layer_speed_summary(q["layer_speed"], variant) if q.get("layer_speed") else None,
        # how many layer-to-layer steps had an SQNR on both sides (0: nothing to say about growth)
        "layer_steps_compared": sum(
            1
            for a, b in zip(errors, errors[1:], strict=False)
            if a.get("sqnr_db") is not None and b.get("sqnr_db") is not None
        ),
    }


def sweep_summary(results: dict) -> dict:
    """The bits sweep: one row per build (fp32 first, then each quantized variant, failed ones with
    their stage and message) and the points of the two charts against bits."""
    sweep = results["sweep"]
    ms = {
        b["variant"]: b["median_ms"]
        for b in results.get("benchmarks", [])
        if b["runtime"] == "tvm" and not b["tuned"]
    }
    fid = {f["variant"]: f for f in results.get("fidelity", []) if f["reference"] == "tvm fp32"}
    accuracy = {a["variant"]: a for a in results.get("accuracy", []) if not a["tuned"]}
    rows: list[dict[str, Any]] = [
        {"variant": "fp32", "bits": 32, "calibration": "", "status": "done", "mode": "float32"}
    ]
    rows += [dict(v) for v in sweep.get("variants", [])]
    rows += [
        {**f, "bits": None, "calibration": "", "status": "failed", "mode": ""}
        for f in sweep.get("failed", [])
    ]
    for row in rows:
        variant = row["variant"]
        row["ms"] = ms.get(variant)
        row["speedup"] = ms["fp32"] / row["ms"] if row["ms"] and ms.get("fp32") else None
        f = fid.get(variant, {})
        row["sqnr_db"], row["cosine"] = f.get("sqnr_db"), f.get("cosine")
        a = accuracy.get(variant, {})
        row["top1"] = a.get("top1")
        # Agreement with fp32's top-1 class only where it was measured on many inputs (the held-out
        # images); on the one benchmark input it is 0% or 100% and says nothing.
        if a.get("agree_fp32") is not None:
            row["top1_agree"], row["agree_inputs"] = a["agree_fp32"], a.get("images")
        elif (f.get("top1_inputs") or 0) > 1:
            row["top1_agree"], row["agree_inputs"] = f["top1_agree"], f["top1_inputs"]
        else:
            row["top1_agree"], row["agree_inputs"] = None, None
    # The charts: one point per bit-width (the job's calibration), fp32 drawn at "32".
    by_bits = [
        r for r in rows if r["status"] == "done" and r["variant"] in ("fp32", f"int{r['bits']}") and r["ms"]
    ]
    with_accuracy = any(r["top1"] is not None for r in rows)
    quality_key = "top1" if with_accuracy else "sqnr_db"
    return {
        "rows": rows,
        "quality": "top-1 accuracy %" if with_accuracy else "SQNR vs fp32, dB",
        "has_accuracy": with_accuracy,
        "has_agreement": any(r["top1_agree"] is not None for r in rows),
        "points": [
            {
                "label": "fp32" if r["bits"] == 32 else str(r["bits"]),
                "quality": None
                if r[quality_key] is None
                else (100 * r[quality_key] if with_accuracy else r[quality_key]),
                "ms": r["ms"],
            }
            for r in by_bits
        ],
    }


def tuning_summary(results: dict) -> dict:
    """What tuning did: trials, kernels with records (the only rows worth a table), and, where the build
    timed a record against its default rule, both times and which won."""
    t = results["tuning"]

    def faster(c: dict):  # the record beat its rule; results from before "faster" only had "used"
        return c.get("faster", c.get("used"))

    # a kernel's name is the same in the tuning table and in its build's record_choice
    timed = {(c.get("variant", "fp32"), c["kernel"]): c for c in results.get("record_choice") or []}
    rows = []
    for task in t.get("tasks", []):
        if task.get("latency_us") is None:
            continue
        variant = task.get("variant", "fp32")
        choice = timed.get((variant, task["name"]), {})
        rows.append(
            {
                "name": task["name"],
                "variant": variant,
                "calls": task.get("weight"),
                "flop": task.get("flop"),
                "search_us": task["latency_us"],
                "search_gflops": task.get("gflops"),
                "pretuned": task.get("pretuned", False),
                "curve": task.get("curve") or [],  # best µs at each trial count where it improved
                "build_record_us": choice.get("tuned_us"),
                "build_default_us": choice.get("default_us"),
                "faster": faster(choice),
                "used": choice.get("used"),
            }
        )
    rows.sort(key=lambda r: natural_key(r["name"]))
    choice = results.get("record_choice") or []
    return {
        "trials": t.get("trials", 0),
        "budget": t.get("budget"),
        "kernels": t.get("kernels", 0),
        "pretuned": t.get("pretuned", 0),
        "with_record": len(rows),
        "without_record": t.get("kernels", 0) - len(rows),
        "rows": rows,
        "records_timed": len(choice),
        "records_faster": sum(1 for c in choice if faster(c)),
        "records_used": sum(1 for c in choice if c.get("used")),
        "records_lost": [
            {k: c.get(k) for k in ("variant", "kernel", "tuned_us", "default_us")}
            for c in choice
            if not faster(c)
        ],
        "model_checks": results.get("record_check") or [],
    }


def device_summary(results: dict, quantized: dict | None) -> dict:
    """The board of the device pool the builds ran on (a target with a board: the remote stage), its
    fp32 and quantized times, the speedup between them, and the board's outputs against each reference.
    An emulated board's times say how the builds compare, not how fast a real board is."""
    device = results["device"]
    quantized = quantized or {}  # the quantization summary: its times and speedup are the board's
    emulated = bool(device.get("emulated"))
    return {
        "name": device["name"],
        "key": device["key"],
        "emulated": emulated,
        "address": device.get("address"),
        "threads": device.get("threads"),
        "fp32_ms": tvm_ms(results, "fp32", False),
        "variant": quantized.get("variant"),
        "quant_ms": quantized.get("quant_ms"),
        "speedup": quantized.get("speedup"),
        # every fidelity row of a board job is the board's output against a reference
        "fidelity": [
            {
                **{k: f.get(k) for k in FIDELITY_FIELDS},
                "bit_exact": f.get("max_abs_err") == 0,
            }
            for f in results.get("fidelity") or []
        ],
        "note": EMULATED_NOTE if emulated else None,
    }


def kernel_summary(results: dict) -> dict:
    """How many kernels each kind of schedule covers ("tuned", "default rule", "naive"), most first."""
    counts: dict[str, int] = {}
    for k in results["kernels"]:
        kind = str(k.get("schedule", "naive")).split(" (")[0].split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    return {
        "count": len(results["kernels"]),
        "schedules": [[kind, n] for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))],
    }


# ---------------------------------------------------------------- the headline: the page's first lines

RUNTIME_NAMES = {"tvm": "TVM", "onnxruntime": "ONNX Runtime", "pytorch": "PyTorch"}
# A quantized build whose accuracy fell this much sends the reader to its worst layer first
ACCURACY_FELL_POINTS, LOW_SQNR_DB = -1.0, 30.0


def build_name(row: dict) -> str:
    """'TVM int8', 'ONNX Runtime fp32', 'TVM fp32 tuned'."""
    tuned = " tuned" if row.get("tuned") else ""
    return f"{RUNTIME_NAMES.get(row['runtime'], row['runtime'])} {row['variant']}{tuned}"


def speed_line(results: dict) -> dict | None:
    """TVM's fastest build against the fastest other runtime timed on the same device: both times,
    their ratio (peer_over_tvm: above 1, TVM is faster) and the sentence that says it; where no other
    runtime ran on TVM's device (a board: the references run on this server), why not."""
    rows = [b for b in results.get("benchmarks") or [] if b.get("median_ms")]
    ours = [b for b in rows if b["runtime"] == "tvm"]
    if not ours:
        return None
    best = min(ours, key=lambda b: b["median_ms"])
    peers = [b for b in rows if b["runtime"] != "tvm" and b.get("device") == best.get("device")]
    line = {"tvm": build_name(best), "tvm_ms": best["median_ms"], "device": best.get("device")}
    if not peers:
        if results.get("device"):  # a board's job: the references' outputs come from this server
            where = (
                "the other runtimes are not timed on a board (their outputs, made on this server, "
                "check the board's)"
            )
        elif results.get("unavailable_runtimes"):
            names = [RUNTIME_NAMES.get(u["runtime"], u["runtime"]) for u in results["unavailable_runtimes"]]
            where = f"{' and '.join(names)} could not run this model"
        else:
            where = "no other runtime was timed"
        text = f"{line['tvm']} {best['median_ms']:.3g} ms on {best.get('device')}; {where}"
        return line | {"peer": None, "peer_ms": None, "peer_over_tvm": None, "text": text}
    peer = min(peers, key=lambda b: b["median_ms"])
    pair = paired_ratio(peer, best)
    ratio = pair["ratio"]
    verdict = speed_words(ratio)
    text = (
        f"{line['tvm']} {verdict} {build_name(peer)}, the fastest other runtime on {best.get('device')}: "
        f"{best['median_ms']:.3g} ms against {peer['median_ms']:.3g} ms"
    )
    uncertain = uncertainty(results, pair, line["tvm"], build_name(peer))
    return line | {
        "peer": build_name(peer),
        "peer_ms": peer["median_ms"],
        "peer_over_tvm": ratio,
        "uncertain": uncertain,
        "text": f"{text}. {uncertain['text']}" if uncertain else text,
    }


def quantized_line(results: dict, summary: dict | None) -> dict | None:
    """The quantized build against TVM fp32: its speedup and how far its outputs are from fp32's."""
    if not summary or not summary.get("speedup"):
        return None
    variant = summary["variant"]
    sqnr = next(
        (
            f["sqnr_db"]
            for f in results.get("fidelity") or []
            if f["variant"] == variant
            and not f.get("tuned")
            and f["reference"].lower().startswith("tvm fp32")
        ),
        None,
    )
    speedup = summary["speedup"]
    gain = f"{speedup:.2f}× faster than" if speedup >= 1 else f"{1 / speedup:.2f}× slower than"
    parts = [f"{variant} {gain} TVM fp32"]
    if summary.get("top1_change_points") is not None:
        parts.append(f"top-1 accuracy {summary['top1_change_points']:+.1f} points")
    if sqnr is not None:
        parts.append(f"SQNR {sqnr:.1f} dB against fp32")
    uncertain = summary.get("uncertain")
    text = ", ".join(parts) + (f". {uncertain['text']}" if uncertain else "")
    return {"variant": variant, "speedup": speedup, "sqnr_db": sqnr, "uncertain": uncertain, "text": text}


def look_next(results: dict, summary: dict | None, sqnr_db: float | None) -> dict | None:
    """The one thing to look at next: why the quantized build is no faster, where it is; else its
    worst layer, where its accuracy fell; else the kernel that takes the most of a run."""
    summary = summary or {}
    if summary.get("why_no_speedup"):
        return {"section": "quantization", "text": f"why {summary['variant']} is no faster than fp32"}
    change, worst = summary.get("top1_change_points"), summary.get("worst_layer")
    fell = (change is not None and change <= ACCURACY_FELL_POINTS) or (
        sqnr_db is not None and sqnr_db < LOW_SQNR_DB
    )
    if fell and worst:
        return {
            "section": "quantization",
            "layer": worst["layer"],
            "text": f"layer {worst['layer']}, where the {summary['variant']} error grows the most "
            f"(SQNR {worst['from_db']:.1f} → {worst['to_db']:.1f} dB)",
        }
    timed = [k for k in results.get("kernels") or [] if k.get("ms")]
    if not timed:
        return None
    k = max(timed, key=lambda k: k["ms"])
    return {
        "section": "code",
        "kernel": k["name"],
        "text": f"the slowest kernel, {k['name']}: {k['share']:.0%} of a run, "
        f"{k['ms']:.3g} ms a run ({k.get('schedule', 'naive')})",
    }


def headline(results: dict, facts: dict) -> dict:
    """The result page's first lines (and the CLI's): the target by its name and description, TVM
    against the fastest other runtime on the same device, the quantized build's gain, and the one
    thing to look at next; each None until measured."""
    target = results["target"]
    summary = facts.get("quantization_summary")
    quantized = quantized_line(results, summary)
    return {
        "target": {k: target.get(k) for k in ("preset", "title", "description")}
        | {"mcpu": (target.get("tvm") or {}).get("mcpu")},
        "speed": speed_line(results),
        "quantized": quantized,
        "look_next": look_next(results, summary, cast("float | None", quantized and quantized["sqnr_db"])),
    }

"""The benchmark chart of a result page: bars of the median latencies on a labelled axis, as
geometry the template draws (the figures themselves are the result JSON's)."""

from __future__ import annotations

import math


def format_ms(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def format_tick(ms: float) -> str:
    return f"{ms:.6g}"  # 0.30000000000000004 -> 0.3


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks (or decades only over a wide range) covering [lo, hi]."""
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    steps = (1, 2, 5) if len(decades) <= 4 else (1,)
    return [s * 10.0**d for d in decades for s in steps if lo <= s * 10.0**d <= hi * 1.0001]


def linear_ticks(high: float) -> list[float]:
    """About five round ticks from 0 to at least `high`."""
    magnitude = 10 ** math.floor(math.log10(high / 5))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= high / 5)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


CHART_WIDTH = 380  # px of the bar area (the chart is 460 wide: each bar's label above it, its value right)
# A log scale only where the runs differ by more than this factor; otherwise bar lengths compare.
LOG_SCALE_ABOVE = 20


def bench_chart(results: dict) -> dict | None:
    """Bars of the median latencies on a labelled axis (ms), each with its p90 as a line beyond.
    Linear when the runs are within LOG_SCALE_ABOVE of each other, else logarithmic."""
    rows = [r for r in results.get("benchmarks", []) if r.get("median_ms")]
    if not rows:
        return None
    low = min(r["median_ms"] for r in rows)
    high = max(max(r["p90_ms"], r["median_ms"]) for r in rows)
    log = high / low > LOG_SCALE_ABOVE
    if log:
        # the axis starts a step below the fastest run, so that its bar has a length to see
        steps = log_ticks(10 ** math.floor(math.log10(low / 2)), 10 ** math.ceil(math.log10(high)))
        lo = max(t for t in steps if t <= low / 1.5)
        hi = min(t for t in steps if t >= high / 1.0001)
        ticks = log_ticks(lo, hi)

        def x(ms: float) -> float:
            return CHART_WIDTH * math.log10(ms / lo) / math.log10(hi / lo)
    else:
        ticks = linear_ticks(high)
        hi = ticks[-1]

        def x(ms: float) -> float:
            return CHART_WIDTH * ms / hi

    bars = [
        {
            "runtime": r["runtime"],
            "label": f"{r['runtime']} {r['variant']}"
            + (" tuned" if r["tuned"] else " default rules" if r["runtime"] == "tvm" else ""),
            "value": format_ms(r["median_ms"]),
            "median_x": round(x(r["median_ms"]), 1),
            "p90_x": round(x(max(r["p90_ms"], r["median_ms"])), 1),
            "p90": format_ms(r["p90_ms"]),
        }
        for r in rows
    ]
    return {
        "bars": bars,
        "log": log,
        "ticks": [{"x": round(x(t), 1), "label": format_tick(t)} for t in ticks],
    }


RUNTIME_ORDER = ("tvm", "onnxruntime", "onnxruntime-genai", "pytorch", "bound")


def generation_charts(generation: dict) -> list[dict]:
    """Two line charts of a generate stage's rows, as geometry: decode tokens/s against the tokens in
    the cache (with the memory-bandwidth bound as a line of its own), and the time to the first token
    against the prompt's length. x: the points evenly spaced; y: linear from 0. A board's section (one
    point, its table) has none."""
    charts: list[dict] = []
    if generation.get("board"):
        return charts
    for phase, title, x_key, y_key, unit in (
        ("decode", "decode, tokens/s", "past", "tokens_per_s", "tokens in the cache"),
        ("prefill", "time to first token, ms", "tokens", "ttft_ms", "tokens in the prompt"),
    ):
        rows = [r for r in generation.get("rows", []) if r["phase"] == phase]
        if not rows:
            continue
        xs = sorted({r[x_key] for r in rows})
        lines: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            name = r["runtime"] if r.get("variant", "fp32") == "fp32" else f"{r['runtime']} {r['variant']}"
            lines.setdefault(name, []).append((r[x_key], r[y_key]))
            if phase == "decode" and name == "tvm":  # the bound of the float weights
                lines.setdefault("bound", []).append((r[x_key], r["bound_tokens_per_s"]))
        high = linear_ticks(max(y for line in lines.values() for _, y in line))
        top = high[-1]

        def at(x: int, y: float, xs: list = xs, top: float = top) -> tuple[float, float]:
            return round(50 + 250 * xs.index(x) / max(len(xs) - 1, 1), 1), round(160 - 140 * y / top, 1)

        series = [
            {
                "runtime": name,
                "css": name.replace(" ", " q-"),  # "tvm int4-g32": the classes tvm and q-int4-g32
                "points": " ".join(
                    f"{px},{py}" for px, py in (at(x, y) for x, y in sorted(set(lines[name])))
                ),
                "dots": [
                    {"x": at(x, y)[0], "y": at(x, y)[1], "label": f"{y:.4g}"}
                    for x, y in sorted(set(lines[name]))
                ],
            }
            for name in sorted(lines, key=lambda n: (RUNTIME_ORDER.index(n.split()[0]), n))
        ]
        charts.append(
            {
                "id": f"generation-{phase}",
                "title": title,
                "unit": unit,
                "series": series,
                "x_ticks": [{"x": at(x, 0)[0], "label": str(x)} for x in xs],
                "y_ticks": [{"y": at(xs[0], t)[1], "label": format_tick(t)} for t in high],
            }
        )
    return charts


def pareto_chart(search: dict) -> dict | None:
    """The precision search's points (quantization.precision_search) as geometry: x the model's ms
    (linear from 0), y the budget's measure against fp32 (SQNR dB, or top-1 agreement %), the float
    build at the top (its SQNR against itself is infinite), the Pareto front as a line and the budget
    as a dashed one."""
    points = search.get("points") or []
    if len(points) < 2:
        return None
    top1 = search["metric"] == "top1_agree"

    def measure(p: dict) -> float | None:
        """None: on top (exact outputs, the float build) or, not comparable, at the bottom (below)."""
        value = p.get(search["metric"])
        return 100 * value if top1 and value is not None else value

    finite = [v for v in map(measure, points) if v is not None]
    budget = 100 * search["least"] if top1 else search["least"]
    ys = linear_ticks(max([*finite, budget]) * 1.05)
    top, right = ys[-1], linear_ticks(max(p["ms"] for p in points))

    def at(ms: float, y: float) -> tuple[float, float]:
        return round(60 + 340 * ms / right[-1], 1), round(190 - 170 * max(y, 0) / top, 1)

    dots: list[dict] = []
    for i, p in enumerate(points):
        y = measure(p)
        x, py = at(p["ms"], y if y is not None else top if p.get("exact") else 0.0)
        label = "fp32" if p["k"] is None else f"{len(p['float_layers'])} float"
        dots.append({"x": x, "y": py, "label": label, "index": i} | {k: p[k] for k in ("pareto", "keeps")})
    # a label written over another would be unreadable: the chosen point's first, then in order; a dot
    # left without one keeps its tooltip
    labelled: list[dict] = []
    for d in sorted(dots, key=lambda d: d["index"] != search["chosen"]):
        d["labelled"] = not any(abs(o["x"] - d["x"]) < 40 and abs(o["y"] - d["y"]) < 12 for o in labelled)
        labelled += [d] if d["labelled"] else []
    front = sorted((d for d in dots if d["pareto"]), key=lambda d: d["x"])
    return {
        "dots": dots,
        "chosen": search["chosen"],
        "front": " ".join(f"{d['x']},{d['y']}" for d in front),
        "budget_y": at(0, budget)[1],
        "budget": search["budget"],
        "y_unit": "top-1 agreement with fp32, %" if top1 else "SQNR against fp32, dB (fp32: exact, on top)",
        "x_unit": ("ms a run, llvm-mca's estimate" if search.get("timed_by") == "llvm-mca" else "ms a run")
        + " (lower is faster)",
        "x_ticks": [{"x": at(t, 0)[0], "label": format_tick(t)} for t in right],
        "y_ticks": [{"y": at(0, t)[1], "label": format_tick(t)} for t in ys],
    }

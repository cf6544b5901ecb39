"""A job's result as the command line prints it (`tvm-playground compile` / `run`): the benchmark table,
the headline, the bisection's verdicts and the precision search's points, each from the result JSON as
the page renders it (nothing computed here that the JSON lacks)."""

from __future__ import annotations


def headline_lines(result: dict) -> str:
    """The result page's headline: TVM against the fastest other runtime, the quantized build's gain,
    what to look at next, the kernel linter's findings (each as the result JSON says it)."""
    h = result.get("headline") or {}
    lines = [h[k]["text"] for k in ("speed", "quantized") if h.get(k)]
    weights = (result.get("model") or {}).get("weights")
    if weights:
        lines.append(f"Weights: {weights['text']}")
    if h.get("look_next"):
        lines.append(f"Look next: {h['look_next']['text']}")
    lint = result.get("lint")
    if lint:  # the kernel linter's count, as the page's headline says it; each finding after it
        by = "; ".join(f"{title}: {n}" for title, n in lint["by_hazard"])
        lines.append(
            f"Kernel linter: {lint['count']} findings in {lint['kernels']} of {lint['checked']} kernels"
            + (f" ({by})" if by else "")
            + (
                f"; {lint['minor']} more on kernels under {lint['counted_share']:.0%} of a run"
                if lint.get("minor")
                else ""
            )
        )
        lines += [f"  {f['kernel']}: {f['title']}: {f['evidence']}" for f in lint["findings"]]
    return "\n".join(f"* {line}" if not line.startswith("  ") else line for line in lines)


def bisection_lines(result: dict) -> str:
    """The bisection section's verdicts, a line each build, and the bindings the first off pass changed."""
    lines = ["Passes bisected:"]
    for b in result["bisection"]:
        ran = f"{len(b['runs'])} of {b['points']} points run in {b['seconds']} s"
        first, tolerance = b.get("first"), b["tolerance_db"]
        if first is None:
            lines.append(f"  {b['variant']}: no step left {b['reference']} by over {tolerance:g} dB ({ran})")
            continue
        sqnr = "-" if first.get("sqnr_db") is None else f"{first['sqnr_db']:.1f} dB"
        lines.append(
            f"  {b['variant']}: first off against {b['reference']}: {first['name']} "
            f"(point {first['index']}), SQNR {sqnr} below {tolerance:g} dB ({ran})"
        )
        for c in b.get("changed", [])[:5]:
            cosine = "-" if c.get("cosine") is None else f"{c['cosine']:.4f}"
            layers, kernel = ", ".join(c["layers"]), c["kernel"] or "no kernel"
            lines.append(f"    {c['binding']} ({kernel}): cosine {cosine}, layers {layers}")
    return "\n".join(lines)


def precision_lines(search: dict) -> str:
    """The precision search's points, a line each, the chosen one marked."""
    if search.get("error"):
        return f"Precision search ({search['budget']}): not run: {search['error']}"
    how = "" if search.get("timed_by") == "llvm-mca" else "timed in turn on "
    lines = [f"Precision search, budget {search['budget']} (points {how}{search['device']}):"]
    for i, p in enumerate(search["points"]):
        what = "fp32" if p["k"] is None else f"{len(p['float_layers'])} layers in float"
        sqnr = "exact" if p["exact"] else "not compared" if p["sqnr_db"] is None else f"{p['sqnr_db']:.1f} dB"
        top1 = "" if p["top1_agree"] is None else f", top-1 {100 * p['top1_agree']:.1f}%"
        lines.append(
            f"  {i}: {what}: {p['ms']:.4g} ms ({p['speedup_vs_fp32']:.2f}x fp32), {sqnr}{top1}, "
            f"{'within' if p['keeps'] else 'outside'} the budget{'  <- chosen' * (i == search['chosen'])}"
        )
    return "\n".join(lines)


def benchmark_table(result: dict) -> str:
    rows = result.get("benchmarks", [])
    if not rows:
        return result.get("not_timed") or "(no benchmark)"
    fastest = min(r["median_ms"] for r in rows)
    lines = [
        f"Benchmark ({result.get('threads')} threads, {rows[0]['device']}"
        + (f", at CPU priority nice {result['nice']}" if result.get("nice") else "")
        + "):",
        f"  {'runtime':<12} {'variant':<8} {'tuned':<6} {'median ms':>10} {'p90 ms':>10} {'runs':>5} "
        f"{'spread':>7} {'vs fastest':>10}",
    ]
    for r in rows:
        spread = "-" if r.get("spread") is None else f"{100 * r['spread']:.1f}%"
        lines.append(
            f"  {r['runtime']:<12} {r['variant']:<8} {'yes' if r['tuned'] else 'no':<6} "
            f"{r['median_ms']:>10.3f} {r['p90_ms']:>10.3f} {r['runs']:>5} {spread:>7} "
            f"{r['median_ms'] / fastest:>9.1f}x"
        )
    machine, conditions, slot = result.get("machine"), result.get("conditions"), result.get("timing_slot")
    if machine:
        sets = ", ".join(machine["instruction_sets"])
        lines.append(f"  measured on {machine['cpu']} ({sets}), {machine['cores']} cores")
    if conditions:
        first = conditions.get("first") if conditions.get("repeated") else None
        again = f"; timed again, the first timing was disturbed: {first['what']}" if first else ""
        lines.append(f"  while it timed: {conditions['what']}{again}")
        timings = conditions.get("timings") or []
        for n, t in enumerate(timings if len(timings) > 1 else [], 1):
            kept = " (kept)" if n == conditions.get("kept") else ""
            lines.append(f"  timing {n}{kept}: {t['disturbed'] or 'undisturbed'}")
    if result.get("fewer_threads"):
        fewer = result["fewer_threads"]
        busy = f"{fewer['busy_cores']} of {fewer['of']} cores were busy"
        lines.append(f"  {busy}: every runtime ran on {fewer['threads']} threads")
    if slot and slot["waited_s"] >= 0.1:
        lines.append(f"  waited {slot['waited_s']:.1f} s for the machine's timing slot (others were timing)")
    tuning = result.get("tuning")
    if tuning:
        lines.append(
            f"  tuning: {tuning['trials']} trials in {tuning['seconds']:.0f} s, {tuning['pretuned']} of "
            f"{tuning['kernels']} kernels already tuned before this job"
            + (" (cancelled)" if tuning["cancelled"] else "")
        )
    device = result.get("device_summary")
    if device:  # the board the builds ran on; the fidelity lines below are its outputs'
        quantized = f"{device['variant']} ms" if device["variant"] else "quantized ms"
        fp32, quant = ("-" if ms is None else f"{ms:.3f}" for ms in (device["fp32_ms"], device["quant_ms"]))
        speedup = f"{device['speedup']:.2f}x" if device["speedup"] else "-"
        lines += [
            f"Device: {device['name']}, key {device['key']}, "
            f"{'emulated' if device['emulated'] else 'real'} board at {device['address']}",
            f"  {'fp32 ms':>10} {quantized:>10} {'speedup':>8}",
            f"  {fp32:>10} {quant:>10} {speedup:>8}",
        ]
        if device["note"]:
            lines.append(f"  {device['note']}")
    for f in result.get("fidelity", []):
        top1 = "n/a" if f.get("top1_agree") is None else f"{100 * f['top1_agree']:.0f}%"
        which = "tuned" if f.get("tuned") else "untuned"
        exact = " (bit-exact)" if f.get("max_abs_err") == 0 else ""
        cosine = "n/a" if f.get("cosine") is None else f"{f['cosine']:.6f}"
        degenerate = f" ({f['degenerate']})" if f.get("degenerate") else ""
        lines.append(
            f"  fidelity of TVM {f['variant']} {which} vs {f['reference']}: max abs err "
            f"{f.get('max_abs_err', 0):.3g}{exact}, cosine {cosine}, top-1 agreement {top1}{degenerate}"
        )
    for a in result.get("accuracy", []):
        lines.append(f"  accuracy of TVM {a['variant']} on {a['dataset']}: top-1 {100 * a['top1']:.2f}%")
    return "\n".join(lines)


def lab_lines(view: dict, show: str = "asm") -> str:
    """A kernel lab build as `tvm-playground lab` prints it: the text asked for (the hot loop of the
    assembly, marked with >), then the time, the check and llvm-mca's figures, or the error and its line."""
    if view["status"] == "failed":
        where = f" at the {view['stage']} stage" if view.get("stage") else ""
        return (
            f"failed{where}" + (f", line {view['line']}" if view.get("line") else "") + f":\n{view['error']}"
        )
    r, text = view["result"], view["texts"].get(show) or ""
    span = r.get("hot_loop") if show == "asm" else None
    lines = [
        (">" if span and span[0] <= i <= span[1] else " ") + " " + line
        for i, line in enumerate(text.splitlines(), 1)
    ]
    out = ["\n".join(lines)] if lines else []
    t, check, mca = r.get("time"), r.get("check") or {}, r.get("mca") or {}
    if t and t.get("ms") is not None:
        runs, threads = t.get("runs") or 0, t.get("threads") or 0
        how = f"measured, median of {runs:.0f} runs" if t["by"] == "measured" else "llvm-mca's estimate"
        out.append(f"time:  {t['ms']:.4g} ms a call ({how}, {threads:.0f} threads)")
    if check.get("why"):
        out.append(f"check: {check['why']}")
    elif check.get("matches") is not None:
        same = f"matches (largest difference {check.get('largest_difference') or 0:.2g})"
        wrong = f"differs from the unscheduled kernel in {', '.join(check.get('wrong') or [])}"
        out.append("check: " + (same if check["matches"] else wrong))
    if mca.get("cycles_per_iteration") is not None:
        ipc = f", IPC {mca['ipc']:g}" if mca.get("ipc") is not None else ""
        out.append(f"llvm-mca: {mca['cycles_per_iteration']:g} cycles a pass of the hot loop{ipc}")
    elif mca.get("why"):
        out.append(f"llvm-mca: {mca['why']}")
    return "\n".join(out)

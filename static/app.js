// Progressive enhancement only: tabs for the two graphs, the graph viewer (below), pan/zoom on other
// pictures, set up on the page and on every section htmx swaps in while a job runs.
document.documentElement.classList.add("js");

function setupTabs(root) {
  root.querySelectorAll(".tabs").forEach((tabs) => {
    if (tabs.dataset.ready) return;
    tabs.dataset.ready = "1";
    const buttons = [...tabs.querySelectorAll("button.tab")];
    buttons.forEach((button, i) => {
      // the keyboard moves between tabs with the arrow keys, Home and End (one tab stop, as ARIA's tabs)
      button.addEventListener("keydown", (e) => {
        const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: buttons.length - 1 }[e.key];
        if (to === undefined) return;
        e.preventDefault();
        const next = buttons[(to + buttons.length) % buttons.length];
        next.focus();
        next.click();
      });
      button.addEventListener("click", () => {
        buttons.forEach((b) => {
          b.classList.toggle("active", b === button);
          b.setAttribute("aria-selected", b === button ? "true" : "false");
          b.tabIndex = b === button ? 0 : -1;
        });
        const section = tabs.parentElement;
        section.querySelectorAll(".tab-panel").forEach((p) => p.classList.toggle("active", p.id === button.dataset.tab));
        const img = section.querySelector("#" + button.dataset.tab + " .panzoom");
        if (img && img.fit) img.fit();
      });
    });
  });
}

const MIN_LABEL_PX = 9, READABLE_PX = 12, ZOOM_STEP = 1.5; // a fitted graph's labels; a click of + or −

// Pan and zoom on an SVG drawn inline (svg-pan-zoom, vendored): wheel and drag, +/−/fit buttons, and
// the view fitted once the picture is shown (a graph in a hidden tab has no size until its tab opens).
// onChange(pz) runs after every pan and zoom; the returned object answers "where is what".
function panZoom(view, svg, onChange = () => {}) {
  const [W, H] = svg.getAttribute("viewBox").split(/[ ,]+/).slice(2).map(Number);
  view.classList.add("inline");
  svg.removeAttribute("width"); svg.removeAttribute("height");
  view.prepend(svg);
  const state = { pz: null, W, H, pending: null };
  const changed = () => state.pz && onChange(state);
  // labels at least MIN_LABEL_PX tall whenever the view is fitted: a graph whose whole would show them
  // smaller opens at READABLE_PX, at its top (its first node in the middle across), to scroll from there
  const fontSize = parseFloat(svg.querySelector("g.node text")?.getAttribute("font-size")) || 14;
  const start = () => {
    if (state.pz || !view.clientWidth) return;
    state.pz = svgPanZoom(svg, {
      zoomEnabled: true, panEnabled: true, mouseWheelZoomEnabled: true, dblClickZoomEnabled: false,
      controlIconsEnabled: false, fit: true, center: true, minZoom: 0.1, maxZoom: 1000, zoomScaleSensitivity: 0.2,
      onPan: changed, onZoom: changed,
    });
    readable();
    changed();
    if (state.pending) { const [gx, gy, z] = state.pending; state.pending = null; state.centre(gx, gy, z); }
  };
  const readable = () => {
    const s = state.pz.getSizes();
    if (fontSize * s.realZoom >= MIN_LABEL_PX) return;
    const z = READABLE_PX / fontSize, first = svg.querySelector("g.node");
    let gx = W / 2;
    if (first) { const r = first.getBoundingClientRect(); gx = state.toGraph((r.left + r.right) / 2, r.top)[0]; }
    state.pz.zoom(state.pz.getZoom() * (z / s.realZoom));
    state.pz.pan({ x: s.width / 2 - gx * z, y: 8 });
  };
  // graph units -> the view's pixels: x * realZoom + pan.x
  state.zoom = () => (state.pz ? state.pz.getSizes().realZoom : 1);
  state.fit = () => { if (!state.pz) return; state.pz.resize(); state.pz.fit(); state.pz.center(); readable(); };
  state.zoomBy = (f) => state.pz?.zoomBy(f);
  state.centre = (gx, gy, realZoom) => { // put graph point (gx, gy) in the middle, at least at realZoom
    start();
    if (!state.pz) { state.pending = [gx, gy, realZoom]; return; }
    const s = state.pz.getSizes(), z = Math.max(s.realZoom, realZoom || 0);
    state.pz.zoom(state.pz.getZoom() * (z / s.realZoom));
    state.pz.pan({ x: s.width / 2 - gx * z, y: s.height / 2 - gy * z });
  };
  state.toGraph = (clientX, clientY) => { // a point on the screen, in graph units
    start();
    const r = svg.getBoundingClientRect(), p = state.pz ? state.pz.getPan() : { x: 0, y: 0 }, z = state.zoom();
    return [(clientX - r.left - p.x) / z, (clientY - r.top - p.y) / z];
  };
  view.fit = state.fit;
  new ResizeObserver(() => {
    if (!view.clientWidth) return;
    if (!state.pz) start(); else { state.pz.resize(); changed(); }
  }).observe(view);
  start();
  const buttons = document.createElement("div");
  buttons.className = "zoom-buttons";
  [["+", () => state.zoomBy(ZOOM_STEP)], ["−", () => state.zoomBy(1 / ZOOM_STEP)], ["fit", state.fit]].forEach(([label, action]) => {
    const b = document.createElement("button"); b.type = "button"; b.textContent = label;
    b.addEventListener("click", action); buttons.appendChild(b);
  });
  view.appendChild(buttons);
  return state;
}

// A picture without the graph viewer (a result from before it): the SVG fetched and inlined.
async function setupPanZoom(view) {
  if (view.dataset.ready) return;
  view.dataset.ready = "1";
  const img = view.querySelector("img");
  try {
    const svg = cleanSvg(await fetch(img.src).then((r) => r.text()));
    if (!svg) return;
    img.remove();
    panZoom(view, svg);
  } catch (e) { /* the picture stays as a plain image */ }
}

function setup(root) {
  setupTabs(root);
  root.querySelectorAll(".panzoom").forEach((view) => { if (!view.closest(".graph-view")) setupPanZoom(view); });
  root.querySelectorAll(".graph-view").forEach(setupGraphView);
  root.querySelectorAll(".code-box").forEach(scrollToHotLoop);
  markScrollable();
}

// A card or table wider than the window scrolls sideways inside itself: the keyboard can reach it (a
// tab stop, named by its heading) to scroll it with the arrow keys. Checked again when the window is
// resized. A table keeps its role (its rows and cells stay a table to a screen reader).
function markScrollable() {
  document.querySelectorAll(".card, table.grid").forEach((box) => {
    const wide = box.scrollWidth > box.clientWidth + 1;
    if (wide && !box.hasAttribute("tabindex")) {
      const card = box.closest(".card");
      box.tabIndex = 0;
      if (box.matches(".card")) box.setAttribute("role", "region");
      box.setAttribute("aria-label", (card?.querySelector("h2")?.textContent || "section").trim() +
        (box.matches("table") ? ", a table that scrolls sideways" : ", scrolls sideways"));
      box.dataset.scrollMarked = "1";
    } else if (!wide && box.dataset.scrollMarked) {
      ["tabindex", "role", "aria-label", "data-scroll-marked"].forEach((a) => box.removeAttribute(a));
    }
  });
}
window.addEventListener("resize", markScrollable);

function scrollToHotLoop(box) { // a kernel's assembly opens at its hot loop (or a linter's line)
  const hot = box.querySelector(".hll");
  // not offsetTop: each line's box (content-visibility) is the marked span's offset parent
  if (hot) box.scrollTop += hot.getBoundingClientRect().top - box.getBoundingClientRect().top - 60;
}
document.addEventListener("click", (e) => {
  if (!e.target.closest("#hot-loop-link")) return;
  e.preventDefault();
  const box = document.querySelector("#code-panel .code-box");
  if (box) { scrollToHotLoop(box); box.scrollIntoView({ block: "nearest" }); }
});

// A code text of many thousand tokens is emptied here at once before the code panel is swapped: htmx's
// own clean-up visits the old panel element by element (an event each), which took 0.7 s.
document.addEventListener("htmx:beforeSwap", (e) => {
  if (e.detail.target?.id === "code-panel") e.detail.target.querySelector("#code-text")?.replaceChildren();
});

if (window.htmx) htmx.onLoad(setup); // the page itself, then each swapped-in section
else document.addEventListener("DOMContentLoaded", () => setup(document));
document.addEventListener("DOMContentLoaded", followAddress);
window.addEventListener("popstate", followAddress);

// ---------------------------------------------------------------- graph viewer
// The graph's SVG (laid out by Graphviz in the job) inlined: pan and zoom on its viewBox, fit in both
// directions, an overview strip, search, colours by time share, and a node's details on click with
// links into the code panel. Every figure shown comes from the job's graph JSON and kernel table.

const SVG_NS = "http://www.w3.org/2000/svg";

function cleanSvg(text) {
  // Graphviz escapes the labels; still, nothing that could run is kept.
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.nodeName !== "svg") return null;
  svg.querySelectorAll("script, foreignObject").forEach((e) => e.remove());
  svg.querySelectorAll("*").forEach((e) => {
    [...e.attributes].forEach((a) => { if (/^on|href$/i.test(a.name)) e.removeAttribute(a.name); });
  });
  return document.importNode(svg, true);
}

function heat(t) { // 0..1 -> pale yellow .. red
  const stops = [[255, 247, 188], [254, 196, 79], [236, 112, 20], [204, 24, 30]];
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function pct(x) { return (100 * x).toFixed(x < 0.001 ? 3 : 1) + "%"; }

function shapeText(t) {
  if (!t) return "";
  if (t.kind === "tensor") return ((t.shape || []).join("×") || "scalar") + " " + t.dtype;
  if (t.kind === "tuple") return "(" + t.fields.map(shapeText).join(", ") + ")";
  return t.text || "";
}

async function setupGraphView(root) {
  if (root.dataset.ready) return;
  root.dataset.ready = "1";
  const view = root.querySelector(".panzoom"), mini = root.querySelector(".minimap");
  const details = root.querySelector(".node-details"), legend = root.querySelector(".legend");
  let svg, graph, svgText;
  try {
    let graphJson;
    [svgText, graphJson] = await Promise.all([
      fetch(root.dataset.svg).then((r) => r.text()), fetch(root.dataset.graph).then((r) => r.json())]);
    svg = cleanSvg(svgText); graph = graphJson;
  } catch (e) { return; } // without the SVG or its JSON: no viewer (the page says how to open the SVG)
  if (!svg) return;
  const kernels = {}; // this view's own kernels (the compare page's two jobs), else the page's
  const kernelData = root.querySelector("script.kernel-data") || document.getElementById("kernel-data");
  JSON.parse(kernelData?.textContent || "[]").forEach((k) => { kernels[k.name] = k; });
  const diff = JSON.parse(root.querySelector("script.diff-data")?.textContent || "null"); // node -> {state, why, match}
  const here = location.pathname === root.dataset.page; // on the job's own page (not the compare page)
  const nodes = {};
  graph.nodes.forEach((n) => { nodes[n.id] = n; });

  view.querySelector("noscript")?.remove();
  // the overview strip draws the same SVG text, fetched once above
  mini.querySelector("img").src = URL.createObjectURL(new Blob([svgText], { type: "image/svg+xml" }));
  const box = mini.querySelector(".viewport");
  const minimap = ({ pz, W, H }) => { // the part of the graph in view, on the overview strip
    const s = pz.getSizes(), p = pz.getPan(), z = s.realZoom;
    const mw = mini.clientWidth, mh = mini.clientHeight, ms = Math.min(mw / W, mh / H);
    box.style.left = (-p.x / z) * ms + (mw - W * ms) / 2 + "px"; box.style.top = (-p.y / z) * ms + "px";
    box.style.width = (s.width / z) * ms + "px"; box.style.height = (s.height / z) * ms + "px";
  };
  const pz = panZoom(view, svg, minimap);
  const show = (id) => { // centre a node (its <g id=...> drawn by Graphviz), at a readable size
    const g = svg.getElementById(id);
    if (!g) return;
    const r = g.getBoundingClientRect();
    const [x0, y0] = pz.toGraph(r.left, r.top), [x1, y1] = pz.toGraph(r.right, r.bottom);
    pz.centre((x0 + x1) / 2, (y0 + y1) / 2, 0.8);
  };

  // a click (not a drag) on a node selects it
  let down = null;
  view.addEventListener("pointerdown", (e) => { down = e.target.closest("button") ? null : [e.clientX, e.clientY]; });
  view.addEventListener("pointerup", (e) => {
    const click = down && Math.abs(e.clientX - down[0]) + Math.abs(e.clientY - down[1]) <= 3;
    down = null;
    if (!click) return;
    const hit = document.elementsFromPoint(e.clientX, e.clientY).map((el) => el.closest && el.closest("g.node")).find(Boolean);
    if (hit && nodes[hit.id]) select(hit.id, false);
  });

  // the keyboard: the graph is one tab stop, its current node (a roving tab index): the arrow keys move
  // to the next or previous node (in the graph's order, top to bottom), Home and End to the first and
  // last, Enter or space opens its details as a click does, + and − zoom, 0 fits; a node that takes the
  // focus out of view is brought into it. The view itself (not a tab stop) pans with the arrows.
  const order = [...svg.querySelectorAll("g.node")].filter((g) => nodes[g.id]);
  order.forEach((g, i) => {
    const n = nodes[g.id];
    g.setAttribute("tabindex", i ? "-1" : "0");
    g.setAttribute("role", "button");
    const drawn = [...g.querySelectorAll("text")].map((t) => t.textContent.trim()).filter(Boolean).join(" ");
    g.setAttribute("aria-label", `${drawn || n.label}: open its details`); // what it shows, then what it does
    g.addEventListener("focus", () => {
      order.forEach((o) => o.setAttribute("tabindex", o === g ? "0" : "-1"));
      const r = g.getBoundingClientRect(), v = view.getBoundingClientRect();
      if (r.left < v.left || r.right > v.right || r.top < v.top || r.bottom > v.bottom) {
        const [x0, y0] = pz.toGraph(r.left, r.top), [x1, y1] = pz.toGraph(r.right, r.bottom);
        pz.centre((x0 + x1) / 2, (y0 + y1) / 2, 0);
      }
    });
    g.addEventListener("keydown", (e) => {
      const to = { ArrowDown: i + 1, ArrowRight: i + 1, ArrowUp: i - 1, ArrowLeft: i - 1, Home: 0, End: order.length - 1 }[e.key];
      if (to !== undefined) {
        e.preventDefault(); e.stopPropagation();
        order[Math.max(0, Math.min(order.length - 1, to))].focus();
        return;
      }
      if (e.key !== "Enter" && e.key !== " ") return;
      e.preventDefault();
      select(g.id, false);
    });
  });
  view.addEventListener("keydown", (e) => {
    if (!pz.pz || e.target.closest("button") || e.altKey || e.ctrlKey || e.metaKey) return;
    const pan = { ArrowLeft: [60, 0], ArrowRight: [-60, 0], ArrowUp: [0, 60], ArrowDown: [0, -60] }[e.key];
    if (pan) pz.pz.panBy({ x: pan[0], y: pan[1] });
    else if (e.key === "+" || e.key === "=") pz.zoomBy(ZOOM_STEP);
    else if (e.key === "-" || e.key === "−") pz.zoomBy(1 / ZOOM_STEP);
    else if (e.key === "0") pz.fit();
    else return;
    e.preventDefault();
  });

  // the overview strip: click or drag to move the view there
  const moveTo = (e) => {
    const r = mini.getBoundingClientRect(), ms = Math.min(r.width / pz.W, r.height / pz.H);
    pz.centre((e.clientX - r.left - (r.width - pz.W * ms) / 2) / ms, (e.clientY - r.top) / ms);
  };
  let miniDrag = false;
  mini.addEventListener("pointerdown", (e) => { miniDrag = true; mini.setPointerCapture(e.pointerId); moveTo(e); });
  mini.addEventListener("pointermove", (e) => { if (miniDrag) moveTo(e); });
  mini.addEventListener("pointerup", () => { miniDrag = false; });

  // search
  const search = root.querySelector(".graph-search"), found = root.querySelector(".graph-found");
  const text = (n) => [n.label, n.var, n.layer, n.kernel, n.module, ...(n.layers || []), ...(n.kernels || [])]
    .filter(Boolean).join(" ").toLowerCase();
  let matches = [], at = -1;
  const find = () => {
    svg.querySelectorAll("g.node.match").forEach((g) => g.classList.remove("match"));
    const q = search.value.trim().toLowerCase();
    matches = q ? graph.nodes.filter((n) => text(n).includes(q)).map((n) => n.id) : [];
    matches.forEach((id) => svg.getElementById(id)?.classList.add("match"));
    at = -1;
    found.textContent = q ? `${matches.length} found` : "";
  };
  const step = (d) => {
    if (!matches.length) return;
    at = (at + d + matches.length) % matches.length;
    found.textContent = `${at + 1} of ${matches.length}`;
    select(matches[at], true);
  };
  search.addEventListener("input", find);
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); step(e.shiftKey ? -1 : 1); } });
  root.querySelector(".graph-next").addEventListener("click", () => step(1));
  root.querySelector(".graph-prev").addEventListener("click", () => step(-1));

  // colours
  const colour = root.querySelector(".graph-colour");
  const sqnrs = graph.nodes.map((n) => n.sqnr_db).filter((v) => v != null);
  const [sqnrLo, sqnrHi] = [Math.min(...sqnrs), Math.max(...sqnrs)];
  // against ONNX Runtime: where they agree exactly (no SQNR) as the best
  const refs = graph.nodes.map((n) => n.ref_sqnr_db).filter((v) => v != null);
  const [refLo, refHi] = refs.length ? [Math.min(...refs), Math.max(...refs)] : [0, 0];
  const heatOf = { // mode -> node -> 0..1 (red is 1), or null (grey)
    share: (n) => (n.share != null ? n.share / Math.max(...graph.nodes.map((x) => x.share || 0), 1e-9) : null),
    sqnr: (n) => (n.sqnr_db != null ? (sqnrHi - n.sqnr_db) / (sqnrHi - sqnrLo || 1) : null),
    ref: (n) => (n.ref_exact ? 0 : n.ref_sqnr_db != null ? (refHi - n.ref_sqnr_db) / (refHi - refLo || 1) : null),
  };
  const css = getComputedStyle(document.documentElement);
  const diffFill = (n) => css.getPropertyValue(`--diff-${diff[n.id]?.state || "none"}`).trim();
  const paint = () => {
    const mode = colour.value, of = heatOf[mode];
    svg.querySelectorAll("g.node").forEach((g) => {
      const n = nodes[g.id], shape = g.querySelector("path, polygon, ellipse");
      if (!n || !shape) return;
      if (!shape.dataset.fill) shape.dataset.fill = shape.getAttribute("fill") || "none";
      const t = of ? of(n) : undefined;
      if (mode === "diff") shape.setAttribute("fill", diffFill(n));
      else shape.setAttribute("fill", !of ? shape.dataset.fill : t == null ? "#f4f4f4" : heat(t));
      if (mode === "diff") g.dataset.diff = diff[n.id]?.state || "";
    });
    legend.hidden = !of;
    if (!of) return;
    legend.innerHTML = "";
    const bar = document.createElement("span"); bar.className = "heat-bar";
    bar.style.background = `linear-gradient(to right, ${[0, 0.33, 0.66, 1].map(heat).join(", ")})`;
    if (mode === "share") {
      const top = Math.max(...graph.nodes.map((x) => x.share || 0));
      legend.append("Share of a run, per kernel call: 0% ", bar, ` ${pct(top)}`,
        " (grey: no kernel time, e.g. inputs or ops folded away)");
    } else if (mode === "ref") {
      legend.append(`SQNR against ONNX Runtime: ${refs.length ? refHi.toFixed(1) : "exact"} dB `, bar,
        ` ${refs.length ? refLo.toFixed(1) : "exact"} dB`, " (red: the largest error; grey: a layer not compared)");
    } else {
      legend.append(`SQNR against fp32: ${sqnrHi.toFixed(1)} dB `, bar, ` ${sqnrLo.toFixed(1)} dB`,
        " (red: the largest error; grey: not a quantized layer)");
    }
  };
  colour.addEventListener("change", paint);
  if (colour.value === "diff") paint();
  root.showWorst = () => {
    const worst = graph.nodes.find((n) => n.worst) ||
      graph.nodes.filter((n) => n.sqnr_db != null).sort((a, b) => a.sqnr_db - b.sqnr_db)[0];
    colour.value = "sqnr"; paint();
    if (worst) select(worst.id, true);
  };
  root.querySelector(".graph-worst")?.addEventListener("click", root.showWorst);
  root.querySelector(".graph-first-off")?.addEventListener("click", () => {
    const first = graph.nodes.find((n) => n.ref_first) ||
      graph.nodes.filter((n) => n.ref_sqnr_db != null).sort((a, b) => a.ref_sqnr_db - b.ref_sqnr_db)[0];
    colour.value = "ref"; paint();
    if (first) select(first.id, true);
  });

  // a node's details
  const page = root.dataset.page, key = root.dataset.key;
  const codeLink = (view, kernel, id) => `${page}?${new URLSearchParams({ view, kernel, graph: key, node: id })}#code`;
  function select(id, centreIt) {
    svg.querySelectorAll("g.node.selected").forEach((g) => g.classList.remove("selected"));
    const g = svg.getElementById(id), n = nodes[id];
    if (!g || !n) return;
    g.classList.add("selected");
    if (centreIt) show(id);
    const kernelName = n.kind === "kernel" ? n.label : n.kernel, k = kernels[kernelName];
    const block = n.kind === "layer";
    const rows = [["kind", block ? "block of the model (folded)" : n.kind], ["var", n.var], ["source layer", n.layer],
      ["module", n.module], ["source layers", (n.layers || []).join(", ")],
      ["operators", n.ops], ["kernels", (n.kernels || []).join(", ")], ["kernel calls, this block", block ? n.calls.length : null],
      ["output", shapeText(n.type)],
      ["weights", (n.weights || []).map(shapeText).join(", ")], ["kernel", kernelName],
      ["schedule", k && k.schedule], ["kernel calls", k && k.calls],
      ["GFLOP per call", k && k.flop ? (k.flop / 1e9).toPrecision(3) : null],
      [block ? "time, this block" : "time, this call", n.ms != null ? `${n.ms.toFixed(4)} ms (${pct(n.share)} of a run)` : null],
      ["dtypes", k && k.dtypes],
      ["SQNR against fp32", n.sqnr_db != null ? `${n.sqnr_db.toFixed(1)} dB${n.worst ? " (where it falls the most)" : ""}` : null],
      ["SQNR against ONNX Runtime", n.ref_exact ? "exact (the same values)" : n.ref_sqnr_db != null
        ? `${n.ref_sqnr_db.toFixed(1)} dB${n.ref_first ? " (the first layer below the tolerance)" : ""}` : null],
      ["B against A", diff?.[id] ? [diff[id].state, ...diff[id].why].join("; ") : null],
      ["matched with", diff?.[id] ? diff[id].match.join(", ") : null]];
    details.hidden = false;
    details.innerHTML = "";
    const h = document.createElement("h3"); h.textContent = n.label; details.appendChild(h);
    const table = document.createElement("table"); table.className = "grid";
    rows.filter(([, v]) => v !== null && v !== undefined && v !== "").forEach(([label, value]) => {
      const tr = table.insertRow(); tr.insertCell().textContent = label; tr.insertCell().textContent = value;
    });
    details.appendChild(table);
    if (k) {
      const p = document.createElement("p"); p.className = "code-links"; p.append("Code of this kernel: ");
      JSON.parse(root.dataset.kernelLinks).forEach(([v, label], i) => {
        const a = document.createElement("a"); a.href = codeLink(v, kernelName, id); a.textContent = label;
        a.dataset.view = v; a.dataset.kernel = kernelName; a.dataset.node = id; a.className = "to-code";
        if (i) p.append(" · "); p.appendChild(a);
      });
      details.appendChild(p);
    }
    const links = [[n.call, "fused", "its kernel call in the fused graph"],
      [block && n.first, "imported", "its operators before fusion (unfolded)"]];
    links.filter(([to]) => to).forEach(([to, graphKey, words]) => {
      const a = document.createElement("a"); a.href = `${page}?graph=${graphKey}&node=${to}#graph`; a.textContent = words;
      a.className = "to-node"; a.dataset.graph = graphKey; a.dataset.node = to;
      const p = document.createElement("p"); p.append("See ", a, "."); details.appendChild(p);
    });
    if (here) history.replaceState(null, "", `${page}?${new URLSearchParams({ graph: key, node: id })}#graph`);
    if (diff) document.dispatchEvent(new CustomEvent("diff-select", { detail: { from: root, match: diff[id]?.match || [] } }));
  }
  // the compare page: a node selected in one graph outlines its matches in the other
  if (diff) document.addEventListener("diff-select", ({ detail }) => {
    if (detail.from === root) return;
    svg.querySelectorAll("g.node.diff-match").forEach((g) => g.classList.remove("diff-match"));
    graph.nodes.filter((n) => detail.match.includes(n.label)).forEach((n) => svg.getElementById(n.id)?.classList.add("diff-match"));
  });
  root.select = (id) => select(id, true);
  root.selectKernel = (kernel) => {
    const n = graph.nodes.find((x) => (x.kind === "kernel" ? x.label : x.kernel) === kernel);
    if (n) select(n.id, true);
  };
  details.addEventListener("click", (e) => {
    const a = e.target.closest("a.to-code, a.to-node");
    if (!a || !window.htmx || !here) return; // from another page, the links open the job's page
    e.preventDefault();
    if (a.classList.contains("to-code")) showCode(root.dataset.code, a.dataset, key, a.getAttribute("href"));
    else goToNode(a.dataset.graph, a.dataset.node);
  });
  root.dispatchEvent(new Event("graph-ready"));
}

function showCode(codeUrl, { view, kernel, node }, graphKey, href) {
  const query = new URLSearchParams({ view, kernel, graph: graphKey, node });
  htmx.ajax("GET", `${codeUrl}?${query}`, { target: "#code-panel", swap: "outerHTML" }).then(() => {
    history.pushState(null, "", href);
    document.getElementById("code")?.scrollIntoView();
  });
}

function goToNode(graphKey, nodeId, kernel, worst) {
  const panel = document.getElementById("graph-" + graphKey);
  if (!panel) return;
  document.querySelector(`#graph button.tab[data-tab="graph-${graphKey}"]`)?.click();
  const root = panel.querySelector(".graph-view");
  const go = () => {
    if (worst) root.showWorst(); else if (nodeId) root.select(nodeId); else if (kernel) root.selectKernel(kernel);
  };
  document.getElementById("graph")?.scrollIntoView();
  if (root.select) go(); else root.addEventListener("graph-ready", go, { once: true });
}

// ?graph=fused&node=n12 (or &kernel=name) on the page's address: open that graph at that node
function followAddress() {
  const q = new URLSearchParams(location.search);
  if (location.hash === "#graph" && q.get("graph") && (q.get("node") || q.get("kernel") || q.get("worst"))) {
    goToNode(q.get("graph"), q.get("node"), q.get("kernel"), q.get("worst"));
  }
}
document.addEventListener("click", (e) => {
  const a = e.target.closest("a.to-worst");
  if (!a) return;
  e.preventDefault();
  history.pushState(null, "", a.getAttribute("href"));
  goToNode("imported", null, null, true);
});
document.addEventListener("click", (e) => {
  const a = e.target.closest("a.back-to-graph");
  if (!a) return;
  e.preventDefault();
  history.pushState(null, "", a.getAttribute("href"));
  goToNode(a.dataset.graph, a.dataset.node, a.dataset.kernel);
});

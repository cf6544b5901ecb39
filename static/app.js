// Progressive enhancement only: tabs for the two graphs, the graph viewer (below), pan/zoom on other
// pictures, set up on the page and on every section htmx swaps in while a job runs.
document.documentElement.classList.add("js");

function setupTabs(root) {
  root.querySelectorAll(".tabs").forEach((tabs) => {
    if (tabs.dataset.ready) return;
    tabs.dataset.ready = "1";
    tabs.querySelectorAll("button.tab").forEach((button) => {
      button.addEventListener("click", () => {
        tabs.querySelectorAll("button.tab").forEach((b) => b.classList.toggle("active", b === button));
        const section = tabs.parentElement;
        section.querySelectorAll(".tab-panel").forEach((p) => p.classList.toggle("active", p.id === button.dataset.tab));
        const img = section.querySelector("#" + button.dataset.tab + " .panzoom");
        if (img && img.fit) img.fit();
      });
    });
  });
}

function setupPanZoom(view) {
  if (view.dataset.ready) return;
  view.dataset.ready = "1";
  const img = view.querySelector("img");
  let scale = 1, x = 0, y = 0, drag = null;
  const apply = () => { img.style.transform = `translate(${x}px, ${y}px) scale(${scale})`; };
  const zoomAt = (factor, cx, cy) => {
    const next = Math.min(8, Math.max(0.02, scale * factor));
    x = cx - ((cx - x) * next) / scale; y = cy - ((cy - y) * next) / scale; scale = next; apply();
  };
  // Fit the width (graphs are tall): the top of the graph shows first.
  view.fit = () => {
    if (!img.naturalWidth || !view.clientWidth) return;
    scale = Math.min(1, (view.clientWidth - 16) / img.naturalWidth);
    x = (view.clientWidth - img.naturalWidth * scale) / 2; y = 8; apply();
  };
  if (img.complete) view.fit(); else img.addEventListener("load", view.fit);
  view.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = view.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? 1.2 : 1 / 1.2, e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  view.addEventListener("pointerdown", (e) => {
    if (e.target.closest("button")) return;
    drag = { x: e.clientX - x, y: e.clientY - y }; view.setPointerCapture(e.pointerId);
  });
  view.addEventListener("pointermove", (e) => { if (drag) { x = e.clientX - drag.x; y = e.clientY - drag.y; apply(); } });
  view.addEventListener("pointerup", () => { drag = null; });
  const buttons = document.createElement("div");
  buttons.className = "zoom-buttons";
  [["+", () => zoomAt(1.25, view.clientWidth / 2, view.clientHeight / 2)],
   ["−", () => zoomAt(0.8, view.clientWidth / 2, view.clientHeight / 2)],
   ["fit", () => view.fit()]].forEach(([label, action]) => {
    const b = document.createElement("button"); b.type = "button"; b.textContent = label;
    b.addEventListener("click", action); buttons.appendChild(b);
  });
  view.appendChild(buttons);
}

function setup(root) {
  setupTabs(root);
  root.querySelectorAll(".panzoom").forEach((view) => { if (!view.closest(".graph-view")) setupPanZoom(view); });
  root.querySelectorAll(".graph-view").forEach(setupGraphView);
  root.querySelectorAll(".code-box").forEach(scrollToHotLoop);
}

function scrollToHotLoop(box) { // a kernel's assembly opens at its hot loop
  const hot = box.querySelector(".hll");
  if (hot) box.scrollTop = hot.offsetTop - 60;
}
document.addEventListener("click", (e) => {
  if (!e.target.closest("#hot-loop-link")) return;
  e.preventDefault();
  const box = document.querySelector("#code-panel .code-box");
  if (box) { scrollToHotLoop(box); box.scrollIntoView({ block: "nearest" }); }
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
  let svg, graph;
  try {
    const [svgText, graphJson] = await Promise.all([
      fetch(root.dataset.svg).then((r) => r.text()), fetch(root.dataset.graph).then((r) => r.json())]);
    svg = cleanSvg(svgText); graph = graphJson;
  } catch (e) { return; } // the picture stays as a plain image
  if (!svg) return;
  const kernels = {};
  JSON.parse(document.getElementById("kernel-data")?.textContent || "[]").forEach((k) => { kernels[k.name] = k; });
  const nodes = {};
  graph.nodes.forEach((n) => { nodes[n.id] = n; });

  view.querySelector("img").remove();
  view.classList.add("inline");
  svg.removeAttribute("width"); svg.removeAttribute("height");
  svg.setAttribute("preserveAspectRatio", "xMinYMin meet");
  view.prepend(svg);
  const [W, H] = svg.getAttribute("viewBox").split(/[ ,]+/).slice(2).map(Number);
  let vb = { x: 0, y: 0, w: W, h: H };
  const size = () => [view.clientWidth || 1, view.clientHeight || 1];
  const scale = () => size()[0] / vb.w;
  const apply = () => {
    svg.setAttribute("viewBox", `${vb.x} ${vb.y} ${vb.w} ${vb.h}`);
    const mw = mini.clientWidth, mh = mini.clientHeight, ms = Math.min(mw / W, mh / H);
    const box = mini.querySelector(".viewport");
    box.style.left = (vb.x * ms + (mw - W * ms) / 2) + "px"; box.style.top = vb.y * ms + "px";
    box.style.width = vb.w * ms + "px"; box.style.height = vb.h * ms + "px";
  };
  const setScale = (s, cx, cy) => { // keep the graph point under (cx, cy) in place
    const [cw, ch] = size(), old = scale();
    s = Math.min(8, Math.max(Math.min(cw / W, ch / H) / 2, s));
    const gx = vb.x + cx / old, gy = vb.y + cy / old;
    vb = { x: gx - cx / s, y: gy - cy / s, w: cw / s, h: ch / s }; apply();
  };
  const centre = (gx, gy, s) => {
    const [cw, ch] = size(); s = s || scale();
    vb = { x: gx - cw / s / 2, y: gy - ch / s / 2, w: cw / s, h: ch / s }; apply();
  };
  const fit = () => {
    const [cw, ch] = size(), s = Math.min(cw / W, ch / H);
    vb = { x: -(cw / s - W) / 2, y: -(ch / s - H) / 2, w: cw / s, h: ch / s }; apply();
  };
  view.fit = fit;
  let fitted = view.clientWidth > 0; // a graph in a hidden tab is fitted when its tab opens
  if (fitted) fit();
  new ResizeObserver(() => {
    if (!view.clientWidth) return;
    if (!fitted) { fitted = true; fit(); } else setScale(scale(), 0, 0);
  }).observe(view);

  // graph coordinates of a node's box (its <g id=...> drawn by Graphviz)
  const box = (g) => {
    const r = g.getBoundingClientRect(), v = svg.getBoundingClientRect(), s = scale();
    return { x: vb.x + (r.left - v.left) / s, y: vb.y + (r.top - v.top) / s, w: r.width / s, h: r.height / s };
  };
  const show = (id) => {
    const g = svg.getElementById(id);
    if (!g) return;
    const b = box(g);
    centre(b.x + b.w / 2, b.y + b.h / 2, Math.max(scale(), 0.8));
  };

  // zoom and pan
  view.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = view.getBoundingClientRect();
    setScale(scale() * (e.deltaY < 0 ? 1.2 : 1 / 1.2), e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  let drag = null;
  view.addEventListener("pointerdown", (e) => {
    if (e.target.closest("button")) return;
    drag = { x: e.clientX, y: e.clientY, vx: vb.x, vy: vb.y, moved: false }; view.setPointerCapture(e.pointerId);
  });
  view.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    vb.x = drag.vx - dx / scale(); vb.y = drag.vy - dy / scale(); apply();
  });
  view.addEventListener("pointerup", (e) => {
    const click = drag && !drag.moved;
    drag = null;
    if (!click) return;
    const hit = document.elementsFromPoint(e.clientX, e.clientY).map((el) => el.closest && el.closest("g.node")).find(Boolean);
    if (hit && nodes[hit.id]) select(hit.id, false);
  });
  const buttons = document.createElement("div");
  buttons.className = "zoom-buttons";
  [["+", () => setScale(scale() * 1.25, size()[0] / 2, size()[1] / 2)],
   ["−", () => setScale(scale() * 0.8, size()[0] / 2, size()[1] / 2)],
   ["fit", fit]].forEach(([label, action]) => {
    const b = document.createElement("button"); b.type = "button"; b.textContent = label;
    b.addEventListener("click", action); buttons.appendChild(b);
  });
  view.appendChild(buttons);

  // the overview strip
  const moveTo = (e) => {
    const r = mini.getBoundingClientRect(), ms = Math.min(r.width / W, r.height / H);
    centre((e.clientX - r.left - (r.width - W * ms) / 2) / ms, (e.clientY - r.top) / ms);
  };
  let miniDrag = false;
  mini.addEventListener("pointerdown", (e) => { miniDrag = true; mini.setPointerCapture(e.pointerId); moveTo(e); });
  mini.addEventListener("pointermove", (e) => { if (miniDrag) moveTo(e); });
  mini.addEventListener("pointerup", () => { miniDrag = false; });

  // search
  const search = root.querySelector(".graph-search"), found = root.querySelector(".graph-found");
  const text = (n) => [n.label, n.var, n.layer, n.kernel, ...(n.layers || [])].filter(Boolean).join(" ").toLowerCase();
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
  const heatOf = { // mode -> node -> 0..1 (red is 1), or null (grey)
    share: (n) => (n.share != null ? n.share / Math.max(...graph.nodes.map((x) => x.share || 0), 1e-9) : null),
    sqnr: (n) => (n.sqnr_db != null ? (sqnrHi - n.sqnr_db) / (sqnrHi - sqnrLo || 1) : null),
  };
  const paint = () => {
    const mode = colour.value, of = heatOf[mode];
    svg.querySelectorAll("g.node").forEach((g) => {
      const n = nodes[g.id], shape = g.querySelector("path, polygon, ellipse");
      if (!n || !shape) return;
      if (!shape.dataset.fill) shape.dataset.fill = shape.getAttribute("fill") || "none";
      const t = of ? of(n) : undefined;
      shape.setAttribute("fill", !of ? shape.dataset.fill : t == null ? "#f4f4f4" : heat(t));
    });
    legend.hidden = !of;
    if (!of) return;
    legend.innerHTML = "";
    const bar = document.createElement("span"); bar.className = "heat-bar";
    bar.style.background = `linear-gradient(to right, ${[0, 0.33, 0.66, 1].map(heat).join(", ")})`;
    if (mode === "share") {
      const top = Math.max(...graph.nodes.map((x) => x.share || 0));
      legend.append("Share of the kernels' time in a run, per kernel call: 0% ", bar, ` ${pct(top)}`,
        " (grey: no kernel time, e.g. inputs or ops folded away)");
    } else {
      legend.append(`SQNR against fp32: ${sqnrHi.toFixed(1)} dB `, bar, ` ${sqnrLo.toFixed(1)} dB`,
        " (red: the largest error; grey: not a quantized layer)");
    }
  };
  colour.addEventListener("change", paint);
  root.showWorst = () => {
    const worst = graph.nodes.find((n) => n.worst) ||
      graph.nodes.filter((n) => n.sqnr_db != null).sort((a, b) => a.sqnr_db - b.sqnr_db)[0];
    colour.value = "sqnr"; paint();
    if (worst) select(worst.id, true);
  };
  root.querySelector(".graph-worst")?.addEventListener("click", root.showWorst);

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
    const rows = [["kind", n.kind], ["var", n.var], ["source layer", n.layer],
      ["source layers", (n.layers || []).join(", ")], ["output", shapeText(n.type)],
      ["weights", (n.weights || []).map(shapeText).join(", ")], ["kernel", kernelName],
      ["schedule", k && k.schedule], ["kernel calls", k && k.calls],
      ["GFLOP per call", k && k.flop ? (k.flop / 1e9).toPrecision(3) : null],
      ["time, this call", n.ms != null ? `${n.ms.toFixed(4)} ms (${pct(n.share)} of the kernels' time)` : null],
      ["dtypes", k && k.dtypes],
      ["SQNR against fp32", n.sqnr_db != null ? `${n.sqnr_db.toFixed(1)} dB${n.worst ? " (where it falls the most)" : ""}` : null]];
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
      [["tir", "TIR"], ["llvm", "LLVM IR"], ["asm", "assembly"]].forEach(([v, label], i) => {
        const a = document.createElement("a"); a.href = codeLink(v, kernelName, id); a.textContent = label;
        a.dataset.view = v; a.dataset.kernel = kernelName; a.dataset.node = id; a.className = "to-code";
        if (i) p.append(" · "); p.appendChild(a);
      });
      details.appendChild(p);
    }
    if (n.call) {
      const a = document.createElement("a"); a.href = `${page}?graph=fused&node=${n.call}#graph`; a.textContent = "its kernel call in the fused graph";
      a.className = "to-node"; a.dataset.graph = "fused"; a.dataset.node = n.call;
      const p = document.createElement("p"); p.append("See ", a, "."); details.appendChild(p);
    }
    history.replaceState(null, "", `${page}?${new URLSearchParams({ graph: key, node: id })}#graph`);
  }
  root.select = (id) => select(id, true);
  root.selectKernel = (kernel) => {
    const n = graph.nodes.find((x) => (x.kind === "kernel" ? x.label : x.kernel) === kernel);
    if (n) select(n.id, true);
  };
  details.addEventListener("click", (e) => {
    const a = e.target.closest("a.to-code, a.to-node");
    if (!a || !window.htmx) return;
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

// Progressive enhancement only: tabs for the two graphs, and pan/zoom on the graph pictures, set up on
// the page and on every section htmx swaps in while a job runs.
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
  root.querySelectorAll(".panzoom").forEach(setupPanZoom);
}

if (window.htmx) htmx.onLoad(setup); // the page itself, then each swapped-in section
else document.addEventListener("DOMContentLoaded", () => setup(document));

// The kernel lab (templates/lab.html): an edit builds after a pause in typing (POST /api/lab), the page's
// address becomes the build's short link, and the build's JSON (GET /api/lab/<id>) is polled and shown.
// Everything shown comes from that JSON; nothing here computes a figure.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("lab-data").textContent);
  const $ = (id) => document.getElementById(id);
  const PAUSE_MS = 700;
  const POLL_MS = 600_000;
  let latest = data.run ? data.run.id : null;
  let view = data.run;
  let shown = "asm";
  let pending = null;

  const editor = new CM.EditorView({
    doc: data.run ? data.run.code : data.code,
    extensions: [
      CM.basicSetup,
      CM.python(),
      CM.lintGutter(),
      CM.keymap.of([CM.indentWithTab]),
      CM.EditorView.updateListener.of((update) => { if (update.docChanged) later(); }),
    ],
    parent: $("lab-editor"),
  });

  function later() {
    clearTimeout(pending);
    say("editing…");
    pending = setTimeout(submit, PAUSE_MS);
  }

  function say(text) { $("lab-status").textContent = text; }

  let sending = false;
  let again = false;

  async function submit() {
    if (sending) { again = true; return; }  // sent when this one is answered, with its build as the parent
    sending = true;
    try {
      await send();
    } finally {
      sending = false;
      if (again) { again = false; submit(); }
    }
  }

  async function send() {
    const body = { code: editor.state.doc.toString(), target: $("lab-target").value };
    if (latest) body.parent = latest;
    say("sending…");
    let answer, sent;
    try {
      answer = await fetch("/api/lab", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      sent = await answer.json().catch(() => ({ error: `The server answered ${answer.status}.` }));
    } catch (e) {
      say("the server could not be reached");
      return;
    }
    if (!answer.ok) { say(""); showError(sent.error, null); return; }
    latest = sent.id;
    history.replaceState(null, "", "/lab/" + sent.id);
    poll(sent.id, Date.now() + POLL_MS);
  }

  async function poll(id, until) {
    if (id !== latest) return;  // a later edit was sent: its build is the one shown
    let answer;
    try {
      answer = await fetch("/api/lab/" + id);
    } catch (e) {
      answer = null;
    }
    if (id !== latest) return;
    if (!answer || !answer.ok) { say("the build's state could not be read" + (answer ? ` (${answer.status})` : "")); return; }
    render(await answer.json());
    if (view.status !== "queued" && view.status !== "running") return;
    if (Date.now() > until) { say("no end after ten minutes: reload the page to look again"); return; }
    setTimeout(() => poll(id, until), 250);
  }

  function render(v) {
    view = v;
    const r = v.result || {};
    const link = $("lab-link");
    link.href = "/lab/" + v.id;
    link.hidden = false;
    if (v.status === "queued") {
      const q = v.queue || {};
      say(`queued: ${q.place} in line` + (q.jobs_running ? `, ${q.jobs_running} job(s) running` : ""));
    } else if (v.status === "running") {
      say(r.phase ? `running: ${r.phase}…` : "building…");
    } else if (v.status === "stopped") {
      say("stopped: a later edit replaced it");
    } else if (v.status === "failed") {
      say(`failed${v.stage ? " at " + v.stage : ""}`);
    } else {
      say(`built in ${r.code_s} s, in all ${r.total_s} s`);
    }
    showError(v.status === "failed" ? v.error : null, v.line);
    $("lab-time").textContent = timeText(r.time);
    $("lab-check").textContent = checkText(r.check);
    $("lab-check").className = r.check && r.check.matches === false ? "bad" : "";
    $("lab-mca").textContent = mcaText(r.mca);
    showText();
  }

  function timeText(t) {
    if (!t || t.ms === null || t.ms === undefined) return "–";
    if (t.by === "measured") return `${t.ms.toPrecision(4)} ms a call, measured (median of ${t.runs} runs, ${t.threads} threads)`;
    return `${t.ms.toPrecision(4)} ms a call, llvm-mca's estimate for the board (${t.threads} cores)`;
  }

  function checkText(c) {
    if (!c) return "–";
    if (c.why) return c.why;
    if (c.matches === null) return "–";
    return c.matches
      ? `matches the unscheduled kernel (largest difference ${c.largest_difference.toPrecision(2)})`
      : `differs from the unscheduled kernel in ${c.wrong.join(", ")}`;
  }

  function mcaText(m) {
    if (!m) return "–";
    if (m.why) return m.why;
    return `${m.cycles_per_iteration} cycles a pass of the hot loop, IPC ${m.ipc}` + (m.bottleneck ? `; ${m.bottleneck}` : "");
  }

  function showError(message, line) {
    const box = $("lab-error");
    box.hidden = !message;
    box.textContent = message ? (line ? `line ${line}: ` : "") + message : "";
    const diagnostics = [];
    if (message && line && line <= editor.state.doc.lines) {
      const at = editor.state.doc.line(line);
      diagnostics.push({ from: at.from, to: at.to, severity: "error", message: message.split("\n")[0] });
    }
    editor.dispatch(CM.setDiagnostics(editor.state, diagnostics));
  }

  function showText() {
    const pre = $("lab-text");
    pre.textContent = "";
    const text = view && view.texts ? view.texts[shown] : null;
    if (!text) { pre.textContent = view ? "(none yet)" : ""; return; }
    const hot = shown === "asm" && view.result ? view.result.hot_loop : null;
    text.split("\n").forEach((line, i) => {
      const span = document.createElement("span");
      span.textContent = line + "\n";
      if (hot && i + 1 >= hot[0] && i + 1 <= hot[1]) span.className = "hot";
      pre.appendChild(span);
    });
    const first = pre.querySelector(".hot");
    if (first) pre.scrollTop = first.offsetTop - pre.offsetTop - 40;
  }

  document.querySelectorAll(".lab-tabs button").forEach((button) => {
    button.addEventListener("click", () => {
      document.querySelectorAll(".lab-tabs button").forEach((b) => b.classList.toggle("active", b === button));
      shown = button.dataset.text;
      showText();
    });
  });
  $("lab-starter").addEventListener("change", (event) => {
    editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: data.starters[event.target.value] } });
  });
  $("lab-target").addEventListener("change", later);

  if (data.run) { render(data.run); poll(data.run.id, Date.now() + POLL_MS); } else { submit(); }
})();

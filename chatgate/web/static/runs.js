// chatgate dashboard: the Runs card (docs/runs.md). Each agent run of the last 7 days: who, how many requests
// and rounds, its cost, how it ended, and its context growth (the prompt tokens of each answered request) as
// a line. Plain JS and inline SVG; it asks only this chatgate's GET /admin/runs, with the dashboard's key.
"use strict";
(function () {
  const KEY = "chatgate.adminKey";
  const SVGNS = "http://www.w3.org/2000/svg";
  const W = 220, H = 44;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function tokens(n) {
    return n >= 10000 ? (n / 1000).toFixed(1) + "k" : String(n);
  }

  function cost(run) {
    const value = run["cost_" + String(run.currency || "USD").toLowerCase()] || 0;
    return (run.currency === "CNY" ? "¥" : "$") + (value >= 0.01 || !value ? value.toFixed(4) : value.toFixed(6));
  }

  // The context sent by each answered request of the run, as a line rising with the history.
  function growth(run) {
    const points = run.context || [];
    const chart = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", class: "run-growth" });
    const top = Math.max(1, ...points);
    const label = `context per request: ${points.map(tokens).join(", ") || "none"} tokens` +
      (run.context_share ? ` (largest ${(run.context_share * 100).toFixed(1)}% of the model's window)` : "");
    const title = svg("title", {});
    title.textContent = label;
    chart.appendChild(title);
    chart.appendChild(svg("line", { x1: 0, y1: H - 1, x2: W, y2: H - 1, stroke: "#ccc" }));
    if (points.length) {
      const step = points.length > 1 ? (W - 4) / (points.length - 1) : 0;
      const xy = points.map((p, i) => [2 + i * step, H - 2 - (p / top) * (H - 6)]);
      chart.appendChild(svg("polyline", { points: xy.map((p) => p.join(",")).join(" "), fill: "none",
                                          stroke: "#2f6fde", "stroke-width": 1.5 }));
      for (const [x, y] of xy) chart.appendChild(svg("circle", { cx: x, cy: y, r: 1.8, fill: "#2f6fde" }));
    }
    return chart;
  }

  function render(container, runs) {
    container.replaceChildren();
    if (!runs.length) {
      container.appendChild(el("p", { class: "empty" }, "No agent runs in the last 7 days."));
      return;
    }
    const table = el("table", { class: "runs" });
    const head = el("tr");
    for (const h of ["run", "team", "key", "requests", "rounds", "tools", "cost", "largest context", "ended",
                     "context growth"]) head.appendChild(el("th", {}, h));
    table.appendChild(head);
    for (const run of runs) {
      const row = el("tr", { "data-run": run.run_id });
      const tools = Object.entries(run.tool_calls || {}).map(([k, v]) => `${k}×${v}`).join(", ") || "-";
      const share = run.context_share ? ` (${(run.context_share * 100).toFixed(1)}%)` : "";
      const ended = run.stopped_by ? `stopped: ${run.stopped_by}` : run.ended;
      for (const text of [run.run_id.slice(0, 18), run.team, run.key_id, run.requests, run.rounds, tools,
                          cost(run), tokens(run.max_context_tokens) + share, ended]) {
        row.appendChild(el("td", {}, String(text)));
      }
      const cell = el("td");
      cell.appendChild(growth(run));
      row.appendChild(cell);
      table.appendChild(row);
    }
    container.appendChild(table);
  }

  async function load(container) {
    const key = sessionStorage.getItem(KEY);
    const since = Math.floor(Date.now() / 1000) - 7 * 86400;
    try {
      const resp = await fetch(`/admin/runs?since=${since}&limit=25`,
                               { headers: key ? { Authorization: "Bearer " + key } : {}, cache: "no-store" });
      const body = await resp.json();
      if (!resp.ok) throw new Error(body && body.error ? body.error.message : String(resp.status));
      render(container, body.runs || []);
    } catch (err) {
      container.replaceChildren(el("p", { class: "error" }, "Runs: " + err.message));
    }
  }

  function start() {
    const grid = document.querySelector("main section.grid") || document.querySelector("main") || document.body;
    const card = el("figure", { class: "card wide", id: "runs-card" });
    const caption = el("figcaption", {}, "Agent runs ");
    caption.appendChild(el("small", {}, "(the last 7 days: each agent task's requests, cost and context growth)"));
    card.appendChild(caption);
    const container = el("div", { id: "runs" });
    card.appendChild(container);
    grid.appendChild(card);
    load(container);
    setInterval(() => load(container), 30000);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

// chatgate usage dashboard: plain JS, inline SVG, no network besides this chatgate's own admin API.
"use strict";
(function () {
  const KEY = "chatgate.adminKey";
  const COLORS = ["#2f6fde", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#d4ac0d", "#7f8c8d",
                  "#2c3e50", "#e84393"];
  const SVGNS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  let openRefusal = null;

  // The key may arrive in the URL fragment (#key=...; never sent to the server); keep it for this tab only.
  function readFragment() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (params.get("key")) sessionStorage.setItem(KEY, params.get("key"));
    if (params.get("bucket")) $("bucket").value = params.get("bucket");
    if (params.get("span")) $("span").value = params.get("span");
    if (params.get("refusal")) openRefusal = params.get("refusal");  // a link to one refusal, opened on load
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  }

  function setStatus(state, text) {
    document.body.dataset.state = state;
    $("status").textContent = text;
  }

  async function api(path) {
    const key = sessionStorage.getItem(KEY);
    const headers = key ? { Authorization: "Bearer " + key } : {};  // no key: asked without one, never a guess
    const resp = await fetch(path, { headers, cache: "no-store" });
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) {
      const msg = body && body.error ? body.error.message : resp.status + " " + resp.statusText;
      const err = new Error(msg);
      err.status = resp.status;
      err.code = body && body.error ? body.error.code : null;
      throw err;
    }
    return body;
  }

  function el(tag, attrs, text) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // The currency symbol of the costs (the reports' currency: $ or ¥, set on each load).
  let money = "$";

  function fmt(v, metric) {
    const cost = metric === "cost" || metric === "cost_usd";
    if (v === 0) return cost ? money + "0" : "0";
    if (cost) return money + (v >= 1 ? v.toFixed(2) : v >= 0.01 ? v.toFixed(4) : v.toPrecision(2));
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return String(Math.round(v * 100) / 100);
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function legend(container, labels) {
    const box = document.createElement("div");
    box.className = "legend";
    labels.forEach((label, i) => {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = COLORS[i % COLORS.length];
      item.append(swatch, document.createTextNode(label));
      box.append(item);
    });
    container.append(box);
  }

  // Stacked bars: one bar per time bucket, one colour per series (team, key or model).
  function stackedBars(container, buckets, series, metric) {
    container.replaceChildren();
    const W = 640, H = 240, L = 56, R = 10, T = 10, B = 34;
    const totals = buckets.map((_, i) => series.reduce((s, e) => s + e[metric][i], 0));
    const grand = totals.reduce((a, b) => a + b, 0);
    container.dataset.series = String(series.length);
    container.dataset.total = String(grand);
    if (!series.length || grand === 0) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No usage in this range.";
      container.append(p);
      return;
    }
    const max = niceMax(Math.max(...totals));
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": metric });
    const plotW = W - L - R, plotH = H - T - B;
    for (let t = 0; t <= 4; t++) {
      const y = T + plotH - (plotH * t) / 4;
      svg.append(el("line", { x1: L, x2: W - R, y1: y, y2: y, stroke: "#e2e5ea" }));
      svg.append(el("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, fmt((max * t) / 4, metric)));
    }
    const slot = plotW / buckets.length, bw = Math.max(2, Math.min(48, slot * 0.7));
    const every = Math.ceil(buckets.length / 8);
    buckets.forEach((b, i) => {
      const x = L + slot * i + (slot - bw) / 2;
      let y = T + plotH;
      series.forEach((s, k) => {
        const v = s[metric][i];
        if (!v) return;
        const h = (plotH * v) / max;
        y -= h;
        const rect = el("rect", { x: x, y: y, width: bw, height: Math.max(h, 0.5), fill: COLORS[k % COLORS.length],
                                  class: "bar", "data-series": s.label });
        rect.append(el("title", {}, `${s.label} ${b}: ${fmt(v, metric)}`));
        svg.append(rect);
      });
      if (i % every === 0) {
        const label = b.length > 10 ? b.slice(5, 13).replace("T", " ") + "h" : b.slice(5);
        svg.append(el("text", { x: x + bw / 2, y: H - B + 16, "text-anchor": "middle" }, label));
      }
    });
    svg.append(el("line", { x1: L, x2: W - R, y1: T + plotH, y2: T + plotH, stroke: "#9aa1ae" }));
    container.append(svg);
    legend(container, series.map((s) => `${s.label} (${fmt(metric === "tokens" ? s.total_tokens : s.total_cost, metric)})`));
  }

  // Horizontal bars: requests per code (rejections per rule code, repairs per repair).
  function codeBars(container, rows, label, empty, fill) {
    container.replaceChildren();
    container.dataset.series = String(rows.length);
    container.dataset.total = String(rows.reduce((s, r) => s + r.count, 0));
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = empty;
      container.append(p);
      return;
    }
    const shown = rows.slice(0, 12), rowH = 22, L = 200, W = 640, H = shown.length * rowH + 8;
    const max = Math.max(...shown.map((r) => r.count));
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label });
    shown.forEach((r, i) => {
      const y = 4 + i * rowH, w = ((W - L - 50) * r.count) / max;
      svg.append(el("text", { x: L - 8, y: y + 14, "text-anchor": "end" }, r.code));
      const rect = el("rect", { x: L, y: y + 2, width: Math.max(w, 1), height: rowH - 6, fill: fill,
                                class: "bar", "data-series": r.code });
      rect.append(el("title", {}, `${r.code}: ${r.count}`));
      svg.append(rect);
      svg.append(el("text", { x: L + w + 6, y: y + 14 }, String(r.count)));
    });
    container.append(svg);
  }

  function offendersTable(container, rows) {
    container.replaceChildren();
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No key has had a request refused or limited.";
      container.append(p);
      return;
    }
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const [h, cls] of [["key", ""], ["team", ""], ["rejected", "num"], ["limited", "num"], ["requests", "num"], ["refused %", "num"]]) {
      const th = document.createElement("th");
      th.textContent = h;
      th.className = cls;
      head.append(th);
    }
    const tbody = table.createTBody();
    for (const r of rows) {
      const tr = tbody.insertRow();
      const pct = r.requests ? ((100 * (r.rejected + r.limited)) / r.requests).toFixed(0) + "%" : "";
      [[r.key_name || r.key_id, ""], [r.team, ""], [r.rejected, "num"], [r.limited, "num"], [r.requests, "num"],
       [pct, "num"]]
        .forEach(([v, cls]) => { const td = tr.insertCell(); td.textContent = String(v); td.className = cls; });
    }
    container.append(table);
  }

  // Lines: the cache hit rate (0-100%) of each series per bucket; a bucket without prompt tokens has no point.
  function hitRateLines(container, buckets, series) {
    container.replaceChildren();
    const shown = series.filter((s) => s.hit_rate.some((r) => r !== null));
    container.dataset.series = String(shown.length);
    container.dataset.rates = JSON.stringify(shown.map((s) => [s.label, s.hit_rate]));
    if (!shown.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No prompt tokens in this range.";
      container.append(p);
      return;
    }
    const W = 640, H = 200, L = 56, R = 10, T = 10, B = 34, plotW = W - L - R, plotH = H - T - B;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cache hit rate" });
    for (let t = 0; t <= 4; t++) {
      const y = T + plotH - (plotH * t) / 4;
      svg.append(el("line", { x1: L, x2: W - R, y1: y, y2: y, stroke: "#e2e5ea" }));
      svg.append(el("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, `${25 * t}%`));
    }
    const slot = plotW / buckets.length, every = Math.ceil(buckets.length / 8);
    const xAt = (i) => L + slot * i + slot / 2, yAt = (r) => T + plotH - plotH * r;
    shown.forEach((s, k) => {
      const color = COLORS[k % COLORS.length];
      const points = s.hit_rate.map((r, i) => (r === null ? null : [xAt(i), yAt(r)])).filter((p) => p);
      if (points.length > 1) {
        svg.append(el("polyline", { points: points.map((p) => p.join(",")).join(" "), fill: "none",
                                    stroke: color, "stroke-width": 2 }));
      }
      s.hit_rate.forEach((r, i) => {
        if (r === null) return;
        const dot = el("circle", { cx: xAt(i), cy: yAt(r), r: 3, fill: color, class: "point",
                                   "data-series": s.label });
        dot.append(el("title", {}, `${s.label} ${buckets[i]}: ${(100 * r).toFixed(1)}% of prompt tokens from the cache`));
        svg.append(dot);
      });
    });
    buckets.forEach((b, i) => {
      if (i % every !== 0) return;
      const label = b.length > 10 ? b.slice(5, 13).replace("T", " ") + "h" : b.slice(5);
      svg.append(el("text", { x: xAt(i), y: H - B + 16, "text-anchor": "middle" }, label));
    });
    container.append(svg);
    legend(container, shown.map((s) => {
      const p = s.prompt_tokens.reduce((a, b) => a + b, 0), h = s.cache_hit_tokens.reduce((a, b) => a + b, 0);
      return `${s.label} (${p ? ((100 * h) / p).toFixed(1) : 0}%)`;
    }));
  }

  // The costliest prefix breaks of every team (GET /admin/cache?by=team): where, how often, what they cost.
  function breaksTable(container, report) {
    container.replaceChildren();
    const rows = [];
    const cur = (report.currency || "USD").toLowerCase();  // lost_usd / lost_picousd, or _cny
    for (const r of report.rows) {
      for (const b of r.breaks) rows.push({ team: r.team, ...b, lost: b["lost_" + cur], pico: b["lost_pico" + cur] });
    }
    rows.sort((a, b) => b.pico - a.pico || b.count - a.count);
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No prefix break seen: prompts keep their prefix.";
      container.append(p);
      return;
    }
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const [h, cls] of [["team", ""], ["break at", ""], ["requests", "num"], ["tokens lost ~", "num"],
                            ["lost ~", "num"], ["usual cause and fix", ""]]) {
      const th = document.createElement("th");
      th.textContent = h;
      th.className = cls;
      head.append(th);
    }
    const tbody = table.createTBody();
    for (const b of rows.slice(0, 10)) {
      const tr = tbody.insertRow();
      tr.className = "break-row";
      Object.assign(tr.dataset, { team: b.team, param: b.param, lost: String(b.lost), count: String(b.count) });
      [[b.team, ""], [b.param, "code"], [b.count, "num"], [fmt(b.lost_tokens, "tokens"), "num"],
       [fmt(b.lost, "cost"), "num"], [b.hint, "hint"]]
        .forEach(([v, cls]) => { const td = tr.insertCell(); td.textContent = String(v); td.className = cls; });
    }
    container.append(table);
  }

  const usd = (v) => fmt(v, "cost");

  // The pool of DeepSeek accounts: each one's state (available, set aside and why, no key), never a key.
  function accountsTable(container, answer) {
    container.replaceChildren();
    const rows = answer.data || [];
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "Passthrough mode: each client's own DeepSeek key goes upstream.";
      container.append(p);
      return;
    }
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const [h, cls] of [["account", ""], ["key variable", ""], ["state", ""], ["in flight", "num"],
                            ["requests", "num"], ["weight", "num"]]) {
      const th = document.createElement("th");
      th.textContent = h;
      th.className = cls;
      head.append(th);
    }
    const tbody = table.createTBody();
    for (const r of rows) {
      const tr = tbody.insertRow();
      const state = r.state === "set_aside" ? `set aside (${r.why}, back in ${Math.ceil(r.back_in_s)} s)` : r.state;
      [[r.name, ""], [r.key_env, ""], [state, ""], [r.in_flight, "num"], [r.requests, "num"], [r.weight, "num"]]
        .forEach(([v, cls]) => { const td = tr.insertCell(); td.textContent = String(v); td.className = cls; });
    }
    container.append(table);
  }

  // Recent refusals: one row per kept refusal, its request id a link that shows it (GET /admin/refusals/{id}).
  function refusalsTable(container, rows, why) {
    container.replaceChildren();
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = why || "No refusals kept.";
      container.append(p);
      return;
    }
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const h of ["time (UTC)", "request id", "status", "by", "team", "key", "route", "rules"]) {
      const th = document.createElement("th");
      th.textContent = h;
      head.append(th);
    }
    const tbody = table.createTBody();
    for (const r of rows) {
      const tr = tbody.insertRow();
      tr.insertCell().textContent = new Date(r.ts * 1000).toISOString().slice(0, 19).replace("T", " ");
      const a = document.createElement("a");
      // by chatgate's own refusal id: a client chooses its request id, and several may share one
      a.href = "#refusal=" + encodeURIComponent(r.refusal_id);
      a.textContent = r.request_id;
      a.className = "refusal-link";
      a.addEventListener("click", (ev) => { ev.preventDefault(); showRefusal(r.refusal_id); });
      tr.insertCell().append(a);
      for (const v of [r.status, r.source, r.team, r.key_name || r.key_id, r.route, r.rules.join(", ")]) {
        tr.insertCell().textContent = String(v);
      }
    }
    container.append(table);
  }

  async function showRefusal(id) {
    const pre = $("refusal-detail");
    pre.hidden = false;
    try {
      const r = await api("/admin/refusals/" + encodeURIComponent(id));
      const problems = r.problems.map((p) => `${p.rule || p.code}${p.param ? " at " + p.param : ""}: ${p.message}`);
      pre.textContent = `${r.request_id}  ${r.status} by ${r.source}  ${r.route}  team ${r.team}  key ${r.key_id}\n` +
        problems.join("\n") + "\n\n" + r.marked;
    } catch (err) {
      pre.textContent = "Could not load " + id + ": " + err.message;
    }
  }

  async function loadRefusals() {
    try {
      const refusals = await api("/admin/refusals?limit=50");
      refusalsTable($("refusals"), refusals.data);
      if (openRefusal) {
        await showRefusal(openRefusal);
        openRefusal = null;
      }
    } catch (err) {
      refusalsTable($("refusals"), [], err.message);
    }
  }

  function day(ts) {
    return new Date(ts * 1000).toISOString().slice(0, 10);
  }

  // Budget use per team, from GET /admin/teams: budget, period, spent, remaining and a bar of the percentage.
  function budgetsTable(container, teams) {
    container.replaceChildren();
    container.dataset.rows = String(teams.length);
    const budgetOf = (t) => (t.limits.budget_usd !== undefined ? t.limits.budget_usd : t.limits.budget_cny);
    container.dataset.budgets = String(teams.filter((t) => budgetOf(t) !== null).length);
    if (!teams.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No teams yet.";
      container.append(p);
      return;
    }
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const [h, cls] of [["team", ""], ["keys", "num"], ["budget", "num"], ["period", ""], ["spent", "num"],
                            ["remaining", "num"], ["use", ""]]) {
      const th = document.createElement("th");
      th.textContent = h;
      th.className = cls;
      head.append(th);
    }
    const tbody = table.createTBody();
    for (const t of teams) {
      const budget = budgetOf(t), s = t.spend, cur = (s.currency || "USD").toLowerCase();
      const spent = s["spent_" + cur], remaining = s["remaining_" + cur];
      const tr = tbody.insertRow();
      tr.className = "budget-row";
      Object.assign(tr.dataset, {
        team: t.team, budget: budget === null ? "" : String(budget), period: budget === null ? "" : s.period,
        spent: String(spent), remaining: remaining === null ? "" : String(remaining), currency: cur,
        percent: s.used_percent === null ? "" : String(s.used_percent),
      });
      let period = "";
      if (budget !== null) {
        period = s.period === "total" ? "total" : `${s.period} (renews ${day(s.period_end)})`;
      }
      const cells = [[t.team, ""], [t.key_count, "num"],
                     [budget === null ? "no budget" : usd(budget), budget === null ? "num muted" : "num"], [period, ""],
                     [usd(spent) + (budget === null ? " (this month)" : ""), "num"],
                     [budget === null ? "" : usd(remaining), "num"]];
      for (const [v, cls] of cells) {
        const td = tr.insertCell();
        td.textContent = String(v);
        td.className = cls;
      }
      const use = tr.insertCell();
      if (budget !== null) {
        const pct = s.used_percent === null ? 0 : s.used_percent;
        const meter = document.createElement("span");
        meter.className = "meter";
        const fill = document.createElement("span");
        fill.className = "meter-fill" + (pct >= 100 ? " over" : pct >= 80 ? " warn" : "");
        fill.style.width = Math.min(100, Math.max(0, pct)) + "%";
        fill.dataset.width = String(Math.min(100, Math.max(0, pct)));
        meter.append(fill);
        const label = document.createElement("span");
        label.className = "percent";
        label.textContent = (pct >= 10 ? pct.toFixed(0) : pct.toFixed(1)) + "%";
        use.append(meter, label);
      }
    }
    container.append(table);
  }

  function totalsBox(report) {
    const box = $("totals");
    box.replaceChildren();
    const t = report.totals;
    // each request once: answered, refused by chatgate's rules (400), limited by chatgate (429), refused by
    // DeepSeek (its 4xx), failed at DeepSeek (5xx after the retries, or no answer)
    for (const [label, value] of [["requests", t.requests], ["rejected by a rule", t.rejected],
                                  ["limited (429)", t.limited], ["refused by DeepSeek (4xx)", t.upstream_refused],
                                  ["failed at DeepSeek (5xx, no answer)", t.upstream_failed],
                                  ["prompt tokens", t.prompt_tokens], ["completion tokens", t.completion_tokens],
                                  [`cost (${report.currency})`, money + t.cost.toFixed(4)],
                                  ["tool calls billed", t.billed_calls],
                                  [`their cost (${report.currency})`,
                                   money + t["billed_" + report.currency.toLowerCase()].toFixed(4)],
                                  ["cache hit rate", t.cache_hit_rate === null ? "-" : (100 * t.cache_hit_rate).toFixed(1) + "%"],
                                  [`saved by the cache (${report.currency})`,
                                   money + t["cache_saved_" + report.currency.toLowerCase()].toFixed(4)]]) {
      const d = document.createElement("div");
      d.className = "total";
      const b = document.createElement("b");
      b.textContent = typeof value === "number" ? fmt(value, "tokens") : value;
      const s = document.createElement("span");
      s.textContent = label;
      d.append(b, s);
      box.append(d);
    }
  }

  // not "refused": this chatgate has no admin key at all (auth.admin_key unset; the admin API says 503)
  function notConfigured() {
    setStatus("error", "No admin key is configured on this chatgate: set CHATGATE_ADMIN_KEY (make one with " +
              "openssl rand -hex 32) and restart chatgate.");
  }

  async function load() {
    if (!sessionStorage.getItem(KEY)) {
      setStatus("locked", "Enter the admin key to load usage.");
      try { await api("/admin/teams"); } catch (err) { if (err.code === "admin_key_not_configured") notConfigured(); }
      return;
    }
    const bucket = $("bucket").value;
    const span = Math.max(1, Math.min(400, parseInt($("span").value, 10) || 14));
    const since = new Date(Date.now() - (span - 1) * (bucket === "day" ? 86400e3 : 3600e3));
    since.setUTCMinutes(0, 0, 0);
    if (bucket === "day") since.setUTCHours(0);
    const q = `bucket=${bucket}&since=${Math.floor(since.getTime() / 1000)}`;
    setStatus("loading", "Loading…");
    try {
      const [team, key, model, totals, rejections, repairs, teams, accounts, cache] = await Promise.all([
        api(`/admin/usage/timeseries?by=team&${q}`), api(`/admin/usage/timeseries?by=key&${q}`),
        api(`/admin/usage/timeseries?by=model&${q}`), api("/admin/usage?by=team"), api("/admin/rejections"),
        api("/admin/repairs"), api("/admin/teams"), api("/admin/accounts"),
        api(`/admin/cache?by=team&since=${Math.floor(since.getTime() / 1000)}`)]);
      money = totals.currency === "CNY" ? "¥" : "$";
      const byName = { team, key, model };
      document.querySelectorAll(".chart[data-by]").forEach((c) => {
        const data = byName[c.dataset.by];
        stackedBars(c, data.buckets, data.series.slice(0, COLORS.length), c.dataset.metric);
      });
      totalsBox(totals);
      codeBars($("chart-rejections"), rejections.by_rule, "refusals by rule and limit", "No refused requests.",
               "#c0392b");
      codeBars($("chart-repairs"), repairs.by_code, "repairs by code", "No repaired requests.", "#2e86c1");
      offendersTable($("offenders"), rejections.top_offenders);
      budgetsTable($("budgets"), teams.data);
      accountsTable($("accounts"), accounts);
      await loadRefusals();
      hitRateLines($("chart-cache-team"), team.buckets, team.series.slice(0, COLORS.length));
      breaksTable($("cache-breaks"), cache);
      setStatus("ready", `Last ${span} ${bucket}(s), UTC. Updated ${new Date().toLocaleTimeString()}.`);
    } catch (err) {
      if (err.status === 401) sessionStorage.removeItem(KEY);
      if (err.code === "admin_key_not_configured") return notConfigured();
      setStatus("error", err.status === 401 ? "The admin key was refused: " + err.message : "Could not load: " + err.message);
    }
  }

  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("admin-key").value.trim();
    if (value) sessionStorage.setItem(KEY, value);
    $("admin-key").value = "";
    load();
  });
  $("forget").addEventListener("click", () => { sessionStorage.removeItem(KEY); location.reload(); });
  $("refresh").addEventListener("click", load);
  $("bucket").addEventListener("change", () => { $("span").value = $("bucket").value === "day" ? 14 : 48; load(); });
  readFragment();
  load();
})();

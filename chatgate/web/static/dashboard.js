// chatgate usage dashboard: plain JS, inline SVG, no network besides this chatgate's own admin API.
"use strict";
(function () {
  const KEY = "chatgate.adminKey";
  const COLORS = ["#2f6fde", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#d4ac0d", "#7f8c8d",
                  "#2c3e50", "#e84393"];
  const SVGNS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const LANG = "chatgate.lang", TZ = "chatgate.tz";

  // Every text of the page, in English and in Chinese (zh-CN). API error messages stay as chatgate says them.
  const I18N = {
    en: {
      title: "chatgate usage", adminKey: "Admin key", load: "Load", forget: "Forget key", language: "Language",
      timeZone: "Times", tzLocal: "this browser's zone", tzBeijing: "UTC+8 (Beijing)", bucket: "Bucket",
      day: "day", hour: "hour", week: "week", month: "month", last: "Last", buckets: "buckets", from: "or from", to: "to", team: "Team",
      key: "Key", all: "all", autoRefresh: "Auto-refresh", off: "off", refresh: "Refresh", csv: "Export CSV",
      latencyCard: "Latency per model", latencyNote: "(answered requests, p50 and p95)",
      errorsCard: "Errors by kind", errorsNote: "(each request once, per bucket)",
      balanceCard: "DeepSeek balance", balanceNote: "(the account, now)",
      accountsCard: "DeepSeek accounts", accountsNote: "(the pool, now)",
      budgetsCard: "Budgets and spend forecast per team",
      budgetsNote: "(the current period, UTC; the forecast goes on at this period's pace so far)",
      tokensTeam: "Tokens per team", costTeam: "Cost per team", tokensKey: "Tokens per key", costKey: "Cost per key",
      tokensModel: "Tokens per model", costModel: "Cost per model", cacheCard: "Cache",
      cacheNote: "(DeepSeek's context-cache hit rate per team; the costliest prefix breaks, estimated)",
      rejectionsCard: "Requests chatgate refused, by rule and by limit", repairsCard: "Repaired requests by repair",
      offendersCard: "Top offenders (keys with most requests refused or limited)", refusalsCard: "Recent refusals",
      refusalsNote: "(chatgate's 400s and DeepSeek's 4xx, bodies redacted; click one for its details)",
      enterKey: "Enter the admin key to load usage.", loading: "Loading…",
      notConfigured: "No admin key is configured on this chatgate: set CHATGATE_ADMIN_KEY (make one with " +
                     "openssl rand -hex 32) and restart chatgate.",
      keyRefused: "The admin key was refused: ", couldNotLoad: "Could not load: ",
      ready: "{0}. Updated {1}.", lastN: "Last {0} {1}(s)", range: "{0} to {1}", dayBuckets: "days are UTC days",
      times: "times in {0}", filtered: "only {0}",
      requests: "requests", rejected: "rejected by a rule", limited: "limited (429)",
      dsRefused: "refused by DeepSeek (4xx)", dsFailed: "failed at DeepSeek (5xx, no answer)",
      promptTokens: "prompt tokens", completionTokens: "completion tokens", cost: "cost ({0})",
      billedCalls: "tool calls billed", theirCost: "their cost ({0})", hitRate: "cache hit rate",
      saved: "saved by the cache ({0})",
      noUsage: "No usage in this range.", noErrors: "No errors in this range.", noRefused: "No refused requests.",
      noRepaired: "No repaired requests.", noOffender: "No key has had a request refused or limited.",
      noPrompt: "No prompt tokens in this range.", noBreak: "No prefix break seen: prompts keep their prefix.",
      passthroughPool: "Passthrough mode: each client's own DeepSeek key goes upstream.", noTeams: "No teams yet.",
      noRefusals: "No refusals kept.", noLatency: "No answered request in this range.",
      model: "model", p50: "p50", p95: "p95", account: "account", keyVariable: "key variable", state: "state",
      inFlight: "in flight", weight: "weight", available: "available", no_key: "no key", setAside: "set aside ({0}, back in {1} s)",
      keys: "keys", budget: "budget", period: "period", spent: "spent", remaining: "remaining", use: "use",
      forecast: "forecast", noBudget: "no budget", renews: "{0} (renews {1})", thisMonth: " (this month)",
      overForecast: "over budget by the period's end at this pace", total: "total",
      breakAt: "break at", tokensLost: "tokens lost ~", lost: "lost ~", causeFix: "usual cause and fix",
      offKey: "key", refusedPct: "refused %", time: "time ({0})", requestId: "request id", status: "status",
      by: "by", route: "route", rules: "rules", couldNotLoadOne: "Could not load {0}: {1}",
      balanceAvailable: "available for requests", yes: "yes", no: "no", balanceTotal: "balance",
      balanceGranted: "granted", balanceToppedUp: "topped up",
      balancePassthrough: "Passthrough mode: each client's key has its own balance; ask /user/balance with that key.",
      balanceNoKey: "Managed mode without a DeepSeek key (DEEPSEEK_API_KEY): nothing to ask DeepSeek with.",
      balanceRefused: "DeepSeek would not give the balance: {0}",
      kindRejected: "rejected (rule)", kindLimited: "limited (429)", kindRefused: "DeepSeek refused (4xx)",
      kindFailed: "DeepSeek failed (5xx)",
      demo: "DEMO: the answers come from chatgate demo's offline stand-in, not from DeepSeek.",
    },
    zh: {
      title: "chatgate 用量", adminKey: "管理密钥", load: "加载", forget: "清除密钥", language: "语言",
      timeZone: "时间", tzLocal: "浏览器所在时区", tzBeijing: "UTC+8（北京时间）", bucket: "粒度",
      day: "天", hour: "小时", week: "周", month: "月", last: "最近", buckets: "个时段", from: "或从", to: "到", team: "团队",
      key: "密钥", all: "全部", autoRefresh: "自动刷新", off: "关", refresh: "刷新", csv: "导出 CSV",
      latencyCard: "各模型延迟", latencyNote: "（已应答的请求，p50 与 p95）",
      errorsCard: "按类型统计的错误", errorsNote: "（每个请求只计一次，按时段）",
      balanceCard: "DeepSeek 余额", balanceNote: "（账户当前余额）",
      accountsCard: "DeepSeek 账户", accountsNote: "（账户池，当前状态）",
      budgetsCard: "各团队预算与花费预测",
      budgetsNote: "（当前周期，UTC；预测按本周期迄今的速度推算）",
      tokensTeam: "各团队 token 数", costTeam: "各团队费用", tokensKey: "各密钥 token 数", costKey: "各密钥费用",
      tokensModel: "各模型 token 数", costModel: "各模型费用", cacheCard: "缓存",
      cacheNote: "（各团队 DeepSeek 上下文缓存命中率；代价最高的前缀断点，估算）",
      rejectionsCard: "chatgate 拒绝的请求（按规则与限额）", repairsCard: "按修复类型统计的已修复请求",
      offendersCard: "被拒最多的密钥（被拒或被限流）", refusalsCard: "最近的拒绝",
      refusalsNote: "（chatgate 的 400 与 DeepSeek 的 4xx，请求体已脱敏；点击查看详情）",
      enterKey: "请输入管理密钥以加载用量。", loading: "加载中…",
      notConfigured: "这个 chatgate 没有配置管理密钥：请设置 CHATGATE_ADMIN_KEY（可用 openssl rand -hex 32 生成）" +
                     "并重启 chatgate。",
      keyRefused: "管理密钥被拒绝：", couldNotLoad: "无法加载：",
      ready: "{0}。更新于 {1}。", lastN: "最近 {0} 个{1}", range: "{0} 至 {1}", dayBuckets: "按 UTC 日期分天",
      times: "时间为 {0}", filtered: "仅 {0}",
      requests: "请求数", rejected: "被规则拒绝", limited: "被限流（429）",
      dsRefused: "被 DeepSeek 拒绝（4xx）", dsFailed: "DeepSeek 失败（5xx、无应答）",
      promptTokens: "输入 token", completionTokens: "输出 token", cost: "费用（{0}）",
      billedCalls: "计费的工具调用", theirCost: "工具调用费用（{0}）", hitRate: "缓存命中率",
      saved: "缓存节省（{0}）",
      noUsage: "此时间范围内没有用量。", noErrors: "此时间范围内没有错误。", noRefused: "没有被拒绝的请求。",
      noRepaired: "没有被修复的请求。", noOffender: "没有密钥的请求被拒绝或限流。",
      noPrompt: "此时间范围内没有输入 token。", noBreak: "没有发现前缀断点：提示词保持了前缀。",
      passthroughPool: "透传模式：每个客户端用自己的 DeepSeek 密钥访问上游。", noTeams: "还没有团队。",
      noRefusals: "没有保留的拒绝记录。", noLatency: "此时间范围内没有已应答的请求。",
      model: "模型", p50: "p50", p95: "p95", account: "账户", keyVariable: "密钥变量", state: "状态",
      inFlight: "进行中", weight: "权重", available: "可用", no_key: "无密钥", setAside: "暂停使用（{0}，{1} 秒后恢复）",
      keys: "密钥数", budget: "预算", period: "周期", spent: "已花费", remaining: "剩余", use: "使用率",
      forecast: "预测", noBudget: "无预算", renews: "{0}（{1} 重置）", thisMonth: "（本月）",
      overForecast: "按此速度，周期结束前会超出预算", total: "总计",
      breakAt: "断点位置", tokensLost: "损失 token ~", lost: "损失 ~", causeFix: "常见原因与修正",
      offKey: "密钥", refusedPct: "被拒比例", time: "时间（{0}）", requestId: "请求 ID", status: "状态码",
      by: "拒绝方", route: "路由", rules: "规则", couldNotLoadOne: "无法加载 {0}：{1}",
      balanceAvailable: "可用于请求", yes: "是", no: "否", balanceTotal: "余额",
      balanceGranted: "赠送", balanceToppedUp: "充值",
      balancePassthrough: "透传模式：每个客户端的密钥有各自的余额，请用该密钥请求 /user/balance。",
      balanceNoKey: "托管模式但没有 DeepSeek 密钥（DEEPSEEK_API_KEY），无法向 DeepSeek 查询。",
      balanceRefused: "DeepSeek 没有返回余额：{0}",
      kindRejected: "被规则拒绝", kindLimited: "被限流（429）", kindRefused: "DeepSeek 拒绝（4xx）",
      kindFailed: "DeepSeek 失败（5xx）",
      demo: "演示：应答来自 chatgate demo 的离线替身，不是 DeepSeek。",
    },
  };
  let lang = "en";
  function t(name, ...args) {
    const text = (I18N[lang] && I18N[lang][name]) || I18N.en[name] || name;
    return text.replace(/\{(\d)\}/g, (_, i) => String(args[Number(i)]));
  }

  function applyLang() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    document.title = t("title");
    $("lang").value = lang;
    document.querySelectorAll("[data-i18n]").forEach((node) => { node.textContent = t(node.dataset.i18n); });
  }

  // Times: in this browser's zone, in UTC, or in Beijing time (UTC+8, no daylight saving).
  const ZONES = { local: undefined, utc: "UTC", utc8: "Asia/Shanghai" };
  let zone = "local";
  function zoneLabel() {
    if (zone === "utc") return "UTC";
    if (zone === "utc8") return "UTC+8";
    const off = -new Date().getTimezoneOffset(), h = Math.trunc(Math.abs(off) / 60), m = Math.abs(off) % 60;
    return "UTC" + (off < 0 ? "-" : "+") + h + (m ? ":" + String(m).padStart(2, "0") : "");
  }
  function parts(date) {
    const out = {};
    new Intl.DateTimeFormat("en-CA", { timeZone: ZONES[zone], year: "numeric", month: "2-digit", day: "2-digit",
                                       hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" })
      .formatToParts(date).forEach((p) => { out[p.type] = p.value; });
    return out;
  }
  function fmtTime(ts) {
    const p = parts(new Date(ts * 1000));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
  }
  // The unix seconds at the start of a YYYY-MM-DD day in the chosen zone.
  function dayStart(value) {
    const [y, m, d] = value.split("-").map(Number);
    if (zone === "utc") return Date.UTC(y, m - 1, d) / 1000;
    if (zone === "utc8") return Date.UTC(y, m - 1, d) / 1000 - 8 * 3600;
    return new Date(y, m - 1, d).getTime() / 1000;
  }

  let openRefusal = null;
  let timer = null;
  let demo = null;
  const shown = { series: {}, latency: [], currency: "USD" };  // what the CSV export holds
  const keyNames = new Map();  // key id -> name, as seen: the key filter's options

  // The key may arrive in the URL fragment (#key=...; never sent to the server); keep it for this tab only.
  // The view's settings may come in the query string too (?lang=zh&tz=utc8&team=…): no secret goes there.
  function readFragment() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const query = new URLSearchParams(location.search);
    const pick = (name) => params.get(name) || query.get(name);
    if (params.get("key")) sessionStorage.setItem(KEY, params.get("key"));
    lang = pick("lang") || localStorage.getItem(LANG) || ((navigator.language || "").startsWith("zh") ? "zh" : "en");
    if (!I18N[lang]) lang = "en";
    zone = pick("tz") || localStorage.getItem(TZ) || "local";
    if (!(zone in ZONES)) zone = "local";
    $("tz").value = zone;
    for (const name of ["bucket", "span", "from", "to"]) if (pick(name)) $(name).value = pick(name);
    for (const [name, id] of [["team", "team"], ["key_id", "key"]]) {
      const value = pick(name);
      if (value) { addOption($(id), value, value); $(id).value = value; }
    }
    if (pick("refresh")) { addOption($("refresh-every"), pick("refresh"), pick("refresh") + " s"); $("refresh-every").value = pick("refresh"); }
    if (params.get("refusal")) openRefusal = params.get("refusal");  // a link to one refusal, opened on load
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  }

  function addOption(select, value, label) {
    let option = Array.from(select.options).find((o) => o.value === value);
    if (!option) {
      option = document.createElement("option");
      option.value = value;
      select.append(option);
    }
    option.textContent = label;
  }

  function setStatus(state, text) {
    document.body.dataset.state = state;
    $("status").textContent = text;
  }

  async function api(path) {
    const key = sessionStorage.getItem(KEY);
    const headers = key ? { Authorization: "Bearer " + key } : {};  // no key: asked without one, never a guess
    const resp = await fetch(path, { headers, cache: "no-store" });
    demo = demo || resp.headers.get("x-chatgate-demo");  // `chatgate demo`: not DeepSeek, and the page says so
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

  // A chart as wide as its data needs (up to the card): 48 px a bucket, never stretched beyond that.
  function chartWidth(buckets) {
    return Math.max(260, Math.min(640, 90 + 48 * buckets));
  }
  function sizedSvg(W, H, label) {
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, class: "sized",
                            "data-width": String(W) });
    svg.style.setProperty("--w", W + "px");  // CSSOM, which the page's CSP allows (a style attribute it would not)
    return svg;
  }
  function emptyNote(container, text) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = text;
    container.append(p);
  }
  function tableWith(container, heads) {
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const [h, cls] of heads) {
      const th = document.createElement("th");
      th.textContent = h;
      th.className = cls || "";
      head.append(th);
    }
    container.append(table);
    return table.createTBody();
  }
  function cells(tr, values) {
    for (const [v, cls] of values) {
      const td = tr.insertCell();
      td.textContent = String(v);
      td.className = cls || "";
    }
  }
  function bucketLabel(b, start) {
    if (b.length <= 10) return b.slice(5);  // a UTC day
    const p = parts(new Date(start * 1000));
    return `${p.hour}:00`;  // the day is in the status line and in each bar's title
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
  function stackedBars(container, buckets, series, metric, starts, empty) {
    container.replaceChildren();
    const W = chartWidth(buckets.length), H = 220, L = 70, R = 10, T = 10, B = 34;
    const totals = buckets.map((_, i) => series.reduce((s, e) => s + e[metric][i], 0));
    const grand = totals.reduce((a, b) => a + b, 0);
    container.dataset.series = String(series.length);
    container.dataset.total = String(grand);
    if (!series.length || grand === 0) {
      emptyNote(container, empty || t("noUsage"));
      return;
    }
    const max = niceMax(Math.max(...totals));
    const svg = sizedSvg(W, H, metric);
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
        rect.append(el("title", {}, `${s.label} ${b.length > 10 ? fmtTime(starts[i]).slice(0, 16) : b}: ${fmt(v, metric)}`));
        svg.append(rect);
      });
      if (i % every === 0) {
        svg.append(el("text", { x: x + bw / 2, y: H - B + 16, "text-anchor": "middle" }, bucketLabel(b, starts[i])));
      }
    });
    svg.append(el("line", { x1: L, x2: W - R, y1: T + plotH, y2: T + plotH, stroke: "#9aa1ae" }));
    container.append(svg);
    legend(container, series.map((s) => `${s.label} (${fmt(s[metric].reduce((a, b) => a + b, 0), metric)})`));
  }

  // Horizontal bars: requests per code (rejections per rule code, repairs per repair).
  function codeBars(container, rows, label, empty, fill) {
    container.replaceChildren();
    container.dataset.series = String(rows.length);
    container.dataset.total = String(rows.reduce((s, r) => s + r.count, 0));
    if (!rows.length) {
      emptyNote(container, empty);
      return;
    }
    const shown = rows.slice(0, 12), rowH = 22, L = 200, W = 640, H = shown.length * rowH + 8;
    const max = Math.max(...shown.map((r) => r.count));
    const svg = sizedSvg(W, H, label);
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
      emptyNote(container, t("noOffender"));
      return;
    }
    const tbody = tableWith(container, [[t("offKey")], [t("team")], [t("kindRejected"), "num"], [t("kindLimited"), "num"],
                                        [t("requests"), "num"], [t("refusedPct"), "num"]]);
    for (const r of rows) {
      const pct = r.requests ? ((100 * (r.rejected + r.limited)) / r.requests).toFixed(0) + "%" : "";
      cells(tbody.insertRow(), [[r.key_name || r.key_id], [r.team], [r.rejected, "num"], [r.limited, "num"],
                                [r.requests, "num"], [pct, "num"]]);
    }
  }

  // Lines: the cache hit rate (0-100%) of each series per bucket; a bucket without prompt tokens has no point.
  function hitRateLines(container, buckets, series, starts) {
    container.replaceChildren();
    const shown = series.filter((s) => s.hit_rate.some((r) => r !== null));
    container.dataset.series = String(shown.length);
    container.dataset.rates = JSON.stringify(shown.map((s) => [s.label, s.hit_rate]));
    if (!shown.length) {
      emptyNote(container, t("noPrompt"));
      return;
    }
    const W = chartWidth(buckets.length), H = 180, L = 56, R = 10, T = 10, B = 34, plotW = W - L - R;
    const plotH = H - T - B;
    const svg = sizedSvg(W, H, "cache hit rate");
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
      svg.append(el("text", { x: xAt(i), y: H - B + 16, "text-anchor": "middle" }, bucketLabel(b, starts[i])));
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
      emptyNote(container, t("noBreak"));
      return;
    }
    const tbody = tableWith(container, [[t("team")], [t("breakAt")], [t("requests"), "num"], [t("tokensLost"), "num"],
                                        [t("lost"), "num"], [t("causeFix")]]);
    for (const b of rows.slice(0, 10)) {
      const tr = tbody.insertRow();
      tr.className = "break-row";
      Object.assign(tr.dataset, { team: b.team, param: b.param, lost: String(b.lost), count: String(b.count) });
      [[b.team, ""], [b.param, "code"], [b.count, "num"], [fmt(b.lost_tokens, "tokens"), "num"],
       [fmt(b.lost, "cost"), "num"], [b.hint, "hint"]]
        .forEach(([v, cls]) => { const td = tr.insertCell(); td.textContent = String(v); td.className = cls; });
    }
  }

  const usd = (v) => fmt(v, "cost");

  // The pool of DeepSeek accounts: each one's state (available, set aside and why, no key), never a key.
  function accountsTable(container, answer) {
    container.replaceChildren();
    const rows = answer.data || [];
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      emptyNote(container, t("passthroughPool"));
      return;
    }
    const tbody = tableWith(container, [[t("account")], [t("keyVariable")], [t("state")], [t("inFlight"), "num"],
                                        [t("requests"), "num"], [t("weight"), "num"]]);
    for (const r of rows) {
      const state = r.state === "set_aside" ? t("setAside", r.why, Math.ceil(r.back_in_s)) : t(r.state);
      cells(tbody.insertRow(), [[r.name], [r.key_env], [state], [r.in_flight, "num"], [r.requests, "num"],
                                [r.weight, "num"]]);
    }
  }

  // The DeepSeek account's balance (managed mode: GET /user/balance with the admin key), or why there is none.
  async function loadBalance(container, mode) {
    container.replaceChildren();
    if (mode !== "managed") {
      container.dataset.state = "passthrough";
      emptyNote(container, t("balancePassthrough"));
      return;
    }
    try {
      const b = await api("/user/balance");
      container.dataset.state = "ready";
      const list = document.createElement("dl");
      list.className = "balance";
      const add = (name, value) => {
        const dt = document.createElement("dt"), dd = document.createElement("dd");
        dt.textContent = name;
        dd.textContent = value;
        list.append(dt, dd);
      };
      add(t("balanceAvailable"), b.is_available ? t("yes") : t("no"));
      for (const info of b.balance_infos || []) {
        const sign = info.currency === "CNY" ? "¥" : info.currency === "USD" ? "$" : info.currency + " ";
        add(`${t("balanceTotal")} (${info.currency})`, sign + info.total_balance);
        add(t("balanceGranted"), sign + info.granted_balance);
        add(t("balanceToppedUp"), sign + info.topped_up_balance);
      }
      container.append(list);
    } catch (err) {
      container.dataset.state = "unavailable";
      emptyNote(container, err.code === "no_upstream_key" ? t("balanceNoKey") : t("balanceRefused", err.message));
    }
  }

  // Latency p50 / p95 per model (GET /admin/latency), the busiest model first.
  function latencyTable(container, rows) {
    container.replaceChildren();
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      emptyNote(container, t("noLatency"));
      return;
    }
    const ms = (v) => (v >= 1000 ? (v / 1000).toFixed(2) + " s" : Math.round(v) + " ms");
    const tbody = tableWith(container, [[t("model")], [t("requests"), "num"], [t("p50"), "num"], [t("p95"), "num"]]);
    for (const r of rows) {
      const tr = tbody.insertRow();
      tr.className = "latency-row";
      Object.assign(tr.dataset, { model: r.model, p50: String(r.p50_ms), p95: String(r.p95_ms), count: String(r.count) });
      cells(tr, [[r.model], [r.count, "num"], [ms(r.p50_ms), "num"], [ms(r.p95_ms), "num"]]);
    }
  }

  // The four kinds of error per bucket, summed over the teams' series: a stacked bar per bucket.
  function errorBars(container, data) {
    const kinds = [["rejected", "kindRejected"], ["limited", "kindLimited"], ["upstream_refused", "kindRefused"],
                   ["upstream_failed", "kindFailed"]];
    const series = kinds.map(([name, label]) => {
      const values = data.buckets.map((_, i) => data.series.reduce((s, e) => s + e[name][i], 0));
      return { label: t(label), kind: name, errors: values };
    });
    stackedBars(container, data.buckets, series.filter((s) => s.errors.some((v) => v)), "errors", data.bucket_starts,
                t("noErrors"));
    container.dataset.kinds = JSON.stringify(Object.fromEntries(series.map((s) => [s.kind, s.errors.reduce((a, b) => a + b, 0)])));
  }

  // Recent refusals: one row per kept refusal, its request id a link that opens its details in a row just
  // below it (GET /admin/refusals/{id}), where it was clicked.
  function refusalsTable(container, rows, why) {
    container.replaceChildren();
    container.dataset.rows = String(rows.length);
    if (!rows.length) {
      emptyNote(container, why || t("noRefusals"));
      return;
    }
    const tbody = tableWith(container, [[t("time", zoneLabel())], [t("requestId")], [t("status")], [t("by")],
                                        [t("team")], [t("key")], [t("route")], [t("rules")]]);
    for (const r of rows) {
      const tr = tbody.insertRow();
      tr.dataset.refusal = r.refusal_id;
      tr.insertCell().textContent = fmtTime(r.ts);
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
  }

  async function showRefusal(id) {
    const old = $("refusal-detail");
    if (old) {
      const openRow = old.closest("tr");
      if (openRow && openRow.previousElementSibling) openRow.previousElementSibling.classList.remove("refusal-open");
      if (openRow) openRow.remove();
      if (openRow && openRow.dataset.refusal === id) return;  // a second click closes it
    }
    const row = Array.from(document.querySelectorAll("#refusals tr[data-refusal]")).find((r) => r.dataset.refusal === id);
    const pre = document.createElement("pre");
    pre.id = "refusal-detail";
    if (row) {
      const detail = document.createElement("tr");
      detail.className = "detail-row";
      detail.dataset.refusal = id;
      const td = detail.insertCell();
      td.colSpan = row.cells.length;
      td.append(pre);
      row.after(detail);
      row.classList.add("refusal-open");
    } else {
      $("refusals").prepend(pre);  // not among the rows shown (an older one, from a link)
    }
    try {
      const r = await api("/admin/refusals/" + encodeURIComponent(id));
      const problems = r.problems.map((p) => `${p.rule || p.code}${p.param ? " at " + p.param : ""}: ${p.message}`);
      pre.textContent = `${r.request_id}  ${r.status} by ${r.source}  ${r.route}  team ${r.team}  key ${r.key_id}\n` +
        problems.join("\n") + "\n\n" + r.marked;
    } catch (err) {
      pre.textContent = t("couldNotLoadOne", id, err.message);
    }
    pre.scrollIntoView({ block: "nearest" });
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
    return fmtTime(ts).slice(0, 10);
  }

  // Where the period's spend ends at the pace so far: spent × period length / time elapsed (null: no period).
  function forecastOf(spend, now) {
    if (!spend.period_end || !spend.period_start || spend.period === "total") return null;
    const elapsed = Math.max(now - spend.period_start, 3600);  // not a wild guess from the first minutes
    return (spend["spent_" + (spend.currency || "USD").toLowerCase()] * (spend.period_end - spend.period_start)) / elapsed;
  }

  // Budget use per team, from GET /admin/teams: budget, period, spent, remaining and a bar of the percentage.
  function budgetsTable(container, teams) {
    container.replaceChildren();
    container.dataset.rows = String(teams.length);
    const budgetOf = (team) => (team.limits.budget_usd !== undefined ? team.limits.budget_usd : team.limits.budget_cny);
    container.dataset.budgets = String(teams.filter((t) => budgetOf(t) !== null).length);
    if (!teams.length) {
      emptyNote(container, t("noTeams"));
      return;
    }
    const tbody = tableWith(container, [[t("team")], [t("keys"), "num"], [t("budget"), "num"], [t("period")],
                                        [t("spent"), "num"], [t("remaining"), "num"], [t("forecast"), "num"], [t("use")]]);
    const now = Date.now() / 1000;
    for (const team of teams) {
      const budget = budgetOf(team), s = team.spend, cur = (s.currency || "USD").toLowerCase();
      const spent = s["spent_" + cur], remaining = s["remaining_" + cur];
      const tr = tbody.insertRow();
      tr.className = "budget-row";
      const forecast = forecastOf(s, now), over = budget !== null && forecast !== null && forecast > budget;
      Object.assign(tr.dataset, {
        team: team.team, budget: budget === null ? "" : String(budget), period: budget === null ? "" : s.period,
        forecast: forecast === null ? "" : String(forecast), forecastOver: String(over),
        spent: String(spent), remaining: remaining === null ? "" : String(remaining), currency: cur,
        percent: s.used_percent === null ? "" : String(s.used_percent),
      });
      let period = "";
      if (budget !== null) {
        period = s.period === "total" ? t("total") : t("renews", t(s.period), day(s.period_end));
      }
      cells(tr, [[team.team], [team.key_count, "num"],
                 [budget === null ? t("noBudget") : usd(budget), budget === null ? "num muted" : "num"], [period],
                 [usd(spent) + (budget === null ? t("thisMonth") : ""), "num"],
                 [budget === null ? "" : usd(remaining), "num"],
                 [forecast === null ? "" : usd(forecast), over ? "num over" : "num"]]);
      if (over) tr.cells[tr.cells.length - 1].title = t("overForecast");
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
  }

  function totalsBox(report) {
    const box = $("totals");
    box.replaceChildren();
    const n = report.totals, cur = report.currency;
    // each request once: answered, refused by chatgate's rules (400), limited by chatgate (429), refused by
    // DeepSeek (its 4xx), failed at DeepSeek (5xx after the retries, or no answer)
    for (const [label, value] of [[t("requests"), n.requests], [t("rejected"), n.rejected],
                                  [t("limited"), n.limited], [t("dsRefused"), n.upstream_refused],
                                  [t("dsFailed"), n.upstream_failed],
                                  [t("promptTokens"), n.prompt_tokens], [t("completionTokens"), n.completion_tokens],
                                  [t("cost", cur), fmt(n.cost, "cost")],
                                  [t("billedCalls"), n.billed_calls],
                                  [t("theirCost", cur), fmt(n["billed_" + cur.toLowerCase()], "cost")],
                                  [t("hitRate"), n.cache_hit_rate === null ? "-" : (100 * n.cache_hit_rate).toFixed(1) + "%"],
                                  [t("saved", cur), fmt(n["cache_saved_" + cur.toLowerCase()], "cost")]]) {
      const d = document.createElement("div");
      d.className = "total";
      const b = document.createElement("b");
      b.textContent = typeof value === "number" ? fmt(value, "tokens") : value;
      const span = document.createElement("span");
      span.textContent = label;
      d.append(b, span);
      box.append(d);
    }
  }

  // not "refused": this chatgate has no admin key at all (auth.admin_key unset; the admin API says 503)
  function notConfigured() {
    setStatus("error", t("notConfigured"));
  }

  // The records asked for: the date range (or the last N buckets), the team and the key.
  function selection() {
    const bucket = $("bucket").value;
    const width = bucket === "day" ? 86400 : 3600;
    let since, until = null;
    if ($("from").value) {
      since = dayStart($("from").value);
      if ($("to").value) until = dayStart($("to").value) + 86400;
    } else {
      const span = Math.max(1, Math.min(400, parseInt($("span").value, 10) || 14));
      const now = Date.now() / 1000;
      since = now - (now % width) - (span - 1) * width;
    }
    const params = new URLSearchParams({ since: String(Math.floor(since)) });
    if (until !== null) params.set("until", String(Math.floor(until)));
    if ($("team").value) params.set("team", $("team").value);
    if ($("key").value) params.set("key", $("key").value);
    return { bucket, since, until, query: params.toString() };
  }

  function describe(sel) {
    const what = $("from").value
      ? t("range", $("from").value, $("to").value || fmtTime(Date.now() / 1000).slice(0, 10))
      : t("lastN", $("span").value, t(sel.bucket));
    const only = [$("team").value, $("key").value && (keyNames.get($("key").value) || $("key").value)].filter((v) => v);
    return [what, only.length ? t("filtered", only.join(", ")) : "", sel.bucket === "day" ? t("dayBuckets") : "",
            t("times", zoneLabel())].filter((v) => v).join(" · ");
  }

  // CSV of what is shown: the series of every chart per bucket, then the latency per model.
  function csvLink() {
    const cur = shown.currency;
    const rows = [["section", "by", "group", "bucket_utc", "requests", "tokens", "cost_" + cur.toLowerCase(),
                   "rejected", "limited", "ds_refused", "ds_failed", "p50_ms", "p95_ms"]];
    for (const [by, data] of Object.entries(shown.series)) {
      for (const e of data.series) {
        data.buckets.forEach((b, i) => {
          rows.push(["usage", by, e.label, b, e.requests[i], e.tokens[i], e.cost[i], e.rejected[i], e.limited[i],
                     e.upstream_refused[i], e.upstream_failed[i], "", ""]);
        });
      }
    }
    for (const r of shown.latency) rows.push(["latency", "model", r.model, "", r.count, "", "", "", "", "", "", r.p50_ms, r.p95_ms]);
    const quote = (v) => (/[",\n]/.test(String(v)) ? '"' + String(v).replace(/"/g, '""') + '"' : String(v));
    const text = rows.map((r) => r.map(quote).join(",")).join("\n") + "\n";
    const link = $("csv");
    link.href = "data:text/csv;charset=utf-8," + encodeURIComponent(text);
    link.dataset.rows = String(rows.length - 1);
    link.removeAttribute("aria-disabled");
  }

  function rememberKeys(keySeries, keys) {
    for (const k of keys) if (k.id) keyNames.set(k.id, k.name);
    for (const s of keySeries) if (s.key_id && !keyNames.has(s.key_id)) keyNames.set(s.key_id, s.label);
    for (const [id, name] of keyNames) addOption($("key"), id, name);
  }

  const more = [];  // the cards of other static files: called with the selection on every load

  async function load() {
    if (!sessionStorage.getItem(KEY)) {
      setStatus("locked", t("enterKey"));
      try { await api("/admin/teams"); } catch (err) { if (err.code === "admin_key_not_configured") notConfigured(); }
      return;
    }
    const sel = selection(), q = `bucket=${sel.bucket}&${sel.query}`;
    setStatus("loading", t("loading"));
    try {
      const [team, key, model, totals, rejections, repairs, teams, accounts, cache, latency, keys] = await Promise.all([
        api(`/admin/usage/timeseries?by=team&${q}`), api(`/admin/usage/timeseries?by=key&${q}`),
        api(`/admin/usage/timeseries?by=model&${q}`), api(`/admin/usage?by=team&${sel.query}`),
        api(`/admin/rejections?${sel.query}`), api(`/admin/repairs?${sel.query}`), api("/admin/teams"),
        api("/admin/accounts"), api(`/admin/cache?by=team&${sel.query}`), api(`/admin/latency?${sel.query}`),
        api("/admin/keys").catch(() => ({ data: [] }))]);
      money = totals.currency === "CNY" ? "¥" : "$";
      shown.series = { team, key, model };
      shown.latency = latency.by_model;
      shown.currency = totals.currency;
      for (const t0 of teams.data) addOption($("team"), t0.team, t0.team);
      rememberKeys(key.series, keys.data || []);
      document.querySelectorAll(".chart[data-by]").forEach((c) => {
        const data = shown.series[c.dataset.by];
        stackedBars(c, data.buckets, data.series.slice(0, COLORS.length), c.dataset.metric, data.bucket_starts);
      });
      totalsBox(totals);
      errorBars($("chart-errors"), team);
      latencyTable($("latency"), latency.by_model);
      codeBars($("chart-rejections"), rejections.by_rule, "refusals by rule and limit", t("noRefused"), "#c0392b");
      codeBars($("chart-repairs"), repairs.by_code, "repairs by code", t("noRepaired"), "#2e86c1");
      offendersTable($("offenders"), rejections.top_offenders);
      budgetsTable($("budgets"), teams.data);
      accountsTable($("accounts"), accounts);
      await loadBalance($("balance"), accounts.mode);
      await loadRefusals();
      hitRateLines($("chart-cache-team"), team.buckets, team.series.slice(0, COLORS.length), team.bucket_starts);
      breaksTable($("cache-breaks"), cache);
      csvLink();
      for (const card of more) {
        try { await card(sel); } catch (err) { console.warn("a dashboard card failed:", err); }  // not the page
      }
      setStatus("ready", (demo ? t("demo") + " " : "") + t("ready", describe(sel), fmtTime(Date.now() / 1000).slice(11)));
    } catch (err) {
      if (err.status === 401) sessionStorage.removeItem(KEY);
      if (err.code === "admin_key_not_configured") return notConfigured();
      setStatus("error", err.status === 401 ? t("keyRefused") + err.message : t("couldNotLoad") + err.message);
    }
  }

  function autoRefresh() {
    if (timer) clearInterval(timer);
    const every = parseInt($("refresh-every").value, 10) || 0;
    timer = every > 0 ? setInterval(load, every * 1000) : null;
  }

  // For a card in a file of its own (one <script> line in dashboard.html): it registers a function that
  // draws it for the current selection; api(), t(), fmtTime() and the selection's query are shared.
  window.chatgateDashboard = {
    api, t, fmtTime, zoneLabel, emptyNote, tableWith, cells,
    addCard(draw, messages) {
      for (const [code, texts] of Object.entries(messages || {})) Object.assign(I18N[code] || {}, texts);
      more.push(draw);
    },
    container: () => $("more-cards"),
  };

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
  for (const id of ["span", "from", "to", "team", "key"]) $(id).addEventListener("change", load);
  $("refresh-every").addEventListener("change", autoRefresh);
  $("lang").addEventListener("change", () => { lang = $("lang").value; localStorage.setItem(LANG, lang); applyLang(); load(); });
  $("tz").addEventListener("change", () => { zone = $("tz").value; localStorage.setItem(TZ, zone); load(); });
  $("csv").setAttribute("aria-disabled", "true");
  readFragment();
  applyLang();
  autoRefresh();
  // the other cards' scripts come after this one: draw once they have registered
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", load);
  else load();
})();

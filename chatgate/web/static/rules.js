// The Rules card (docs/confirmation.md): the rules DeepSeek disputed (they warn instead of refusing) and the
// refusals of DeepSeek no rule predicted, from GET /admin/rules. A card of its own file, added through
// window.chatgateDashboard (docs/dashboard.md).
(function () {
  "use strict";
  const d = window.chatgateDashboard;
  if (!d) return;

  function figure() {
    let fig = document.getElementById("rules-card");
    if (!fig) {
      fig = document.createElement("figure");
      fig.id = "rules-card";
      fig.className = "card wide";
      d.container().append(fig);
    }
    fig.replaceChildren();
    const caption = document.createElement("figcaption");
    caption.textContent = d.t("rulesCard");
    const note = document.createElement("small");
    note.textContent = " " + d.t("rulesNote");
    caption.append(note);
    fig.append(caption);
    const body = document.createElement("div");
    fig.append(body);
    return body;
  }

  const when = (iso) => (iso ? d.fmtTime(Date.parse(iso) / 1000) : "-");

  async function draw(sel) {
    const body = figure();
    const since = new URLSearchParams(sel.query).get("since");
    const report = await d.api("/admin/rules" + (since ? "?since=" + encodeURIComponent(since) : ""));
    const disputed = report.rules.filter((r) => r.status === "disputed");
    if (!disputed.length) d.emptyNote(body, d.t("rulesNoDisputed"));
    else {
      const rows = d.tableWith(body, [[d.t("rulesRule")], [d.t("rulesFamily")], [d.t("rulesModel")], [d.t("rulesDisputedAt")],
                                      [d.t("rulesConfirmedAt")], [d.t("rulesExample")]]);
      for (const r of disputed) {
        d.cells(rows.insertRow(), [[r.rule], [r.family], [r.model], [when(r.last_disputed)],
                                   [when(r.last_confirmed)], [r.example_request_id || ""]]);
      }
    }
    const groups = report.unpredicted.slice(0, 10);
    if (!groups.length) d.emptyNote(body, d.t("rulesNoUnpredicted"));
    else {
      const rows = d.tableWith(body, [[d.t("rulesCount"), "num"], [d.t("rulesFamily")], [d.t("rulesModel")],
                                      [d.t("rulesLastSeen")], [d.t("rulesDeepseekSays")]]);
      for (const g of groups) {
        d.cells(rows.insertRow(), [[g.count, "num"], [g.family], [g.model], [when(g.last_seen)], [g.message]]);
      }
    }
  }

  d.addCard(draw, {
    en: {
      rulesCard: "Rules", rulesNote: "(rules DeepSeek disputed, which warn instead of refusing, and DeepSeek's refusals no rule predicted)",
      rulesRule: "rule", rulesFamily: "family", rulesModel: "model", rulesDisputedAt: "disputed", rulesConfirmedAt: "last confirmed", rulesExample: "example request",
      rulesNoDisputed: "No rule disputed: DeepSeek confirmed every refusal it was asked about.",
      rulesNoUnpredicted: "No refusal of DeepSeek's that chatgate did not predict.", rulesCount: "count",
      rulesLastSeen: "last seen", rulesDeepseekSays: "DeepSeek's message (numbers and ids masked)",
    },
    zh: {
      rulesCard: "规则", rulesNote: "（被 DeepSeek 否定的规则——改为警告而不拒绝——以及没有规则预料到的 DeepSeek 拒绝）",
      rulesRule: "规则", rulesFamily: "接口", rulesModel: "模型", rulesDisputedAt: "被否定于", rulesConfirmedAt: "最近确认", rulesExample: "示例请求",
      rulesNoDisputed: "没有被否定的规则：DeepSeek 确认了每一次询问的拒绝。",
      rulesNoUnpredicted: "没有 chatgate 未预料到的 DeepSeek 拒绝。", rulesCount: "次数",
      rulesLastSeen: "最近一次", rulesDeepseekSays: "DeepSeek 的消息（数字和 ID 已遮盖）",
    },
  });
})();

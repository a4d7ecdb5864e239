# ruff: noqa: RUF001  (the Chinese texts use Chinese punctuation: full-width parentheses, colons)
"""How the CLI's reports print for people: one way to write a rate and an amount of money, columns padded by
their width on a terminal (a Chinese character takes two), and the reports' words in English or Chinese."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from decimal import Decimal

from chatgate.metering.catalogue import SYMBOLS

LANGUAGES = ("en", "zh")

# The reports' words in Chinese (zh-CN); a word not here prints as it is (a model name, a rule code).
ZH: dict[str, str] = {
    "team": "团队", "key": "密钥", "model": "模型", "day": "日期", "rule_code": "规则或限额",
    "repair": "修复", "account": "账户", "requests": "请求数", "rejected": "规则拒绝", "limited": "限流",
    "ds_refused": "DS拒绝", "ds_failed": "DS失败", "prompt": "输入", "input": "输入",
    "output": "输出", "hit_rate": "命中率", "hit%": "命中率", "cost": "费用", "saved": "缓存节省",
    "calls": "工具调用",
    "calls_cost": "调用费用", "TOTAL": "合计", "cache_hit": "缓存命中", "lost~": "损失~",
    "breaks": "断点", "(not refused)": "（未被拒绝）", "(no repair)": "（未修复）",
    "(no account)": "（无账户）", "(none)": "（无）",
    # the headings of keys list, teams list, refusals list, prices, runs and rules
    "key_id": "密钥ID", "name": "名称", "prefix": "前缀", "budget_usd": "预算USD", "period": "周期",
    "concurrent": "并发", "created": "创建", "revoked": "吊销", "keys": "密钥数", "spent_usd": "已用USD",
    "spent_cny": "已用CNY", "remaining_usd": "剩余USD", "remaining_cny": "剩余CNY", "used": "已用",
    "since": "起始", "time": "时间", "request id": "请求ID", "status": "状态", "by": "拒绝方",
    "route": "路由", "rules": "规则", "currency": "币种", "peak": "高峰价", "off-peak": "低谷价",
    "since (UTC)": "起始(UTC)", "row": "价目行", "source": "来源", "run": "运行", "reqs": "请求",
    "rounds": "轮次", "compl": "输出", "context": "上下文", "ended": "结束", "rule": "规则",
    "family": "接口", "certainty": "确定度", "confirmed": "确认", "disputed": "争议",
    "score w/r/a": "警/拒/收", "last confirmed": "最近确认", "last disputed": "最近争议", "count": "次数",
    "last seen": "最近出现", "message": "消息",
}
# the words a report's notes are made of, in Chinese: {0}... are filled in
ZH_NOTES: dict[str, str] = {
    "legend": "DS拒绝：DeepSeek 的 4xx；DS失败：DeepSeek 的 5xx 或无应答；"
              "金额单位 {0}。",
    "estimated": "{0} 个请求的 token 由 chatgate 估算，而非 DeepSeek 报告"
                 "（见 JSON 报告的 estimated_requests）",
    "other_currency": "费用只计 {0}；另有 {1} 以 {2} 计价"
                      "（见 JSON 报告的 cost_{3}）",
    "key_ids": "密钥 ID（key_…）与团队见 --format json 或 csv。",
    "cache_lost": "（~ 损失：按上一个请求实测的输入 token 估算；"
                  "见 docs/cache.md）",
    "unpredicted": "DeepSeek 拒绝而无规则预见的请求：",
}
EN_NOTES: dict[str, str] = {
    "legend": "ds_refused: DeepSeek's 4xx; ds_failed: its 5xx or no answer; amounts in {0}.",
    "estimated": "{0} request(s) with tokens counted by chatgate, not DeepSeek (estimated_requests in the "
                 "JSON report)",
    "other_currency": "Costs in {0} only; {1} more was priced in {2} (cost_{3} in the JSON report)",
    "key_ids": "Key ids (key_…) and teams are in --format json or csv.",
    "cache_lost": "(~ lost: estimated from the earlier request's measured prompt tokens; see docs/cache.md)",
    "unpredicted": "DeepSeek's refusals no rule predicted:",
}


def language(flag: str | None, env: Mapping[str, str]) -> str:
    """`--lang` if given, else Chinese when the locale asks for it (LC_ALL, LC_MESSAGES, LANG: zh_CN…)."""
    if flag:
        return flag
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = env.get(name)
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


def word(text: str, lang: str) -> str:
    return ZH.get(text, text) if lang == "zh" else text


def lines(rows: Sequence[Sequence[str]], lang: str) -> list[str]:
    """A plain table, every column aligned left and padded by its width on a terminal; the first row is the
    heads, in `lang`."""
    heads = [word(h, lang) for h in rows[0]]
    every = [heads, *rows[1:]]
    widths = [max(width(r[i]) for r in every) for i in range(len(heads))]
    return ["  ".join(pad(c, w, False) for c, w in zip(r, widths, strict=True)).rstrip() for r in every]


def note(name: str, lang: str, *args: object) -> str:
    return (ZH_NOTES if lang == "zh" else EN_NOTES)[name].format(*args)


def rate(value: float | None) -> str:
    """A share, as a percentage with one decimal (51.2%); empty when there is none."""
    return "" if value is None else f"{value:.1%}"


def money(amount: float | None, currency: str) -> str:
    """An amount with its currency's sign ($ or ¥): cents from 1 up, else six decimals without trailing zeros
    (never an exponent, never a small amount rounded to 0)."""
    if amount is None:
        return ""
    sign = SYMBOLS.get(currency.upper(), currency.upper() + " ")
    if amount == 0:
        return f"{sign}0"
    if abs(amount) >= 1:
        return f"{'-' if amount < 0 else ''}{sign}{abs(amount):,.2f}"
    if abs(amount) < 0.000001:
        return f"<{sign}0.000001"
    text = format(Decimal(repr(abs(amount))).quantize(Decimal("0.000001")), "f").rstrip("0").rstrip(".")
    return f"{'-' if amount < 0 else ''}{sign}{text}"


def count(value: int | None) -> str:
    return "" if value is None else str(value)


def tokens(value: int | None) -> str:
    """A token count: exact below 100,000, else three significant digits (988M, 98.8M, 1.23B)."""
    if value is None:
        return ""
    if value < 100_000:
        return str(value)
    for size, unit in ((10**3, "k"), (10**6, "M"), (10**9, "B")):
        if value / size < 999.5:  # else it would round to 1000: the next unit
            return f"{value / size:.3g}{unit}"
    return f"{value / 10**12:.3g}T"


def clip(label: str, columns: int) -> str:
    """A label cut to `columns` terminal columns, with … where it was cut."""
    if width(label) <= columns:
        return label
    while width(label) > columns - 1:
        label = label[:-1]
    return label + "…"


def width(text: str) -> int:
    """Columns `text` takes on a terminal: two for each wide (CJK) character."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, columns: int, right: bool) -> str:
    gap = " " * max(0, columns - width(text))
    return gap + text if right else text + gap


def table(heads: Sequence[str], rows: Sequence[Sequence[str]], total: Sequence[str] | None,
          left: int) -> list[str]:
    """Lines of a table: the first `left` columns aligned left (labels), the others right (numbers); a rule
    under the heads, and above the total."""
    every = [*rows, *([total] if total is not None else [])]
    widths = [max(width(h), *(width(r[i]) for r in every)) if every else width(h)
              for i, h in enumerate(heads)]

    def line(cells: Sequence[str]) -> str:
        padded = (pad(c, w, i >= left) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [line(heads), rule, *(line(r) for r in rows)]
    if total is not None:
        out += [rule, line(total)]
    return out

"""The cache advisor: what DeepSeek's context cache saved each request, and what a prefix break lost.

DeepSeek caches every prompt prefix in 64-token units and bills a hit at a fraction of a miss. A request
whose prompt repeats an earlier one of the same caller but differs near the top (a clock in the system
prompt, tools in another order, a new `user_id`) pays the whole repeated part as misses.

Each request is cut into its rendered parts in DeepSeek's order (`parts_*`), each part hashed (nothing of
its text is kept). `PrefixMemory` keeps, per caller, the last few requests' hashes and measured prompt
tokens, and `PrefixMemory.observe` applies the rule of docs/cache.md: R breaks the prefix of E when R has
at least every part E has, differs from E first at part k, and repeats every part of E after k at the same
place (k is not E's last part); E is the longest remembered request R extends that way or by appending.
The estimated loss: E's prompt tokens, rounded down to DeepSeek's 64-token unit, minus R's measured hits.
"""

from __future__ import annotations

import functools
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from itertools import repeat
from typing import Any

import orjson

from app.metering.pricing import PICO_PER_USD_PER_MTOK, is_peak
from app.profiles import Prices

UNIT = 64  # DeepSeek's cache unit, in tokens
PRINT_OVERHEAD = 300  # bytes of a remembered request besides its hashes (objects, the request id)

_dumps = orjson.dumps


# --- money ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _discount(prices: Prices, peak: bool, off_peak_multiplier: Decimal) -> Decimal:
    """picoUSD per prompt token: a miss's price minus a hit's."""
    scale = PICO_PER_USD_PER_MTOK * (1 if peak else off_peak_multiplier)
    return (prices.input_cache_miss - prices.input_cache_hit) * scale


def discount_picousd(tokens: int, prices: Prices | None, ts: float, windows: list[str],
                     off_peak_multiplier: Decimal) -> int:
    """What `tokens` prompt tokens cost as cache misses minus what they cost as hits, at `ts`'s prices: the
    money hits saved, or (for tokens a break kept out of the cache) the money lost."""
    if prices is None or tokens <= 0:
        return 0
    rate = _discount(prices, is_peak(ts, windows), off_peak_multiplier)
    return int((tokens * rate).to_integral_value(ROUND_HALF_UP))


# --- fingerprints --------------------------------------------------------------------------------------


def _h(value: Any) -> int:
    return hash(value) if type(value) is str or value is None else hash(_dumps(value))


_get = dict.get


def _json_hashes(items: list[Any]) -> list[int]:
    """A hash of each item's JSON, the loop in C (map): an item costs one orjson.dumps and one hash."""
    return list(map(hash, map(_dumps, items)))


@dataclass(slots=True)
class Parts:
    """A request's rendered parts in DeepSeek's order, as one 8-byte hash each, and where they are: the
    first `len(names)` parts are named by `names`; part `len(names) + i` is `seq[seq_offset + i]`.
    `system` maps the parts that are system prompt to a hash of their `content`; `tools` holds each tool's
    hash (the `tools` part is at `tools_at`, -1 without tools)."""

    hashes: bytes
    names: list[str]
    seq: str
    seq_offset: int
    system: dict[int, int]
    tools: list[Any]  # the request's tools themselves: never kept beyond the request (Print keeps hashes)
    tools_at: int

    def tool_hashes(self) -> list[int]:
        return _json_hashes(self.tools)

    def path(self, k: int) -> str:
        if k < len(self.names):
            return self.names[k]
        return f"{self.seq}[{self.seq_offset + k - len(self.names)}]"


def _field(request: Any, name: str) -> Any:
    return request.get(name) if type(request) is dict else getattr(request, name, None)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _tools(request: Any) -> tuple[list[Any], int | None]:
    """The tools and one hash of them all (each tool's own hash is taken only when they changed)."""
    tools = _field(request, "tools")
    if not isinstance(tools, list) or not tools:
        return [], None
    return tools, hash(_dumps(tools))


def _pack(hashes: list[int]) -> bytes:
    return array("q", hashes).tobytes()


def parts_chat(request: Any) -> Parts:
    """Chat completions: the system messages (DeepSeek's template puts them first), the tools, then every
    other message in order."""
    messages = _list(_field(request, "messages"))
    user = _field(request, "user_id")
    head = [_h(_field(request, "model")), _h(user) if user is not None else 0]
    names = ["model", "user_id"]
    roles = list(map(_get, messages, repeat("role")))
    n = roles.count("system")
    tools, tools_hash = _tools(request)
    if roles[:n] == ["system"] * n:  # the usual case: the system messages lead
        hashes = _json_hashes(messages)
        system = {2 + i: _h(_get(messages[i], "content")) for i in range(n)}
        names += [f"messages[{i}]" for i in range(n)]
        tools_at = -1
        if tools_hash is not None:
            tools_at = len(names)
            names.append("tools")
            hashes.insert(n, tools_hash)
        return Parts(_pack(head + hashes), names, "messages", n, system, tools, tools_at)
    # system messages further down: DeepSeek still renders them first (rare: spelt out part by part)
    order = [i for i, r in enumerate(roles) if r == "system"]
    system = {2 + j: _h(_get(messages[i], "content")) for j, i in enumerate(order)}
    tools_at = -1
    if tools_hash is not None:
        tools_at = 2 + len(order)
    rest = [i for i, r in enumerate(roles) if r != "system"]
    names += [f"messages[{i}]" for i in order] + (["tools"] if tools_hash is not None else [])
    names += [f"messages[{i}]" for i in rest]
    hashes = _json_hashes([messages[i] for i in order]) + ([tools_hash] if tools_hash is not None else [])
    hashes += _json_hashes([messages[i] for i in rest])
    return Parts(_pack(head + hashes), names, "messages", len(messages), system, tools, tools_at)


def parts_anthropic(request: Any) -> Parts:
    """The Anthropic route: tools, system, then the messages (the order DeepSeek renders them in)."""
    metadata = _field(request, "metadata")
    user = _field(metadata, "user_id") if metadata is not None else None
    hashes = [_h(_field(request, "model")), _h(user) if user is not None else 0]
    names = ["model", "metadata.user_id"]
    tools, tools_hash = _tools(request)
    tools_at = -1
    if tools_hash is not None:
        tools_at = len(names)
        names.append("tools")
        hashes.append(tools_hash)
    system: dict[int, int] = {}
    prompt = _field(request, "system")
    if prompt is not None:
        system[len(names)] = _h(prompt)
        names.append("system")
        hashes.append(system[len(names) - 1])
    hashes += _json_hashes(_list(_field(request, "messages")))
    return Parts(_pack(hashes), names, "messages", 0, system, tools, tools_at)


def parts_responses(request: Any) -> Parts:
    """The Responses API: instructions (the first system message), tools, then the input items."""
    user = _field(request, "user")
    hashes = [_h(_field(request, "model")), _h(user) if user is not None else 0]
    names = ["model", "user"]
    system: dict[int, int] = {}
    instructions = _field(request, "instructions")
    if instructions is not None:
        system[len(names)] = _h(instructions)
        names.append("instructions")
        hashes.append(system[len(names) - 1])
    tools, tools_hash = _tools(request)
    tools_at = -1
    if tools_hash is not None:
        tools_at = len(names)
        names.append("tools")
        hashes.append(tools_hash)
    items = _field(request, "input")
    if isinstance(items, list):
        hashes += _json_hashes(items)
    elif items is not None:
        names.append("input")
        hashes.append(_h(items))
    return Parts(_pack(hashes), names, "input", 0, system, tools, tools_at)


# --- the memory and the rule -----------------------------------------------------------------------------


@dataclass(slots=True)
class Print:
    """One remembered request: its parts' hashes (8 bytes a part), the content hashes of its system parts,
    its tools' hashes (one list shared by the caller's requests while the tools stay the same), its
    measured prompt tokens and its id."""

    hashes: bytes
    system: dict[int, int]
    tools: list[int]
    tools_hash: bytes
    prompt_tokens: int
    request_id: str
    size: int


@dataclass(frozen=True, slots=True)
class Break:
    param: str  # the path of the first difference: `messages[0].content`, `tools`, `tools[2]`, `user_id`
    lost_tokens: int  # estimated: what DeepSeek could have served from its cache, minus what it served
    earlier_request_id: str


def _first_difference(a: bytes, b: bytes) -> int:
    """The index of the first 8-byte item where a and b differ (both longer than it)."""
    lo, hi = 0, min(len(a), len(b)) // 8  # a[:8*lo] == b[:8*lo]; they differ before hi (or at hi)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:8 * mid] == b[:8 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixMemory:
    """Per caller, the last `per_caller` requests' prints; at most `max_bytes` of prints in all (the callers
    seen longest ago are forgotten first). Used on the event loop only (no lock)."""

    def __init__(self, per_caller: int, max_bytes: int) -> None:
        self.per_caller = per_caller
        self.max_bytes = max_bytes
        self.bytes = 0
        self._callers: OrderedDict[str, list[Print]] = OrderedDict()

    @property
    def callers(self) -> int:
        return len(self._callers)

    def observe(self, caller: str, parts: Parts, prompt_tokens: int, hit_tokens: int,
                request_id: str) -> Break | None:
        """R's break against the caller's remembered requests, if it has one; R is remembered."""
        hashes = parts.hashes
        prints = self._callers.get(caller)
        found = None
        tools_hash = hashes[8 * parts.tools_at:8 * parts.tools_at + 8] if parts.tools_at >= 0 else b""
        if prints is not None:
            self._callers.move_to_end(caller)
            found = self._compare(parts, prints, prompt_tokens, hit_tokens)
        else:
            prints = self._callers[caller] = []
        last = prints[-1] if prints else None
        if last is not None and last.tools_hash == tools_hash:
            tools, size = last.tools, 0  # the caller's usual tools: one list, counted once
        else:
            tools = parts.tool_hashes()
            size = 8 * len(tools)
        size += len(hashes) + PRINT_OVERHEAD
        prints.append(Print(hashes, parts.system, tools, tools_hash, prompt_tokens, request_id, size))
        self.bytes += size
        if len(prints) > self.per_caller:
            self.bytes -= prints.pop(0).size
        while self.bytes > self.max_bytes and self._callers:
            _, gone = self._callers.popitem(last=False)
            self.bytes -= sum(p.size for p in gone)
        return found

    def _compare(self, parts: Parts, prints: list[Print], prompt_tokens: int, hit_tokens: int
                 ) -> Break | None:
        hashes = parts.hashes
        n = len(hashes)
        best: Print | None = None
        best_m = best_k = -1
        for e in reversed(prints):  # the most recent first: it wins a tie
            m = len(e.hashes)
            if m <= best_m or m > n:
                continue
            if hashes.startswith(e.hashes):
                best, best_m, best_k = e, m, -1  # R appends to E: no break
                continue
            if hashes[m - 8:m] != e.hashes[m - 8:]:
                continue  # E's last part is not where R has it: R does not repeat E after a difference
            k = _first_difference(hashes, e.hashes)
            if 8 * (k + 1) < m and hashes[8 * (k + 1):m] == e.hashes[8 * (k + 1):m]:
                best, best_m, best_k = e, m, k
        if best is None or best_k < 0:
            return None
        lost = min(best.prompt_tokens, prompt_tokens) // UNIT * UNIT - hit_tokens
        if lost < UNIT:
            return None
        return Break(self._path(parts, best, best_k), lost, best.request_id)

    @staticmethod
    def _path(parts: Parts, e: Print, k: int) -> str:
        path = parts.path(k)
        if k == parts.tools_at:
            ours = parts.tool_hashes()
            if sorted(ours) == sorted(e.tools):
                return "tools"  # the same tools, in another order
            i = next((i for i, (a, b) in enumerate(zip(ours, e.tools, strict=False)) if a != b),
                     min(len(ours), len(e.tools)))
            return f"tools[{i}]"
        mine = parts.system.get(k)
        if mine is not None and e.system.get(k) != mine and path.startswith("messages["):
            return f"{path}.content"
        return path


# --- hints -------------------------------------------------------------------------------------------------


def hint(param: str) -> str:
    """The usual cause of a break at `param`, and its fix."""
    if param in ("user_id", "metadata.user_id", "user"):
        return (f"`{param}` changes between requests, and DeepSeek keeps a separate cache per user id: "
                "send one stable value per end user (or none)")
    if param == "model":
        return "the model changed mid-conversation, and each model has its own cache: keep one model"
    if param == "tools":
        return ("the same tools are sent in another order: send them in a fixed order (sorted by name), "
                "built once")
    if param.startswith("tools["):
        return ("a tool definition changes between requests (a description or schema built per request, "
                "a date in it): keep tool definitions fixed")
    if param.startswith(("system", "instructions", "messages[0]")):
        return ("a value that changes every request (a date, a clock, a request id) sits at the top of the "
                "prompt (the system prompt): move it to the last user message")
    return ("an earlier message of the history was rewritten (a compaction or summary step, a message "
            "trimmed or re-rendered): append to the history instead, or compact rarely")


# --- the gateway's one call ----------------------------------------------------------------------------


def parts_for(upstream_path: str) -> Callable[[Any], Parts] | None:
    """How a route's requests are cut into parts (None: a route without a prompt cache to advise on)."""
    if upstream_path.endswith("/chat/completions"):
        return parts_chat
    if upstream_path.endswith("/messages"):
        return parts_anthropic
    if upstream_path.endswith("/responses"):
        return parts_responses
    return None


class Advisor:
    """The prefix memory of this process (None when `cache.breaks` is off)."""

    def __init__(self, enabled: bool, per_caller: int, max_bytes: int) -> None:
        self.memory = PrefixMemory(per_caller, max_bytes) if enabled else None

    def assess(self, upstream_path: str, caller: str, checked: Any, data: Callable[[], dict[str, Any]],
               prompt_tokens: int, hit_tokens: int, request_id: str) -> Break | None:
        """A served request's break, if it has one (it is remembered either way). `checked` is the family's
        validated request when there is one (its messages are plain dicts: no second parse of the body);
        else, or when part of it is not plain JSON data, the body parsed (`data`)."""
        if self.memory is None or prompt_tokens <= 0:
            return None
        parts_of = parts_for(upstream_path)
        if parts_of is None:
            return None
        parts = None
        if checked is not None:
            try:
                parts = parts_of(checked)
            except TypeError:  # a part held as a model object, which orjson does not serialise
                parts = None
        if parts is None:
            body = data()
            try:
                parts = parts_of(body) if body else None
            except TypeError:  # a message that is not an object: the rules refuse it, but never fail here
                return None
        if parts is None:
            return None
        return self.memory.observe(caller, parts, prompt_tokens, hit_tokens, request_id)

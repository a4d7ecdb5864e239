"""The cache advisor: what DeepSeek's context cache saved each request, and what a prefix break lost.

DeepSeek caches every prompt prefix in 64-token units and bills a hit at a fraction of a miss. A request
whose prompt repeats an earlier one of the same caller but differs near the top (a clock in the system
prompt, tools in another order, a new `user_id`) pays the whole repeated part as misses.

Each request is cut by its family into its rendered parts in DeepSeek's order (`PromptShape`:
chatgate/openai/prompt.py, chatgate/anthropic/prompt.py, chatgate/responses/prompt.py), each part hashed
(nothing of its text is kept). A request whose body repeats a remembered one's bytes and appends items to its
messages (an agent round, a retry) takes that request's hashes and hashes only the new items
(`PrefixMemory.extend`): the body's bytes are read once, by XXH3. `PrefixMemory` keeps, per
caller, the last few requests' hashes and measured prompt tokens, and `PrefixMemory.observe` applies the
rule of docs/cache.md: R breaks the prefix of E when R has
at least every part E has, differs from E first at part k, and repeats every part of E after k at the same
place (k is not E's last part); E is the longest remembered request R extends that way or by appending.
The estimated loss: E's prompt tokens, rounded down to DeepSeek's 64-token unit, minus R's measured hits.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

UNIT = 64  # DeepSeek's cache unit, in tokens
PRINT_OVERHEAD = 400  # bytes of a remembered request besides its hashes (objects, the request id, raw)

_dumps = orjson.dumps
_xx = xxhash.xxh3_64_intdigest  # about 0.4 instructions a byte (Python's SipHash: 3)
_digest = xxhash.xxh3_64_digest  # the same hash as 8 bytes: a part's
NO_PART = bytes(8)  # the hash of a part that is not there (no user id)


# --- fingerprints --------------------------------------------------------------------------------------


def part_hash(value: Any) -> bytes:
    return _digest(_dumps(value))


def item_hashes(items: list[Any]) -> bytes:
    """The hash of each item's JSON, 8 bytes each, the loop in C (map): an item costs one orjson.dumps and
    one hash."""
    return b"".join(map(_digest, map(_dumps, items)))


def _tool_hashes(tools: Any) -> list[int]:
    return list(map(_xx, map(_dumps, tools))) if isinstance(tools, list) else []


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a request's parts come from: part k < len(names) is `names[k]`; part len(names) + i is
    `seq[offset + i]`, or `seq[order[i]]` when `order` is given (chat with system messages further down,
    which DeepSeek renders first). `appends`: an item appended to `seq` is a part appended at the end."""

    names: tuple[str, ...]
    seq: str
    offset: int
    tools_at: int  # -1: no tools
    order: tuple[int, ...] = ()
    appends: bool = True

    def path(self, k: int) -> str:
        if k < len(self.names):
            return self.names[k]
        i = k - len(self.names)
        return f"{self.seq}[{self.order[i] if self.order else self.offset + i}]"


@functools.lru_cache(maxsize=16)
def named_layout(names: tuple[str, ...], seq: str, appends: bool = True) -> Layout:
    return Layout(names, seq, 0, names.index("tools") if "tools" in names else -1, (), appends)


@dataclass(slots=True)
class Parts:
    """A request's rendered parts in DeepSeek's order, one 8-byte hash each, and where they are (`layout`).
    `system` maps the parts that are system prompt to a hash of their `content`; `tools` is the request's
    `tools`, hashed one by one when needed (never kept beyond the request: a print keeps hashes); `count`:
    the items of `layout.seq` (-1 when it is not a list)."""

    hashes: bytes
    layout: Layout
    system: dict[int, bytes]
    tools: Any
    count: int = -1
    tools_hash: bytes | None = None  # the `tools` part's hash (None: read from `hashes` when needed)

    @property
    def tools_at(self) -> int:
        return self.layout.tools_at

    def tool_hashes(self) -> list[int]:
        return _tool_hashes(self.tools)

    def path(self, k: int) -> str:
        return self.layout.path(k)


def field_of(request: Any, name: str) -> Any:
    return request.get(name) if type(request) is dict else getattr(request, name, None)


def list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def tools_hash_of(request: Any) -> bytes | None:
    """One hash of all the tools (each tool's own hash is taken only when they changed)."""
    tools = field_of(request, "tools")
    if not isinstance(tools, list) or not tools:
        return None
    return _digest(_dumps(tools))


# --- the body's bytes: a request that repeats an earlier one's bytes reuses its hashes -------------------


MAX_CUTS = 8  # segments of a remembered head; beyond, one hash of the whole head again


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs four times as much
class Raw:
    """Where a remembered request's body stood: its head (the body up to the end of the last item of its
    `seq`) as consecutive segments ending at `cuts`, each with its hash (`sums`), and its tail (the rest of
    the body, from the `]` that closes `seq`) as a length and a hash. A later request whose body has the
    same head bytes, then whole items, then the same tail bytes, has the same parts plus one per new item.
    `whole`: the whole body's hash, taken when a later body first repeats it (a repeat is then one hash)."""

    cuts: tuple[int, ...]
    sums: tuple[int, ...]
    tail: int
    tail_sum: int
    size: int  # the whole body's
    whole: int | None = None

    @property
    def head(self) -> int:
        return self.cuts[-1]


def raw_of(body: bytes, data: Any, seq: str) -> Raw | None:
    """Where `seq`'s last item ends in `body`, from the body's own parse (`data`, its objects' keys in the
    body's order): that item's JSON found from the end of the body and followed by `]`. None when the body
    is not written as orjson writes it (spaces, escapes of its own) or has no item."""
    items = data.get(seq) if type(data) is dict else None
    if not body or not isinstance(items, list) or not items:
        return None
    try:
        needle = _dumps(items[-1])
    except TypeError:
        return None
    at = body.rfind(needle)
    if at < 0:
        return None
    head = at + len(needle)
    if body[head:head + 1] != b"]":
        return None
    return Raw((head,), (_xx(body[:head]),), len(body) - head, _xx(body[head:]), len(body))


def always(items: list[Any]) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class PromptShape:
    """How a family's requests are cut into parts (`parts`, the family's own: chatgate/openai/prompt.py, …);
    `seq`: the list a new round appends to; `appendable`: whether items appended to it are parts appended
    at the end."""

    parts: Callable[[Any], Parts]
    seq: str
    appendable: Callable[[list[Any]], bool]


# --- the memory and the rule -----------------------------------------------------------------------------


@dataclass(slots=True)
class Print:
    """One remembered request: its parts' hashes (8 bytes a part) and layout, the content hashes of its
    system parts, its tools' hashes (one list shared by the caller's requests while the tools stay the
    same), its measured prompt tokens and its id; the items of its `seq` and where its body stood (`raw`).
    `m` is len(hashes) and `last` its last part's hash, read by every later request's comparison."""

    hashes: bytes
    m: int
    last: bytes
    layout: Layout
    system: dict[int, bytes]
    tools: list[int]
    tools_hash: bytes
    prompt_tokens: int
    request_id: str
    size: int
    count: int
    raw: Raw | None
    again: Sketch | None = None  # the sketch of a request whose body is this one's again (made once)


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


MAX_TRIES = 2  # remembered requests whose bytes a request is checked against (each check reads its body)


@dataclass(slots=True)
class Sketch:
    """A request R's parts, made when R is forwarded, while its body and objects are still in the CPU's
    caches (`PrefixMemory.sketch`), and compared with its caller's remembered requests once R's usage is
    known (`PrefixMemory.settle`). `like`: the remembered request whose body R's repeats or extends (R's
    hashes start with its hashes, and R's tools are its tools); else `tools` is R's `tools`, hashed one by
    one only when they changed."""

    hashes: bytes
    layout: Layout
    system: dict[int, bytes]
    tools_hash: bytes
    tools: Any
    count: int
    raw: Raw | None
    like: Print | None = None

    def tool_hashes(self) -> list[int]:
        return self.like.tools if self.like is not None else _tool_hashes(self.tools)


def _sketch_of(parts: Parts, raw: Raw | None) -> Sketch:
    """The sketch of a request cut from itself (no remembered request's hashes reused)."""
    tools_hash = parts.tools_hash
    if tools_hash is None:
        at = parts.layout.tools_at
        tools_hash = parts.hashes[8 * at:8 * at + 8] if at >= 0 else b""
    return Sketch(parts.hashes, parts.layout, parts.system, tools_hash, parts.tools, parts.count, raw)


def _again(e: Print) -> Sketch:
    """The sketch of a request whose body is remembered request E's body again: E's own, made once."""
    again = e.again
    if again is None:
        again = e.again = Sketch(e.hashes, e.layout, e.system, e.tools_hash, None, e.count, e.raw, e)
    return again


def _appended(body: bytes, at: int, head: int) -> list[Any] | None:
    """The items a body appends after a remembered head: the JSON between the "," at `at` and the item's
    end at `head`, read as the items of an array (None: it is not whole items)."""
    try:
        items = orjson.loads(b"[" + body[at + 1:head] + b"]")
    except orjson.JSONDecodeError:
        return None
    return items if type(items) is list and items else None


class PrefixMemory:
    """Per caller, the last `per_caller` requests' prints; at most `max_bytes` of prints in all (the callers
    seen longest ago are forgotten first). Used on the event loop only (no lock).

    A request whose body is a remembered request's body again (a retry, the same opening of a new
    conversation) is remembered by that print itself, again: its prompt tokens and id become this request's.
    An earlier place of the print in the list then holds those too, which changes nothing: the rule only
    reads the latest place of equal prints (the most recent wins a tie), and the earliest goes first."""

    def __init__(self, per_caller: int, max_bytes: int) -> None:
        self.per_caller = per_caller
        self.max_bytes = max_bytes
        self.bytes = 0
        self._callers: OrderedDict[str, list[Print]] = OrderedDict()

    @property
    def callers(self) -> int:
        return len(self._callers)

    def assess(self, caller: str, family: PromptShape, request: Any, body: bytes, parsed: Any,
               prompt_tokens: int, hit_tokens: int, request_id: str) -> Break | None:
        """R's break (it is remembered): `sketch` and `settle` at once."""
        sketch = self.sketch(caller, family, request, body, parsed)
        return None if sketch is None else self.settle(caller, sketch, prompt_tokens, hit_tokens, request_id)

    def sketch(self, caller: str, family: PromptShape, request: Any, body: bytes, parsed: Any = None
               ) -> Sketch | None:
        """R's parts, by `extend` from R's bytes when it can, else from `request` (None: `request` is None
        and R's bytes repeat or extend no remembered request; TypeError: a part orjson cannot serialise).
        `parsed`: R's own parse, its objects' keys in the body's order, to find where R's items end."""
        prints = self._callers.get(caller)
        if prints and body:
            last = prints[-1]
            raw = last.raw
            if raw is not None and raw.whole is not None and raw.size == len(body) and _xx(body) == raw.whole:
                return _again(last)  # the caller's last body again (a benchmark, a retry)
            made = self.extend(prints, family, request, body)
            if made is not None:
                return made
        if request is None:
            return None
        parts = family.parts(request)
        return _sketch_of(parts, raw_of(body, parsed, family.seq) if parts.layout.appends else None)

    def extend(self, prints: list[Print], family: PromptShape, request: Any, body: bytes) -> Sketch | None:
        """R's parts without hashing what R repeats: when R's body is a remembered request E's body (the same
        head bytes and tail bytes) with whole items appended to `seq` between them, R's parts are E's plus
        one per new item (the same hashes the parts of R would have: equal bytes parse to equal requests).
        The new items are `request`'s, or (`request` None: a body too large to be parsed twice) the bytes
        between E's head and tail, parsed alone. R's hashes are E's when R's body is E's again; None when no
        remembered request is repeated so (the parts are then made from R itself)."""
        items: Any = None
        count = -1
        if request is not None:
            seq = family.seq
            items = request.get(seq) if type(request) is dict else getattr(request, seq, None)
            if type(items) is not list:
                return None
            count = len(items)
        size = len(body)
        tries = MAX_TRIES
        for e in reversed(prints):
            raw = e.raw
            if raw is None:
                continue
            if raw.size == size:  # the same body again, or nothing
                if count >= 0 and e.count != count:
                    continue
                if raw.whole is not None:
                    if _xx(body) == raw.whole:  # a retry, the same opening of a new conversation
                        return _again(e)
                    tries -= 1
                    if not tries:
                        return None
                    continue
            elif raw.size > size or e.count >= count >= 0:
                continue
            if _xx(body[size - raw.tail:]) == raw.tail_sum:
                cuts, sums = raw.cuts, raw.sums
                if len(cuts) == 1:
                    if _xx(body[:cuts[0]]) == sums[0]:
                        break
                else:  # (a plain loop: a generator over zip(..., strict=False) costs about 4K more)
                    a = 0
                    for i, z in enumerate(cuts):
                        if _xx(body[a:z]) != sums[i]:
                            break
                        a = z
                    else:
                        break
            tries -= 1
            if not tries:
                return None
        else:
            return None
        if raw.size == size:  # the same body again: the next repeat is checked by one hash of the whole
            raw.whole = _xx(body)
            return _again(e)
        at, head = raw.cuts[-1], size - raw.tail
        if body[at] != 44 or body[head - 1] != 125:  # "," and "}"
            return None
        new = items[e.count:] if items is not None else _appended(body, at, head)
        if new is None or not family.appendable(new):
            return None
        hashes = e.hashes + item_hashes(new)
        if len(raw.cuts) < MAX_CUTS:
            cut = Raw((*raw.cuts, head), (*raw.sums, _xx(body[at:head])), raw.tail, raw.tail_sum, size)
        else:
            cut = Raw((head,), (_xx(body[:head]),), raw.tail, raw.tail_sum, size)
        return Sketch(hashes, e.layout, e.system, e.tools_hash, None, e.count + len(new), cut, e)

    def observe(self, caller: str, parts: Parts, prompt_tokens: int, hit_tokens: int,
                request_id: str, raw: Raw | None = None) -> Break | None:
        """R's break against the caller's remembered requests, if it has one; R is remembered."""
        return self.settle(caller, _sketch_of(parts, raw), prompt_tokens, hit_tokens, request_id)

    def settle(self, caller: str, sk: Sketch, prompt_tokens: int, hit_tokens: int, request_id: str
               ) -> Break | None:
        """R's break against the caller's remembered requests, and R remembered. The sketch may be older
        than the caller's last requests (R was answered after them), or the caller forgotten since."""
        callers = self._callers
        hashes, tools_hash, like = sk.hashes, sk.tools_hash, sk.like
        prints = callers.get(caller)
        size = len(hashes) + PRINT_OVERHEAD
        if like is not None and prints and like is prints[-1] and hashes is like.hashes and like.size == size:
            # the last body again, remembered as it was (no break: it repeats the last request)
            callers.move_to_end(caller)
            like.prompt_tokens, like.request_id = prompt_tokens, request_id
            prints.append(like)
            self._trim(prints, self.bytes + size)
            return None
        found = None
        if prints is None:
            prints = callers[caller] = []
            tools = sk.tool_hashes()
            size += 8 * len(tools)
        else:
            callers.move_to_end(caller)
            last = prints[-1]
            if like is last and hashes is not last.hashes:
                # R appends to the last request: the longest R extends is the last one unless a longer one has
                # its last part where R has it
                m0, n, end = last.m, len(hashes), hashes[-8:]
                for e in prints:
                    m = e.m
                    if m0 < m <= n and (end if m == n else hashes[m - 8:m]) == e.last:
                        found = self._compare(sk, prints, prompt_tokens, hit_tokens)
                        break
            elif like is not None and hashes is like.hashes and hashes is not last.hashes:
                # R's body is an earlier one's again: only a request since then, of as many parts, can be
                # the one R breaks instead
                n = len(hashes)
                for e in reversed(prints):
                    if e is like:
                        break
                    if e.m == n:
                        found = self._compare(sk, prints, prompt_tokens, hit_tokens)
                        break
            elif hashes is not last.hashes:  # (the same hashes as the last request's: R repeats it, no break)
                found = self._compare(sk, prints, prompt_tokens, hit_tokens)
            if last.tools_hash == tools_hash:
                tools = last.tools  # the caller's usual tools: one list, counted once
            else:
                tools = sk.tool_hashes()
                size += 8 * len(tools)
        if like is not None and like.hashes is hashes and like.size == size:  # R's body is `like`'s again
            like.prompt_tokens, like.request_id = prompt_tokens, request_id
            prints.append(like)
        else:
            prints.append(Print(hashes, len(hashes), hashes[-8:], sk.layout, sk.system, tools, tools_hash,
                                prompt_tokens, request_id, size, sk.count, sk.raw))
        self._trim(prints, self.bytes + size)
        return found

    def _trim(self, prints: list[Print], total: int) -> None:
        """A caller's oldest print beyond `per_caller`, then the callers seen longest ago beyond
        `max_bytes`, forgotten; `total`: the bytes held with the print just remembered."""
        if len(prints) > self.per_caller:
            total -= prints.pop(0).size
        callers = self._callers
        while total > self.max_bytes and callers:
            _, gone = callers.popitem(last=False)
            total -= sum(p.size for p in gone)
        self.bytes = total

    def _compare(self, sk: Sketch, prints: list[Print], prompt_tokens: int, hit_tokens: int) -> Break | None:
        hashes, like = sk.hashes, sk.like
        n = len(hashes)
        end = hashes[-8:]
        best: Print | None = None
        best_m = best_k = -1
        for e in reversed(prints):  # the most recent first: it wins a tie
            m = e.m
            if m <= best_m or m > n:
                continue  # shorter than the best so far, or longer than R
            if e.hashes is hashes:
                best, best_k = e, -1  # R's body is E's again
                break
            if e is like:
                best, best_m, best_k = e, m, -1  # R appends to E
                continue
            if (end if m == n else hashes[m - 8:m]) != e.last:
                continue  # its last part not where R has it
            if hashes[:m] == e.hashes:
                best, best_m, best_k = e, m, -1  # R appends to E: no break
                if m == n:
                    break  # R repeats E whole: no earlier request is longer and extended by R
                continue
            k = _first_difference(hashes, e.hashes)
            if 8 * (k + 1) < m and hashes[8 * (k + 1):m] == e.hashes[8 * (k + 1):m]:
                best, best_m, best_k = e, m, k
        if best is None or best_k < 0:
            return None
        lost = min(best.prompt_tokens, prompt_tokens) // UNIT * UNIT - hit_tokens
        if lost < UNIT:
            return None
        return Break(self._path(sk, best, best_k), lost, best.request_id)

    @staticmethod
    def _path(sk: Sketch, e: Print, k: int) -> str:
        path = sk.layout.path(k)
        if k == sk.layout.tools_at:
            ours = sk.tool_hashes()
            if sorted(ours) == sorted(e.tools):
                return "tools"  # the same tools, in another order
            i = next((i for i, (a, b) in enumerate(zip(ours, e.tools, strict=False)) if a != b),
                     min(len(ours), len(e.tools)))
            return f"tools[{i}]"
        mine = sk.system.get(k)
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


class Advisor:
    """The prefix memory of this process (None when `cache.breaks` is off)."""

    def __init__(self, enabled: bool, per_caller: int, max_bytes: int) -> None:
        self.memory = PrefixMemory(per_caller, max_bytes) if enabled else None

    def sketch(self, family: PromptShape | None, caller: str, checked: Any,
               data: Callable[[], dict[str, Any]], body: bytes = b"", parsed: Any = None) -> Sketch | None:
        """A request's parts, taken as it is forwarded (None: advice is off, or not for this route or body;
        `family`: how the route's family cuts its requests into parts, None for a route without a prompt).
        `checked` is the family's validated request when there is one (its messages are plain dicts: no
        second parse of the body); else, or when part of it is not plain JSON data, the body parsed (`data`),
        unless the body's bytes repeat or extend a remembered request's. `body` is the request's body as
        sent to DeepSeek, and `parsed` its own parse if one was made (keys in the body's order): a body that
        repeats a remembered one's bytes reuses its hashes (`PrefixMemory.extend`)."""
        memory = self.memory
        if memory is None or family is None:
            return None
        try:
            if checked is not None:
                try:
                    return memory.sketch(caller, family, checked, body, parsed)
                except TypeError:  # a part held as a model object, which orjson does not serialise
                    pass
            elif body:
                made = memory.sketch(caller, family, None, body)  # its bytes alone, before any parse
                if made is not None:
                    return made
            request = data()
            if not request:
                return None
            return memory.sketch(caller, family, request, body, request if parsed is None else parsed)
        except TypeError:  # a message that is not an object: the rules refuse it, but never fail here
            return None

    def settle(self, caller: str, sketch: Sketch, prompt_tokens: int, hit_tokens: int, request_id: str
               ) -> Break | None:
        """A served request's break, if it has one (it is remembered either way, when it used the prompt)."""
        if self.memory is None or prompt_tokens <= 0:
            return None
        return self.memory.settle(caller, sketch, prompt_tokens, hit_tokens, request_id)

    def assess(self, family: PromptShape | None, caller: str, checked: Any,
               data: Callable[[], dict[str, Any]], prompt_tokens: int, hit_tokens: int, request_id: str,
               body: bytes = b"", parsed: Any = None) -> Break | None:
        """`sketch` and `settle` at once: a served request's break, if it has one."""
        if self.memory is None or prompt_tokens <= 0:
            return None
        sketch = self.sketch(family, caller, checked, data, body, parsed)
        return None if sketch is None else self.settle(caller, sketch, prompt_tokens, hit_tokens, request_id)

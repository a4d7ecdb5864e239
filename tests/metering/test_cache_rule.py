"""The prefix-break rule of docs/cache.md on its own: what is a break, where it is, how much it lost, and
the memory's bound."""

from __future__ import annotations

import json
from typing import Any

import orjson

from chatgate.anthropic.prompt import MESSAGES_PROMPT, parts_anthropic
from chatgate.gateway.checking import check_now
from chatgate.gateway.strict import parse_strictly
from chatgate.metering.cache import (
    MAX_CUTS,
    PRINT_OVERHEAD,
    Advisor,
    PrefixMemory,
    PromptShape,
)
from chatgate.openai.chat import ChatFamily
from chatgate.openai.prompt import CHAT_PROMPT, parts_chat
from chatgate.openai.protocol import ChatCompletionRequest
from chatgate.responses.prompt import RESPONSES_PROMPT, parts_responses
from chatgate.settings import Settings
from chatgate.wire import validate_body

TOOLS = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
         for i in range(4)]


def chat(system: str = "You are terse.", n: int = 4, tools: list[Any] | None = None, **extra: Any
         ) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(n)]
    return {"model": "deepseek-flash", "messages": messages, "tools": TOOLS if tools is None else tools,
            **extra}


def observe(memory: PrefixMemory, body: dict[str, Any], tokens: int, hits: int = 0, rid: str = "r") -> Any:
    return memory.observe("caller", parts_chat(body), tokens, hits, rid)


def test_appending_is_never_a_break_and_a_change_before_repeated_parts_is() -> None:
    memory = PrefixMemory(8, 1 << 20)
    assert observe(memory, chat(n=3), 1000) is None
    assert observe(memory, chat(n=5), 1100, hits=960) is None  # an agent round
    assert observe(memory, chat(n=5), 1100, hits=1088) is None  # a retry
    found = observe(memory, chat("Now: 12:01. You are terse.", n=7), 1200, hits=0, rid="r4")
    assert found is not None and found.param == "messages[0].content"
    assert found.lost_tokens == 1088 and found.earlier_request_id == "r"  # floor64(1100) - 0


def test_the_loss_is_what_the_earlier_prompt_could_have_served_minus_the_hits() -> None:
    memory = PrefixMemory(8, 1 << 20)
    observe(memory, chat(n=3), 1000)
    found = observe(memory, chat(n=5, user_id="u-2"), 1100, hits=0)
    assert found is not None and (found.param, found.lost_tokens) == ("user_id", 960)
    observe(memory, chat(n=3, user_id="u-3"), 1000)
    # a loss under one 64-token unit is no break
    assert observe(memory, chat(n=5, user_id="u-4"), 1100, hits=1040) is None  # 1088 - 1040


def test_tools_in_another_order_or_changed() -> None:
    memory = PrefixMemory(8, 1 << 20)
    observe(memory, chat(n=3), 2000)
    found = observe(memory, chat(n=5, tools=TOOLS[::-1]), 2100)
    assert found is not None and found.param == "tools"
    memory = PrefixMemory(8, 1 << 20)
    observe(memory, chat(n=3), 2000)
    changed = [*TOOLS[:2], {**TOOLS[2], "function": {"name": "t2", "description": "today"}}, TOOLS[3]]
    found = observe(memory, chat(n=5, tools=changed), 2100)
    assert found is not None and found.param == "tools[2]"


def test_a_rewritten_middle_message_and_a_new_model() -> None:
    memory = PrefixMemory(8, 1 << 20)
    body = chat(n=6)
    observe(memory, body, 3000)
    rewritten = chat(n=8)
    rewritten["messages"][3] = {"role": "assistant", "content": "(summary)"}
    found = observe(memory, rewritten, 3100)
    assert found is not None and found.param == "messages[3]"
    found = observe(memory, {**chat(n=10), "model": "deepseek-v4-pro"}, 3200)
    assert found is not None and found.param == "model"


def test_two_changed_parts_or_a_shorter_history_are_not_breaks() -> None:
    memory = PrefixMemory(8, 1 << 20)
    observe(memory, chat(n=6), 3000)
    assert observe(memory, chat("Now: 12:02", n=8, tools=TOOLS[::-1]), 3100) is None  # two differences
    assert observe(memory, chat("Now: 12:03", n=2), 800) is None  # fewer parts than any earlier request


def test_callers_are_apart() -> None:
    memory = PrefixMemory(8, 1 << 20)
    memory.observe("a", parts_chat(chat(n=3)), 1000, 0, "r1")
    assert memory.observe("b", parts_chat(chat("Now: 1", n=5)), 1100, 0, "r2") is None


def test_the_other_families_name_their_parts() -> None:
    memory = PrefixMemory(8, 1 << 20)
    msgs = [{"role": "user", "content": f"q{i}"} for i in range(4)]
    first = {"model": "m", "system": "s", "metadata": {"user_id": "a"}, "messages": msgs[:2]}
    memory.observe("c", parts_anthropic(first), 1000, 0, "r1")
    found = memory.observe("c", parts_anthropic({**first, "metadata": {"user_id": "b"}, "messages": msgs}),
                           1100, 0, "r2")
    assert found is not None and found.param == "metadata.user_id"
    first = {"model": "m", "instructions": "i", "input": msgs[:2]}
    memory.observe("d", parts_responses(first), 1000, 0, "r1")
    second = {**first, "instructions": "i2", "input": msgs}
    found = memory.observe("d", parts_responses(second), 1100, 0, "r2")
    assert found is not None and found.param == "instructions"


def test_the_memory_is_bounded_per_caller_and_in_all() -> None:
    memory = PrefixMemory(3, 10 * (PRINT_OVERHEAD + 200))
    for i in range(5):
        memory.observe("one", parts_chat(chat(n=i + 1)), 1000, 0, f"r{i}")
    assert len(memory._callers["one"]) == 3
    for i in range(50):
        memory.observe(f"caller-{i}", parts_chat(chat(n=2)), 1000, 0, "r")
    assert memory.bytes <= memory.max_bytes and memory.callers < 50
    assert "one" not in memory._callers  # the callers seen longest ago go first


def test_off_records_nothing_and_a_body_that_is_not_json_data_is_no_error() -> None:
    assert Advisor(False, 8, 1 << 20).memory is None
    advisor = Advisor(True, 8, 1 << 20)
    assert advisor.assess(None, "c", None, dict, 100, 0, "r") is None  # FIM: no advice
    assert advisor.assess(CHAT_PROMPT, "c", None, lambda: {"messages": ["not an object"]}, 100, 0,
                          "r") is None


# --- parts from the body's bytes (PrefixMemory.extend): the same hashes as parts made from the request ----


def _replay(bodies: list[bytes], route: PromptShape = CHAT_PROMPT) -> tuple[Advisor, list[Any]]:
    """Each body assessed twice over: from its bytes (as the gateway does) and from its parse alone."""
    from_bytes, from_request = Advisor(True, 8, 1 << 24), Advisor(True, 8, 1 << 24)
    found = []
    for i, raw in enumerate(bodies):
        a = from_bytes.assess(route, "c", orjson.loads(raw), dict, 4000 + 100 * i, 500, f"r{i}", raw,
                              orjson.loads(raw))
        b = from_request.assess(route, "c", orjson.loads(raw), dict, 4000 + 100 * i, 500, f"r{i}")
        assert a == b, i
        assert from_bytes.memory is not None and from_request.memory is not None
        mine, theirs = from_bytes.memory._callers["c"][-1], from_request.memory._callers["c"][-1]
        assert (mine.hashes, mine.system, mine.tools, mine.layout) == \
            (theirs.hashes, theirs.system, theirs.tools, theirs.layout), i
        found.append(a)
    return from_bytes, found


def _dump(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)


def test_a_body_that_repeats_or_appends_to_an_earlier_one_reuses_its_hashes() -> None:
    rounds = [chat(n=n) for n in (1, 3, 3, 5, 7)]
    rounds.append({**chat(n=9), "messages": [*chat(n=8)["messages"], {"role": "user", "content": [
        {"type": "text", "text": "a part"}]}]})
    advisor, found = _replay([_dump(b) for b in rounds])
    assert found == [None] * len(rounds)
    assert advisor.memory is not None
    prints = advisor.memory._callers["c"]
    assert prints[2].hashes is prints[1].hashes  # the same body again: its hashes, not new ones
    assert [len(p.raw.cuts) for p in prints if p.raw is not None] == [1, 2, 2, 3, 4, 5]


def test_breaks_found_from_bytes_are_the_breaks_of_the_rule() -> None:
    clock = "Now: 12:01. You are terse."
    bodies = [chat(n=3), chat(n=5), chat(clock, n=7), chat(clock, n=9), chat(clock, n=11, tools=TOOLS[::-1]),
              chat(clock, n=13, tools=TOOLS[::-1], user_id="u1"),
              chat(clock, n=15, tools=TOOLS[::-1], user_id="u2")]
    _, found = _replay([_dump(b) for b in bodies])
    assert [f.param if f else None for f in found] == \
        [None, None, "messages[0].content", None, "tools", "user_id", "user_id"]


def test_a_system_message_appended_or_a_body_written_with_spaces_is_cut_from_the_request() -> None:
    first = chat(n=3)
    later = {**chat(n=5), "messages": [*chat(n=4)["messages"], {"role": "system", "content": "be brief"}]}
    advisor, _ = _replay([_dump(first), _dump(later), _dump(chat(n=6))])
    assert advisor.memory is not None
    # the system message further down is rendered first by DeepSeek: no layout that appends, no bytes kept
    assert advisor.memory._callers["c"][1].raw is None
    spaced = [json.dumps(chat(n=n)).encode() for n in (3, 5)]  # ", " and ": ": not how orjson writes
    advisor, _ = _replay(spaced)
    assert advisor.memory is not None and [p.raw for p in advisor.memory._callers["c"]] == [None, None]


def test_more_rounds_than_cuts_hash_the_head_again_in_one_piece() -> None:
    advisor, _ = _replay([_dump(chat(n=n)) for n in range(1, 2 + 2 * MAX_CUTS, 2)])
    assert advisor.memory is not None
    cuts = [len(p.raw.cuts) for p in advisor.memory._callers["c"] if p.raw is not None]
    assert max(cuts) == MAX_CUTS and 1 in cuts[1:]


def test_the_other_families_reuse_hashes_from_bytes_too() -> None:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"q{i}"} for i in range(7)]
    anthropic = [{"model": "m", "system": "s", "tools": TOOLS, "messages": msgs[:n]} for n in (1, 3, 5)]
    anthropic.append({**anthropic[-1], "system": "s2", "messages": msgs})
    advisor, found = _replay([_dump(b) for b in anthropic], MESSAGES_PROMPT)
    assert [f.param if f else None for f in found] == [None, None, None, "system"]
    assert advisor.memory is not None and len(advisor.memory._callers["c"][2].raw.cuts) == 3
    responses = [{"model": "m", "instructions": "i", "input": msgs[:n]} for n in (1, 3, 5)]
    responses.append({"model": "m", "instructions": "i", "input": "a string"})
    advisor, found = _replay([_dump(b) for b in responses], RESPONSES_PROMPT)
    assert found == [None] * 4
    assert advisor.memory is not None and len(advisor.memory._callers["c"][2].raw.cuts) == 3


def test_r1s_parse_keeps_the_bodys_key_order() -> None:
    body = _dump(chat(n=3))
    parse, problem = parse_strictly(body)
    assert problem is None
    validate_body(ChatCompletionRequest, body, parse)
    assert isinstance(parse, dict) and list(parse["messages"][0]) == ["role", "content"]


def test_the_gateways_check_hands_its_parse_to_the_advisor_which_then_reads_bytes_only() -> None:
    family = ChatFamily(Settings().policy())
    advisor = Advisor(True, 8, 1 << 24)
    for i, n in enumerate((1, 3, 3, 5)):
        messages = [{"content": m["content"], "role": m["role"]} for m in chat(n=n)["messages"]]
        body = _dump({**chat(n=n), "messages": messages})  # keys not in the schema's order
        checked = check_now(family, body, False, None)
        verdict, parsed = checked.verdict, checked.parse
        assert not verdict.problems and parsed is not None
        advisor.assess(CHAT_PROMPT, "c", verdict.request, dict, 1000, 0, f"r{i}", body, parsed)
    assert advisor.memory is not None
    assert [len(p.raw.cuts) if p.raw else 0 for p in advisor.memory._callers["c"]] == [1, 2, 2, 3]


# --- the sketch (taken as the request is forwarded) and the settlement (when its usage is known) ---------


def test_a_body_too_large_to_parse_twice_is_sketched_from_its_bytes_when_it_repeats_or_appends() -> None:
    """The checker processes keep their parse (a body over 1 MiB): a body that repeats or extends a
    remembered one's bytes is cut by them alone; only a body that does neither is parsed."""
    clock = "Now: 12:01. You are terse."
    bodies = [_dump(chat(n=3)), _dump(chat(n=3)), _dump(chat(n=5)), _dump(chat(n=7)), _dump(chat(clock, n=9)),
              _dump(chat(clock, n=11))]
    _, expected = _replay(bodies)
    advisor = Advisor(True, 8, 1 << 24)
    parses: list[int] = []
    found = []
    for i, raw in enumerate(bodies):
        def parse(raw: bytes = raw, i: int = i) -> dict[str, Any]:
            parses.append(i)
            return orjson.loads(raw)  # type: ignore[no-any-return]
        found.append(advisor.assess(CHAT_PROMPT, "c", None, parse, 4000 + 100 * i, 500, f"r{i}", raw))
    assert found == expected
    assert [f.param if f else None for f in found] == [None, None, None, None, "messages[0].content", None]
    assert parses == [0, 4]  # the first body, and the one whose system prompt changed
    assert advisor.memory is not None
    assert [len(p.raw.cuts) for p in advisor.memory._callers["c"] if p.raw is not None] == [1, 1, 2, 3, 1, 2]


def test_bytes_between_a_head_and_a_tail_that_are_not_whole_items_are_parsed_as_a_request() -> None:
    first = _dump(chat(n=3))
    memory = PrefixMemory(8, 1 << 24)
    sketch = memory.sketch("c", CHAT_PROMPT, orjson.loads(first), first, orjson.loads(first))
    assert sketch is not None and sketch.raw is not None
    memory.settle("c", sketch, 1000, 0, "r0")
    head = sketch.raw.head
    # the same head and tail around bytes that close the list and open another: not items appended
    odd = first[:head] + b',{"role":"user","content":"x"}],"x":[{"a":1}' + first[head:]
    assert memory.sketch("c", CHAT_PROMPT, None, odd) is None


def test_requests_settled_in_another_order_than_they_were_sketched() -> None:
    """Two requests of one caller in flight at once: the later one is answered first. Each is compared with
    what is remembered when it is settled, and its sketch still reuses the hashes it was made from."""
    memory = PrefixMemory(8, 1 << 24)
    first = _dump(chat(n=3))
    opening = memory.sketch("c", CHAT_PROMPT, orjson.loads(first), first, orjson.loads(first))
    assert opening is not None
    memory.settle("c", opening, 1000, 0, "r0")
    longer, rewritten = _dump(chat(n=5)), _dump(chat("Now: 12:01. You are terse.", n=7))
    a = memory.sketch("c", CHAT_PROMPT, orjson.loads(longer), longer, orjson.loads(longer))
    b = memory.sketch("c", CHAT_PROMPT, orjson.loads(rewritten), rewritten, orjson.loads(rewritten))
    assert a is not None and b is not None and a.like is not None and b.like is None
    found_b = memory.settle("c", b, 1400, 0, "r2")
    assert found_b is not None and found_b.param == "messages[0].content"
    assert found_b.earlier_request_id == "r0"
    assert memory.settle("c", a, 1200, 1000, "r1") is None  # it appends to r0
    assert [p.request_id for p in memory._callers["c"]] == ["r0", "r2", "r1"]
    assert memory._callers["c"][-1].hashes == parts_chat(orjson.loads(longer)).hashes
    tools = memory._callers["c"][0].tools
    assert len(tools) == len(TOOLS)
    again = memory.sketch("c", CHAT_PROMPT, orjson.loads(longer), longer)
    assert again is not None and again.like is memory._callers["c"][-1]
    memory._callers.clear()  # the caller forgotten between a sketch and its settlement
    memory.bytes = 0
    assert memory.settle("c", again, 1200, 1150, "r3") is None
    (kept,) = memory._callers["c"]
    assert kept.tools == tools
    assert memory.bytes == kept.size == len(kept.hashes) + PRINT_OVERHEAD + 8 * len(TOOLS)


def test_the_callers_last_body_again_is_its_own_sketch_and_changes_only_its_tokens_and_id() -> None:
    """A caller sending its last body again (a retry, a benchmark) is remembered by that print again, with
    no parse, no new sketch and no comparison."""
    body = _dump(chat(n=5))
    memory = PrefixMemory(3, 1 << 24)
    sketches = []
    for i in range(6):
        sketch = memory.sketch("c", CHAT_PROMPT, orjson.loads(body), body, orjson.loads(body))
        assert sketch is not None
        sketches.append(sketch)
        assert memory.settle("c", sketch, 1000 + i, 900, f"r{i}") is None
    # the second request is cut by its bytes (extend) and remembered by a print of its own, without the
    # first's tools; from the third on, that print's one sketch
    assert sketches[1] is not sketches[2] and sketches[2].like is memory._callers["c"][-1]
    assert sketches[2] is sketches[3] is sketches[4] is sketches[5]
    prints = memory._callers["c"]
    assert len(prints) == 3 and prints[0] is prints[1] is prints[2]
    assert (prints[-1].request_id, prints[-1].prompt_tokens) == ("r5", 1005)
    assert prints[-1].hashes == parts_chat(orjson.loads(body)).hashes
    assert memory.bytes == sum(p.size for p in prints)
    # a longer body is not taken for the last one: it extends it
    longer = _dump(chat(n=7))
    grown = memory.sketch("c", CHAT_PROMPT, orjson.loads(longer), longer, orjson.loads(longer))
    assert grown is not None and grown is not sketches[5] and grown.like is prints[-1]
    assert grown.hashes == parts_chat(orjson.loads(longer)).hashes
    # and a repeat of the caller's last body found by the rule (not the shortcut) is the same finding
    assert memory.settle("c", grown, 1200, 1000, "r6") is None
    assert memory.sketch("c", CHAT_PROMPT, orjson.loads(body), body).like is prints[-2]  # type: ignore[union-attr]

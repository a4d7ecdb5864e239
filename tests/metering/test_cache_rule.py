"""The prefix-break rule of docs/cache.md on its own: what is a break, where it is, how much it lost, and
the memory's bound."""

from __future__ import annotations

from typing import Any

from app.metering.cache import (
    PRINT_OVERHEAD,
    Advisor,
    PrefixMemory,
    parts_anthropic,
    parts_chat,
    parts_responses,
)

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
    assert advisor.assess("/beta/completions", "c", None, dict, 100, 0, "r") is None  # FIM: no advice
    assert advisor.assess("/chat/completions", "c", None, lambda: {"messages": ["not an object"]}, 100, 0,
                          "r") is None

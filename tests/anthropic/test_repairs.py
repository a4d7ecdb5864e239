"""The Anthropic route's repairs as pure functions: each fixes only what it names, the result passes the
rules, and a valid request is never changed."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from chatgate.anthropic.repairs import EMPTY_THINKING, HANDLES, repair_messages
from chatgate.repair.base import NAMES, RepairOptions
from chatgate.verdict import Verdict
from tests.anthropic.messages import (
    TOOLS,
    assistant,
    check,
    loop,
    request,
    text,
    thinking,
    tool_result,
    tool_use,
    user,
)
from tests.openai.test_properties import examples

EVERYTHING = RepairOptions(frozenset(NAMES))
PASSES = 3


def repaired(req: dict[str, Any], options: RepairOptions = EVERYTHING, recalled: dict[int, str] | None = None,
             strict: bool = False) -> tuple[dict[str, Any], list[tuple[str, str]], Verdict]:
    data = copy.deepcopy(req)
    applied: list[tuple[str, str]] = []
    verdict = check(data, strict=strict)
    for _ in range(PASSES):
        done = repair_messages(data, [*verdict.problems, *verdict.warnings], options, recalled or {})
        if not done:
            break
        applied += [(a.code, a.path) for a in done]
        verdict = check(data, strict=strict)
    return data, applied, verdict


def test_every_handler_is_a_catalogued_repair() -> None:
    assert set(HANDLES) <= set(NAMES)


def test_restore_thinking_puts_back_what_chatgate_relayed_a10() -> None:
    req = request(loop(2, keep_thinking=False), tools=TOOLS)
    remembered = json.dumps([thinking("round 0, as relayed", "sig-abc")])
    data, applied, after = repaired(req, recalled={1: remembered})
    assert applied == [("restore_thinking", "messages[1]"), ("restore_thinking", "messages[3]")]
    assert data["messages"][1]["content"][0] == thinking("round 0, as relayed", "sig-abc")
    assert data["messages"][3]["content"][0] == EMPTY_THINKING, "never relayed: the empty block"
    assert data["messages"][3]["content"][1]["type"] == "tool_use"
    assert after.problems == []


def test_thinking_conflict_drops_the_effort_a12() -> None:
    req = request([user()], thinking={"type": "disabled"}, output_config={"effort": "max"})
    data, applied, after = repaired(req, RepairOptions())
    assert applied == [("thinking_conflict", "output_config.effort")]
    assert "output_config" not in data and after.warnings == []


def test_system_messages_merge_into_the_top_level_system_a3() -> None:
    req = request([user(), {"role": "system", "content": "Mind the tests."}, user("go")],
                  system=[{"type": "text", "text": "You are Claude Code.",
                           "cache_control": {"type": "ephemeral"}}])
    data, applied, after = repaired(req)
    assert applied == [("system_messages", "messages[1]")]
    assert data["system"][-1] == {"type": "text", "text": "Mind the tests."}
    assert [m["role"] for m in data["messages"]] == ["user", "user"]
    assert after.problems == []
    data, _, _ = repaired(request([{"role": "system", "content": [text("a"), text("b")]}, user()]))
    assert data["system"] == [text("a"), text("b")], "no system yet: the message's blocks, as sent"


def test_system_messages_keep_every_block_as_sent_in_order_a3() -> None:
    """Claude Code 2.1.332's shape: an environment message after the first user turn (text blocks with
    cache_control), a later reminder; the top-level system is a string: it becomes its own first block."""
    env = {"type": "text", "text": "# Environment\n - Primary working directory: /w",
           "cache_control": {"type": "ephemeral"}}
    msgs = [user(), {"role": "system", "content": [env]}, assistant(text("ok")),
            {"role": "system", "content": "Mind the tests.", "clear_at": "next_user_message"}, user("go")]
    data, applied, after = repaired(request(msgs, system="You are Claude Code."))
    assert applied == [("system_messages", "messages[1]"), ("system_messages", "messages[3]")]
    assert data["system"] == [text("You are Claude Code."), env, text("Mind the tests.")]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user"]
    assert after.problems == [] and after.warnings == []


def test_a_per_turn_effort_statement_becomes_the_requests_output_config_a3() -> None:
    """Claude Code's `{"role": "system", "content": [], "output_config": …}`: no text to move; the last
    statement is the one in force for the turn being generated."""
    msgs = [user(), {"role": "system", "content": [], "output_config": {"effort": "low"}},
            assistant(text("ok")), {"role": "system", "content": [], "output_config": {"effort": "max"}},
            user("go")]
    data, applied, after = repaired(request(msgs, output_config={"effort": "high"}))
    assert applied == [("system_messages", "messages[1]"), ("system_messages", "messages[3]")]
    assert data["output_config"] == {"effort": "max"} and "system" not in data
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user"]
    assert after.problems == []


def test_a_system_message_with_an_image_is_left_for_a3_to_refuse() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    _, applied, after = repaired(request([user(), {"role": "system", "content": [image]}, user("go")]))
    assert applied == [] and [p.code for p in after.problems] == ["invalid_role"]


def test_split_tool_results_are_merged_into_the_next_message_a7() -> None:
    msgs = [user(), assistant(thinking(), tool_use("toolu_a"), tool_use("toolu_b")),
            user(tool_result("toolu_a")), user(tool_result("toolu_b"), text("and also this"))]
    data, applied, after = repaired(request(msgs, tools=TOOLS))
    assert applied == [("split_tool_results", "messages[1].content")]
    assert [b.get("tool_use_id") for b in data["messages"][2]["content"]] == ["toolu_a", "toolu_b"]
    assert data["messages"][3]["content"] == [text("and also this")]
    assert after.problems == []


def test_split_tool_results_behind_a_latest_reminder_stay_behind_it_a7() -> None:
    reminder = {"role": "latest_reminder", "content": "2026-11-11,Wednesday,Singapore,Web,English"}
    msgs = [user(), assistant(thinking(), tool_use("toolu_a"), tool_use("toolu_b")), reminder,
            user(tool_result("toolu_a")), user(tool_result("toolu_b"))]
    data, applied, after = repaired(request(msgs, tools=TOOLS))
    assert applied == [("split_tool_results", "messages[1].content")]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "latest_reminder", "user"]
    assert [b.get("tool_use_id") for b in data["messages"][3]["content"]] == ["toolu_a", "toolu_b"]
    assert after.problems == [] and after.warnings == []


def test_results_that_are_nowhere_are_not_invented_a7() -> None:
    msgs = [user(), assistant(thinking(), tool_use("toolu_a")), user("I changed my mind")]
    _, applied, after = repaired(request(msgs, tools=TOOLS))
    assert applied == [] and [p.code for p in after.problems] == ["tool_use_unanswered"]


def test_empty_assistant_content_gets_a_space_a6() -> None:
    data, applied, after = repaired(request([user(), assistant(), user("again")]))
    assert applied == [("empty_assistant", "messages[1].content")]
    assert data["messages"][1]["content"] == [{"type": "text", "text": " "}] and after.problems == []


def test_forced_tool_choice_is_served_without_thinking_a13() -> None:
    req = request([user()], tools=TOOLS, tool_choice={"type": "tool", "name": "Read"},
                  output_config={"effort": "high"})
    data, applied, after = repaired(req)
    assert applied == [("forced_tool_choice", "thinking")]
    assert data["thinking"] == {"type": "disabled"}
    assert data["tool_choice"] == {"type": "tool", "name": "Read"}
    assert "output_config" not in data and after.problems == [] and after.warnings == []


def test_user_id_model_suffix_and_redacted_thinking_a15_a19_a5() -> None:
    req = request([user(), assistant({"type": "redacted_thinking", "data": "x"}, text("ok")), user("go")],
                  model="deepseek-v4-pro[1m]", metadata={"user_id": '{"session_id":"a b"}'})
    data, applied, after = repaired(req)
    assert sorted(applied) == [("model_suffix", "model"), ("redacted_thinking", "messages[1].content[0]"),
                               ("user_id", "metadata.user_id")]
    assert data["model"] == "deepseek-v4-pro" and data["metadata"]["user_id"] == "__session_id___a_b__"
    assert data["messages"][1]["content"] == [text("ok")]
    assert after.problems == [] and after.warnings == []


def test_only_redacted_thinking_in_a_message_is_left_alone_a5() -> None:
    req = request([user(), assistant({"type": "redacted_thinking", "data": "x"}), user("go")])
    _, applied, _ = repaired(req)
    assert applied == []


@examples(100)
@given(case=st.sampled_from([
    request(loop(3), tools=TOOLS),
    request(loop(1), tools=TOOLS, thinking={"type": "disabled"}),
    request([user()], system="Be brief.", stream=True, output_config={"effort": "low"}),
    request([user(text(), {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}})]),
    request(loop(2), tools=TOOLS, tool_choice={"type": "auto"}, metadata={"user_id": "u_1"}),
]), options=st.sets(st.sampled_from(NAMES)).map(lambda s: RepairOptions(frozenset(s))))
def test_a_valid_request_is_never_changed(case: dict[str, Any], options: RepairOptions) -> None:
    data, applied, after = repaired(case, options, recalled={1: json.dumps([thinking("other")])})
    assert applied == [] and data == case and after.problems == []

"""Sequence and parameter rules (docs/rules-chat.md, R3-R38), as pure functions over request bytes.

Each rule gets an invalid conversation (exact `code` and `param`, and a message that names the message
and says how to fix it) next to a valid neighbour that must pass. Type errors are in test_type_errors.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatgate.errors import APIError
from tests.openai.conversations import (
    EXTRA_MODEL,
    SEARCH_TOOL,
    TOOLS,
    WEATHER_TOOL,
    agent_history,
    assert_valid,
    assistant,
    call,
    calls,
    chat_history,
    check,
    image_part,
    only_problem,
    only_warning,
    parallel_round,
    request,
    says,
    summary,
    system,
    text_part,
    tool,
    user,
    weather_round,
)

# --- tricky valid conversations (no false alarms) ------------------------------------------


@pytest.mark.parametrize("content", [None, ""])
def test_assistant_content_null_or_empty_beside_tool_calls_is_valid(content: str | None) -> None:
    assert_valid(check(request([user(), calls(call("call_1"), content=content), tool("call_1"), assistant()],
                               tools=TOOLS)))


def test_assistant_content_key_absent_beside_tool_calls_is_valid() -> None:
    turn = calls(call("call_1"))
    del turn["content"]
    assert_valid(check(request([user(), turn, tool("call_1")], tools=TOOLS)))


def test_parallel_calls_answered_in_another_order_are_valid() -> None:
    assert_valid(check(request(parallel_round(["call_a", "call_b", "call_c"], ["call_b", "call_c", "call_a"]),
                               tools=TOOLS)))


def test_several_tool_rounds_in_one_turn_are_valid() -> None:
    messages = [
        system(), user("Is Paris warmer than Oslo? Then search the runbook."),
        calls(call("call_1"), reasoning="Paris first."), tool("call_1"),
        calls(call("call_2", arguments=json.dumps({"city": "Oslo", "unit": "c"})), reasoning="Now Oslo."),
        tool("call_2", '{"temp_c": 9}'),
        calls(call("call_3", "search_docs", json.dumps({"query": "heat runbook"})), content="Searching.",
              reasoning="Runbook."),
        tool("call_3", "Runbook: open the windows."),
        assistant("Paris is warmer; the runbook says open the windows."),
        *weather_round("call_4"),
    ]
    assert_valid(check(request(messages, tools=TOOLS)))


def test_reasoning_content_on_thinking_turns_without_tool_calls_is_valid() -> None:
    """DOC-think: reasoning_content of a turn without tool calls is ignored, not refused."""
    messages = [user("2+2?"), assistant("4", reasoning_content="Add them."), user("And 3+3?")]
    assert_valid(check(request(messages, model="deepseek-v4-pro")))


def test_empty_reasoning_content_on_tool_call_turn_is_accepted_r17() -> None:
    """docs/rules-chat.md U3: the field present but empty is not known to fail; R17 only asks for the
    field."""
    assert_valid(check(request([user(), calls(call("call_1"), reasoning=""), tool("call_1"), assistant()],
                               model="deepseek-v4-pro", tools=TOOLS)))


def test_unknown_top_level_fields_are_valid_r39() -> None:
    assert_valid(check(request([user()], temp=0.1, dsh_session={"id": 7}, metadata=None, seed=42,
                               parallel_tool_calls=True)))


def test_unknown_fields_inside_messages_are_valid_r39() -> None:
    t_call = call("call_1")
    t_call["index"] = 0
    t_call["function"]["x_trace"] = "t-1"
    messages = [
        system(cache_control={"type": "ephemeral"}),
        user(timestamp="2026-11-30T07:00:00Z"),
        calls(t_call, refusal=None, annotations=[]),
        tool("call_1", name="get_weather", is_error=False),
        assistant(audio=None),
        {"role": "user",
         "content": [{"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]},
    ]
    assert_valid(check(request(messages, tools=TOOLS)))


def test_name_fields_on_every_role_are_valid() -> None:
    messages = [system(name="policy"), user(name="alice"), calls(call("call_1"), name="bot"),
                tool("call_1", name="get_weather"), assistant(name="bot"), user(name="bob")]
    assert_valid(check(request(messages, tools=TOOLS)))


def test_deepseek_chat_is_non_thinking_so_tool_turn_without_reasoning_is_valid() -> None:
    """Legacy deepseek-chat = non-thinking (NEWS-250821): no R17."""
    messages = [user(), calls(call("call_1"), reasoning=None), tool("call_1"), assistant()]
    assert_valid(check(request(messages, model="deepseek-chat", tools=TOOLS)))


def test_deepseek_reasoner_is_thinking_so_r17_applies() -> None:
    messages = [user(), calls(call("call_1"), reasoning=None), tool("call_1"), assistant()]
    problem = only_problem(check(request(messages, model="deepseek-reasoner", tools=TOOLS)),
                           "reasoning_content_missing", "messages[1].reasoning_content", "R17")
    says(problem, "messages[1] (role assistant)", "reasoning_content")


@pytest.mark.parametrize("switch", [{"thinking": {"type": "disabled"}}, {"reasoning_effort": "none"}],
                         ids=["thinking-disabled", "effort-none"])
def test_thinking_switched_off_needs_no_reasoning_content(switch: dict[str, Any]) -> None:
    messages = [user(), calls(call("call_1"), reasoning=None), tool("call_1"), assistant()]
    assert_valid(check(request(messages, model="deepseek-v4-pro", tools=TOOLS, **switch)))


def test_500_message_chat_history_is_valid() -> None:
    messages = chat_history(500)
    assert len(messages) == 500
    assert_valid(check(request(messages)))


def test_speed_sanity_1000_messages_with_200_tool_pairs_is_valid() -> None:
    """Not a timing assertion: a long agent transcript goes through every rule and passes."""
    messages = agent_history(1000, 200)
    assert sum(1 for m in messages if m["role"] == "tool") == 200
    checked = check(request(messages, model="deepseek-v4-pro", tools=TOOLS))
    assert_valid(checked)
    assert checked.request is not None and len(checked.request.messages) == 1000


# --- R3 unknown models ----------------------------------------------------------------------


def test_a_model_deepseek_does_not_serve_is_refused_with_the_closest_one_r3() -> None:
    """Issue 50 item 7: DeepSeek answers "Model Not Exist" (param null); chatgate names the model to use."""
    problem = only_problem(check(request([user()], model="gpt-4o")), "model_not_found", "model", "R3")
    says(problem, "'gpt-4o'", "did you mean 'deepseek-flash'", "Model Not Exist", "deepseek-v4-pro",
         "observed as of 2026-03", "validation.extra_models")
    problem = only_problem(check(request([user()], model="deepseek-v5-preview")), "model_not_found", "model",
                           "R3")
    says(problem, "did you mean 'deepseek-v4-pro'")


def test_an_unknown_model_is_only_warned_about_when_configured_r3() -> None:
    checked = check(request([user()], model="gpt-4o"), unknown_models="warn")
    assert checked.ok and [(w.code, w.param, w.rule) for w in checked.warnings] == [
        ("model_not_found", "model", "R3")]
    says(checked.warnings[0], "Forwarded as sent")


def test_a_model_in_another_case_is_warned_not_refused_r3() -> None:
    checked = check(request([user()], model="DeepSeek-Flash"))
    assert checked.ok and "did you mean 'deepseek-flash'" in checked.warnings[0].message


def test_a_model_deepseek_added_since_is_forwarded_by_configuration_r3() -> None:
    """`validation.extra_models`: the general rules only (no model-specific limit, not assumed thinking)."""
    assert_valid(check(request(weather_round(), model=EXTRA_MODEL, tools=TOOLS)))
    checked = check(request([user(), calls(call("call_1"))], model=EXTRA_MODEL))
    assert summary(checked) == [("tool_calls_unanswered", "messages[1].tool_calls")]


def test_every_problem_is_listed_with_an_unknown_model_r3() -> None:
    checked = check(request([user()], model="gpt-4o", n=2))
    assert summary(checked) == [("model_not_found", "model"), ("n_not_supported", "n")]


def test_known_model_passes_when_unknown_models_are_rejected_r3() -> None:
    assert_valid(check(request([user()], model="deepseek-v4-pro"), unknown_models="reject"))


# --- R6 / R8 / R9 content and images ------------------------------------------------------------


def test_user_text_and_image_on_vision_model_is_valid_r8() -> None:
    messages = [user(), assistant(), {"role": "user", "content": [text_part(), image_part()]}]
    assert_valid(check(request(messages, model="deepseek-flash")))


def test_user_image_on_non_vision_model_is_invalid_r8() -> None:
    messages = [user(), assistant(), {"role": "user", "content": [text_part(), image_part()]}]
    problem = only_problem(check(request(messages, model="deepseek-v4-pro")),
                           "image_not_supported", "messages[2].content[1]", "R8")
    says(problem, "messages[2] (role user)", "does not support image", "deepseek-flash")


def test_user_text_parts_on_non_vision_model_are_valid() -> None:
    assert_valid(check(request([{"role": "user", "content": [text_part("Hi"), text_part("there")]}],
                               model="deepseek-v4-pro")))


def test_file_part_on_non_vision_model_is_invalid_r8() -> None:
    part = {"type": "file", "file": {"file_id": "file-abc"}}
    only_problem(check(request([{"role": "user", "content": [text_part(), part]}], model="deepseek-v4-pro")),
                 "image_not_supported", "messages[0].content[1]", "R8")


@pytest.mark.parametrize("part", [
    # DeepSeek's documented form (docs/rules-chat.md#the-request-deepseek-documents)
    {"type": "file", "file_id": "file-abc"},
    {"type": "file", "file_data": "data:application/pdf;base64,JVBERi0xLjQ=", "filename": "a.pdf"},
    {"type": "file", "file": {"file_id": "file-abc"}},  # the openai SDK's
])  # fmt: skip
def test_file_parts_in_either_form_are_valid_on_a_vision_model_r7(part: dict[str, Any]) -> None:
    assert_valid(check(request([{"role": "user", "content": [text_part("Summarise it."), part]}],
                               model="deepseek-flash")))


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "file"}, "messages[0].content[0]"),
    ({"type": "file", "file_id": "f", "file_data": "data:,x"}, "messages[0].content[0]"),
    ({"type": "file", "file": {}}, "messages[0].content[0].file"),
])  # fmt: skip
def test_a_file_part_needs_exactly_one_of_id_or_data_r9(part: dict[str, Any], param: str) -> None:
    only_problem(check(request([{"role": "user", "content": [part]}], model="deepseek-flash")),
                 "invalid_image", param, "R9")


def test_tool_content_array_is_valid_on_vision_model_r6() -> None:
    """docs/rules-chat.md U4: Vercel measured arrays (even images) accepted in tool messages on
    deepseek-flash."""
    result = [text_part("Screenshot taken."), image_part("data:image/png;base64,iVBORw0KGgo=")]
    assert_valid(check(request([user(), calls(call("call_1")), tool("call_1", result), assistant()],
                               model="deepseek-flash", tools=TOOLS)))


def test_tool_content_array_is_invalid_on_v4_pro_r6() -> None:
    messages = [user(), calls(call("call_1")), tool("call_1", [text_part("18 °C")]), assistant()]
    problem = only_problem(check(request(messages, model="deepseek-v4-pro", tools=TOOLS)),
                           "content_not_string", "messages[2].content", "R6")
    says(problem, "messages[2] (role tool)", "Join the text parts into one string")


def test_image_url_too_long_is_invalid_r9() -> None:
    url = "https://example.com/" + "a" * 8200
    problem = only_problem(check(request([{"role": "user", "content": [image_part(url)]}])),
                           "invalid_image", "messages[0].content[0].image_url.url", "R9")
    says(problem, "messages[0] (role user)", "data: URL")


def test_inline_data_image_of_any_length_is_valid_r9() -> None:
    url = "data:image/jpeg;base64," + "A" * 20000
    assert_valid(check(request([{"role": "user", "content": [image_part(url, detail="high")]}])))


@pytest.mark.parametrize(("part", "param"), [
    (image_part("ftp://example.com/cat.png"), "messages[0].content[0].image_url.url"),
    (image_part("data:image/svg+xml;base64,PHN2Zz4="), "messages[0].content[0].image_url.url"),
    (image_part(detail="medium"), "messages[0].content[0].image_url.detail"),
    ({"type": "file", "file": {"file_id": "file-1", "file_data": "data:application/pdf;base64,AA=="}},
     "messages[0].content[0].file"),
    ({"type": "file", "file": {"filename": "a.pdf"}}, "messages[0].content[0].file"),
], ids=["ftp-url", "svg", "detail", "file-both", "file-neither"])
def test_bad_image_or_file_part_is_invalid_r9(part: dict[str, Any], param: str) -> None:
    only_problem(check(request([{"role": "user", "content": [part]}])), "invalid_image", param, "R9")


def test_more_than_600_images_is_invalid_r9() -> None:
    messages = [{"role": "user", "content": [image_part(f"https://example.com/{n}.png") for n in range(601)]}]
    only_problem(check(request(messages)), "invalid_image", "messages", "R9")
    assert_valid(check(request([{"role": "user", "content": messages[0]["content"][:600]}])))


# --- R10-R12 assistant messages and tool calls ---------------------------------------------------


def test_assistant_without_content_and_tool_calls_is_invalid_r10() -> None:
    problem = only_problem(check(request([user(), assistant(None), user("Hello?")])),
                           "assistant_empty", "messages[1]", "R10")
    says(problem, "messages[1] (role assistant)", "content or tool_calls must be set", 'content ""')


def test_assistant_with_empty_content_string_is_valid_r10() -> None:
    assert_valid(check(request([user(), assistant(""), user("Hello?")])))


def test_assistant_with_empty_tool_calls_and_null_content_is_invalid_r10() -> None:
    turn = assistant(None, tool_calls=[])
    only_problem(check(request([user(), turn, user("Hello?")])), "assistant_empty", "messages[1]", "R10")


def test_empty_tool_call_id_warns_by_default_and_fails_strict_r11() -> None:
    """No source shows DeepSeek refusing an empty id (its parser only requires the field)."""
    req = request([user(), calls(call("")), tool(""), assistant()], tools=TOOLS)
    warning = only_warning(check(req), "invalid_tool_call", "messages[1].tool_calls[0].id", "R11")
    says(warning, "messages[1] (role assistant)", "is empty", "Keep the id")
    assert not only_problem(check(req, strict=True), "invalid_tool_call", "messages[1].tool_calls[0].id",
                            "R11").warning


@pytest.mark.parametrize("bad", [None, 7, ["call_1"]], ids=["null", "number", "array"])
def test_missing_or_non_string_tool_call_id_is_invalid_r11(bad: Any) -> None:
    missing = call("call_1")
    del missing["id"]
    for turn in (missing, {**call("call_1"), "id": bad}):
        only_problem(check(request([user(), calls(turn), tool("call_1"), assistant()], tools=TOOLS)),
                     "invalid_tool_call", "messages[1].tool_calls[0].id", "R11")


def test_duplicate_tool_call_ids_pass_by_default_and_fail_strict_r12() -> None:
    """Some clients reuse call_0 in every round; DeepSeek's behaviour is not documented (R12: an
    inference)."""
    messages = [*weather_round("call_0"), user("And tomorrow?"), calls(call("call_0")), tool("call_0"),
                assistant("Rain tomorrow.")]
    assert_valid(check(request(messages, tools=TOOLS)))
    problem = only_problem(check(request(messages, tools=TOOLS), strict=True),
                           "duplicate_tool_call_id", "messages[5].tool_calls[0].id", "R12")
    says(problem, "messages[5] (role assistant)", "messages[1]", "unique")


# --- R13-R16 tool message ordering ----------------------------------------------------------------


def test_tool_message_without_preceding_tool_calls_is_invalid_r14() -> None:
    problem = only_problem(check(request([user(), tool("call_1"), assistant()])),
                           "tool_without_tool_calls", "messages[1].role", "R14")
    says(problem, "messages[1] (role tool)", "must be a response to a preceding message with 'tool_calls'",
         "directly after the assistant message")


def test_tool_message_after_plain_assistant_is_invalid_r14() -> None:
    only_problem(check(request([user(), assistant("Let me check."), tool("call_1")])),
                 "tool_without_tool_calls", "messages[2].role", "R14")


def test_unknown_tool_call_id_with_too_few_tool_messages_is_invalid_r15_r16() -> None:
    """The first problem (and `param`) is the tool message's unknown id, what the user must fix and what
    DeepSeek names; the calls it leaves unanswered follow as a further problem (issue 11). One tool message
    for two calls: DeepSeek's own count check refuses it ("insufficient tool messages")."""
    checked = check(request([user(), calls(call("call_1"), call("call_2")), tool("call_9"), assistant()],
                            tools=TOOLS))
    assert summary(checked) == [("unknown_tool_call_id", "messages[2].tool_call_id"),
                                ("tool_calls_unanswered", "messages[1].tool_calls")]
    assert checked.warnings == []
    says(checked.problems[0], "'call_9' not found", "messages[2] (role tool)", "'call_1', 'call_2'")
    says(checked.problems[1], "Missing: call_1, call_2")
    assert "Forwarded" not in checked.problems[0].message + checked.problems[1].message


@pytest.mark.parametrize(("ids", "answers"), [
    (["call_1"], ["call_X"]),
    (["call_1", "call_2"], ["call_1", "call_9"]),
    (["call_1", "call_2"], ["call_8", "call_9", "call_2"]),
], ids=["one-call-wrong-id", "one-of-two-wrong", "more-results-than-calls"])
def test_unknown_tool_call_id_with_a_tool_message_for_each_call_warns_and_fails_strict_r15_r16(
        ids: list[str], answers: list[str]) -> None:
    """R15 is inferred for DeepSeek (docs/rules-chat.md, R15 and U6) and its R16
    message is a count check: with a tool message for each call, a mismatched id is forwarded."""
    messages = [user(), calls(*(call(x) for x in ids)), *(tool(x) for x in answers), assistant()]
    unknown = [f"messages[{2 + n}].tool_call_id" for n, x in enumerate(answers) if x not in ids]
    expected = [*(("unknown_tool_call_id", param) for param in unknown),
                ("tool_calls_unanswered", "messages[1].tool_calls")]
    checked = check(request(messages, tools=TOOLS))
    assert_valid(checked)
    assert [(w.code, w.param) for w in checked.warnings] == expected
    assert [w.rule for w in checked.warnings] == [*(["R15"] * len(unknown)), "R16"]
    says(checked.warnings[0], "not found in 'tool_calls' of previous message", "Forwarded")
    missing = ", ".join(x for x in ids if x not in answers)
    says(checked.warnings[-1], f"Missing: {missing} (messages[1]", "Forwarded")
    strict = check(request(messages, tools=TOOLS), strict=True)
    assert summary(strict) == expected and strict.warnings == []
    assert all("Forwarded" not in p.message for p in strict.problems)


def test_a_call_answered_twice_instead_of_another_warns_and_fails_strict_r15_r16() -> None:
    """As many tool messages as calls, one id twice: DeepSeek's count check passes it."""
    messages = [user(), calls(call("call_1"), call("call_2")), tool("call_1"), tool("call_1"), assistant()]
    only_warning(check(request(messages, tools=TOOLS)), "tool_calls_unanswered", "messages[1].tool_calls",
                 "R16")
    assert summary(check(request(messages, tools=TOOLS), strict=True)) == [
        ("tool_calls_unanswered", "messages[1].tool_calls"),
        ("duplicate_tool_result", "messages[3].tool_call_id")]


def test_unknown_ids_come_first_in_each_block_and_blocks_stay_in_order_r15_r16() -> None:
    """The first block has a tool message for each call (warned), the second too few (refused)."""
    messages = [user(), calls(call("a1"), call("a2")), tool("a1"), tool("zz"), user("next"),
                calls(call("b1"), call("b2")), tool("yy"), assistant()]
    first = [("unknown_tool_call_id", "messages[3].tool_call_id"),
             ("tool_calls_unanswered", "messages[1].tool_calls")]
    second = [("unknown_tool_call_id", "messages[6].tool_call_id"),
              ("tool_calls_unanswered", "messages[5].tool_calls")]
    checked = check(request(messages, tools=TOOLS))
    assert summary(checked) == second
    assert [(w.code, w.param) for w in checked.warnings] == first
    assert summary(check(request(messages, tools=TOOLS), strict=True)) == first + second


def test_unknown_extra_tool_result_passes_by_default_and_fails_strict_r15() -> None:
    """Every call answered plus an extra result with an unknown id: only an inference (R15), strict-only."""
    messages = [user(), calls(call("call_1")), tool("call_1"), tool("call_x"), assistant()]
    assert_valid(check(request(messages, tools=TOOLS)))
    only_problem(check(request(messages, tools=TOOLS), strict=True),
                 "unknown_tool_call_id", "messages[3].tool_call_id", "R15")


def test_tool_result_answered_twice_fails_strict_r15() -> None:
    messages = [user(), calls(call("call_1")), tool("call_1"), tool("call_1"), assistant()]
    assert_valid(check(request(messages, tools=TOOLS)))
    only_problem(check(request(messages, tools=TOOLS), strict=True),
                 "duplicate_tool_result", "messages[3].tool_call_id", "R15")


def test_missing_tool_result_at_end_is_invalid_r16() -> None:
    messages = [user(), calls(call("call_1"), call("call_2")), tool("call_2")]
    problem = only_problem(check(request(messages, tools=TOOLS)),
                           "tool_calls_unanswered", "messages[1].tool_calls", "R16")
    says(problem, "Missing: call_1", "messages[1], role assistant", "conversation ends",
         "Add a tool message for each id")


@pytest.mark.parametrize("intruder", [system("Be brief."), user("hurry up")], ids=["system", "user"])
def test_message_between_tool_calls_and_results_is_invalid_r16(intruder: dict[str, Any]) -> None:
    messages = [user(), calls(call("call_1")), intruder, tool("call_1"), assistant()]
    checked = check(request(messages, tools=TOOLS))
    assert summary(checked) == [("tool_calls_unanswered", "messages[1].tool_calls"),
                                ("tool_without_tool_calls", "messages[3].role")]
    says(checked.problems[0], f"messages[2] (role {intruder['role']}) comes before they are all answered")


# --- R17 thinking and reasoning_content -----------------------------------------------------------


@pytest.mark.parametrize("model", ["deepseek-flash", "deepseek-v4-pro", "deepseek-v4-flash"])
def test_tool_call_turn_without_reasoning_content_in_thinking_mode_is_invalid_r17(model: str) -> None:
    messages = [user(), calls(call("call_1")), tool("call_1"), assistant(),
                user("And Oslo?"), calls(call("call_2"), reasoning=None), tool("call_2"), assistant()]
    problem = only_problem(check(request(messages, model=model, tools=TOOLS)),
                           "reasoning_content_missing", "messages[5].reasoning_content", "R17")
    says(problem, "The `reasoning_content` in the thinking mode must be passed back to the API",
         "messages[5] (role assistant)", 'thinking.type = "disabled"')


def test_explicit_null_reasoning_content_counts_as_missing_r17() -> None:
    messages = [user(), calls(call("call_1"), reasoning=None, reasoning_content=None), tool("call_1")]
    only_problem(check(request(messages, model="deepseek-v4-pro", tools=TOOLS, thinking={"type": "enabled"})),
                 "reasoning_content_missing", "messages[1].reasoning_content", "R17")


@pytest.mark.parametrize("no_tools", [{}, {"tools": None}, {"tools": []}], ids=["absent", "null", "empty"])
def test_tool_call_turn_without_reasoning_in_a_request_without_tools_warns_and_fails_strict_r17(
        no_tools: dict[str, Any]) -> None:
    """DeepSeek requires it "for requests carrying the `tools` parameter" (R17, U3): a title or
    compaction call that replays an agent's history without its tools is forwarded with a warning."""
    messages = [user(), calls(call("call_1"), reasoning=None), tool("call_1"), assistant(),
                user("Summarise this conversation in one line.")]
    req = request(messages, **no_tools)
    warning = only_warning(check(req), "reasoning_content_missing", "messages[1].reasoning_content", "R17")
    says(warning, "The `reasoning_content` in the thinking mode must be passed back to the API",
         "messages[1] (role assistant)", "requests carrying 'tools'", 'thinking.type = "disabled"')
    problem = only_problem(check(req, strict=True),
                           "reasoning_content_missing", "messages[1].reasoning_content", "R17")
    assert not problem.warning and "requests carrying" not in problem.message
    assert check(request(messages, tools=TOOLS)).problems[0].code == "reasoning_content_missing"


def test_unknown_model_is_not_assumed_thinking_r17() -> None:
    messages = [user(), calls(call("call_1"), reasoning=None), tool("call_1"), assistant()]
    assert_valid(check(request(messages, model=EXTRA_MODEL, tools=TOOLS)))


# --- R18-R20 legacy deepseek-reasoner (behind legacy_reasoner_rules) -------------------------------


R1_HISTORY = [user("Hi"), assistant("Hello.", reasoning_content="Greet back."), user("Bye")]


def test_reasoning_content_on_reasoner_input_fails_only_with_legacy_rules_r18() -> None:
    assert_valid(check(request(R1_HISTORY, model="deepseek-reasoner")))
    problem = only_problem(check(request(R1_HISTORY, model="deepseek-reasoner"), legacy=True),
                           "reasoning_content_not_allowed", "messages[1].reasoning_content", "R18")
    says(problem, "messages[1] (role assistant)", "remove the")


def test_successive_user_messages_fail_only_with_legacy_rules_r19() -> None:
    messages = [user("Hi"), user("Are you there?")]
    assert_valid(check(request(messages, model="deepseek-reasoner")))
    problem = only_problem(check(request(messages, model="deepseek-reasoner"), legacy=True),
                           "successive_roles", "messages[1].role", "R19")
    says(problem, "messages[0] and messages[1]", "both role user", "interleave")


def test_legacy_rules_do_not_touch_other_models_r19() -> None:
    assert_valid(check(request([user("Hi"), user("Are you there?")], model="deepseek-flash"), legacy=True))


@pytest.mark.parametrize(("messages", "param", "words"), [
    ([user(), system("late"), user()], "messages[1].role", "must be put on the beginning"),
    ([system(), assistant("Hi!"), user()], "messages[1].role",
     "The first message (except the system message)"),
    ([user(), assistant("Sure.")], "messages[1].role", "The last message of deepseek-reasoner"),
], ids=["system-late", "assistant-first", "assistant-last"])
def test_reasoner_order_fails_only_with_legacy_rules_r20(messages: list[dict[str, Any]], param: str,
                                                         words: str) -> None:
    assert_valid(check(request(messages, model="deepseek-reasoner")))
    problem = only_problem(check(request(messages, model="deepseek-reasoner"), legacy=True),
                           "reasoner_order", param, "R20")
    says(problem, words, param.removesuffix(".role"))


def test_reasoner_may_end_with_prefix_assistant_on_beta_r20() -> None:
    messages = [user("Write a haiku"), assistant("Autumn", prefix=True)]
    assert_valid(check(request(messages, model="deepseek-reasoner"), legacy=True, beta=True))


# --- R21-R22 prefix completion ------------------------------------------------------------------------


def test_prefix_on_last_assistant_on_beta_is_valid_r21() -> None:
    messages = [user("Write quicksort in Python"), assistant("```python\n", prefix=True)]
    assert_valid(check(request(messages, stop=["```"]), beta=True))


def test_prefix_without_beta_is_invalid_r21() -> None:
    messages = [user("Write quicksort in Python"), assistant("```python\n", prefix=True)]
    problem = only_problem(check(request(messages)), "invalid_prefix", "messages[1].prefix", "R21")
    says(problem, "messages[1] (role assistant)", "/beta")


def test_prefix_not_on_last_message_is_invalid_even_on_beta_r21() -> None:
    messages = [user("Start"), assistant("Once upon", prefix=True), user("Continue")]
    problem = only_problem(check(request(messages), beta=True), "invalid_prefix", "messages[1].prefix", "R21")
    says(problem, "messages[1] (role assistant)", "only on the last message", "Remove 'prefix'")


def test_prefix_false_anywhere_is_valid_r21() -> None:
    assert_valid(check(request([user(), assistant("Hi", prefix=False), user("More")])))


def test_reasoning_content_with_prefix_on_beta_is_valid_r22() -> None:
    messages = [user("9.11 or 9.8?"), assistant("", prefix=True, reasoning_content="Compare decimals.")]
    assert_valid(check(request(messages, model="deepseek-flash"), beta=True))


# --- R23-R24 response_format ------------------------------------------------------------------------


def test_json_schema_response_format_is_invalid_r23() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    problem = only_problem(check(request([user("Reply in JSON")], response_format=fmt)),
                           "unsupported_response_format", "response_format.type", "R23")
    says(problem, "unavailable", "json_object")


def test_json_object_without_the_word_json_is_invalid_r24() -> None:
    req = request([user("List three colours")], response_format={"type": "json_object"})
    problem = only_problem(check(req), "json_word_missing", "messages", "R24")
    says(problem, "Prompt must contain the word 'json'", "Answer in JSON")


@pytest.mark.parametrize("messages", [
    [system("Always answer in JSON."), user("List three colours")],
    [user("List three colours as a Json array")],
    [{"role": "user", "content": [text_part("Colours?"), text_part("format: json")]}],
], ids=["system-upper", "user-mixed-case", "text-part"])
def test_json_word_is_found_case_insensitively_r24(messages: list[dict[str, Any]]) -> None:
    assert_valid(check(request(messages, response_format={"type": "json_object"})))


def test_text_response_format_is_valid_r23() -> None:
    assert_valid(check(request([user()], response_format={"type": "text"})))


# --- R25-R29 sampling and output --------------------------------------------------------------------


def test_temperature_out_of_range_in_non_thinking_mode_is_invalid_r25() -> None:
    problem = only_problem(check(request([user()], model="deepseek-chat", temperature=3)),
                           "out_of_range", "temperature", "R25")
    says(problem, "[0, 2]", "got 3")


def test_top_p_out_of_range_is_invalid_r25() -> None:
    only_problem(check(request([user()], model="deepseek-flash", thinking={"type": "disabled"}, top_p=1.5)),
                 "out_of_range", "top_p", "R25")


def test_temperature_bounds_are_valid_r25() -> None:
    for t in (0, 2, 0.7):
        assert_valid(check(request([user()], model="deepseek-chat", temperature=t, top_p=1)))


def test_temperature_ignored_in_thinking_mode_is_checked_only_strict_r25() -> None:
    """DOC-think: temperature is ignored in thinking mode; whether it is range-checked is unknown."""
    req = request([user()], model="deepseek-flash", temperature=3)
    assert_valid(check(req))
    only_problem(check(req, strict=True), "out_of_range", "temperature", "R25")


@pytest.mark.parametrize("field", ["frequency_penalty", "presence_penalty"])
def test_penalties_range_is_strict_only_r26(field: str) -> None:
    """R26: deprecated, 'will not take effect'; the old [-2, 2] range is only enforced with strict."""
    req = request([user()], model="deepseek-chat", **{field: 2.5})
    assert_valid(check(req))
    only_problem(check(req, strict=True), "out_of_range", field, "R26")
    assert_valid(check(request([user()], model="deepseek-chat", **{field: -2}), strict=True))


@pytest.mark.parametrize(("model", "value"), [
    ("deepseek-flash", 0), ("deepseek-flash", 393_217), ("deepseek-v4-pro", -5), ("deepseek-chat", 400_000),
])
def test_max_tokens_out_of_range_is_invalid_r27(model: str, value: int) -> None:
    problem = only_problem(check(request([user()], model=model, max_tokens=value)),
                           "max_tokens_out_of_range", "max_tokens", "R27")
    says(problem, "Invalid max_tokens value, the valid range of max_tokens is [1, ", f"got {value}")


def test_max_tokens_at_the_model_maximum_is_valid_r27() -> None:
    assert_valid(check(request([user()], model="deepseek-flash", max_tokens=393_216)))
    assert_valid(check(request([user()], model=EXTRA_MODEL, max_tokens=2_000_000)))


def test_seventeen_stop_sequences_are_invalid_r28() -> None:
    only_problem(check(request([user()], stop=[f"END{n}" for n in range(17)])),
                 "too_many_stop_sequences", "stop", "R28")
    assert_valid(check(request([user()], stop=[f"END{n}" for n in range(16)])))
    assert_valid(check(request([user()], stop="END")))


@pytest.mark.parametrize("stream", [False, None, "absent"])
def test_stream_options_without_stream_true_are_invalid_r29(stream: Any) -> None:
    params: dict[str, Any] = {"stream_options": {"include_usage": True}}
    if stream != "absent":
        params["stream"] = stream
    problem = only_problem(check(request([user()], **params)),
                           "stream_options_without_stream", "stream_options", "R29")
    says(problem, "stream_options should be set along with stream = true", '"stream": true')


def test_stream_options_with_stream_true_are_valid_r29() -> None:
    assert_valid(check(request([user()], stream=True, stream_options={"include_usage": True})))
    assert_valid(check(request([user()], stream=False, stream_options=None)))


# --- R30-R34 tools and tool_choice --------------------------------------------------------------------


def _tool(name: str, **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}, **function}}


def test_129_tools_are_invalid_and_128_valid_r30() -> None:
    only_problem(check(request([user()], tools=[_tool(f"t{n}") for n in range(129)])),
                 "too_many_tools", "tools", "R30")
    assert_valid(check(request([user()], tools=[_tool(f"t{n}") for n in range(128)])))


def test_unknown_tool_type_is_forwarded_with_a_warning_r30() -> None:
    tools = [WEATHER_TOOL, {"type": "retrieval", "function": {"name": "r"}}, {"type": "code_runner"}]
    checked = check(request([user()], tools=tools))
    assert checked.ok
    assert [(w.code, w.param, w.rule) for w in checked.warnings] == [
        ("unknown_tool_type", "tools[1].type", "R30"), ("unknown_tool_type", "tools[2].type", "R30")]
    strict = check(request([user()], tools=tools), strict=True)
    assert [(p.code, p.param) for p in strict.problems] == [
        ("unknown_tool_type", "tools[1].type"), ("unknown_tool_type", "tools[2].type")]


@pytest.mark.parametrize("name", ["github.create_issue", "fs:read", "搜索", "a" * 65, ""])
def test_bad_function_name_is_invalid_r31(name: str) -> None:
    problem = only_problem(check(request([user()], tools=[WEATHER_TOOL, _tool(name)])),
                           "invalid_function_name", "tools[1].function.name", "R31")
    says(problem, "string does not match pattern", "'^[a-zA-Z0-9_-]+$'", "Replace")


def test_function_name_of_64_allowed_characters_is_valid_r31() -> None:
    assert_valid(check(request([user()], tools=[_tool("a-Z_9" + "x" * 59)])))


def test_duplicate_function_names_are_strict_only_r31() -> None:
    req = request([user()], tools=[WEATHER_TOOL, SEARCH_TOOL, WEATHER_TOOL])
    assert_valid(check(req))
    problem = only_problem(check(req, strict=True), "invalid_function_name", "tools[2].function.name", "R31")
    says(problem, "already defined by tools[0]")


STRICT_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "format": "hostname"}},
                 "required": ["city"], "additionalProperties": False}


def test_strict_tools_off_beta_are_forwarded_with_a_warning_r32() -> None:
    """openai-agents and pydantic-ai send strict: true on every tool; DeepSeek accepts it off /beta and does
    not enforce it (docs/rules-chat.md U11). Valid, one warning naming the tools; even a non-strict schema is
    not checked."""
    loose = {"type": "object", "properties": {"city": {"type": "string"}}}
    req = request([user()], tools=[_tool("lookup", parameters=STRICT_PARAMS, strict=True),
                                   _tool("find", parameters=loose, strict=True), _tool("plain")])
    warning = only_warning(check(req, origin="http://10.0.0.5:9000"), "strict_not_enforced",
                           "tools[0].function.strict", "R32")
    says(warning, "tools[0], tools[1]", "only enforced on DeepSeek's /beta", "http://10.0.0.5:9000/beta")


def test_strict_mode_refuses_strict_tools_off_beta_with_the_clients_address_r32() -> None:
    req = request([user()], tools=[_tool("lookup", parameters=STRICT_PARAMS, strict=True)])
    problem = only_problem(check(req, strict=True, origin="http://gate.internal:8080"),
                           "strict_requires_beta", "tools[0].function.strict", "R32")
    says(problem, "http://gate.internal:8080/beta", "remove 'strict'")
    assert "8787" not in problem.message
    assert_valid(check(req, beta=True))
    assert check(req, beta=True).warnings == []


def test_hints_name_no_address_offline_r21_r32() -> None:
    req = request([user(), {"role": "assistant", "content": "x", "prefix": True}])
    problem = only_problem(check(req), "invalid_prefix", "messages[1].prefix", "R21")
    says(problem, "set base_url to …/beta")
    assert "chatgate:" not in problem.message


def test_strict_schema_must_require_every_property_and_close_objects_r32() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
              "required": ["city"]}
    checked = check(request([user()], tools=[_tool("lookup", parameters=params, strict=True)]), beta=True)
    assert summary(checked) == [("invalid_parameters_schema", "tools[0].function.parameters")] * 2
    says(checked.problems[0], "missing: unit")
    says(checked.problems[1], "'additionalProperties' must be false")


def test_strict_schema_refuses_min_length_r32() -> None:
    params = {**STRICT_PARAMS, "properties": {"city": {"type": "string", "minLength": 2}}}
    only_problem(check(request([user()], tools=[_tool("lookup", parameters=params, strict=True)]), beta=True),
                 "invalid_parameters_schema", "tools[0].function.parameters.properties.city", "R32")


def test_strict_schema_with_odd_required_list_is_reported_not_crashing_r32() -> None:
    """Regression: a `required` list holding objects used to raise TypeError (unhashable dict)."""
    params = {"type": "object", "properties": {"a": {"type": "string"}}, "required": [{"a": 1}, ["a"]],
              "additionalProperties": False}
    only_problem(check(request([user()], tools=[_tool("lookup", parameters=params, strict=True)]), beta=True),
                 "invalid_parameters_schema", "tools[0].function.parameters", "R32")


def test_non_strict_tool_schema_is_not_checked_r32() -> None:
    assert_valid(check(request([user()], tools=[SEARCH_TOOL])))


@pytest.mark.parametrize("choice", ["any", "function", "auto "])
def test_unknown_tool_choice_string_is_invalid_r33(choice: str) -> None:
    problem = only_problem(check(request([user()], model="deepseek-chat", tools=TOOLS, tool_choice=choice)),
                           "invalid_tool_choice", "tool_choice", "R33")
    says(problem, "expected one of `none`, `auto`, `required` or a tool")


def test_tool_choice_object_of_another_type_is_forwarded_with_a_warning_r33() -> None:
    for choice in ({"type": "tool", "function": {"name": "get_weather"}}, {"type": "deepseek_web_search"}):
        req = request([user()], tools=[*TOOLS, {"type": "deepseek_web_search"}], tool_choice=choice)
        only_warning(check(req), "invalid_tool_choice", "tool_choice.type", "R33")
        only_problem(check(req, strict=True), "invalid_tool_choice", "tool_choice.type", "R33")


def test_named_tool_choice_must_name_a_defined_tool_only_strict_r33() -> None:
    req = request([user()], model="deepseek-chat", tools=[SEARCH_TOOL],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert_valid(check(req))
    only_problem(check(req, strict=True), "invalid_tool_choice", "tool_choice.function.name", "R33")


def test_tool_choice_without_tools_is_strict_only_and_none_always_valid_r33() -> None:
    assert_valid(check(request([user()], model="deepseek-chat", tool_choice="auto")))
    only_problem(check(request([user()], model="deepseek-chat", tool_choice="auto"), strict=True),
                 "invalid_tool_choice", "tool_choice", "R33")
    assert_valid(check(request([user()], model="deepseek-chat", tool_choice="none"), strict=True))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forcing_tool_choice_in_thinking_mode_is_invalid_r34(choice: Any) -> None:
    problem = only_problem(check(request([user()], model="deepseek-flash", tools=TOOLS, tool_choice=choice)),
                           "tool_choice_in_thinking", "tool_choice", "R34")
    says(problem, "Thinking mode does not support this tool_choice", 'thinking.type = "disabled"')


@pytest.mark.parametrize(("model", "params"), [
    ("deepseek-flash", {"thinking": {"type": "disabled"}}),
    ("deepseek-v4-pro", {"reasoning_effort": "none"}),
    ("deepseek-chat", {}),
], ids=["thinking-disabled", "effort-none", "deepseek-chat"])
def test_required_tool_choice_without_thinking_is_valid_r34(model: str, params: dict[str, Any]) -> None:
    assert_valid(check(request([user()], model=model, tools=TOOLS, tool_choice="required", **params)))


def test_auto_tool_choice_in_thinking_mode_is_valid_r34() -> None:
    assert_valid(check(request([user()], model="deepseek-flash", tools=TOOLS, tool_choice="auto")))


# --- R35-R38 ------------------------------------------------------------------------------------------


def test_top_logprobs_requires_logprobs_r35() -> None:
    problem = only_problem(check(request([user()], top_logprobs=5)),
                           "top_logprobs_requires_logprobs", "top_logprobs", "R35")
    says(problem, "`logprobs` must be set to true")
    assert_valid(check(request([user()], logprobs=True, top_logprobs=5)))


def test_top_logprobs_above_20_is_invalid_r35() -> None:
    only_problem(check(request([user()], logprobs=True, top_logprobs=21)),
                 "out_of_range", "top_logprobs", "R35")
    assert_valid(check(request([user()], logprobs=True, top_logprobs=20)))


@pytest.mark.parametrize("kind", ["enabled", "disabled", "adaptive"])
def test_thinking_types_deepseek_lists_are_valid_r36(kind: str) -> None:
    """`adaptive` is in DeepSeek's deserializer (`expected one of adaptive, enabled, disabled`)."""
    assert_valid(check(request([user()], thinking={"type": kind})))


def test_adaptive_thinking_is_thinking_r17() -> None:
    messages = [user(), calls(call("call_1"), reasoning=None), tool("call_1")]
    only_problem(check(request(messages, tools=TOOLS, thinking={"type": "adaptive"})),
                 "reasoning_content_missing", "messages[1].reasoning_content", "R17")


@pytest.mark.parametrize("effort", ["low", "high", "max", "medium"])
def test_thinking_disabled_with_an_effort_warns_by_default_and_fails_strict_r41(effort: str) -> None:
    req = request([user()], thinking={"type": "disabled"}, reasoning_effort=effort)
    warning = only_warning(check(req), "thinking_disabled_with_effort", "reasoning_effort", "R41")
    says(warning, "thinking options type cannot be disabled when reasoning_effort is set", f"'{effort}'",
         "Remove 'reasoning_effort'")
    only_problem(check(req, strict=True), "thinking_disabled_with_effort", "reasoning_effort", "R41")


def test_thinking_disabled_with_effort_none_is_always_valid_r41() -> None:
    for strict in (False, True):
        checked = check(request([user()], thinking={"type": "disabled"}, reasoning_effort="none"),
                        strict=strict)
        assert_valid(checked)
        assert checked.warnings == []


@pytest.mark.parametrize(("params", "param"), [
    ({"thinking": {"type": "auto"}}, "thinking.type"),
    ({"reasoning_effort": "off"}, "reasoning_effort"),
], ids=["thinking-auto", "effort-off"])
def test_bad_thinking_parameters_are_invalid_r36(params: dict[str, Any], param: str) -> None:
    only_problem(check(request([user()], **params)), "invalid_thinking", param, "R36")


@pytest.mark.parametrize("effort", ["low", "high", "max", "minimal", "medium", "xhigh", "ultra", "none"])
def test_reasoning_efforts_deepseek_maps_are_valid_r36(effort: str) -> None:
    assert_valid(check(request([user()], reasoning_effort=effort, thinking={"type": "enabled"})))


def test_user_id_over_512_utf8_bytes_is_refused_r37() -> None:
    for bad in ("a" * 513, "用" * 171):  # 171 three-byte characters: 513 bytes
        problem = only_problem(check(request([user()], user_id=bad)), "invalid_user_id", "user_id", "R37")
        says(problem, "513 UTF-8 bytes", "at most 512")
    assert_valid(check(request([user()], user_id="team-7_user-" + "a" * 500)))
    assert_valid(check(request([user()], user_id="a" * 512)))


def test_user_id_characters_are_only_recommended_r37() -> None:
    """Since 2026-11 DeepSeek only recommends [a-zA-Z0-9_-] (§13.2): other characters are a warning."""
    for unusual in ("alice smith", "ünï", "", "bob@example.com", "用户 42", "用" * 170):
        body = request([user()], user_id=unusual)
        only_warning(check(body), "invalid_user_id", "user_id", "R37")
        only_problem(check(body, strict=True), "invalid_user_id", "user_id", "R37")


def test_n_other_than_one_is_invalid_r38() -> None:
    problem = only_problem(check(request([user()], n=3)), "n_not_supported", "n", "R38")
    says(problem, "only n = 1", "Remove 'n'")
    assert_valid(check(request([user()], n=1)))


# --- several problems at once ------------------------------------------------------------------------------


def test_every_problem_is_listed_earliest_message_first() -> None:
    messages = [
        system(),
        user("Weather?"),
        assistant(None),                                # R10 at messages[2]
        user("Paris and Oslo please"),
        calls(call("call_1"), call("call_2")),          # R16 at messages[4]: call_2 unanswered
        tool("call_1"),
        user("and?"),
        calls(call("call_3"), reasoning=None),          # R17 at messages[7]
        tool("call_3"),
    ]
    checked = check(request(messages, model="deepseek-v4-pro", tools=TOOLS, max_tokens=0, n=2))
    assert summary(checked) == [
        ("assistant_empty", "messages[2]"),
        ("tool_calls_unanswered", "messages[4].tool_calls"),
        ("reasoning_content_missing", "messages[7].reasoning_content"),
        ("max_tokens_out_of_range", "max_tokens"),
        ("n_not_supported", "n"),
    ]
    assert [p.rule for p in checked.problems] == ["R10", "R16", "R17", "R27", "R38"]
    assert not checked.ok


# --- the November 2026 surface (docs/rules-chat.md#the-november-2026-surface) ----------------------------

WEB_TOOLS = [{"type": "deepseek_web_search"}, {"type": "deepseek_read_url"}]


def test_server_web_tools_are_valid_on_deepseek_flash_r30() -> None:
    checked = check(request([user("What happened today?")], tools=[*WEB_TOOLS, WEATHER_TOOL]))
    assert_valid(checked)
    assert checked.warnings == []


def test_server_web_tools_alone_with_a_tool_choice_are_valid_r30() -> None:
    for choice in ("auto", "none", "required"):
        assert_valid(check(request([user()], tools=WEB_TOOLS, tool_choice=choice,
                                   thinking={"type": "disabled"})))


def test_server_web_tools_on_another_model_are_forwarded_with_a_warning_r30() -> None:
    warning = only_warning(check(request([user()], model="deepseek-v4-pro", tools=WEB_TOOLS[:1])),
                           "server_tool_model", "tools[0].type", "R30")
    says(warning, "deepseek_web_search", "deepseek-flash only", "deepseek-v4-pro")


def test_function_rules_apply_to_function_tools_only_r31_r32() -> None:
    tools = [*WEB_TOOLS, _tool("bad name"), {"type": "function", "function": {"name": "s", "strict": True}}]
    checked = check(request([user()], tools=tools), beta=True)
    assert summary(checked) == [("invalid_function_name", "tools[2].function.name")]


def test_a_function_tool_without_its_function_is_refused_r30() -> None:
    only_problem(check(request([user()], tools=[{"type": "function"}])), "missing_required_parameter",
                 "tools[0].function", "R30")


def test_named_tool_choice_strict_check_skips_server_tools_r33() -> None:
    req = request([user()], tools=[*WEB_TOOLS, WEATHER_TOOL], thinking={"type": "disabled"},
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert_valid(check(req, strict=True))


def test_a_function_tool_choice_without_its_function_r33() -> None:
    req = request([user()], model="deepseek-chat", tools=TOOLS, tool_choice={"type": "function"})
    only_problem(check(req), "missing_required_parameter", "tool_choice.function", "R33")


@pytest.mark.parametrize("level", ["high", "low"])
def test_safety_check_levels_are_valid_r42(level: str) -> None:
    checked = check(request([user()], safety_check={"level": level}, title={"enabled": True}))
    assert_valid(checked)
    assert checked.warnings == []


@pytest.mark.parametrize("level", ["medium", "HIGH", "none", ""])
def test_other_safety_check_levels_are_refused_r42(level: str) -> None:
    problem = only_problem(check(request([user()], safety_check={"level": level})), "invalid_safety_check",
                           "safety_check.level", "R42")
    says(problem, f"unknown variant `{level}`, expected `high` or `low`")


def test_safety_check_level_of_another_type_is_a_type_error_r42() -> None:
    only_problem(check(request([user()], safety_check={"level": 2})), "invalid_type", "safety_check.level",
                 "R42")
    only_problem(check(request([user()], safety_check="high")), "invalid_type", "safety_check", "R42")


def _reminder() -> dict[str, Any]:
    return {"role": "latest_reminder", "content": "2026-11-11,Wednesday,Singapore,Web,English"}


def test_latest_reminder_before_its_user_message_keeps_tool_rounds_valid_r5() -> None:
    messages = [system(), _reminder(), user("Weather?"), *weather_round("call_1")[1:], _reminder(),
                user("And tomorrow?")]
    checked = check(request(messages, tools=TOOLS))
    assert_valid(checked)
    assert checked.warnings == []


def test_latest_reminder_is_not_a_turn_for_the_legacy_order_rules_r19_r20() -> None:
    messages = [_reminder(), user("Hi"), assistant("Hello"), _reminder(), user("Again")]
    assert_valid(check(request(messages, model="deepseek-reasoner"), legacy=True))


def test_a_latest_reminder_inside_a_tool_block_is_read_past_r14_r16() -> None:
    messages = [user(), calls(call("call_a"), call("call_b")), tool("call_b"), _reminder(), tool("call_a"),
                assistant()]
    assert_valid(check(request(messages, tools=TOOLS)))
    short = [user(), calls(call("call_a"), call("call_b")), tool("call_a"), _reminder(), user()]
    assert summary(check(request(short, tools=TOOLS))) == [
        ("tool_calls_unanswered", "messages[1].tool_calls")]


def test_a_tool_call_of_another_type_passed_back_is_forwarded_with_a_warning_r11() -> None:
    """How DeepSeek's chat answer carries its server tools' work is not documented: a call of another type in
    `tool_calls` is forwarded, and needs no tool message (R14-R16 pair function calls only)."""
    server = {"id": "ws_1", "type": "deepseek_web_search", "deepseek_web_search": {"query": "news"}}
    turn = calls(call("call_1"), reasoning="Search, then the weather.")
    turn["tool_calls"].insert(0, server)
    messages = [user(), turn, tool("call_1"), assistant(), user("More?")]
    warning = only_warning(check(request(messages, tools=[*TOOLS, {"type": "deepseek_web_search"}])),
                           "unknown_tool_call_type", "messages[1].tool_calls[0].type", "R11")
    says(warning, "'deepseek_web_search'", "forwarded")


def test_a_function_call_without_its_function_is_refused_r11() -> None:
    turn = calls(call("call_1"))
    del turn["tool_calls"][0]["function"]
    only_problem(check(request([user(), turn, tool("call_1")], tools=TOOLS)), "invalid_tool_call",
                 "messages[1].tool_calls[0].function", "R11")


# --- every problem of a body (issue 50 item 8) ----------------------------------------------------------


def test_a_developer_role_does_not_hide_the_other_problems_r5() -> None:
    body = request([{"role": "developer", "content": "Be brief."}, user()], max_tokens=999_999, n=2)
    checked = check(body)
    assert summary(checked) == [("invalid_role", "messages[0].role"),
                                ("max_tokens_out_of_range", "max_tokens"), ("n_not_supported", "n")]
    error = APIError.from_problems(checked.problems)
    assert error.param == "messages[0].role" and error.code == "invalid_role"
    assert error.message.endswith("(2 more problem(s) listed in error.problems)")
    assert [p["rule"] for p in error.body()["error"]["problems"]] == ["R5", "R27", "R38"]


def test_a_type_error_does_not_hide_the_other_problems() -> None:
    checked = check(request([user()], temperature="hot", n=2))
    assert summary(checked) == [("invalid_type", "temperature"), ("n_not_supported", "n")]
    assert [param for _, param in summary(check(request([user(), {"role": "user", "content": 3}], n=2)))] == [
        "messages[1].content"], "an error in the messages leaves nothing to read"

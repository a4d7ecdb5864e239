"""The Responses route's rules P1-P23 (docs/rules-responses.md): what DeepSeek documents or was seen refusing
is refused with its words and a precise param; what is uncertain is warned and refused only in strict mode;
what DeepSeek silently ignores is never refused; Codex's own shapes pass."""

from __future__ import annotations

from typing import Any

import pytest

from tests.responses.items import (
    SHELL,
    TOOLS,
    assistant,
    call,
    check,
    developer,
    only,
    output,
    reasoning,
    request,
    summary,
    turn,
    user,
    warned,
)


def codex_request(**extra: Any) -> dict[str, Any]:
    """What Codex sends DeepSeek: instructions, a long history with reasoning items, store false, include,
    prompt_cache_key, parallel calls, apply_patch, web_search, json_schema text format, client_metadata."""
    history = [developer("<permissions instructions>"), user("<environment_context>"), user("Fix it.")]
    history += turn("call_1")
    history += turn("call_2", "call_3")
    history += [{"type": "web_search_call", "id": "ws_1", "status": "completed",
                 "action": {"type": "search", "query": "pytest fixtures"}}]
    history += [reasoning("Now patch.", "rs_p"), {"type": "custom_tool_call", "call_id": "call_p",
                                                  "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."}]
    history += [reasoning("Summarise.", "rs_e", encrypted_content="d8b79690-7c51-4f2e-9a1b-2f0c8d1e5a77-0"),
                assistant("Fixed."), user("Thanks, now run it again.")]
    return request(history, instructions="You are Codex.", store=False, stream=True,
                   include=["reasoning.encrypted_content"], prompt_cache_key="019a-conv", tool_choice="auto",
                   parallel_tool_calls=True, reasoning={"effort": "high", "summary": "auto"},
                   text={"verbosity": "medium", "format": {"type": "json_schema", "name": "x", "strict": True,
                                                           "schema": {"type": "object"}}},
                   service_tier="auto", client_metadata={"x": "y"}, **extra)


def test_a_codex_request_is_valid_without_a_warning() -> None:
    verdict = check(codex_request())
    assert summary(verdict) == [] and warned(verdict) == []
    assert (verdict.model, verdict.stream, verdict.thinking, verdict.tools) == ("deepseek-flash", True, True,
                                                                                 True)
    assert verdict.profile is not None and verdict.profile.name == "deepseek-flash"


def test_an_sdk_string_input_and_easy_messages_are_valid() -> None:
    assert summary(check({"model": "deepseek-v4-pro", "input": "Hello"})) == []
    easy = {"model": "deepseek-flash", "input": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi"}]}
    assert summary(check(easy)) == [] and warned(check(easy)) == []


def test_silently_ignored_fields_are_never_refused_p20() -> None:
    body = request([user()], previous_response_id="resp_1", store=True, include=["x"], truncation="auto",
                   background=True, conversation={"id": "conv_1"}, metadata={"a": 1}, safety_identifier="u",
                   prompt={"id": "p"}, prompt_cache_retention="24h", max_tool_calls=3,
                   stream_options={"x": 1}, context_management=[{"type": "compaction"}])
    verdict = check(body, strict=True)
    assert summary(verdict) == []
    assert warned(verdict) == [("stateless_field_ignored", name, "P20") for name in
                               ("previous_response_id", "conversation", "background", "truncation")]
    assert "DeepSeek stores no responses" in verdict.warnings[0].message


# --- P1: types ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param", "code"), [
    pytest.param(b"{", None, "invalid_json", id="not-json"),
    pytest.param(b"[1]", None, "invalid_json", id="not-an-object"),
    pytest.param({"input": "hi"}, "model", "missing_required_parameter", id="no-model"),
    pytest.param({"model": "deepseek-flash", "input": 5}, "input", "invalid_type", id="input-number"),
    pytest.param({"model": "deepseek-flash", "input": [5]}, "input[0]", "invalid_type", id="item-number"),
    pytest.param({"model": "deepseek-flash", "input": [{"content": "x"}]}, "input[0]", "invalid_type",
                 id="item-without-type-or-role"),
    pytest.param(request([user(), {**call(), "arguments": {"command": "ls"}}]), "input[1].arguments",
                 "invalid_type", id="arguments-object"),
    pytest.param(request([user(), {"type": "function_call", "name": "shell", "arguments": "{}"}]),
                 "input[1].call_id", "missing_required_parameter", id="call-without-call_id"),
    pytest.param(request([user(), call(), {**output(), "output": {"ok": True}}]), "input[2].output",
                 "invalid_type", id="output-object"),
    pytest.param({"model": "deepseek-flash", "input": "x", "tools": [
        {"type": "function", "function": {"name": "shell"}}]}, "tools[0].name", "missing_required_parameter",
                 id="chat-style-tool"),
    pytest.param({"model": "deepseek-flash", "input": "x", "stream": "yes"}, "stream", "invalid_type",
                 id="stream-string"),
    pytest.param({"model": "deepseek-flash", "input": [{"role": "user", "content": [{"text": "x"}]}]},
                 "input[0].content[0]", "invalid_type", id="part-without-type"),
])
def test_wrong_types_are_refused_with_the_path_p1(body: Any, param: str | None, code: str) -> None:
    problem = check(body).problems[0]
    assert (problem.code, problem.param, problem.rule) == (code, param, "P1")


def test_a_chat_style_tool_is_explained_p1() -> None:
    body = {"model": "deepseek-flash", "input": "x", "tools": [{"type": "function", "function": SHELL}]}
    assert "Responses API function tools are flat" in check(body).problems[0].message


def test_a_call_without_call_id_uses_deepseeks_words_p1() -> None:
    body = request([user(), {"type": "function_call", "name": "shell", "arguments": "{}"}])
    assert "missing field `call_id`" in check(body).problems[0].message


# --- P2, P3: model and input --------------------------------------------------------------------------------


def test_an_unknown_model_is_refused_with_deepseeks_words_p2() -> None:
    verdict = check({"model": "deepseek-v4.1-flash", "input": "hi"})
    assert summary(verdict) == [("model_not_found", "model", "P2")]
    message = verdict.problems[0].message
    assert "did you mean 'deepseek-v4-flash'" in message
    assert ("The supported API model names are deepseek-flash, deepseek-v4-pro, but you passed "
            "deepseek-v4.1-flash.") in message
    assert not verdict.thinking, "an unknown model: thinking unknown, so no P11"
    warned_only = check({"model": "deepseek-v4.1-flash", "input": "hi"}, unknown_models="warn")
    assert summary(warned_only) == [] and warned(warned_only) == [("model_not_found", "model", "P2")]


def test_a_missing_or_empty_input_is_only_warned_p3() -> None:
    assert warned(check({"model": "deepseek-flash"})) == [("missing_input", "input", "P3")]
    assert warned(check({"model": "deepseek-flash", "input": []})) == [("empty_input", "input", "P3")]
    assert summary(check({"model": "deepseek-flash", "input": []}, strict=True)) == [
        ("empty_input", "input", "P3")]


# --- P4-P6: messages, parts, images -------------------------------------------------------------------------


def test_roles_are_the_documented_four_and_others_forwarded_p4() -> None:
    for role in ("user", "assistant", "system", "developer"):
        assert summary(check({"model": "deepseek-flash", "input": [{"role": role, "content": "x"}]})) == []
    body = {"model": "deepseek-flash", "input": [{"role": "tool", "content": "x"}]}
    verdict = check(body)
    assert summary(verdict) == [] and warned(verdict) == [("unknown_role", "input[0].role", "P4")]
    assert "function_call_output" in verdict.warnings[0].message
    assert summary(check(body, strict=True)) == [("unknown_role", "input[0].role", "P4")]


def test_latest_reminder_is_not_a_responses_feature_p4() -> None:
    reminder = {"role": "latest_reminder", "content": "2026-11-11,Wednesday,Singapore,Web,English"}
    verdict = check({"model": "deepseek-flash", "input": [reminder, {"role": "user", "content": "hi"}]})
    assert summary(verdict) == [] and warned(verdict) == [("unknown_role", "input[0].role", "P4")]
    assert "Chat Completions and Messages" in verdict.warnings[0].message


def test_unknown_parts_and_files_are_warned_p5() -> None:
    body = request([{"role": "user", "content": [
        {"type": "input_text", "text": "read"}, {"type": "input_file", "file_id": "file_1"},
        {"type": "input_audio", "input_audio": {}}]}])
    verdict = check(body)
    assert summary(verdict) == []
    assert warned(verdict) == [("unsupported_content_part", "input[0].content[1].type", "P5"),
                               ("unsupported_content_part", "input[0].content[2].type", "P5")]
    assert "accepts no files" in verdict.warnings[0].message
    assert len(check(body, strict=True).problems) == 2


IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "auto"}


def test_images_in_user_developer_messages_and_tool_outputs_on_flash_p6() -> None:
    body = request([{"role": "user", "content": [IMAGE]}, {"role": "developer", "content": [IMAGE]},
                    *turn("call_1")[:2],
                    {**output(), "output": [IMAGE, {"type": "input_text", "text": "x"}]}])
    verdict = check(body)
    assert summary(verdict) == [] and warned(verdict) == []


def test_images_in_system_or_assistant_messages_are_refused_p6() -> None:
    body = request([{"role": "system", "content": [IMAGE]}, user(),
                    {"role": "assistant", "content": [IMAGE]}])
    assert summary(check(body)) == [("image_not_allowed_here", "input[0].content[0]", "P6"),
                                    ("image_not_allowed_here", "input[2].content[0]", "P6")]


def test_images_on_a_model_without_vision_are_warned_p6() -> None:
    body = {"model": "deepseek-v4-pro", "input": [{"role": "user", "content": [IMAGE]}]}
    assert warned(check(body)) == [("image_not_supported", "input[0].content[0]", "P6")]
    assert summary(check(body, strict=True)) == [("image_not_supported", "input[0].content[0]", "P6")]


# --- P7-P10: calls and outputs ------------------------------------------------------------------------------


def test_call_ids_must_be_non_empty_and_unique_p7() -> None:
    body = request([user(), reasoning(), call(""), output(""), user(), reasoning(), call("call_1"),
                    output("call_1"), user(), reasoning(), call("call_1"), output("call_1")])
    problems = summary(check(body))
    assert ("invalid_call_id", "input[2].call_id", "P7") in problems
    assert ("duplicate_call_id", "input[10].call_id", "P7") in problems


def test_an_output_without_call_id_is_refused_with_deepseeks_words_p8() -> None:
    heartbeat = {"type": "function_call_output", "id": "automation_heartbeat", "output": "ok"}
    problem = only(check(request([user(), heartbeat])).problems)
    assert (problem.code, problem.param, problem.rule) == ("missing_call_id", "input[1].call_id", "P8")
    assert "missing field `call_id`" in problem.message and "automation_heartbeat" in problem.message


def test_an_output_without_a_call_is_refused_with_deepseeks_words_p9() -> None:
    problem = only(check(request([user(), output("call_automation_update")])).problems)
    assert (problem.code, problem.param, problem.rule) == ("tool_output_without_call", "input[1].call_id",
                                                           "P9")
    assert problem.message.startswith("No tool call found for tool output with call_id "
                                      "call_automation_update")


def test_a_second_output_for_one_call_is_warned_p9() -> None:
    body = request([user(), *turn("call_1"), output("call_1")])
    assert warned(check(body)) == [("duplicate_tool_output", "input[4].call_id", "P9")]


def test_a_call_without_any_output_is_refused_p10() -> None:
    problem = only(check(request([user(), reasoning(), call("call_1")])).problems)
    assert (problem.code, problem.param, problem.rule) == ("tool_output_missing", "input[2]", "P10")
    assert problem.message.startswith("No tool output found for tool call call_1")


@pytest.mark.parametrize("between", [developer(), user("Also check lint."),
                                     {"role": "system", "content": "x"}, reasoning("later", "rs_9")],
                         ids=["developer", "user", "system", "reasoning"])
def test_a_message_or_reasoning_between_call_and_output_is_refused_p10(between: dict[str, Any]) -> None:
    body = request([user(), reasoning(), call("call_1"), between, output("call_1")])
    problem = only(check(body).problems)
    assert (problem.code, problem.param, problem.rule) == ("tool_output_not_adjacent", "input[2]", "P10")
    assert problem.message.startswith("No tool output found for tool call call_1: DeepSeek wants each output")
    assert "responses_output_order" in problem.message


def test_parallel_calls_answered_in_any_order_are_valid_p10() -> None:
    body = request([user(), reasoning(), call("a"), call("b"), call("c"), output("c"), output("a"),
                    output("b"), user("next")])
    assert summary(check(body)) == [] and warned(check(body)) == []


def test_an_output_before_its_call_is_refused_p10() -> None:
    body = request([user(), output("call_1"), reasoning(), call("call_1")])
    assert summary(check(body)) == [("tool_output_not_adjacent", "input[3]", "P10")]


def test_an_assistant_message_between_call_and_output_is_only_warned_p10() -> None:
    """DeepSeek merges a function_call into the adjacent assistant message: it may well accept this."""
    body = request([user(), reasoning(), call("call_1"), assistant("Running it."), output("call_1")])
    verdict = check(body)
    assert summary(verdict) == []
    assert warned(verdict) == [("tool_output_not_adjacent", "input[2]", "P10")]
    assert summary(check(body, strict=True)) == [("tool_output_not_adjacent", "input[2]", "P10")]


def test_unknown_items_between_call_and_output_are_ignored_like_deepseek_does_p10_p21() -> None:
    body = request([user(), reasoning(), call("call_1"), {"type": "agent_message", "text": "x"},
                    output("call_1")])
    verdict = check(body)
    assert summary(verdict) == [] and warned(verdict) == [("ignored_item", "input[3].type", "P21")]
    assert "sub-agent" in verdict.warnings[0].message


def test_custom_tool_pairs_are_checked_but_only_warned_p10() -> None:
    patch = {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "x"}
    verdict = check(request([user(), reasoning(), patch, user("wait")]))
    assert summary(verdict) == [] and warned(verdict) == [("tool_output_missing", "input[2]", "P10")]


# --- P11: reasoning in thinking mode ------------------------------------------------------------------------


def test_a_tool_turn_without_reasoning_is_refused_in_thinking_mode_p11() -> None:
    problem = only(check(request([user(), call("call_1"), output("call_1")])).problems)
    assert (problem.code, problem.param, problem.rule) == ("reasoning_text_missing", "input[1]", "P11")
    assert problem.message.startswith("The `reasoning_text` in the thinking mode must be passed back to the "
                                      "API")


@pytest.mark.parametrize(("item", "why"), [
    (reasoning(None), "has no reasoning_text content"),
    (reasoning(""), "has an empty reasoning_text"),
    (reasoning(None, summary=[{"type": "summary_text", "text": "**Running tests**"}]), "has only a summary"),
    (reasoning(None, encrypted_content="gAAAAABo-openai-blob"), "has no reasoning_text content"),
], ids=["no-content", "empty-text", "summary-only", "encrypted-only"])
def test_an_empty_or_summary_only_reasoning_item_is_refused_p11(item: dict[str, Any], why: str) -> None:
    problem = check(request([user(), item, call("call_1"), output("call_1")])).problems[0]
    assert (problem.code, problem.param) == ("reasoning_text_missing", "input[1].content")
    assert why in problem.message


def test_reasoning_is_not_needed_without_thinking_or_tools_p11() -> None:
    items = [user(), call("call_1"), output("call_1")]
    assert summary(check(request(items, reasoning={"effort": "none"}))) == []
    assert summary(check({"model": "deepseek-flash", "input": items})) == []


def test_a_plain_answer_without_reasoning_is_fine_and_after_tools_only_warned_p11() -> None:
    plain = request([user(), assistant(), user("more")])
    assert summary(check(plain)) == [] and warned(check(plain)) == []
    after_tools = request([user(), *turn("call_1"), assistant("Fixed."), user("more")])
    assert warned(check(after_tools)) == [("reasoning_text_missing", "input[4]", "P11")]


def test_a_chat_style_thinking_switch_makes_p11_a_warning() -> None:
    body = request([user(), call("call_1"), output("call_1")], thinking={"type": "disabled"})
    assert summary(check(body)) == []
    assert warned(check(body)) == [("reasoning_text_missing", "input[1]", "P11")]


def test_each_turn_needs_its_own_reasoning_p11() -> None:
    body = request([user(), *turn("call_1"), call("call_2"), output("call_2")])
    assert summary(check(body)) == [("reasoning_text_missing", "input[4]", "P11")]


# --- P12-P14: tools -----------------------------------------------------------------------------------------


def test_function_names_follow_the_pattern_and_are_unique_p12() -> None:
    tools = [SHELL, {**SHELL, "name": "mcp.server/tool"}, SHELL, {**SHELL, "name": "x" * 129},
             {**SHELL, "name": "x" * 128}]
    problems = summary(check({"model": "deepseek-flash", "input": "x", "tools": tools}))
    assert problems == [("invalid_function_name", f"tools[{k}].name", "P12") for k in (1, 2, 3)]


def test_a_custom_tool_other_than_apply_patch_is_refused_p13() -> None:
    tools = [{"type": "custom", "name": "grep"}, {"type": "custom", "name": "apply_patch"}]
    assert summary(check({"model": "deepseek-flash", "input": "x", "tools": tools})) == [
        ("unsupported_custom_tool", "tools[0].name", "P13")]


def test_tools_deepseek_ignores_are_warned_p13() -> None:
    tools = [{"type": "file_search", "vector_store_ids": []}, {"type": "web_search_2025_08_26"},
             {"type": "mcp", "server_label": "x"}]
    verdict = check({"model": "deepseek-flash", "input": "x", "tools": tools}, strict=True)
    assert summary(verdict) == []
    assert warned(verdict) == [("ignored_tool", "tools[0].type", "P13"),
                               ("ignored_tool", "tools[2].type", "P13")]


def test_forcing_web_search_needs_the_tool_p14() -> None:
    body = {"model": "deepseek-flash", "input": "x", "tool_choice": {"type": "web_search"}, "tools": [SHELL]}
    assert summary(check(body)) == [("web_search_not_enabled", "tool_choice.type", "P14")]
    assert summary(check({**body, "tools": [{"type": "web_search_2025_08_26"}]})) == []


def test_tool_choice_values_p14() -> None:
    base = {"model": "deepseek-flash", "input": "x", "tools": [SHELL], "reasoning": {"effort": "none"}}
    for choice in ("none", "auto", "required", {"type": "function", "name": "shell"}):
        assert summary(check({**base, "tool_choice": choice})) == [], choice
    assert summary(check({**base, "tool_choice": "any"})) == [("invalid_tool_choice", "tool_choice", "P14")]
    assert summary(check({**base, "tool_choice": {"type": "function"}})) == [
        ("invalid_tool_choice", "tool_choice.name", "P14")]
    other = check({**base, "tool_choice": {"type": "function", "name": "grep"}})
    assert warned(other) == [("invalid_tool_choice", "tool_choice.name", "P14")]
    thinking = check({**base, "reasoning": {"effort": "high"}, "tool_choice": "required"})
    assert summary(thinking) == [] and warned(thinking) == [("tool_choice_in_thinking", "tool_choice", "P14")]


# --- P15-P19: parameters ------------------------------------------------------------------------------------


def test_user_follows_the_documented_pattern_p15() -> None:
    assert summary(check({"model": "deepseek-flash", "input": "x", "user": "team-a_42"})) == []
    for unusual in ("ana@example.com", "用户 42", "用" * 170):  # recommended against only, since 2026-11
        verdict = check({"model": "deepseek-flash", "input": "x", "user": unusual})
        assert summary(verdict) == [] and warned(verdict) == [("invalid_user", "user", "P15")]
    for long in ("u" * 513, "用" * 171):
        assert summary(check({"model": "deepseek-flash", "input": "x", "user": long})) == [
            ("invalid_user", "user", "P15")]


def test_sampling_ranges_outside_thinking_mode_p16() -> None:
    off = {"model": "deepseek-flash", "input": "x", "reasoning": {"effort": "none"}}
    assert summary(check({**off, "temperature": 2.5, "top_p": 1.5, "top_logprobs": 21})) == [
        ("out_of_range", "temperature", "P16"), ("out_of_range", "top_p", "P16"),
        ("out_of_range", "top_logprobs", "P16")]
    thinking = {"model": "deepseek-flash", "input": "x", "temperature": 2.5}
    assert summary(check(thinking)) == [], "without effect in thinking mode"
    assert summary(check(thinking, strict=True)) == [("out_of_range", "temperature", "P16")]


def test_max_output_tokens_is_at_most_384k_p17() -> None:
    ok = {"model": "deepseek-flash", "input": "x", "max_output_tokens": 393_216}
    assert summary(check(ok)) == []
    assert summary(check({**ok, "max_output_tokens": 393_217})) == [
        ("max_output_tokens_out_of_range", "max_output_tokens", "P17")]
    assert summary(check({**ok, "max_output_tokens": 0})) == [
        ("max_output_tokens_out_of_range", "max_output_tokens", "P17")]


def test_text_format_and_effort_values_are_warned_p18_p19() -> None:
    body = {"model": "deepseek-flash", "input": "x", "text": {"format": {"type": "grammar"}},
            "reasoning": {"effort": "ultra"}}
    assert warned(check(body)) == [("unsupported_text_format", "text.format.type", "P18"),
                                   ("invalid_effort", "reasoning.effort", "P19")]
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh", "max"):
        assert warned(check({"model": "deepseek-flash", "input": "x", "reasoning": {"effort": effort}})) == []


# --- P21, P22: what DeepSeek ignores ------------------------------------------------------------------------


def test_item_types_deepseek_ignores_are_warned_once_per_type_p21() -> None:
    body = request([user(), {"type": "compaction_trigger"}, {"type": "local_shell_call", "call_id": "x"},
                    {"type": "compaction_trigger"}])
    verdict = check(body, strict=True)
    assert summary(verdict) == []
    assert warned(verdict) == [("ignored_item", "input[1].type", "P21"),
                               ("ignored_item", "input[2].type", "P21")]
    message = verdict.warnings[0].message
    assert "(and 1 more)" in message and "Codex compacts locally" in message


def test_openais_encrypted_reasoning_is_warned_and_deepseeks_own_is_not_p22() -> None:
    own = request([user(), reasoning(encrypted_content="d8b79690-7c51-4f2e-9a1b-2f0c8d1e5a77-0"),
                   call("call_1"), output("call_1")])
    assert warned(check(own)) == []
    foreign = request([user(), reasoning(encrypted_content="gAAAAABoZ2J..."), call("call_1"),
                       output("call_1")])
    assert summary(check(foreign)) == []
    assert warned(check(foreign)) == [("foreign_encrypted_content", "input[1].encrypted_content", "P22")]


def test_problems_come_in_input_order_with_the_model_first() -> None:
    body = request([user(), call("b"), user(), output("zz")], model="deepseek-v5", user="a" * 600)
    verdict = check(body, unknown_models="reject")
    params = [p.param for p in verdict.problems]
    assert params[0] == "model" and params[-1] == "user"
    assert params[1:-1] == ["input[1]", "input[3].call_id"]


def test_every_tool_list_codex_sends_is_valid() -> None:
    assert summary(check({"model": "deepseek-flash", "input": "x", "tools": TOOLS})) == []


def test_the_retired_chat_names_are_unknown_here_p2() -> None:
    """deepseek-chat and deepseek-reasoner were retired a week before DeepSeek served /responses."""
    for model in ("deepseek-chat", "deepseek-reasoner"):
        assert warned(check({"model": model, "input": "hi"})) == [("model_not_found", "model", "P2")]
    assert warned(check({"model": "deepseek-v4-flash", "input": "hi"})) == [], "legacy flash is still served"


# --- the November 2026 surface (docs/rules-responses.md#the-november-2026-surface) -----------------------


def test_server_web_tools_are_valid_p13() -> None:
    tools = [{"type": "deepseek_web_search"}, {"type": "deepseek_read_url"}, *TOOLS]
    verdict = check({"model": "deepseek-flash", "input": "x", "tools": tools})
    assert summary(verdict) == [] and warned(verdict) == []
    other = check({"model": "deepseek-v4-pro", "input": "x", "tools": tools[:1]})
    assert summary(other) == [] and warned(other) == [("server_tool_model", "tools[0].type", "P13")]
    assert "ignores" not in other.warnings[0].message


def test_unknown_tool_types_are_forwarded_and_documented_ignored_ones_say_so_p13() -> None:
    verdict = check({"model": "deepseek-flash", "input": "x",
                     "tools": [{"type": "tool_search"}, {"type": "file_search"}]})
    assert summary(verdict) == []
    assert warned(verdict) == [("unknown_tool_type", "tools[0].type", "P13"),
                               ("ignored_tool", "tools[1].type", "P13")]
    assert "forwarded" in verdict.warnings[0].message and "ignored" in verdict.warnings[1].message


def test_deepseeks_own_output_items_passed_back_are_not_warned_p21() -> None:
    item = {"type": "deepseek_web_search_call", "id": "ws_1", "status": "completed", "results": []}
    verdict = check(request([user(), item, {"role": "assistant", "content": "Found it."}, user()]))
    assert summary(verdict) == [] and warned(verdict) == []


@pytest.mark.parametrize("level", ["high", "low"])
def test_safety_check_levels_p23(level: str) -> None:
    verdict = check({"model": "deepseek-flash", "input": "x", "safety_check": {"level": level},
                     "title": {"enabled": True}})
    assert summary(verdict) == [] and warned(verdict) == []


def test_another_safety_check_level_is_refused_p23() -> None:
    body = {"model": "deepseek-flash", "input": "x", "safety_check": {"level": "Low"}}
    problem = only(check(body).problems)
    assert (problem.code, problem.param, problem.rule) == (
        "invalid_safety_check", "safety_check.level", "P23")
    assert "unknown variant `Low`, expected `high` or `low`" in problem.message


def test_a_type_error_does_not_hide_the_other_problems() -> None:
    """Issue 50 item 8: a top-level field's type error is listed with what the rules find in the rest."""
    verdict = check({"model": "gpt-4o", "input": "hi", "temperature": "hot"})
    assert [(p.code, p.param) for p in verdict.problems] == [("invalid_type", "temperature"),
                                                              ("model_not_found", "model")]

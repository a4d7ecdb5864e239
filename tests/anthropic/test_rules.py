"""The Anthropic route's rules (docs/rules-anthropic.md): certain ones refuse with DeepSeek's words,
uncertain ones warn by default and refuse in strict mode; Claude Code's own shapes pass."""

from __future__ import annotations

from typing import Any

import pytest

from tests.anthropic.messages import (
    TOOLS,
    assistant,
    check,
    loop,
    request,
    summary,
    text,
    thinking,
    tool_result,
    tool_use,
    user,
    warned,
)


def test_a_claude_code_request_is_valid() -> None:
    """System blocks with cache_control, dozens of tools, metadata.user_id that is JSON, adaptive thinking,
    context_management, an effort: everything Claude Code sends that DeepSeek accepts (A23)."""
    tools = [*TOOLS, *({"name": f"mcp__srv__tool_{n}", "input_schema": {"type": "object"},
                        "cache_control": {"type": "ephemeral"}} for n in range(40)),
             {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
    req = request(loop(3), tools=tools, stream=True,
                  system=[{"type": "text", "text": "You are Claude Code.",
                           "cache_control": {"type": "ephemeral"}}],
                  thinking={"type": "adaptive"}, output_config={"effort": "max"},
                  context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                  metadata={"user_id": "user_abc_account_def_session_123"}, service_tier="auto",
                  top_k=5, container=None)
    verdict = check(req)
    assert summary(verdict) == [] and warned(verdict) == []
    assert (verdict.model, verdict.stream, verdict.thinking, verdict.tools) == ("claude-sonnet-4-5", True,
                                                                                 True, True)
    assert verdict.profile is not None and verdict.profile.name == "deepseek-flash"


@pytest.mark.parametrize("kind", ["enabled", "disabled", "adaptive"])
def test_thinking_types_are_valid_and_budget_tokens_ignored_a11(kind: str) -> None:
    assert summary(check(request([user()], thinking={"type": kind, "budget_tokens": 10_000}))) == []


def test_unknown_thinking_type_is_refused_with_deserializer_words_a11() -> None:
    (problem,) = check(request([user()], thinking={"type": "auto"})).problems
    assert (problem.code, problem.param, problem.rule) == ("invalid_thinking", "thinking.type", "A11")
    assert "unknown variant `auto`, expected one of `adaptive`, `enabled`, `disabled`" in problem.message


def test_max_tokens_is_required_and_bounded_a2() -> None:
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "messages": [user()]}
    assert summary(check(body)) == [("missing_required_parameter", "max_tokens", "A2")]
    assert summary(check(request([user()], max_tokens=393_217))) == [
        ("max_tokens_out_of_range", "max_tokens", "A2")]
    assert summary(check(request([user()], max_tokens=393_216))) == []


def test_system_role_inside_messages_is_refused_a3() -> None:
    (problem,) = check(request([user(), {"role": "system", "content": "Be brief."}, user("go")])).problems
    assert (problem.code, problem.param, problem.rule) == ("invalid_role", "messages[1].role", "A3")
    assert "unknown variant `system`, expected `user` or `assistant`" in problem.message
    assert "top-level 'system'" in problem.message


def test_empty_assistant_content_is_refused_with_deepseeks_words_a6() -> None:
    (problem,) = check(request([user(), assistant(), user("again")])).problems
    assert (problem.code, problem.param, problem.rule) == ("empty_content", "messages[1].content", "A6")
    assert problem.message.startswith("messages.1: all messages must have non-empty content")


def test_tool_use_without_results_in_the_next_message_a7() -> None:
    msgs = [user(), assistant(thinking(), tool_use("toolu_a"), tool_use("toolu_b")),
            user(tool_result("toolu_a")), user(tool_result("toolu_b"))]
    (problem,) = check(request(msgs, tools=TOOLS)).problems
    assert (problem.code, problem.param, problem.rule) == ("tool_use_unanswered", "messages[1].content", "A7")
    assert problem.message.startswith("messages.1:`tool_use` ids were found without `tool_result` blocks "
                                      "immediately after: toolu_b.")
    assert "split_tool_results" in problem.message


def test_a_trailing_tool_use_is_fine_and_server_tools_need_no_result_a7() -> None:
    server = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    msgs = [user(), assistant(thinking(), server, result, text("Found it.")), user("thanks"),
            assistant(thinking(), tool_use("toolu_z"))]
    assert summary(check(request(msgs, tools=TOOLS))) == []


def test_a_result_for_no_call_warns_and_is_refused_in_strict_mode_a8() -> None:
    msgs = [user(), assistant(thinking(), tool_use("toolu_1")),
            user(tool_result("toolu_1"), tool_result("x"))]
    verdict = check(request(msgs, tools=TOOLS))
    assert summary(verdict) == [] and warned(verdict) == [
        ("unknown_tool_use_id", "messages[2].content[1].tool_use_id", "A8")]
    assert summary(check(request(msgs, tools=TOOLS), strict=True)) == warned(verdict)


def test_a_thinking_block_without_its_text_is_refused_a9() -> None:
    msgs = [user(), assistant({"type": "thinking", "signature": "s"}, tool_use()), user(tool_result())]
    (problem,) = check(request(msgs, tools=TOOLS)).problems
    assert (problem.code, problem.param, problem.rule) == (
        "invalid_thinking_block", "messages[1].content[0].thinking", "A9")
    assert "missing field `thinking`" in problem.message


def test_tool_use_turns_need_their_thinking_block_in_thinking_mode_a10() -> None:
    msgs = loop(2, keep_thinking=False)
    verdict = check(request(msgs, tools=TOOLS))
    assert summary(verdict) == [("thinking_block_missing", "messages[1].content", "A10"),
                                ("thinking_block_missing", "messages[3].content", "A10")]
    assert verdict.problems[0].message.startswith(
        "The `content[].thinking` in the thinking mode must be passed back to the API.")
    assert summary(check(request(msgs, tools=TOOLS, thinking={"type": "disabled"}))) == []
    empty = [user(), assistant(thinking("", signature=None), tool_use()), user(tool_result())]
    assert summary(check(request(empty, tools=TOOLS))) == [], "an empty thinking block is accepted (A10)"


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_turn_with_only_server_tool_use_needs_no_thinking_block_a10(strict: bool) -> None:
    """A10 is about client `tool_use`: web_search runs at DeepSeek, and its turn is not refused without a
    thinking block; a turn that also calls a client tool still is."""
    search = [{"type": "web_search_20250305", "name": "web_search"}]
    server = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    msgs = [user(), assistant(server, result, text("Found it.")), user("thanks")]
    verdict = check(request(msgs, tools=search, thinking={"type": "enabled"}), strict=strict)
    assert summary(verdict) == [] and warned(verdict) == []
    mixed = [user(), assistant(server, result, tool_use()), user(tool_result())]
    assert summary(check(request(mixed, tools=[*TOOLS, *search]), strict=strict)) == [
        ("thinking_block_missing", "messages[1].content", "A10")]


def test_thinking_disabled_with_an_effort_warns_and_strict_refuses_a12() -> None:
    req = request([user()], thinking={"type": "disabled"}, output_config={"effort": "max"})
    assert warned(check(req)) == [("thinking_disabled_with_effort", "output_config.effort", "A12")]
    assert summary(check(req, strict=True)) == [
        ("thinking_disabled_with_effort", "output_config.effort", "A12")]
    assert warned(check(request([user()], thinking={"type": "disabled"}, reasoning_effort="high"))) == []


def test_forced_tool_choice_in_thinking_mode_a13() -> None:
    forced = request([user()], tools=TOOLS, tool_choice={"type": "tool", "name": "Read"})
    (problem,) = check(forced).problems
    assert (problem.code, problem.rule) == ("tool_choice_in_thinking", "A13")
    assert "Thinking mode does not support this tool_choice" in problem.message
    assert summary(check({**forced, "thinking": {"type": "disabled"}})) == []
    anything = request([user()], tools=TOOLS, tool_choice={"type": "any"})
    assert summary(check(anything)) == [] and warned(check(anything)) == [
        ("tool_choice_in_thinking", "tool_choice", "A13")]
    assert summary(check(request([user()], tools=TOOLS, tool_choice={"type": "auto"}))) == []


def test_a_json_user_id_warns_a15() -> None:
    req = request([user()], metadata={"user_id": '{"device_id":"ea10","session_id":"db60"}'})
    assert summary(check(req)) == []
    assert warned(check(req)) == [("invalid_user_id", "metadata.user_id", "A15")]


def test_images_need_a_vision_model_a16() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    assert summary(check(request([user(text("what is it?"), image)]))) == []
    assert summary(check(request([user(image)], model="claude-opus-4-1"))) == [
        ("image_not_supported", "messages[0].content[0]", "A16")]
    bmp = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "Qk0="}}
    assert summary(check(request([user(bmp)]))) == [
        ("invalid_image", "messages[0].content[0].source.media_type", "A16")]


@pytest.mark.parametrize(("block", "rule"), [({"type": "document", "source": {}}, "A5"),
                                             ({"type": "redacted_thinking", "data": "xx"}, "A5"),
                                             ({"type": "tool_reference", "name": "x"}, "A4")])
def test_unsupported_blocks_warn_and_strict_refuses_a4_a5(block: dict[str, Any], rule: str) -> None:
    req = request([user(text(), block)])
    assert summary(check(req)) == [] and warned(check(req)) == [
        ("unsupported_block", "messages[0].content[1].type", rule)]
    assert summary(check(req, strict=True)) == [("unsupported_block", "messages[0].content[1].type", rule)]


def test_server_tools_other_than_web_search_warn_a17() -> None:
    tools = [*TOOLS, {"type": "web_fetch_20250910", "name": "web_fetch"}]
    assert warned(check(request([user()], tools=tools))) == [
        ("unsupported_server_tool", "tools[2].type", "A17")]


def test_model_names_a18_a19() -> None:
    assert warned(check(request([user()], model="deepseek-v4-pro[1m]"))) == [("model_suffix", "model", "A19")]
    refused = check(request([user()], model="gpt-4o"))
    assert summary(refused) == [("model_not_found", "model", "A18")]
    assert "did you mean 'deepseek-flash'" in refused.problems[0].message
    assert warned(check(request([user()], model="gpt-4o"), unknown_models="warn")) == [
        ("model_not_found", "model", "A18")]
    for name in ("claude-sonnet-5-0", "claude-something-new", "deepseek-v4-flash"):  # DeepSeek maps claude*
        assert summary(check(request([user()], model=name))) == []
    for name in ("claude-opus-4-1", "claude-haiku-4-5", "deepseek-flash", "deepseek-v4-pro"):
        verdict = check(request([user()], model=name))
        assert summary(verdict) == [] == warned(verdict)
    opus = check(request([user()], model="claude-opus-4-1")).profile
    assert opus is not None and opus.name == "deepseek-v4-pro"


def test_sampling_ranges_outside_thinking_mode_a20() -> None:
    off = {"thinking": {"type": "disabled"}}
    assert summary(check(request([user()], temperature=2.5, **off))) == [
        ("out_of_range", "temperature", "A20")]
    assert summary(check(request([user()], top_p=1.5, **off))) == [("out_of_range", "top_p", "A20")]
    assert summary(check(request([user()], temperature=2.5))) == [], "ignored in thinking mode"


@pytest.mark.parametrize("body", [b"[1]", b'{"model": 3}', b"not json", b'{"model": "m", "messages": "hi",'
                                  b' "max_tokens": 1}'])
def test_malformed_bodies_are_problems_never_exceptions_a1(body: bytes) -> None:
    assert check(body).problems


# --- the November 2026 surface (docs/rules-anthropic.md#the-november-2026-surface) -----------------------

WEB_TOOLS = [{"type": "deepseek_web_search", "name": "deepseek_web_search"},
             {"type": "deepseek_read_url", "name": "deepseek_read_url"}]


def _reminder() -> dict[str, Any]:
    return {"role": "latest_reminder", "content": "2026-11-11,Wednesday,Singapore,Web,English"}


def test_server_web_tools_are_valid_without_a_warning_on_flash_a17() -> None:
    for model in ("deepseek-flash", "claude-sonnet-4-5"):
        verdict = check(request([user()], model=model, tools=[*WEB_TOOLS, *TOOLS]))
        assert summary(verdict) == [] and warned(verdict) == []


def test_server_web_tools_on_another_model_are_forwarded_with_a_warning_a17() -> None:
    verdict = check(request([user()], model="deepseek-v4-pro", tools=WEB_TOOLS))
    assert summary(verdict) == []
    assert warned(verdict) == [("server_tool_model", "tools[0].type", "A17"),
                               ("server_tool_model", "tools[1].type", "A17")]
    assert "deepseek-flash only" in verdict.warnings[0].message
    assert "fail" not in verdict.warnings[0].message


@pytest.mark.parametrize("kind", ["advisor_20260301", "tool_search_tool_regex_20251119", "namespace"])
def test_unknown_tool_types_are_forwarded_with_a_warning_a17(kind: str) -> None:
    verdict = check(request([user()], tools=[*TOOLS, {"type": kind, "name": "x"}]))
    assert summary(verdict) == [] and warned(verdict) == [("unsupported_server_tool", "tools[2].type", "A17")]
    assert "forwarded" in verdict.warnings[0].message and "fail" not in verdict.warnings[0].message


def test_latest_reminder_before_its_user_message_is_valid_a3() -> None:
    messages = [_reminder(), user("Weather?"), assistant(thinking(), tool_use("toolu_1")), _reminder(),
                user(tool_result("toolu_1")), assistant(text("Sunny.")), _reminder(), user("Thanks")]
    verdict = check(request(messages, tools=TOOLS))
    assert summary(verdict) == [] and warned(verdict) == []


def test_latest_reminder_elsewhere_is_forwarded_with_a_warning_a3() -> None:
    verdict = check(request([user(), _reminder(), assistant(text("Hi"))]))
    assert summary(verdict) == []
    assert warned(verdict) == [("latest_reminder_placement", "messages[1].role", "A3")]


def test_a_reminder_does_not_hide_an_unanswered_tool_use_a7() -> None:
    messages = [user(), assistant(thinking(), tool_use("toolu_1")), _reminder(), user("no result")]
    assert [p[0] for p in summary(check(request(messages, tools=TOOLS)))] == ["tool_use_unanswered"]


def test_an_unknown_role_is_forwarded_with_a_warning_but_system_and_tool_are_refused_a3() -> None:
    verdict = check(request([user(), {"role": "critic", "content": "x"}, user("again")]))
    assert summary(verdict) == [] and warned(verdict) == [("unknown_role", "messages[1].role", "A3")]
    assert summary(check(request([user(), {"role": "tool", "content": "x"}]))) == [
        ("invalid_role", "messages[1].role", "A3")]


@pytest.mark.parametrize("level", ["high", "low"])
def test_safety_check_levels_are_valid_a24(level: str) -> None:
    verdict = check(request([user()], safety_check={"level": level}, title={"enabled": True}))
    assert summary(verdict) == [] and warned(verdict) == []


def test_another_safety_check_level_is_refused_a24() -> None:
    (problem,) = check(request([user()], safety_check={"level": "strict"})).problems
    assert (problem.code, problem.param, problem.rule) == (
        "invalid_safety_check", "safety_check.level", "A24")
    assert "unknown variant `strict`, expected `high` or `low`" in problem.message


def test_user_id_over_512_utf8_bytes_is_refused_and_other_characters_warned_a15() -> None:
    assert summary(check(request([user()], metadata={"user_id": "用" * 171}))) == [
        ("invalid_user_id", "metadata.user_id", "A15")]
    for unusual in ("用户 42", "alice@example.com", "用" * 170):
        verdict = check(request([user()], metadata={"user_id": unusual}))
        assert summary(verdict) == [] and warned(verdict) == [("invalid_user_id", "metadata.user_id", "A15")]


def test_a_client_tool_needs_its_name_and_a_new_type_may_have_none_a17() -> None:
    assert summary(check(request([user()], tools=[{"input_schema": {"type": "object"}}]))) == [
        ("missing_required_parameter", "tools[0].name", "A17")]
    verdict = check(request([user()], tools=[{"type": "memory_20270101"}]))
    assert summary(verdict) == [] and warned(verdict) == [("unsupported_server_tool", "tools[0].type", "A17")]


def test_a_type_error_does_not_hide_the_other_problems() -> None:
    """Issue 50 item 8: a top-level field's type error is listed with what the rules find in the rest."""
    verdict = check(request([user()], model="gpt-4o", temperature="hot"))
    assert [(p.code, p.param) for p in verdict.problems] == [("invalid_type", "temperature"),
                                                              ("model_not_found", "model")]

"""Bodies that fail before any sequence rule: invalid JSON and wrong types (R1, R2, R4-R7, R11, R13, and
top-level parameters), each reported with its exact `param` path, like DeepSeek's deserializer would refuse.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.openai.conversations import (
    TOOLS,
    assert_valid,
    assistant,
    call,
    calls,
    check,
    image_part,
    only_problem,
    only_warning,
    request,
    says,
    summary,
    system,
    text_part,
    tool,
    user,
    weather_round,
)


def raw(messages_json: str, extra: str = "") -> bytes:
    return ('{"model": "deepseek-flash", "messages": [' + messages_json + "]" + extra + "}").encode()


# --- R1 the body itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}',  # truncated
    b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"},]}',  # trailing comma
    b"{'model': 'deepseek-flash'}",
    b"",
    b"model=deepseek-flash&messages=hi",
], ids=["truncated", "trailing-comma", "single-quotes", "empty", "form-encoded"])
def test_invalid_json_is_reported_r1(body: bytes) -> None:
    checked = check(body)
    problem = only_problem(checked, "invalid_json", None, "R1")
    says(problem, "Request body is not valid JSON", "line 1 column")
    assert checked.request is None


@pytest.mark.parametrize("escape", [r"\ud800", r"\udc00", r"\ud83d x", r"\ud800\u0041"],
                         ids=["lone-high", "lone-low", "high-then-text", "high-then-letter"])
def test_lone_surrogate_escape_is_invalid_json_like_deepseek_r1(escape: str) -> None:
    """docs/rules-chat.md, R1: DeepSeek answers 'Failed to parse the request body as JSON: … unexpected end of
    hex escape'."""
    checked = check(raw('{"role": "user", "content": "pasted text ' + escape + ' end"}'))
    problem = only_problem(checked, "invalid_json", None, "R1")
    says(problem, "surrogate" if "dc00" in escape or "u0041" in escape else "hex escape")


def test_surrogate_pairs_and_raw_emoji_are_valid() -> None:
    body = raw('{"role": "user", "content": "escaped \\ud83d\\ude00 raw \xf0\x9f\x98\x80 '
               'accents \\u00e9 caf\xc3\xa9 cjk \xe4\xbd\xa0\xe5\xa5\xbd"}'.encode("latin-1").decode("utf-8"))
    checked = check(body)
    assert_valid(checked)
    assert checked.request is not None
    assert checked.request.messages[0]["content"] == "escaped 😀 raw 😀 accents é café cjk 你好"


def test_invalid_utf8_is_invalid_json_r1() -> None:
    only_problem(check(raw('{"role": "user", "content": "') + b'\xff\xfe"}]}'), "invalid_json", None, "R1")


@pytest.mark.parametrize(("body", "got"), [
    (b"[]", "array"), (b'[{"model": "deepseek-flash"}]', "array"), (b'"hello"', "string"), (b"42", "number"),
    (b"null", "null"), (b"true", "boolean"),
], ids=["empty-array", "array-of-request", "string", "number", "null", "bool"])
def test_non_object_body_is_reported_r1(body: bytes, got: str) -> None:
    problem = only_problem(check(body), "invalid_json", None, "R1")
    says(problem, f"must be a JSON object, got {got}")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_refused(number: str) -> None:
    """DeepSeek's JSON parser refuses NaN/Infinity and overflowing numbers; pydantic's would accept them."""
    body = raw('{"role": "user", "content": "hi"}', f', "temperature": {number}')
    problem = only_problem(check(body), "invalid_type", "temperature", "R25")
    says(problem, "finite number")


# --- R2 model, R4 messages ----------------------------------------------------------------------------


def test_missing_model_r2() -> None:
    problem = only_problem(check({"messages": [user()]}), "missing_required_parameter", "model", "R2")
    says(problem, "Missing required parameter: 'model'.")


@pytest.mark.parametrize("model", [None, 5, ["deepseek-flash"]])
def test_model_not_a_string_r2(model: Any) -> None:
    only_problem(check({"model": model, "messages": [user()]}), "invalid_type", "model", "R2")


def test_missing_messages_r4() -> None:
    only_problem(check({"model": "deepseek-flash", "prompt": "hi"}),
                 "missing_required_parameter", "messages", "R4")


def test_empty_messages_r4() -> None:
    problem = only_problem(check(request([])), "empty_array", "messages", "R4")
    says(problem, "empty array", "at least one message")


@pytest.mark.parametrize("messages", [{"role": "user", "content": "hi"}, "hi", None])
def test_messages_not_an_array_r4(messages: Any) -> None:
    only_problem(check({"model": "deepseek-flash", "messages": messages}), "invalid_type", "messages", "R4")


def test_message_that_is_not_an_object_r4() -> None:
    problem = only_problem(check(request([user(), assistant(), "and also this", user("?")])),
                           "invalid_type", "messages[2]", "R4")
    says(problem, "messages[2] must be an object", "got string")


# --- R5 roles -------------------------------------------------------------------------------------------


def test_developer_role_r5() -> None:
    problem = only_problem(check(request([{"role": "developer", "content": "Be brief."}, user()])),
                           "invalid_role", "messages[0].role", "R5")
    says(problem, "messages[0].role 'developer' is not supported by DeepSeek", "use 'system'")


@pytest.mark.parametrize("role", ["function", "model", "System"])
def test_other_unknown_roles_are_forwarded_with_a_warning_r5(role: str) -> None:
    """Unknown is not invalid: only `developer` was seen refused (docs/rules-chat.md, R5)."""
    body = request([user(), {"role": role, "content": "x", "extra": [1]}, user("again")])
    warning = only_warning(check(body), "unknown_role", "messages[1].role", "R5")
    says(warning, f"'{role}'", "forwarded")
    only_problem(check(body, strict=True), "unknown_role", "messages[1].role", "R5")


def test_a_role_that_is_not_a_string_r5() -> None:
    problem = only_problem(check(request([user(), {"role": 3, "content": "x"}])),
                           "invalid_type", "messages[1].role", "R5")
    says(problem, "a string")


def test_developer_after_an_unknown_role_in_a_large_body_is_still_refused_r5() -> None:
    """A body over 256 KB is type-checked failing fast: its first error is the unknown role, and the lenient
    pass that follows meets the developer message."""
    filler = [user("x" * 1000), assistant("y" * 1000)] * 150
    messages = [user(), {"role": "critic", "content": "y"}, *filler, {"role": "developer", "content": "x"},
                user()]
    checked = check(request(messages))
    assert checked.request is not None, "read by the lenient pass"
    assert summary(checked) == [("invalid_role", f"messages[{len(messages) - 2}].role")]
    assert [w.code for w in checked.warnings] == ["unknown_role"]


def test_developer_beside_an_unknown_role_is_still_refused_r5() -> None:
    messages = [{"role": "developer", "content": "x"}, {"role": "critic", "content": "y"}, user()]
    checked = check(request(messages))
    assert ("invalid_role", "messages[0].role") in summary(checked)


def test_missing_role_r5() -> None:
    only_problem(check(request([user(), {"content": "x"}])),
                 "missing_required_parameter", "messages[1].role", "R5")


# --- R6 content types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("message", "fix"), [
    (system([text_part("Be brief.")]), "Join text parts into one string"),
    (assistant([text_part("Hello")]), "Join text parts into one string"),
    (assistant(42), "or null beside tool_calls"),
    (system(None), "Send the text as a JSON string"),
    (user(None), "Send the text as a JSON string"),
    (user({"text": "hi"}), "Send the text as a JSON string"),
], ids=["system-array", "assistant-array", "assistant-number", "system-null", "user-null", "user-object"])
def test_content_of_wrong_type_r6(message: dict[str, Any], fix: str) -> None:
    is_system = message["role"] == "system"
    messages = [message, user()] if is_system else [user("Hi"), assistant("Hello."), message]
    index = 0 if is_system else 2
    problem = only_problem(check(request(messages)), "content_not_string", f"messages[{index}].content", "R6")
    says(problem, f"messages[{index}] (role {message['role']})", fix)


def test_missing_user_content_r6() -> None:
    only_problem(check(request([{"role": "user", "name": "alice"}])),
                 "missing_required_parameter", "messages[0].content", "R6")


def test_tool_content_number_r6() -> None:
    only_problem(check(request([user(), calls(call("call_1")), tool("call_1", 18)], tools=TOOLS)),
                 "content_not_string", "messages[2].content", "R6")


# --- R7 content parts ----------------------------------------------------------------------------------


def test_unknown_content_part_type_is_forwarded_with_a_warning_r7() -> None:
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    body = request([{"role": "user", "content": [text_part(), part]}])
    warning = only_warning(check(body), "unknown_content_part", "messages[0].content[1].type", "R7")
    says(warning, "messages[0] (role user)", "'input_audio'", "forwarded")
    only_problem(check(body, strict=True), "unknown_content_part", "messages[0].content[1].type", "R7")


def test_an_unknown_part_beside_a_wrong_known_one_reports_the_known_one_r7() -> None:
    parts = [{"type": "web_result", "url": "https://example.com"}, {"type": "text", "text": 5}]
    only_problem(check(request([{"role": "user", "content": parts}])), "invalid_content_part",
                 "messages[0].content[1].text", "R7")


def test_content_part_without_type_r7() -> None:
    problem = only_problem(check(request([{"role": "user", "content": [{"text": "hi"}]}])),
                           "invalid_content_part", "messages[0].content[0].type", "R7")
    says(problem, "has no 'type'", "{type: text, text}")


def test_text_part_with_non_string_text_r7() -> None:
    bad = {"role": "user", "content": [{"type": "text", "text": 5}]}
    only_problem(check(request([user(), assistant(), bad])),
                 "invalid_content_part", "messages[2].content[0].text", "R7")


def test_image_part_without_url_r7() -> None:
    part = {"type": "image_url", "image_url": {"detail": "low"}}
    problem = only_problem(check(request([{"role": "user", "content": [text_part(), part]}])),
                           "invalid_content_part", "messages[0].content[1].image_url.url", "R7")
    says(problem, "messages[0] (role user)", "image_url: {url}")


def test_image_url_as_plain_string_r7() -> None:
    """Some clients send {"type": "image_url", "image_url": "https://..."} (the old shape)."""
    part = {"type": "image_url", "image_url": "https://example.com/cat.png"}
    only_problem(check(request([{"role": "user", "content": [part]}])),
                 "invalid_content_part", "messages[0].content[0].image_url", "R7")


def test_valid_parts_neighbour_r7() -> None:
    assert_valid(check(request([{"role": "user", "content": [text_part(), image_part(detail="auto")]}])))


# --- R11 tool_calls shape ---------------------------------------------------------------------------------


def _history_with_call(bad_call: dict[str, Any]) -> list[dict[str, Any]]:
    """The bad call is messages[3].tool_calls[0]; a good parallel call sits beside it."""
    return [user("What's the weather?"), assistant("Which city?"), user("Paris, in celsius."),
            calls(bad_call, call("call_2")), tool(str(bad_call.get("id", "call_1"))), tool("call_2"),
            assistant()]


def test_arguments_as_object_is_invalid_r11() -> None:
    """The most common agent bug: arguments sent back as a parsed object instead of a JSON string."""
    bad = call("call_1", arguments={"city": "Paris", "unit": "c"})
    messages = _history_with_call(bad)
    assert messages[3]["tool_calls"][0] is bad
    problem = only_problem(check(request(messages, tools=TOOLS)),
                           "invalid_tool_call", "messages[3].tool_calls[0].function.arguments", "R11")
    says(problem, "messages[3] (role assistant)", "must be a JSON string, got object", "json.dumps")


@pytest.mark.parametrize(("bad", "param", "words"), [
    ({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": None}},
     "messages[3].tool_calls[0].function.arguments", "got null"),
    ({"id": "call_1", "type": "function", "function": {"name": "get_weather"}},
     "messages[3].tool_calls[0].function.arguments", "Missing required parameter"),
    ({"id": "call_1", "type": "function", "function": {"arguments": "{}"}},
     "messages[3].tool_calls[0].function.name", "Missing required parameter"),
    ({"type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
     "messages[3].tool_calls[0].id", "Missing required parameter"),
    ({"id": 17, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
     "messages[3].tool_calls[0].id", "expected a string"),
    ({"id": "call_1", "type": "function", "function": "get_weather({})"},
     "messages[3].tool_calls[0].function", "expected an object"),
], ids=["arguments-null", "arguments-missing", "name-missing", "id-missing", "id-number", "function-string"])
def test_tool_call_shape_errors_r11(bad: dict[str, Any], param: str, words: str) -> None:
    checked = check(request(_history_with_call(bad), tools=TOOLS))
    problem = only_problem(checked, "invalid_tool_call", param, "R11")
    says(problem, "messages[3] (role assistant)", words)


def test_a_tool_call_of_an_unknown_type_is_forwarded_with_a_warning_r11() -> None:
    bad = {"id": "call_1", "type": "tool_use", "function": {"name": "get_weather", "arguments": "{}"}}
    warning = only_warning(check(request(_history_with_call(bad), tools=TOOLS)), "unknown_tool_call_type",
                           "messages[3].tool_calls[0].type", "R11")
    says(warning, "messages[3] (role assistant)", "'tool_use'")


def test_tool_calls_not_an_array_r11() -> None:
    messages = [user(), {"role": "assistant", "content": None, "tool_calls": call("call_1")}, tool("call_1")]
    only_problem(check(request(messages, tools=TOOLS)), "invalid_tool_call", "messages[1].tool_calls", "R11")


def test_tool_call_without_type_is_accepted() -> None:
    """`type` defaults to function in practice; not a reason to refuse."""
    bare = {"id": "call_1", "function": {"name": "get_weather", "arguments": "{}"}}
    assert_valid(check(request([user(), calls(bare), tool("call_1")], tools=TOOLS)))


# --- R13 tool messages ------------------------------------------------------------------------------------


def test_tool_message_without_tool_call_id_r13() -> None:
    result = {"role": "tool", "content": "18 °C"}
    problem = only_problem(check(request([user(), calls(call("call_1")), result], tools=TOOLS)),
                           "missing_tool_call_id", "messages[2].tool_call_id", "R13")
    says(problem, "Missing required parameter: 'messages[2].tool_call_id'", "role tool")


def test_tool_call_id_not_a_string_r13() -> None:
    result = {"role": "tool", "tool_call_id": 1, "content": "18 °C"}
    only_problem(check(request([user(), calls(call("1")), result])),
                 "invalid_type", "messages[2].tool_call_id", "R13")


# --- top-level parameter types ------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "param", "rule"), [
    ({"temperature": "1.3"}, "temperature", "R25"),
    ({"top_p": [1]}, "top_p", "R25"),
    ({"max_tokens": 1024.5}, "max_tokens", "R27"),
    ({"max_tokens": "1024"}, "max_tokens", "R27"),
    ({"stream": "true"}, "stream", "R29"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "R29"),
    ({"stop": 5}, "stop", "R28"),
    ({"stop": ["END", 5]}, "stop[1]", "R28"),
    ({"tools": {"get_weather": {}}}, "tools", "R30"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
     "tools[0].function.name", "R30"),
    ({"tool_choice": 1}, "tool_choice", "R33"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.function", "R33"),
    ({"thinking": "enabled"}, "thinking", "R36"),
    ({"thinking": True}, "thinking", "R36"),
    ({"reasoning_effort": 3}, "reasoning_effort", "R36"),
    ({"response_format": "json_object"}, "response_format", "R23"),
    ({"logprobs": 1}, "logprobs", "R35"),
    ({"user_id": 12345}, "user_id", "R37"),
    ({"n": "1"}, "n", "R38"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v))
def test_top_level_wrong_types(params: dict[str, Any], param: str, rule: str) -> None:
    checked = check(request([user()], **params))
    problem = checked.problems[0]
    assert (problem.param, problem.rule) == (param, rule), checked.problems
    assert len(checked.problems) == 1, checked.problems
    assert problem.code in ("invalid_type", "missing_required_parameter")
    says(problem, param)


def test_stop_union_error_names_the_wrong_item_only() -> None:
    problem = only_problem(check(request([user()], stop=["END", 5])), "invalid_type", "stop[1]", "R28")
    says(problem, "expected a string, but got number")


def test_stop_of_wrong_type_names_both_accepted_forms() -> None:
    problem = only_problem(check(request([user()], stop=5)), "invalid_type", "stop", "R28")
    says(problem, "expected a string or an array of them")


# --- deep type errors and several at once ------------------------------------------------------------


def test_type_error_deep_in_a_long_history_has_exact_param() -> None:
    messages = [system()]
    for n in range(6):
        messages += weather_round(f"call_{n}")
    messages[22]["tool_calls"][0]["function"]["name"] = ["get_weather"]
    assert messages[22]["role"] == "assistant"
    only_problem(check(request(messages, tools=TOOLS)),
                 "invalid_tool_call", "messages[22].tool_calls[0].function.name", "R11")


def test_every_type_error_is_listed_in_message_order() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},                       # messages[0].role
        user(),
        calls(call("call_1", arguments={"city": "Paris"})),                  # messages[2]...arguments
        {"role": "tool", "content": "18"},                                   # messages[3].tool_call_id
        assistant([text_part("It is 18.")]),                                 # messages[4].content
    ]
    checked = check(request(messages, temperature="warm", tools=TOOLS))
    assert summary(checked) == [
        ("invalid_role", "messages[0].role"),
        ("invalid_tool_call", "messages[2].tool_calls[0].function.arguments"),
        ("missing_tool_call_id", "messages[3].tool_call_id"),
        ("content_not_string", "messages[4].content"),
        ("invalid_type", "temperature"),
    ]
    assert checked.request is None


def test_deeply_nested_json_is_refused_not_crashing() -> None:
    nested = "[" * 20_000 + "]" * 20_000
    checked = check(raw('{"role": "user", "content": "hi"}', f', "x_extra": {nested}'))
    assert checked.problems and checked.problems[0].code == "invalid_json"

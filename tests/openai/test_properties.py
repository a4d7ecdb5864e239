"""Property-based tests over the validation rules (hypothesis).

1. Generated VALID histories (optional system prompt, user turns as strings or text parts, assistant text
   turns with or without reasoning_content, tool rounds of 1-4 parallel calls answered in random order,
   unknown extra fields everywhere) are never rejected, for deepseek-flash, deepseek-v4-pro, deepseek-chat and
   an unknown model, under default options and with strict=True.
2. Mutations that break one rule are caught with the right code and param (R5, R11, R12, R14, R16, R17, R27).
3. check_body never raises: arbitrary JSON values, semi-structured requests with wrong types anywhere, and
   arbitrary bytes all come back as a `Checked`.

Example counts are modest by default so this file runs in a few seconds. For the long run set
CHATGATE_FUZZ_EXAMPLES, which raises every property's max_examples to at least that number:

    CHATGATE_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/openai/test_properties.py
"""

from __future__ import annotations

import copy
import json
import os
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.openai.rules import (
    Checked,
    RuleContext,
    _tool_block,
    index_messages,
    is_thinking,
    rule_tool_sequence,
)
from tests.openai.conversations import TOOLS, call, calls, check, policy, request, summary, tool, user

FUZZ_EXAMPLES = int(os.environ.get("CHATGATE_FUZZ_EXAMPLES", "0") or 0)


def examples(default: int) -> settings:
    return settings(
        max_examples=max(default, FUZZ_EXAMPLES),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


Message = dict[str, Any]
MODELS = ["deepseek-flash", "deepseek-v4-pro", "deepseek-chat", "acme-unknown-model"]
THINKING_MODELS = ["deepseek-flash", "deepseek-v4-pro", "deepseek-v4-flash", "deepseek-reasoner"]

# --- strategies for valid requests ----------------------------------------------------------------

# Cheap strategies: generation cost dominates these tests, the validator itself takes microseconds.
texts = st.sampled_from(
    [
        "",
        "ok",
        "Paris",
        "résumé ✓",
        "你好",
        "😀 emoji",
        "line\nbreak",
        'quote " and \\',
        "answer in JSON",
        "<|tool▁sep|>",
        "x" * 300,
    ]
) | st.text(max_size=12)
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
EXTRA_VALUES = [
    None,
    True,
    0,
    1.5,
    "x",
    "",
    [],
    {},
    {"type": "ephemeral"},
    [1, {"a": None}],
    {"nested": [[]]},
]
ARGUMENTS = [
    "{}",
    '{"city": "Paris", "unit": "c"}',
    '{"query": "disk usage"}',
    '{"n": 3, "deep": {"a": [1]}}',
    '{"text": "caf\\u00e9 \\ud83d\\ude00"}',
]
# Names DeepSeek does not know; they must pass through untouched (R39). None collides with a wire field.
EXTRA_MESSAGE_KEYS = ["x_trace", "cache_control", "timestamp", "annotations", "refusal", "audio", "metadata"]
EXTRA_TOP_KEYS = [
    "seed",
    "metadata",
    "parallel_tool_calls",
    "service_tier",
    "dsh_session",
    "store",
    "x_client",
]
message_extras = st.just({}) | st.dictionaries(
    st.sampled_from(EXTRA_MESSAGE_KEYS), st.sampled_from(EXTRA_VALUES), min_size=1, max_size=2
)


@st.composite
def histories(draw: st.DrawFn, max_turns: int = 8, min_calls: int = 0) -> list[Message]:
    """A valid conversation; every tool-call turn carries reasoning_content (thinking mode, R17)."""
    msgs: list[Message] = []
    next_id = iter(range(10**6))
    n_calls = 0

    def tool_round(width: int) -> None:
        nonlocal n_calls
        ids = [f"call_{next(next_id)}_{draw(st.sampled_from(['ab', 'XyZ', '00']))}" for _ in range(width)]
        tool_calls = []
        for cid in ids:
            arguments = draw(st.sampled_from(ARGUMENTS))
            entry: dict[str, Any] = {
                "id": cid,
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(["get_weather", "search_docs"])),
                    "arguments": arguments,
                },
            }
            if draw(st.booleans()):
                entry["index"] = len(tool_calls)
            tool_calls.append(entry)
        turn: Message = {
            "role": "assistant",
            "tool_calls": tool_calls,
            "reasoning_content": draw(st.sampled_from(["", "Let me call the tools."]) | texts),
            **draw(message_extras),
        }
        content = draw(st.sampled_from([None, "", "Checking.", "absent"]))
        if content != "absent":
            turn["content"] = content
        msgs.append(turn)
        for cid in draw(st.permutations(ids)):
            msgs.append({"role": "tool", "tool_call_id": cid, "content": draw(texts), **draw(message_extras)})
        n_calls += width

    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(texts), **draw(message_extras)})
    for _turn in range(draw(st.integers(1, max_turns))):
        if draw(st.booleans()):
            content: Any = draw(texts)
        else:
            content = [{"type": "text", "text": t} for t in draw(st.lists(texts, min_size=1, max_size=3))]
        msgs.append({"role": "user", "content": content, **draw(message_extras)})
        for _round in range(draw(st.integers(0, 3))):
            tool_round(draw(st.integers(1, 4)))
        if draw(st.integers(0, 3)):  # usually an answer; sometimes the user speaks again
            answer: Message = {"role": "assistant", "content": draw(texts), **draw(message_extras)}
            if draw(st.booleans()):
                answer["reasoning_content"] = draw(texts)
            if draw(st.booleans()):
                answer["name"] = "helper"
            msgs.append(answer)
    if n_calls < min_calls:
        msgs.append({"role": "user", "content": "Use the tools please."})
        tool_round(max(2, min_calls - n_calls))
    return msgs


@st.composite
def valid_params(draw: st.DrawFn) -> dict[str, Any]:
    """Parameters every model accepts (max_tokens <= 8192, stream_options only with stream)."""
    params: dict[str, Any] = {}
    if draw(st.booleans()):
        params["tools"] = TOOLS
        params["tool_choice"] = draw(st.sampled_from(["auto", "none"]))
    if draw(st.booleans()):
        params["temperature"] = draw(st.floats(0, 2))
    if draw(st.booleans()):
        params["top_p"] = draw(st.floats(0, 1))
    if draw(st.booleans()):
        params["max_tokens"] = draw(st.integers(1, 8192))
    if draw(st.booleans()):
        params["stream"] = True
        if draw(st.booleans()):
            params["stream_options"] = {"include_usage": draw(st.booleans())}
    if draw(st.booleans()):
        params["thinking"] = {"type": draw(st.sampled_from(["enabled", "disabled"]))}
    for key in draw(st.lists(st.sampled_from(EXTRA_TOP_KEYS), max_size=2, unique=True)):
        params[key] = draw(st.sampled_from(EXTRA_VALUES))
    return params


def _explain(checked: Checked) -> str:
    return "\n".join(f"{p.code} {p.param}: {p.message}" for p in checked.problems)


@examples(200)
@given(messages=histories(), model=st.sampled_from(MODELS), params=valid_params())
def test_valid_histories_are_never_rejected(
    messages: list[Message], model: str, params: dict[str, Any]
) -> None:
    req = {"model": model, "messages": messages, **params}
    for strict in (False, True):
        checked = check(req, strict=strict)
        assert checked.ok, _explain(checked)
        assert checked.request is not None and len(checked.request.messages) == len(messages)


@examples(25)
@given(rnd=st.randoms(use_true_random=False), model=st.sampled_from(MODELS))
def test_long_valid_histories_are_never_rejected(rnd: random.Random, model: str) -> None:
    """A few hundred messages each; structure drawn from a seeded Random to keep generation cheap."""
    messages = long_history(rnd, rnd.randint(150, 400))
    checked = check({"model": model, "messages": messages, "tools": TOOLS})
    assert checked.ok, _explain(checked)


def long_history(rnd: random.Random, target: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are an agent."}]
    n = 0
    while len(msgs) < target:
        msgs.append(
            {"role": "user", "content": f"step {len(msgs)}", **({"x_seq": n} if rnd.random() < 0.2 else {})}
        )
        for _ in range(rnd.randint(0, 3)):
            ids = [f"call_{n}_{k}" for k in range(rnd.randint(1, 4))]
            n += 1
            msgs.append(
                {
                    "role": "assistant",
                    "content": rnd.choice([None, ""]),
                    "reasoning_content": "r",
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": "search_docs", "arguments": '{"query": "x"}'},
                        }
                        for i in ids
                    ],
                }
            )
            rnd.shuffle(ids)
            msgs.extend({"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids)
        msgs.append({"role": "assistant", "content": "done", "reasoning_content": rnd.choice(["", "why"])})
    return msgs


# --- mutations ------------------------------


def call_turns(msgs: list[Message]) -> list[int]:
    return [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")]


def owner(msgs: list[Message], t: int) -> int:
    """Index of the assistant whose tool_calls the tool message at `t` answers."""
    i = t
    while msgs[i]["role"] == "tool":
        i -= 1
    return i


@examples(100)
@given(messages=histories(max_turns=4, min_calls=1), model=st.sampled_from(MODELS), data=st.data())
def test_dropping_a_tool_result_is_r16(messages: list[Message], model: str, data: st.DataObject) -> None:
    t = data.draw(st.sampled_from([i for i, m in enumerate(messages) if m["role"] == "tool"]))
    a = owner(messages, t)
    missing = messages[t]["tool_call_id"]
    del messages[t]
    checked = check({"model": model, "messages": messages})
    assert summary(checked) == [("tool_calls_unanswered", f"messages[{a}].tool_calls")], _explain(checked)
    assert checked.problems[0].rule == "R16"
    assert f"Missing: {missing} (messages[{a}], role assistant)" in checked.problems[0].message


@examples(100)
@given(
    messages=histories(max_turns=4, min_calls=1),
    model=st.sampled_from(MODELS),
    data=st.data(),
    intruder=st.sampled_from(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Are you done?"}]
    ),
)
def test_a_message_between_tool_calls_and_results_is_r16(
    messages: list[Message], model: str, data: st.DataObject, intruder: Message
) -> None:
    a = data.draw(st.sampled_from(call_turns(messages)))
    width = len(messages[a]["tool_calls"])
    messages.insert(a + 1, intruder)
    checked = check({"model": model, "messages": messages})
    assert summary(checked) == [("tool_calls_unanswered", f"messages[{a}].tool_calls")] + [
        ("tool_without_tool_calls", f"messages[{a + 2 + j}].role") for j in range(width)
    ], _explain(checked)


@examples(100)
@given(messages=histories(max_turns=4), model=st.sampled_from(MODELS), data=st.data())
def test_an_orphan_tool_message_is_r14(messages: list[Message], model: str, data: st.DataObject) -> None:
    u = data.draw(st.sampled_from([i for i, m in enumerate(messages) if m["role"] in ("user", "system")]))
    messages.insert(u + 1, {"role": "tool", "tool_call_id": "call_orphan", "content": "stale result"})
    checked = check({"model": model, "messages": messages})
    assert summary(checked) == [("tool_without_tool_calls", f"messages[{u + 1}].role")], _explain(checked)
    assert checked.problems[0].rule == "R14"


@examples(100)
@given(messages=histories(max_turns=4, min_calls=2), model=st.sampled_from(MODELS), data=st.data())
def test_a_duplicated_tool_call_id_is_r12_when_strict(
    messages: list[Message], model: str, data: st.DataObject
) -> None:
    positions = [(i, k) for i in call_turns(messages) for k in range(len(messages[i]["tool_calls"]))]
    first, second = sorted(
        data.draw(st.lists(st.sampled_from(positions), min_size=2, max_size=2, unique=True))
    )
    (a1, k1), (a2, k2) = first, second
    old = messages[a2]["tool_calls"][k2]["id"]
    new = messages[a1]["tool_calls"][k1]["id"]
    messages[a2]["tool_calls"][k2]["id"] = new
    answer = next(t for t in range(a2 + 1, len(messages)) if messages[t].get("tool_call_id") == old)
    messages[answer]["tool_call_id"] = new
    req = {"model": model, "messages": messages}
    assert check(req).ok, _explain(check(req))  # R12 is an inference (§11 "I"): strict only
    checked = check(req, strict=True)
    assert checked.problems[0].code == "duplicate_tool_call_id", _explain(checked)
    assert checked.problems[0].param == f"messages[{a2}].tool_calls[{k2}].id"
    rest = {p.code for p in checked.problems[1:]}
    assert rest <= ({"duplicate_tool_result"} if a1 == a2 else set()), _explain(checked)


@examples(100)
@given(messages=histories(max_turns=4, min_calls=1), model=st.sampled_from(MODELS), data=st.data())
def test_arguments_as_an_object_is_r11(messages: list[Message], model: str, data: st.DataObject) -> None:
    a = data.draw(st.sampled_from(call_turns(messages)))
    k = data.draw(st.integers(0, len(messages[a]["tool_calls"]) - 1))
    function = messages[a]["tool_calls"][k]["function"]
    function["arguments"] = json.loads(function["arguments"])
    checked = check({"model": model, "messages": messages})
    assert summary(checked) == [("invalid_tool_call", f"messages[{a}].tool_calls[{k}].function.arguments")], (
        _explain(checked)
    )
    assert checked.problems[0].rule == "R11"


@examples(100)
@given(messages=histories(max_turns=4, min_calls=1), model=st.sampled_from(THINKING_MODELS), data=st.data())
def test_dropping_reasoning_content_in_thinking_mode_is_r17(
    messages: list[Message], model: str, data: st.DataObject
) -> None:
    a = data.draw(st.sampled_from(call_turns(messages)))
    del messages[a]["reasoning_content"]
    req = {"model": model, "messages": messages, "tools": TOOLS}
    checked = check(req)
    assert summary(checked) == [("reasoning_content_missing", f"messages[{a}].reasoning_content")], _explain(
        checked
    )
    if model != "deepseek-reasoner":  # thinking switched off: the same history is fine
        assert check({**req, "thinking": {"type": "disabled"}}).ok


@examples(100)
@given(messages=histories(max_turns=4), model=st.sampled_from(MODELS), data=st.data())
def test_developer_role_is_r5(messages: list[Message], model: str, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(messages) - 1))
    messages[i]["role"] = "developer"
    checked = check({"model": model, "messages": messages})
    assert summary(checked) == [("invalid_role", f"messages[{i}].role")], _explain(checked)
    assert checked.problems[0].rule == "R5"


@examples(100)
@given(
    messages=histories(max_turns=3),
    model=st.sampled_from(MODELS),
    value=st.integers(max_value=0) | st.integers(min_value=393_217, max_value=10**30),
)
def test_max_tokens_out_of_range_is_r27(messages: list[Message], model: str, value: int) -> None:
    if model == "acme-unknown-model" and value > 0:
        value = -value  # no known maximum for a model without a profile: only the lower bound applies
    checked = check({"model": model, "messages": messages, "max_tokens": value})
    assert summary(checked) == [("max_tokens_out_of_range", "max_tokens")], _explain(checked)


# --- the validator never raises ------------------------------

ROLES = ["system", "user", "assistant", "tool", "developer", "function", ""]
MESSAGE_KEYS = ["content", "name", "tool_calls", "tool_call_id", "reasoning_content", "prefix"]
TOP_KEYS = [
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "thinking",
    "reasoning_effort",
    "response_format",
    "logprobs",
    "top_logprobs",
    "user_id",
    "n",
    "frequency_penalty",
    "presence_penalty",
]


@st.composite
def odd_requests(draw: st.DrawFn) -> Any:
    """Request-shaped JSON with wrong types and odd values anywhere, to drive every rule and error path."""

    def message() -> Any:
        if draw(st.integers(0, 9)) == 0:
            return draw(json_values)
        msg: dict[str, Any] = {"role": draw(st.sampled_from(ROLES) | json_values)}
        for key in draw(st.lists(st.sampled_from(MESSAGE_KEYS), max_size=4, unique=True)):
            msg[key] = draw(
                json_values
                | st.sampled_from(
                    [
                        "x",
                        "",
                        [{"type": "text", "text": "json"}],
                        [{"type": "image_url", "image_url": {"url": "x"}}],
                        [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                        "c1",
                        True,
                    ]
                )
            )
        return msg

    req: dict[str, Any] = {
        "model": draw(st.sampled_from([*MODELS, "deepseek-reasoner", ""]) | json_values),
        "messages": [message() for _ in range(draw(st.integers(0, 6)))],
    }
    for key in draw(st.lists(st.sampled_from(TOP_KEYS), max_size=5, unique=True)):
        req[key] = draw(
            json_values
            | st.sampled_from(
                [
                    {
                        "type": "function",
                        "function": {"name": "f", "strict": True, "parameters": {"type": "object"}},
                    },
                    [
                        {
                            "type": "function",
                            "function": {
                                "name": "f.g",
                                "strict": True,
                                "parameters": {"type": "object", "required": [{}], "properties": []},
                            },
                        }
                    ],
                    {"type": "json_object"},
                    {"type": "enabled"},
                    "required",
                    0,
                    -1,
                    3,
                    10**12,
                ]
            )
        )
    if draw(st.booleans()):
        del req[draw(st.sampled_from(list(req)))]
    return req


@examples(200)
@given(
    value=json_values | st.dictionaries(st.text(max_size=10), json_values, max_size=6),
    strict=st.booleans(),
    beta=st.booleans(),
)
def test_check_body_never_raises_on_arbitrary_json(value: Any, strict: bool, beta: bool) -> None:
    checked = check(json.dumps(value).encode(), strict=strict, beta=beta)
    assert isinstance(checked, Checked)
    assert checked.problems, "an arbitrary value is never a valid request"


@examples(150)
@given(
    req=odd_requests(),
    strict=st.booleans(),
    beta=st.booleans(),
    legacy=st.booleans(),
    unknown_models=st.sampled_from(["pass", "reject"]),
)
def test_check_body_never_raises_on_odd_requests(
    req: Any, strict: bool, beta: bool, legacy: bool, unknown_models: str
) -> None:
    checked = check(
        json.dumps(req).encode(), strict=strict, beta=beta, legacy=legacy, unknown_models=unknown_models
    )
    assert isinstance(checked, Checked)
    assert checked.ok == (not checked.problems)
    if checked.ok:
        assert checked.request is not None
    for problem in checked.problems:
        assert problem.code and problem.message


@examples(200)
@given(body=st.binary(max_size=300))
def test_check_body_never_raises_on_arbitrary_bytes(body: bytes) -> None:
    checked = check(body)
    assert isinstance(checked, Checked)
    assert checked.problems


@examples(100)
@given(messages=histories(max_turns=3), data=st.data())
def test_check_body_never_raises_on_corrupted_valid_bodies(
    messages: list[Message], data: st.DataObject
) -> None:
    body = bytearray(json.dumps({"model": "deepseek-flash", "messages": copy.deepcopy(messages)}).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at : at + data.draw(st.integers(0, 3))] = data.draw(st.binary(max_size=3))
    assert isinstance(check(bytes(body)), Checked)



# --- the tool-block shortcut never hides a problem (R14-R16) --------------------------------------


@examples(300)
@given(
    ids=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3),
    answers=st.lists(st.sampled_from(["a", "b", "c", "x"]), max_size=4),
    tail=st.booleans(),
    strict=st.booleans(),
)
def test_tool_block_shortcut_reports_what_the_detailed_check_reports(
    ids: list[str], answers: list[str], tail: bool, strict: bool
) -> None:
    """`rule_tool_sequence` skips the detailed block check when the results answer each call once, in
    order. Whatever the block, it must report exactly what the detailed check (`_tool_block`) reports."""
    messages = [user(), calls(*(call(i) for i in ids)), *(tool(a) for a in answers)]
    if tail:
        messages.append(user("thanks"))
    checked = check(request(messages, tools=TOOLS), strict=strict)
    req = checked.request
    assert req is not None
    pol = policy(strict=strict)
    profile, known = pol.profile_for(req.model)
    ctx = RuleContext(profile, known, False, pol.options, is_thinking(req, profile, known), pol,
                      index_messages(req.messages), None)
    reported = sorted((p.code, p.param or "", p.message) for p in rule_tool_sequence(req, ctx))
    detailed = sorted((p.code, p.param or "", p.message)
                      for p in _tool_block(req.messages, 1, ids, 2 + len(answers), ctx))
    assert reported == detailed

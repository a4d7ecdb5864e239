"""Property-based tests over the validation rules (hypothesis).

1. VALID requests are never rejected (`valid_requests`): every model name, every thinking set-up (`thinking`
   absent/null/enabled/disabled/adaptive, every `reasoning_effort`), a history to match (reasoning_content
   required only on tool-call turns in thinking mode, R17; tool rounds answered in any order; `name`,
   `latest_reminder`, unknown fields; image/file parts and tool content arrays on vision models), every
   documented parameter up to its limits, tools (128 functions; strict schemas on /beta), the tool_choice
   the mode allows, prefix completion on /beta. Requests valid only by default (strict tools off /beta R32,
   thinking disabled + effort R41, out-of-range sampling in thinking mode R25, penalties R26) are accepted
   by default and get exactly the expected codes in strict mode; all others pass strict mode too.
2. Mutations that break one rule are caught with the right code and param (R5, R11, R12, R14, R16, R17,
   R27, R32 on /beta, R34, R36, R41 in strict mode).
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
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatgate.openai.rules import (
    STRICT_UNSUPPORTED,
    ChatContext,
    Checked,
    _tool_block,
    index_messages,
    is_thinking,
    rule_tool_sequence,
)
from tests.openai.conversations import TOOLS, call, calls, check, policy, request, summary, tool, user

pytestmark = pytest.mark.slow  # hypothesis

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
UNKNOWN_MODEL = "acme-unknown-model"
MODELS = [
    "deepseek-flash",
    "deepseek-v4-flash",
    "deepseek-v4-flash-vision-exp",
    "deepseek-v4-pro",
    "deepseek-chat",
    "deepseek-reasoner",
    UNKNOWN_MODEL,
]
V4_MODELS = ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-flash-vision-exp", "deepseek-v4-pro"]
THINKING_MODELS = [*V4_MODELS, "deepseek-reasoner"]
# Image and file parts: deepseek-flash and the legacy names it serves (docs/rules-chat.md#models, R8); an
# unknown model gets the general rules only, so nothing model-specific is refused for it either.
VISION_MODELS = ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-flash-vision-exp", UNKNOWN_MODEL]
# "384K" for V4/V4.1; deepseek-chat/-reasoner route to v4-flash since 2026-04-24 (docs/rules-chat.md#models)
MAX_TOKENS = 393_216
ABSENT = "<absent>"  # a sampled marker: leave the field out

# --- strategies for valid requests ----------------------------------------------------------------

# Cheap strategies: generation cost dominates these tests, the validator itself takes microseconds.
TEXTS = [
    "",
    "ok",
    "Paris",
    "résumé ✓",
    "你好",
    "😀 emoji",
    "line\nbreak",
    "tab\tand\r\nCRLF",
    "nul \x00 and \u2028",
    'quote " and \\',
    "answer in JSON",
    "<|tool▁sep|>",
    '{"not": "a message"}',
    "x" * 300,
]
texts = st.sampled_from(TEXTS)  # message text is never inspected beyond the word json: no deep generation
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
# Mostly none; otherwise one or two unknown keys (a precomputed list: one draw per message).
MESSAGE_EXTRAS: list[dict[str, Any]] = [{}] * 6 + [
    {key: EXTRA_VALUES[(3 * n + 5 * k + width) % len(EXTRA_VALUES)]
     for k, key in enumerate(EXTRA_MESSAGE_KEYS[n : n + width])}
    for n in range(len(EXTRA_MESSAGE_KEYS))
    for width in (1, 2)
]
message_extras = st.sampled_from(MESSAGE_EXTRAS)
NAMES = ["alice", "helper", "ops_bot-2"]

# Vision content (docs/rules-chat.md, R9, R8, R9): http(s) URLs up to 8192 characters, data: URLs of the four
# formats at any length, every `detail`, file parts with exactly one of file_id / file_data.
IMAGE_URLS = [
    "https://example.com/cat.png",
    "http://img.example.org/a.jpg?size=large&v=2",
    "https://cdn.example.com/" + "p" * (8192 - len("https://cdn.example.com/")),
    "data:image/png;base64,iVBORw0KGgo=",
    "data:image/jpeg;base64,/9j/4AAQSkZJRg==",
    "data:image/gif;base64,R0lGODlhAQABAAAAACw=",
    "data:image/webp;base64,UklGRh4AAABXRUJQVlA4",
    "data:image/jpeg;base64," + "A" * 20_000,
]
IMAGE_PARTS: list[dict[str, Any]] = [
    {"type": "image_url", "image_url": {"url": url} if detail == ABSENT else {"url": url, "detail": detail}}
    for url in IMAGE_URLS
    for detail in (ABSENT, "low", "high", "auto", "original")
]
FILE_PARTS: list[dict[str, Any]] = [
    {"type": "file", "file": {"file_id": "file-abc123"}},
    {"type": "file", "file": {"file_id": "file-9", "filename": "scan.png"}},
    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQ=", "filename": "a.pdf"}},
    {"type": "file", "file": {"file_data": "data:image/png;base64,iVBORw0KGgo="}},
]
TEXT_PARTS = [{"type": "text", "text": t} for t in TEXTS]
text_parts = st.sampled_from(TEXT_PARTS)
any_parts = st.sampled_from(TEXT_PARTS + IMAGE_PARTS + FILE_PARTS)
# Tool results as arrays (vision models only, U4), text alone or with a screenshot.
TOOL_ARRAYS: list[list[dict[str, Any]]] = [
    [TEXT_PARTS[1]],
    [TEXT_PARTS[2], TEXT_PARTS[4]],
    [{"type": "text", "text": "Screenshot taken."}, IMAGE_PARTS[15]],
    [{"type": "text", "text": "Two frames."}, IMAGE_PARTS[0], IMAGE_PARTS[-1]],
]
tool_contents = texts | st.sampled_from(TOOL_ARRAYS)
CALLS = [(fn, args) for fn in ("get_weather", "search_docs") for args in ARGUMENTS]


@st.composite
def histories(
    draw: st.DrawFn,
    max_turns: int = 8,
    min_calls: int = 0,
    *,
    thinking: bool = True,
    vision: bool = False,
    names: bool = False,
    reminders: bool = False,
) -> list[Message]:
    """A valid conversation. `thinking`: every tool-call turn carries a reasoning_content string (R17);
    otherwise reasoning_content is absent, null or a string anywhere. `vision`: user messages may carry
    image and file parts, tool results content arrays. `names`: `name` on system, user and assistant
    messages. `reminders`: undocumented `latest_reminder` messages after user turns (R5)."""
    msgs: list[Message] = []
    n_calls = 0
    name = st.sampled_from([{}, {}, *({"name": n} for n in NAMES)]) if names else st.just({})
    required_reasoning = st.sampled_from(["", "Let me call the tools.", *TEXTS[2:5]])
    optional_reasoning = st.sampled_from([ABSENT, None, "", "I thought about it."])

    def reasoning(required: bool) -> dict[str, Any]:
        if required:
            return {"reasoning_content": draw(required_reasoning)}
        value = draw(optional_reasoning)
        return {} if value == ABSENT else {"reasoning_content": value}

    def tool_round(width: int) -> None:
        nonlocal n_calls
        suffix = draw(st.sampled_from(["ab", "XyZ", "00_kw66qNnNto11bSfJVIdlV5Oo"]))
        ids = [f"call_{n_calls + k}_{suffix}" for k in range(width)]
        tool_calls = []
        for k, cid in enumerate(ids):
            fn, arguments = draw(st.sampled_from(CALLS))
            function = {"name": fn, "arguments": arguments}
            entry: dict[str, Any] = {"id": cid, "type": "function", "function": function}
            if k % 2:
                entry["index"] = k  # the streamed delta's field, sometimes kept by clients
            tool_calls.append(entry)
        # The reference: assistant content is "nullable but present": null, "" or text beside tool_calls.
        turn: Message = {
            "role": "assistant",
            "content": draw(st.sampled_from([None, "", "Checking."])),
            "tool_calls": tool_calls,
            **reasoning(thinking),
            **draw(name),
            **draw(message_extras),
        }
        msgs.append(turn)
        for cid in draw(st.permutations(ids)):  # R16: answered in any order
            content = draw(tool_contents if vision else texts)
            msgs.append({"role": "tool", "tool_call_id": cid, "content": content, **draw(message_extras)})
        n_calls += width

    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(texts), **draw(name), **draw(message_extras)})
    for _turn in range(draw(st.integers(1, max_turns))):
        kind = draw(st.integers(0, 2))
        if kind == 0:
            content: Any = draw(texts)
        else:
            content = draw(st.lists(any_parts if vision else text_parts, min_size=1, max_size=3))
        msgs.append({"role": "user", "content": content, **draw(name), **draw(message_extras)})
        if reminders and draw(st.integers(0, 7)) == 0:
            reminder = draw(st.sampled_from(["Be brief.", "Today is Monday."]))
            msgs.append({"role": "latest_reminder", "content": reminder})
        for _round in range(draw(st.integers(0, 3))):
            tool_round(draw(st.integers(1, 4)))
        if draw(st.integers(0, 3)):  # usually an answer; sometimes the user speaks again
            answer: Message = {
                "role": "assistant",
                "content": draw(texts),
                **reasoning(False),  # never required without tool_calls (R17)
                **draw(name),
                **draw(message_extras),
            }
            msgs.append(answer)
    if reminders and draw(st.integers(0, 7)) == 0:  # or after the last answer
        msgs.append({"role": "latest_reminder", "content": "Check the result."})
    if n_calls < min_calls:
        msgs.append({"role": "user", "content": "Use the tools please."})
        tool_round(max(2, min_calls - n_calls))
    return msgs


# --- tools ---


def function_tool(name: str, parameters: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, **extra}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


FUNCTION_NAMES = ["get_weather", "search_docs", "run-shell", "A", "f0", "Get_Weather-2", "n" * 64]
# Any JSON-Schema object, or none at all (R32 checks nothing outside strict mode on /beta).
LOOSE_SCHEMAS: list[dict[str, Any] | None] = [
    None,
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    {
        "type": "object",
        "properties": {
            "q": {"type": "string", "minLength": 1, "maxLength": 200},
            "tags": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        },
    },
    {"type": "object"},
    {"type": "object", "properties": {"opts": {"type": "object", "properties": {"x": {"type": "number"}}}}},
]
# Strict schemas as DOC-tools allows them (docs/rules-chat.md, R32): every object lists all properties in
# `required` and sets additionalProperties false; object/string/number/integer/boolean/array/enum/anyOf,
# $ref/$defs, string pattern and the five formats.
STRICT_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
    {
        "type": "object",
        "properties": {
            "filters": {
                "type": "object",
                "properties": {
                    "tag": {"type": "string", "pattern": "^[a-z]+$"},
                    "limit": {"type": "integer"},
                },
                "required": ["tag", "limit"],
                "additionalProperties": False,
            },
            "ids": {"type": "array", "items": {"type": "string", "format": "uuid"}},
            "exact": {"type": "boolean"},
        },
        "required": ["filters", "ids", "exact"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "target": {
                "anyOf": [
                    {"type": "string", "format": "email"},
                    {"type": "string", "format": "hostname"},
                    {"type": "string", "format": "ipv4"},
                    {"type": "string", "format": "ipv6"},
                ]
            },
            "score": {"type": "number", "description": "0 to 1"},
            "level": {"type": "string", "enum": ["low", "high"]},
            "rank": {"enum": [1, 2, 3]},
        },
        "required": ["target", "score", "level", "rank"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "item": {"$ref": "#/$defs/item"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
        },
        "required": ["item", "items"],
        "additionalProperties": False,
        "$defs": {
            "item": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "tags": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"k": {"type": "string"}},
                            "required": ["k"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["name", "tags"],
                "additionalProperties": False,
            }
        },
    },
]
MANY_TOOLS = [function_tool(f"fn_{k}", LOOSE_SCHEMAS[1]) for k in range(128)]  # R30: "A max of 128"


@st.composite
def tool_sets(draw: st.DrawFn, strict: bool) -> list[dict[str, Any]]:
    """1-4 functions with unique names (R31); with `strict`, all of them strict with strict schemas."""
    tools = []
    for fn in draw(st.lists(st.sampled_from(FUNCTION_NAMES), min_size=1, max_size=4, unique=True)):
        extra: dict[str, Any] = {}
        if draw(st.booleans()):
            extra["description"] = draw(st.sampled_from(["Look it up.", "", "Runs a command."]))
        if strict:
            tools.append(function_tool(fn, draw(st.sampled_from(STRICT_SCHEMAS)), strict=True, **extra))
        else:
            if draw(st.integers(0, 3)) == 0:
                extra["strict"] = False
            tools.append(function_tool(fn, draw(st.sampled_from(LOOSE_SCHEMAS)), **extra))
    return tools


# --- whole requests ---


@dataclass(frozen=True, slots=True)
class ValidCase:
    """A request the spec says DeepSeek accepts, the route it goes to, and what chatgate says about it."""

    body: dict[str, Any]
    beta: bool
    strict_only: frozenset[str]  # codes strict mode reports (empty: valid under strict too)
    warnings: frozenset[str]  # warning codes the default mode attaches


EFFORTS = ["low", "high", "max", "minimal", "medium", "xhigh", "ultra"]  # R36; "none" turns thinking off
in_range_temperature = st.sampled_from([0, 1, 2, 0.0, 2.0, 0.7]) | st.floats(0, 2)
in_range_top_p = st.sampled_from([0, 1, 0.0, 1.0, 0.95]) | st.floats(0, 1)
in_range_penalty = st.sampled_from([-2, 0, 2, -2.0, 1.5]) | st.floats(-2, 2)
# Ignored in thinking mode (R25, temperature and top_p) or deprecated without effect (R26, penalties):
# chatgate checks their ranges only in strict mode.
out_of_range = st.sampled_from([-1, -0.01, 2.5, 3, 100, 1e9])
out_of_range_penalty = st.sampled_from([-2.5, 3, -100, 1e9])


@st.composite
def valid_requests(draw: st.DrawFn) -> ValidCase:
    model = draw(st.sampled_from(MODELS))
    beta = draw(st.booleans())
    body: dict[str, Any] = {"model": model}
    strict_only: set[str] = set()
    warnings: set[str] = set()

    def put(key: str, strategy: st.SearchStrategy[Any]) -> Any:
        value = draw(strategy)
        if value != ABSENT:
            body[key] = value
        return value

    # Thinking set-up (docs/rules-chat.md, R36, R41). mode "on": chatgate and DeepSeek agree the model
    # thinks; "off": it does not; "adaptive": DeepSeek decides, so the request must suit both.
    if model == "deepseek-chat":
        thinking = draw(st.sampled_from([ABSENT, None, "disabled"]))
        effort = draw(st.sampled_from([ABSENT, None, "none"]))
    elif model == "deepseek-reasoner":
        thinking = draw(st.sampled_from([ABSENT, None, "enabled"]))
        effort = draw(st.sampled_from([ABSENT, None, *EFFORTS]))
    else:
        effort = draw(st.sampled_from([ABSENT, None, "none", *EFFORTS]))
        choices = [ABSENT, None, "disabled"] + ([] if effort == "none" else ["enabled", "adaptive"])
        thinking = draw(st.sampled_from(choices))
    if thinking != ABSENT:
        body["thinking"] = None if thinking is None else {"type": thinking}
    if effort != ABSENT:
        body["reasoning_effort"] = effort
    if model == UNKNOWN_MODEL or thinking == "disabled" or effort == "none" or model == "deepseek-chat":
        mode = "off"
    else:
        mode = "adaptive" if thinking == "adaptive" else "on"
    if thinking == "disabled" and effort not in (ABSENT, None, "none"):  # R41: repaired, warned by default
        strict_only.add("thinking_disabled_with_effort")
        warnings.add("thinking_disabled_with_effort")

    messages = draw(
        histories(thinking=mode != "off", vision=model in VISION_MODELS, names=True, reminders=True)
    )
    body["messages"] = messages

    if draw(st.integers(0, 3)) == 0:  # R24: json_object needs "json" in a system or user message
        body["response_format"] = {"type": "json_object"}
        users = [m for m in messages if m["role"] == "user"]
        if messages[0]["role"] == "system":
            messages[0]["content"] += " Reply in JSON."
        elif draw(st.booleans()) or not users:
            prompt = draw(st.sampled_from(["Reply in JSON.", "json"]))
            messages.insert(0, {"role": "system", "content": prompt})
        elif isinstance(users[0]["content"], str):
            users[0]["content"] += " Answer as JSON."
        else:
            users[0]["content"].append({"type": "text", "text": "Output: Json object"})
    else:
        put("response_format", st.sampled_from([ABSENT, None, {"type": "text"}]))

    # Prefix completion (R21): /beta, last message an assistant with prefix true after the user's turn.
    if beta and draw(st.booleans()):
        if messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": "Write the function."})
        prefix: Message = {"role": "assistant", "content": draw(st.sampled_from(["```python\n", "", "Sure"]))}
        prefix["prefix"] = True
        if draw(st.booleans()):
            prefix["reasoning_content"] = "The user wants code."  # R22: CoT input with prefix
        messages.append(prefix)

    # Sampling (R25, R26): out-of-range values only where they are ignored (1 in 8 of each).
    for key, valid, ignored in (
        ("temperature", in_range_temperature, mode == "on"),
        ("top_p", in_range_top_p, mode == "on"),
        ("frequency_penalty", in_range_penalty, True),
        ("presence_penalty", in_range_penalty, True),
    ):
        kind = draw(st.integers(0, 7))
        if kind == 7 and ignored:
            body[key] = draw(out_of_range_penalty if "penalty" in key else out_of_range)
            strict_only.add("out_of_range")
        elif kind >= 4:
            body[key] = draw(valid)

    limit = 2**63 - 1 if model == UNKNOWN_MODEL else MAX_TOKENS  # R27; no known maximum for an unknown model
    put("max_tokens", st.sampled_from([ABSENT, None, 1, limit]) | st.integers(1, limit))
    put("stop", st.sampled_from([ABSENT, None, "", "\n\n", "END"]) | st.lists(texts, min_size=1, max_size=16))
    stream = put("stream", st.sampled_from([ABSENT, None, True, False]))
    if stream is True:  # R29
        put(
            "stream_options",
            st.sampled_from([ABSENT, None, {"include_usage": True}, {"include_usage": False}]),
        )
    if model != "deepseek-reasoner":  # DOC-R1: logprobs were an error on the reasoner
        logprobs = put("logprobs", st.sampled_from([ABSENT, None, True, False]))
        if logprobs is True:
            put("top_logprobs", st.sampled_from([ABSENT, None, 0, 20]) | st.integers(0, 20))  # R35
    put("user_id", st.sampled_from([ABSENT, None, "u1", "user-42_A", "0", "a" * 512]))  # R37
    put("n", st.sampled_from([ABSENT, None, 1]))  # R38

    # Tools (R30-R34): strict tools are checked on /beta; off /beta they are forwarded with a warning.
    tool_kind = draw(st.sampled_from(["absent", "null", "loose", "strict", "many"]))
    tools: list[dict[str, Any]] = []
    if tool_kind == "null":
        body["tools"] = None
    elif tool_kind == "many":
        tools = body["tools"] = MANY_TOOLS
    elif tool_kind in ("loose", "strict"):
        tools = body["tools"] = draw(tool_sets(strict=tool_kind == "strict"))
        if tool_kind == "strict" and not beta:
            strict_only.add("strict_requires_beta")
            warnings.add("strict_not_enforced")
    choices: list[Any] = [ABSENT, None, "none"]
    if tools:
        choices.append("auto")
        if mode == "off":  # R34: a forced tool only without thinking
            choices.append("required")
            named = [t["function"]["name"] for t in tools[-2:]]
            choices.extend({"type": "function", "function": {"name": fn}} for fn in named)
    put("tool_choice", st.sampled_from(choices))

    for key in draw(st.lists(st.sampled_from(EXTRA_TOP_KEYS), max_size=2, unique=True)):
        body[key] = draw(st.sampled_from(EXTRA_VALUES))
    return ValidCase(body, beta, frozenset(strict_only), frozenset(warnings))


def _explain(checked: Checked) -> str:
    return "\n".join(f"{p.code} {p.param}: {p.message}" for p in checked.problems)


@examples(300)
@given(case=valid_requests())
def test_valid_requests_are_never_rejected(case: ValidCase) -> None:
    checked = check(case.body, beta=case.beta)
    assert checked.ok, _explain(checked)
    assert checked.request is not None and len(checked.request.messages) == len(case.body["messages"])
    assert case.warnings <= {w.code for w in checked.warnings}, checked.warnings
    strict = check(case.body, strict=True, beta=case.beta)
    # Valid under strict too unless the case says which strict-only codes apply.
    assert {p.code for p in strict.problems} == case.strict_only, _explain(strict)


@examples(25)
@given(rnd=st.randoms(use_true_random=False), model=st.sampled_from(MODELS))
def test_long_valid_histories_are_never_rejected(rnd: random.Random, model: str) -> None:
    """A few hundred messages each; structure drawn from a seeded Random to keep generation cheap."""
    thinking = model not in ("deepseek-chat", UNKNOWN_MODEL)
    messages = long_history(rnd, rnd.randint(150, 400), reasoning=thinking)
    for strict in (False, True):
        checked = check({"model": model, "messages": messages, "tools": TOOLS}, strict=strict)
        assert checked.ok, _explain(checked)


def long_history(rnd: random.Random, target: int, *, reasoning: bool = True) -> list[Message]:
    """`reasoning`: every tool-call turn carries reasoning_content; otherwise only some do."""
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
                    **({"reasoning_content": "r"} if reasoning or rnd.random() < 0.5 else {}),
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
    assert check(req).ok, _explain(check(req))  # R12 is an inference: strict only
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
    assert ("invalid_role", f"messages[{i}].role") in summary(checked), _explain(checked)
    # every problem is listed (issue 50 item 8): a tool call or result that loses its partner with the role
    assert {p.rule for p in checked.problems} <= {"R5", "R14", "R15", "R16", "R17"}, _explain(checked)


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


@examples(50)
@given(
    messages=histories(max_turns=3),
    model=st.sampled_from(THINKING_MODELS),
    thinking=st.sampled_from([ABSENT, "enabled", "adaptive"]),
    effort=st.sampled_from([ABSENT, *EFFORTS]),
    choice=st.sampled_from(["required", {"type": "function", "function": {"name": "search_docs"}}]),
)
def test_forcing_a_tool_in_thinking_mode_is_r34(
    messages: list[Message], model: str, thinking: str, effort: str, choice: Any
) -> None:
    req: dict[str, Any] = {"model": model, "messages": messages, "tools": TOOLS, "tool_choice": choice}
    if thinking != ABSENT:
        req["thinking"] = {"type": thinking}
    if effort != ABSENT:
        req["reasoning_effort"] = effort
    checked = check(req)
    assert summary(checked) == [("tool_choice_in_thinking", "tool_choice")], _explain(checked)
    assert checked.problems[0].rule == "R34"
    if model != "deepseek-reasoner":  # thinking switched off, either way: the same request is fine
        rest = {k: v for k, v in req.items() if k not in ("thinking", "reasoning_effort")}
        disabled = {**rest, "thinking": {"type": "disabled"}}
        no_effort = {**rest, "reasoning_effort": "none"}
        for off in (disabled, no_effort):
            assert check(off).ok and check(off, strict=True).ok, _explain(check(off, strict=True))


@examples(50)
@given(
    messages=histories(max_turns=3),
    model=st.sampled_from(MODELS),
    param=st.sampled_from(["thinking.type", "reasoning_effort"]),
    value=st.sampled_from(["", "auto", "on", "off", "true", "Enabled", "HIGH", "medium-high"]),
)
def test_an_unknown_thinking_option_is_r36(
    messages: list[Message], model: str, param: str, value: str
) -> None:
    req: dict[str, Any] = {"model": model, "messages": messages}
    if param == "thinking.type":
        req["thinking"] = {"type": value}
    else:
        req["reasoning_effort"] = value
    checked = check(req)
    assert summary(checked) == [("invalid_thinking", param)], _explain(checked)
    assert checked.problems[0].rule == "R36"


@examples(30)
@given(messages=histories(max_turns=3), model=st.sampled_from(MODELS), effort=st.sampled_from(EFFORTS))
def test_thinking_disabled_with_an_effort_is_r41_only_when_strict(
    messages: list[Message], model: str, effort: str
) -> None:
    req = {"model": model, "messages": messages, "thinking": {"type": "disabled"}, "reasoning_effort": effort}
    checked = check(req)
    assert checked.ok, _explain(checked)
    warned = [(w.code, w.param) for w in checked.warnings]
    assert warned == [("thinking_disabled_with_effort", "reasoning_effort")]
    strict = check(req, strict=True)
    assert summary(strict) == [("thinking_disabled_with_effort", "reasoning_effort")], _explain(strict)
    assert strict.problems[0].rule == "R41"


@examples(50)
@given(
    messages=histories(max_turns=2),
    model=st.sampled_from(MODELS),
    data=st.data(),
    breakage=st.sampled_from(["required", "additionalProperties", *STRICT_UNSUPPORTED]),
)
def test_a_broken_strict_schema_on_beta_is_r32(
    messages: list[Message], model: str, data: st.DataObject, breakage: str
) -> None:
    tools = [copy.deepcopy(t) for t in data.draw(tool_sets(strict=True))]  # the schemas are shared objects
    k = data.draw(st.integers(0, len(tools) - 1))
    parameters = tools[k]["function"]["parameters"]
    if breakage == "required":
        if parameters["required"]:
            parameters["required"].pop()
        else:
            parameters["properties"]["note"] = {"type": "string"}  # a property not listed in required
    elif breakage == "additionalProperties":
        if data.draw(st.booleans()):
            del parameters["additionalProperties"]
        else:
            parameters["additionalProperties"] = data.draw(st.sampled_from([True, {}, None]))
    else:
        parameters[breakage] = 1
    req = {"model": model, "messages": messages, "tools": tools}
    checked = check(req, beta=True)
    assert summary(checked) == [("invalid_parameters_schema", f"tools[{k}].function.parameters")], (
        _explain(checked)
    )
    assert checked.problems[0].rule == "R32"
    off_beta = check(req)  # U11: accepted and not enforced off /beta; forwarded with a warning
    assert off_beta.ok and [w.code for w in off_beta.warnings] == ["strict_not_enforced"], _explain(off_beta)


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
        "model": draw(st.sampled_from([*MODELS, ""]) | json_values),
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
    ctx = ChatContext(profile, known, pol.options, False, is_thinking(req, profile, known), pol,
                      index_messages(req.messages), None)
    reported = sorted((p.code, p.param or "", p.message) for p in rule_tool_sequence(req, ctx))
    detailed = sorted((p.code, p.param or "", p.message)
                      for p in _tool_block(req.messages, 1, ids, 2 + len(answers), ctx,
                                   range(2, 2 + len(answers))))
    assert reported == detailed

"""Builders for realistic chat-completions requests, and a `check` helper over `chatgate.openai.rules`.

Messages are plain dicts, exactly what an SDK puts on the wire, so tests read like the JSON a client
sends. `check(...)` serialises the request and runs the real `check_body` on the bytes.
"""

from __future__ import annotations

import json
from typing import Any

from chatgate.errors import Problem
from chatgate.openai.rules import Checked, check_body
from chatgate.rules.kernel import CheckOptions
from chatgate.rules.models import Policy

Message = dict[str, Any]

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the internal documentation.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


# --- messages ----------------------------------------------------------------------


def system(text: str = "You are a concise assistant for the ops team.", **extra: Any) -> Message:
    return {"role": "system", "content": text, **extra}


def user(text: str = "What's the weather in Paris?", **extra: Any) -> Message:
    return {"role": "user", "content": text, **extra}


def assistant(text: str | None = "It is 18 °C and sunny in Paris.", **extra: Any) -> Message:
    return {"role": "assistant", "content": text, **extra}


def call(call_id: str, name: str = "get_weather", arguments: Any = None) -> dict[str, Any]:
    """One entry of `tool_calls`, with `arguments` a JSON *string* as DeepSeek returns it."""
    args = json.dumps({"city": "Paris", "unit": "c"}) if arguments is None else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def calls(*calls_: dict[str, Any], content: str | None = None, reasoning: str | None = "I should look it up.",
          **extra: Any) -> Message:
    """An assistant turn that calls tools; `reasoning=None` leaves `reasoning_content` out."""
    msg: Message = {"role": "assistant", "content": content, "tool_calls": list(calls_), **extra}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def tool(call_id: str, content: Any = '{"temp_c": 18, "sky": "sunny"}', **extra: Any) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content, **extra}


def image_part(url: str = "https://example.com/cat.png", **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def text_part(text: str = "What is in this picture?") -> dict[str, Any]:
    return {"type": "text", "text": text}


# --- whole conversations -------------------------------------------------------------


def weather_round(call_id: str = "call_w1") -> list[Message]:
    """user asks, assistant calls get_weather, tool answers, assistant replies."""
    return [user(), calls(call(call_id)), tool(call_id), assistant()]


def parallel_round(ids: list[str], answer_order: list[str] | None = None) -> list[Message]:
    """One assistant turn with parallel calls, answered in `answer_order` (default: reversed)."""
    order = answer_order if answer_order is not None else list(reversed(ids))
    cities = ["Paris", "Oslo", "Lima", "Kyoto", "Accra", "Perth"]
    return [
        user("Compare the weather in " + ", ".join(cities[: len(ids)]) + "."),
        calls(*(call(cid, arguments=json.dumps({"city": cities[n % 6], "unit": "c"}))
                for n, cid in enumerate(ids)), content=""),
        *(tool(cid, json.dumps({"city_call": cid, "temp_c": 10 + n})) for n, cid in enumerate(order)),
        assistant("Paris is warmest today."),
    ]


def chat_history(n_messages: int) -> list[Message]:
    """A plain user/assistant chat of exactly `n_messages` messages (system prompt first)."""
    msgs: list[Message] = [system()]
    while len(msgs) < n_messages:
        n = len(msgs)
        msgs.append(user(f"Question {n}: how do I rotate the logs on host {n}?") if n % 2 else
                    assistant(f"Answer {n}: run logrotate -f /etc/logrotate.d/app on host {n - 1}."))
    return msgs


def agent_history(n_messages: int, tool_pairs: int) -> list[Message]:
    """An agent transcript of `n_messages` messages containing `tool_pairs` call/result pairs.

    Tool rounds (assistant with tool_calls + its results) alternate with user/assistant chat; every
    tool-call turn carries `reasoning_content` as thinking mode requires (R17).
    """
    msgs: list[Message] = [system("You are an SRE agent. Use the tools.")]
    pairs = 0
    round_no = 0
    while pairs < tool_pairs:
        round_no += 1
        width = min(1 + round_no % 3, tool_pairs - pairs)  # 1-3 parallel calls
        ids = [f"call_{round_no}_{k}" for k in range(width)]
        msgs.append(user(f"Step {round_no}: check the disks on db-{round_no}."))
        msgs.append(calls(*(call(cid, "search_docs", json.dumps({"query": f"disk db-{round_no} {k}"}))
                            for k, cid in enumerate(ids)),
                          content="" if round_no % 2 else None,
                          reasoning=f"Round {round_no}: query the docs."))
        msgs.extend(tool(cid, f"disk {cid}: 61% used") for cid in reversed(ids))
        msgs.append(assistant(f"db-{round_no} disks are fine.", reasoning_content="All under 80%."))
        pairs += width
    while len(msgs) < n_messages:
        n = len(msgs)
        last = msgs[-1]["role"]
        msgs.append(user(f"Follow-up {n}?") if last == "assistant" else assistant(f"Reply {n}."))
    assert len(msgs) == n_messages, (len(msgs), n_messages)
    return msgs


def request(messages: list[Message], model: str = "deepseek-flash", **params: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **params}


# --- checking ---------------------------------------------------------------------------


# A model DeepSeek serves that chatgate has no profile for (validation.extra_models): the general rules only
EXTRA_MODEL = "acme-unknown-model"


def policy(*, strict: bool = False, unknown_models: str = "reject", legacy: bool = False) -> Policy:
    return Policy(options=CheckOptions(strict=strict, unknown_models=unknown_models,  # type: ignore[arg-type]
                                       legacy_reasoner_rules=legacy), extra_models=frozenset({EXTRA_MODEL}))


def check(req: dict[str, Any] | bytes, *, strict: bool = False, unknown_models: str = "reject",
          legacy: bool = False, beta: bool = False, origin: str | None = None) -> Checked:
    body = req if isinstance(req, bytes) else json.dumps(req).encode()
    return check_body(body, policy(strict=strict, unknown_models=unknown_models, legacy=legacy), beta=beta,
                      origin=origin)


def summary(checked: Checked) -> list[tuple[str, str | None]]:
    return [(p.code, p.param) for p in checked.problems]


def assert_valid(checked: Checked) -> None:
    assert checked.problems == [], "\n".join(f"{p.code} {p.param}: {p.message}" for p in checked.problems)


def only_warning(checked: Checked, code: str, param: str | None, rule: str | None = None) -> Problem:
    """Valid, with exactly one warning of this code and param (and rule, when given)."""
    assert_valid(checked)
    assert [(w.code, w.param) for w in checked.warnings] == [(code, param)]
    warning = checked.warnings[0]
    assert warning.warning
    if rule is not None:
        assert warning.rule == rule
    return warning


def only_problem(checked: Checked, code: str, param: str | None, rule: str | None = None) -> Problem:
    """Exactly one problem, with this code and param (and rule, when given)."""
    assert summary(checked) == [(code, param)], "\n".join(f"{p.code} {p.param}: {p.message}"
                                                          for p in checked.problems)
    problem = checked.problems[0]
    if rule is not None:
        assert problem.rule == rule
    return problem


def says(problem: Problem, *fragments: str) -> None:
    """The message contains every fragment (index, role, how to fix...)."""
    for fragment in fragments:
        assert fragment in problem.message, f"{fragment!r} not in {problem.message!r}"

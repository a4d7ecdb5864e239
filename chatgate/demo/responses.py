"""The fake DeepSeek's native Responses API: `POST /responses` (and `/v1/responses`).

Answers like api.deepseek.com does since 2026-07-31 (docs/rules-responses.md), written from
the spec, never from the product (no `chatgate` import):

- validation with DeepSeek's texts where they are known (docs/rules-responses.md, its 400s): `missing field
`call_id``,
  `No tool call found for tool output with call_id …`, `No tool output found for tool call …` (strict
  adjacency: the outputs of a batch of calls must follow it directly), ``The `reasoning_text` in the thinking
  mode must be passed back to the API.`` (thinking mode with tools, a turn that calls without a reasoning item
  with non-empty content before it), `The supported API model names are deepseek-flash, deepseek-v4-pro, but
  you passed …`; the fake's own words where DeepSeek's are unknown (a custom tool other than apply_patch,
  web_search forced without the tool, images in system/assistant messages). What the spec says DeepSeek
  ignores is accepted (unknown fields and item types, previous_response_id, store, include, …);
- deterministic answers: a `function_call` (after a `reasoning` item in thinking mode) when function tools are
  defined and the last input item is a user message; else a `message` with `output_text` ("the tool said …"
  after a function_call_output); `max_output_tokens` cuts the answer (`status: incomplete`);
- the event stream: `event:` + `data:` lines with a `sequence_number`, response.created, .in_progress,
  .output_item.added/done, .content_part.added/done, .reasoning_text.delta/done, .output_text.delta/done,
  .function_call_arguments.delta/done, then .completed (or .incomplete) carrying the whole response; no
  `data: [DONE]`;
- usage: input_tokens (= body length / 4 + 1) with input_tokens_details.cached_tokens (a third),
  output_tokens (one per piece) with output_tokens_details.reasoning_tokens.

Bookkeeping as on the other routes: `RecordedRequest.usage` holds the Responses usage as sent plus the chat
route's names for the same counts (prompt_tokens = input_tokens, prompt_cache_hit_tokens = cached_tokens,
prompt_cache_miss_tokens = input - cached, completion_tokens = output_tokens, total_tokens,
completion_tokens_details.reasoning_tokens); once the usage reached the client, `FakeState.issued_usage` per
key grows by those (shared with chat) and by `responses_requests`, `input_tokens`, `cached_tokens`,
`output_tokens`. Faults (`x-fake-fault`, `FakeState.fault`), keep-alives and delays work as for chat;
`error_mid_stream` ends the stream with `response.failed`; the header `x-fake-terminal: none` leaves out the
terminal event (as early DeepSeek streams sometimes did); `x-fake-served-model: NAME` answers under another
model name (as a route that maps names would). Tool loops follow `FakeState.tool_rounds` / `tool_name` /
`tool_arguments` (`ToolScript`). `FakeDeepSeek.route()` sends these paths here.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from chatgate.demo.deepseek import (
    HTML_GARBAGE,
    INVALID,
    STREAM_FAULTS,
    Conn,
    Event,
    FakeState,
    RecordedRequest,
    ToolScript,
    auth_error,
    error_bytes,
    header_float,
    random_tool_call_id,
    split_pieces,
    with_server_tool_use,
)
from chatgate.demo.rules import DESERIALIZE, SAFETY_LEVELS, USER_ID_MAX_BYTES, Deserializer, Refused, kind
from chatgate.demo.server_tools import WebUse, responses_items, title_for, usage_field, wants_title, web_use

if TYPE_CHECKING:
    from chatgate.demo.deepseek import FakeDeepSeek

PATHS = frozenset({"/responses", "/v1/responses"})
MODELS = ("deepseek-flash", "deepseek-v4-pro")
LEGACY_MODELS = ("deepseek-v4-flash", "deepseek-v4-flash-vision-exp")  # still accepted (NEWS-260910)
MAX_OUTPUT = 393_216  # 384K
ROLES = ("user", "assistant", "system", "developer")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
              "custom_tool_call_output", "web_search_call")
CALLS = ("function_call", "custom_tool_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")
ASSISTANT_SIDE = ("reasoning", "web_search_call", *CALLS)
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
REASONING_MISSING = "The `reasoning_text` in the thinking mode must be passed back to the API."
TOOL_ARGUMENT_PIECES = ('{"q', '": "', 'x"}')  # the arguments {"q": "x"}, one output token each
RESPONSES_SUM_KEYS = ("input_tokens", "cached_tokens", "output_tokens")


# ---------------------------------------------------------------------------------------------- validation


def responses_error(body: Any, size: int = 0) -> str | None:
    """DeepSeek's 400 message for this /responses body, or None if it would accept it."""
    try:
        deserialize(Deserializer(f"at line 1 column {max(size, 1)}"), body)
        semantics(body)
    except Refused as refused:
        return str(refused)
    return None


def item_type(item: dict[str, Any]) -> str:
    value = item.get("type")
    return value if isinstance(value, str) else "message"


def deserialize(d: Deserializer, body: Any) -> None:
    top = d.mapping("", body)
    if "model" not in top:
        raise d.missing("", "model")
    d.string("model", top["model"])
    value = top.get("input")
    if isinstance(value, list):
        for i, item in enumerate(value):
            deserialize_item(d, f"input[{i}]", item)
    elif value is not None and not isinstance(value, str):
        raise d.wrong("input", value, "a string or a sequence of input items")
    for name in ("stream", "background"):
        d.boolean(name, top.get(name))
    for name in ("temperature", "top_p"):
        number = top.get(name)
        if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float))):
            raise d.wrong(name, number, "f64")
    for name in ("max_output_tokens", "top_logprobs"):
        number = top.get(name)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise d.wrong(name, number, "u32")
    for name in ("user", "instructions"):
        if top.get(name) is not None and not isinstance(top[name], (str, list)):
            raise d.wrong(name, top[name], "a string")
    tools = top.get("tools")
    for k, tool in enumerate(d.sequence("tools", tools) if tools is not None else ()):
        tool = d.mapping(f"tools[{k}]", tool)
        if "type" not in tool:
            raise d.missing(f"tools[{k}]", "type")
        d.string(f"tools[{k}].type", tool["type"])
        if tool["type"] in ("function", "custom"):
            if "name" not in tool:
                raise d.missing(f"tools[{k}]", "name")
            d.string(f"tools[{k}].name", tool["name"])
    choice = top.get("tool_choice")
    if choice is not None and not isinstance(choice, str):
        d.mapping("tool_choice", choice, "a string or a map")
    reasoning = top.get("reasoning")
    if reasoning is not None:
        d.string("reasoning.effort", d.mapping("reasoning", reasoning).get("effort"), nullable=True)
    check = top.get("safety_check")
    level = d.mapping("safety_check", check).get("level") if check is not None else None
    if level is not None and level not in SAFETY_LEVELS:  # 2026-11
        if not isinstance(level, str):
            raise d.wrong("safety_check.level", level, "variant identifier")
        raise d.fail("safety_check.level", f"unknown variant `{level}`, expected `high` or `low`")


def deserialize_item(d: Deserializer, path: str, value: Any) -> None:
    item = d.mapping(path, value)
    if "type" not in item and "role" not in item:
        raise d.missing(path, "type")
    d.string(f"{path}.type", item.get("type", "message"))
    kind_ = item_type(item)
    if kind_ == "message":
        if "role" not in item:
            raise d.missing(path, "role")
        d.variant(f"{path}.role", item["role"], ROLES)
        if "content" not in item:
            raise d.missing(path, "content")
        content = item["content"]
        if not isinstance(content, (str, list)):
            raise d.wrong(f"{path}.content", content, "a string or a sequence of content parts")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            deserialize_part(d, f"{path}.content[{j}]", part)
    elif kind_ in CALLS:
        for name in ("call_id", "name", "arguments" if kind_ == "function_call" else "input"):
            if name not in item:
                raise d.missing(path, name)
            d.string(f"{path}.{name}", item[name])
    elif kind_ in OUTPUTS:
        if "call_id" not in item:
            raise d.missing(path, "call_id")
        d.string(f"{path}.call_id", item["call_id"])
        output = item.get("output")
        if not isinstance(output, (str, list)):
            raise d.wrong(f"{path}.output", output, "a string or a sequence of content parts")
        for j, part in enumerate(output if isinstance(output, list) else ()):
            deserialize_part(d, f"{path}.output[{j}]", part)
    elif kind_ == "reasoning":
        content = item.get("content")
        for j, part in enumerate(d.sequence(f"{path}.content", content) if content is not None else ()):
            part = d.mapping(f"{path}.content[{j}]", part)
            if "text" not in part:
                raise d.missing(f"{path}.content[{j}]", "text")
            d.string(f"{path}.content[{j}].text", part["text"])


def deserialize_part(d: Deserializer, path: str, value: Any) -> None:
    part = d.mapping(path, value)
    if "type" not in part:
        raise d.missing(path, "type")
    d.string(f"{path}.type", part["type"])
    if part["type"] in ("input_text", "output_text"):
        if "text" not in part:
            raise d.missing(path, "text")
        d.string(f"{path}.text", part["text"])


def is_thinking(body: dict[str, Any]) -> bool:
    """Thinking is on by default on every model; reasoning.effort "none" turns it off."""
    reasoning = body.get("reasoning")
    return not (isinstance(reasoning, dict) and reasoning.get("effort") == "none")


def known_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The items DeepSeek reads: a string is one user message; unknown item types are ignored."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        return []
    return [item for item in value if item_type(item) in ITEM_TYPES]


def semantics(body: dict[str, Any]) -> None:
    model = body["model"]
    if model not in MODELS + LEGACY_MODELS:
        raise Refused(f"The supported API model names are {', '.join(MODELS)}, but you passed {model}.")
    user = body.get("user")  # since 2026-11 the character set is only recommended; the length is the limit
    if isinstance(user, str) and len(user.encode("utf-8", "surrogatepass")) > USER_ID_MAX_BYTES:
        raise Refused("Invalid 'user': at most 512 UTF-8 bytes.")
    ranges = [("top_logprobs", 0, 20), ("max_output_tokens", 1, MAX_OUTPUT)]
    if not is_thinking(body):  # without effect in thinking mode
        ranges += [("temperature", 0, 2), ("top_p", 0, 1)]
    for name, lo, hi in ranges:
        value = body.get(name)
        if value is not None and not lo <= value <= hi:
            raise Refused(f"Invalid '{name}': expected a value in [{lo}, {hi}], got {value}.")
    tools_semantics(body)
    items = known_items(body)
    images(items)
    sequence(items, thinking=is_thinking(body) and bool(body.get("tools")))


def tools_semantics(body: dict[str, Any]) -> None:
    tools = body.get("tools") or []
    names: set[str] = set()
    for k, tool in enumerate(tools):
        if tool["type"] == "function":
            if not FUNCTION_NAME.fullmatch(tool["name"]) or tool["name"] in names:
                raise Refused(f"Invalid 'tools[{k}].name': function names must match '^[a-zA-Z0-9_-]+$', be "
                              "at most 128 characters and unique.")
            names.add(tool["name"])
        elif tool["type"] == "custom" and tool["name"] != "apply_patch":
            raise Refused(f"Unsupported custom tool '{tool['name']}': only apply_patch is supported.")
    choice = body.get("tool_choice")
    forced = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(forced, str) and forced.startswith("web_search") and not any(
            str(t["type"]).startswith("web_search") for t in tools):
        raise Refused("tool_choice web_search requires the web_search tool in 'tools'.")
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise Refused(f"{DESERIALIZE} tool_choice: unknown variant `{choice}`, expected one of `none`, "
                      "`auto`, `required`")


def images(items: list[dict[str, Any]]) -> None:
    for item in items:
        content = item.get("content") if item_type(item) == "message" else None
        if item.get("role") in ("system", "assistant") and isinstance(content, list) and any(
                isinstance(p, dict) and p.get("type") == "input_image" for p in content):
            raise Refused(f"Images are not supported in {item['role']} messages.")


def sequence(items: list[dict[str, Any]], thinking: bool) -> None:
    """Calls and outputs pair up by strict adjacency; thinking turns that call carry their reasoning."""
    seen: set[str] = set()
    pending: list[str] = []  # the calls of the last batch, not answered yet
    in_outputs = False
    for n, item in enumerate(items):
        kind_ = item_type(item)
        if kind_ in CALLS:
            call_id = item["call_id"]
            if not call_id:
                raise Refused("Invalid call_id: it must be a non-empty string.")
            if call_id in seen:
                raise Refused(f"Duplicate call_id {call_id}: call ids must be unique.")
            if in_outputs and pending:
                raise Refused(f"No tool output found for tool call {pending[0]}")
            if not pending and thinking and not reasoning_before(items, n):
                raise Refused(REASONING_MISSING)
            seen.add(call_id)
            pending = [*pending, call_id] if not in_outputs else [call_id]
            in_outputs = False
        elif kind_ in OUTPUTS:
            call_id = item["call_id"]
            if call_id not in pending:
                raise Refused(f"No tool call found for tool output with call_id {call_id}")
            pending.remove(call_id)
            in_outputs = True
        else:
            if pending:
                raise Refused(f"No tool output found for tool call {pending[0]}")
            in_outputs = False
    if pending:
        raise Refused(f"No tool output found for tool call {pending[0]}")


def reasoning_before(items: list[dict[str, Any]], n: int) -> bool:
    """A reasoning item with text in the assistant turn before items[n]."""
    for item in reversed(items[:n]):
        kind_ = item_type(item)
        if kind_ == "reasoning":
            content = item.get("content")
            if isinstance(content, list) and any(isinstance(p, dict) and p.get("text") for p in content):
                return True
        elif not (kind_ in ASSISTANT_SIDE or (kind_ == "message" and item.get("role") == "assistant")):
            return False
    return False


# ---------------------------------------------------------------------------------------------- answers


@dataclass
class OutItem:
    """One output item the fake model "generates"; one piece = one output token (function_call: +1)."""

    type: str  # reasoning | message | function_call | server (a server tool's item, whole in `payload`)
    pieces: list[str]
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    call_id: str = ""
    name: str = ""
    payload: dict[str, Any] | None = None

    @property
    def tokens(self) -> int:
        return len(self.pieces) + (self.type == "function_call")

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class ResponsePlan:
    items: list[OutItem]
    incomplete: bool = False
    web: WebUse | None = None  # the server web tools it ran (chatgate.demo.server_tools)
    title: str | None = None  # with title: {"enabled": true}

    @property
    def completion_tokens(self) -> int:  # the name `FakeDeepSeek.nonstream` reads
        return sum(item.tokens for item in self.items)

    @property
    def reasoning_tokens(self) -> int:
        return sum(item.tokens for item in self.items if item.type == "reasoning")


def calls_since_user(items: list[dict[str, Any]]) -> int:
    """The tool rounds since the last user message: its calls (the fake makes one call a round)."""
    done = 0
    for item in reversed(items):
        if item_type(item) == "message" and item.get("role") == "user":
            break
        done += item_type(item) in CALLS
    return done


def wanted_function(body: dict[str, Any], last: dict[str, Any], items: list[dict[str, Any]] | None = None,
                    script: ToolScript | None = None) -> str | None:
    """The function the model calls: after a user message, or after the outputs of fewer rounds than the
    script's; the forced one, else the script's or the first function tool."""
    script = script or ToolScript()
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list) or choice == "none":
        return None
    user_turn = item_type(last) == "message" and last.get("role") == "user"
    if not user_turn and not (item_type(last) in OUTPUTS and calls_since_user(items or []) < script.rounds):
        return None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return str(choice["name"])
    return script.pick([str(t["name"]) for t in tools if isinstance(t, dict) and t.get("type") == "function"])


def output_text(output: Any) -> str:
    if isinstance(output, list):
        return " ".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return str(output)


def answer_text(body: dict[str, Any], n: int, last: dict[str, Any]) -> str:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return f'{{"answer": "Answer {n}", "ok": true}}'
    if item_type(last) in OUTPUTS:
        return f"Answer {n}: the tool said {output_text(last.get('output'))}"
    return f"Answer {n}: the fake DeepSeek says hello."


def make_plan(body: dict[str, Any], script: ToolScript | None = None) -> ResponsePlan:
    items = known_items(body)
    last = items[-1] if items else {}
    n = len(items)
    thinking = split_pieces(f"The user sent {n} items; I will answer.") if is_thinking(body) else []
    script = script or ToolScript()
    function = wanted_function(body, last, items, script)
    title = title_for(output_text(items[0].get("content")) if items else "") if wants_title(body) else None
    if function is not None:
        call = OutItem("function_call", script.pieces(), call_id=random_tool_call_id(),
                       name=function)
        return ResponsePlan([OutItem("reasoning", thinking), call] if thinking else [call], title=title)
    user_turn = item_type(last) == "message" and last.get("role") == "user"
    web = web_use(body.get("tools"), output_text(last.get("content")) if user_turn else None)
    searched = [OutItem("server", [], payload=item) for item in responses_items(web)] if web else []
    text = split_pieces(answer_text(body, n, last))
    asked = body.get("max_output_tokens")
    limit = asked if isinstance(asked, int) and not isinstance(asked, bool) else len(thinking) + len(text)
    incomplete = limit < len(thinking) + len(text)
    if incomplete:
        thinking = thinking[:limit]
        text = text[:max(limit - len(thinking), 0)]
    plan = [OutItem("reasoning", thinking)] if thinking else []
    plan += searched
    return ResponsePlan([*plan, OutItem("message", text)] if text else plan, incomplete, web, title)


def make_usage(raw_body: bytes, plan: ResponsePlan, cached: tuple[int, int] | None = None) -> dict[str, Any]:
    prompt, hit = cached if cached is not None else (len(raw_body) // 4 + 1, (len(raw_body) // 4 + 1) // 3)
    output = plan.completion_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": hit}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
            "total_tokens": prompt + output, **(usage_field(plan.web) if plan.web is not None else {})}


def recorded_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """`usage` plus the chat route's names for the same counts (see the module docstring)."""
    prompt, hit = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    reasoning = usage["output_tokens_details"]["reasoning_tokens"]
    return {
        **usage, "cached_tokens": hit, "prompt_tokens": prompt, "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"], "prompt_cache_hit_tokens": hit,
        "prompt_cache_miss_tokens": prompt - hit,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def item_json(item: OutItem, encrypted: bool, done: bool = True) -> dict[str, Any]:
    if item.payload is not None:
        return item.payload if done else {**item.payload, "status": "in_progress"}
    status = "completed" if done else "in_progress"
    if item.type == "reasoning":
        out: dict[str, Any] = {"id": f"rs_{item.id}", "type": "reasoning", "summary": [],
                               "content": [{"type": "reasoning_text", "text": item.text}] if done else [],
                               "status": status}
        if encrypted:
            # DeepSeek's shape (docs/rules-responses.md)
            out["encrypted_content"] = f"{uuid.UUID(int=int(item.id, 16))}-0"
        return out
    if item.type == "function_call":
        return {"id": f"fc_{item.id}", "type": "function_call", "call_id": item.call_id, "name": item.name,
                "arguments": item.text if done else "", "status": status}
    content = [{"type": "output_text", "text": item.text, "annotations": [], "logprobs": []}] if done else []
    return {"id": f"msg_{item.id}", "type": "message", "role": "assistant", "status": status,
            "content": content}


def response_json(response_id: str, body: dict[str, Any], plan: ResponsePlan, usage: dict[str, Any] | None,
                  status: str | None = None) -> dict[str, Any]:
    encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
    final = status is None
    status = status or ("incomplete" if plan.incomplete else "completed")
    asked = body.get("reasoning")
    reasoning: dict[str, Any] = asked if isinstance(asked, dict) else {}
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if plan.incomplete and final else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"], "output": [item_json(i, encrypted) for i in plan.items] if final else [],
        "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": reasoning.get("effort"), "summary": None}, "store": False,
        "temperature": body.get("temperature", 1.0), "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": "disabled", "usage": usage if final else None,
        "user": None, "metadata": {},
        **({"title": plan.title} if plan.title is not None and final else {}),
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- streaming


class Sequencer:
    def __init__(self) -> None:
        self.n = 0

    def event(self, payload: dict[str, Any], tokens: int = 0, usage: bool = False) -> Event:
        data = {"type": payload["type"], "sequence_number": self.n, **payload}
        self.n += 1
        return Event(b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n",
                     tokens=tokens, carries_usage=usage)


def stream_events(response_id: str, body: dict[str, Any], plan: ResponsePlan, usage: dict[str, Any]
                  ) -> list[Event]:
    seq = Sequencer()
    encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
    start = response_json(response_id, body, plan, None, "in_progress")
    events = [seq.event({"type": "response.created", "response": start}),
              seq.event({"type": "response.in_progress", "response": start})]
    for index, item in enumerate(plan.items):
        events += item_events(seq, index, item, encrypted)
    final = response_json(response_id, body, plan, usage)
    kind_ = "response.incomplete" if plan.incomplete else "response.completed"
    events.append(seq.event({"type": kind_, "response": final}, usage=True))
    return events


def item_events(seq: Sequencer, index: int, item: OutItem, encrypted: bool) -> list[Event]:
    started = item_json(item, encrypted, done=False)
    item_id = started["id"]
    where = {"item_id": item_id, "output_index": index}
    events = [seq.event({"type": "response.output_item.added", "output_index": index, "item": started},
                        tokens=int(item.type == "function_call"))]
    if item.type == "server":
        pass  # added, then done: the fake's stand-in has no events of its own
    elif item.type == "function_call":
        for piece in item.pieces:
            payload = {"type": "response.function_call_arguments.delta", **where, "delta": piece}
            events.append(seq.event(payload, tokens=1))
        events.append(seq.event({"type": "response.function_call_arguments.done", **where,
                                 "arguments": item.text}))
    else:
        reasoning = item.type == "reasoning"
        part = {"type": "reasoning_text", "text": ""} if reasoning else {
            "type": "output_text", "text": "", "annotations": [], "logprobs": []}
        delta = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        done = "response.reasoning_text.done" if reasoning else "response.output_text.done"
        extra: dict[str, Any] = {} if reasoning else {"logprobs": []}
        events.append(seq.event({"type": "response.content_part.added", **where, "content_index": 0,
                                 "part": part}))
        for piece in item.pieces:
            events.append(seq.event({"type": delta, **where, "content_index": 0, "delta": piece, **extra},
                                    tokens=1))
        events.append(seq.event({"type": done, **where, "content_index": 0, "text": item.text, **extra}))
        events.append(seq.event({"type": "response.content_part.done", **where, "content_index": 0,
                                 "part": {**part, "text": item.text}}))
    events.append(seq.event({"type": "response.output_item.done", "output_index": index,
                             "item": item_json(item, encrypted)}))
    return events


# ---------------------------------------------------------------------------------------------- the route


def parse_body(raw: bytes, validate: bool) -> tuple[dict[str, Any] | None, str | None]:
    """(body, None) or (None, DeepSeek's 400 message)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"Failed to parse the request body as JSON: {exc}"
    if not isinstance(body, dict):
        return None, f"{DESERIALIZE} invalid type: {kind(body)}, expected a map at line 1 column 1"
    problem = responses_error(body, len(raw)) if validate else None
    if problem is None and "model" not in body:  # validation off: still needs a model to answer
        body["model"] = "deepseek-flash"
    return (None, problem) if problem else (body, None)


def note_responses_totals(state: FakeState, rec: RecordedRequest) -> None:
    """After `FakeState.note_usage_sent` (the chat-named per-key totals): the Responses-named ones."""
    if rec.usage is None:
        return
    with state._lock:
        totals = state.issued_usage.setdefault(rec.auth_key or "", {"requests": 0})
        totals["responses_requests"] = totals.get("responses_requests", 0) + 1
        for key in RESPONSES_SUM_KEYS:
            totals[key] = totals.get(key, 0) + int(rec.usage[key])


async def serve(app: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    """Entry point from `FakeDeepSeek.route()` for the Responses paths (any method)."""
    denied = auth_error(rec.headers, app.state)
    if denied is not None:
        await app.send_error(rec, conn, 401, denied)
    elif rec.method != "POST":
        await app.send_error(rec, conn, 405, error_bytes("Method Not Allowed", INVALID))
    else:
        await respond(app, rec, conn)


async def respond(app: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    await app.fault_or_answer(rec, conn, lambda fault: answer(app, rec, conn, fault))


async def answer(app: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    body, problem = app.state.changed_mind(rec.body, *parse_body(rec.body, app.state.validate))
    if body is None:
        rec.refused = problem
        await app.send_error(rec, conn, 400, error_bytes(problem or "Invalid request", INVALID))
        return
    if served := rec.headers.get("x-fake-served-model"):  # the model DeepSeek says it served, for a test
        body = {**body, "model": served}
    plan = make_plan(body, ToolScript.of(app.state))
    usage = with_server_tool_use(make_usage(rec.body, plan, app.state.cached(rec, "responses", body)), rec)
    rec.usage = recorded_usage(usage)
    rec.status = 200
    response_id = f"resp_{uuid.uuid4().hex}"
    if fault == "non_json_200":
        rec.outcome = "completed"
        await conn.respond(200, HTML_GARBAGE, "text/html; charset=utf-8")
    elif rec.stream:
        events = stream_events(response_id, body, plan, usage)
        # as early streams did (docs/rules-responses.md): no response.completed
        if rec.headers.get("x-fake-terminal") == "none":
            events = events[:-1]
        failed = response_json(response_id, body, plan, None, "failed")
        await stream(app.state, rec, conn, events, fault, failed)
    else:
        data = orjson.dumps(response_json(response_id, body, plan, usage))
        await app.nonstream(rec, conn, data, plan, fault)  # type: ignore[arg-type]  # duck-typed plan
        if rec.usage_sent:  # it ran FakeState.note_usage_sent
            note_responses_totals(app.state, rec)


async def stream(state: FakeState, rec: RecordedRequest, conn: Conn, events: list[Event], fault: str | None,
                 failed: dict[str, Any]) -> None:
    delay = header_float(rec.headers, "x-fake-chunk-delay", state.chunk_delay)
    cut_at = min(state.fault_after_chunks, len(events) - 2) if fault in STREAM_FAULTS else -1
    await conn.start(200, {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"})
    for index in range(state.keepalive_count):
        if index and await conn.sleep(delay):
            rec.outcome = "client_disconnected"
            return
        await conn.body(b": keep-alive\n\n")
    for index, event in enumerate(events):
        if index == cut_at and await stream_fault(state, rec, conn, fault, index, failed):
            return
        if await conn.sleep(delay if index or state.keepalive_count else 0):
            rec.outcome = "client_disconnected"
            return
        await conn.body(event.data, more=index < len(events) - 1)
        rec.completion_tokens_sent += event.tokens
        if event.carries_usage:
            state.note_usage_sent(rec)
            note_responses_totals(state, rec)
    rec.outcome = "completed"


async def stream_fault(state: FakeState, rec: RecordedRequest, conn: Conn, fault: str | None, index: int,
                       failed: dict[str, Any]) -> bool:
    """Apply a mid-stream fault; True if the stream is over."""
    if fault == "reset_mid_stream":
        rec.outcome = "reset"  # returning without more_body=False makes uvicorn drop the connection
        return True
    if fault == "error_mid_stream":  # a documented terminal event
        failed = {**failed, "error": {"code": "server_error", "message": "Internal Server Error"}}
        payload = {"type": "response.failed", "sequence_number": index, "response": failed}
        await conn.body(b"event: response.failed\ndata: " + orjson.dumps(payload) + b"\n\n", more=False)
        rec.outcome = "stream_error"
        return True
    if await conn.sleep(header_float(rec.headers, "x-fake-delay", state.hang_seconds)):
        rec.outcome = "client_disconnected"
        return True
    return False

"""The fake DeepSeek's Anthropic-format route: `POST /anthropic/v1/messages` (and `/anthropic/messages`).

Answers like api.deepseek.com/anthropic does (docs/rules-anthropic.md): a `message`
object with a UUID id, the model DeepSeek served, thinking blocks signed with the message id, DeepSeek's
usage (`input_tokens` excludes cache reads); or, with `stream: true`, named SSE events and no `[DONE]`. Bodies
DeepSeek refuses get its 400 in its OpenAI-style envelope (`chatgate.demo.anthropic_rules`). Everything else
works as on the chat route: `RecordedRequest`s, the `x-fake-*` headers and `FakeState` faults, keep-alives,
chunk delays, disconnects. `FakeDeepSeek.route()` sends these paths here.

Auth: `Authorization: Bearer` wins over `x-api-key` (DOC-msg); `anthropic-version` / `anthropic-beta` are
ignored. Two headers of the fake's own shape the stream: `x-fake-ping: 0` leaves out the `ping` event and
`x-fake-signature-delta: 0` the thinking block's `signature_delta` (whether DeepSeek sends them varies:
docs/rules-anthropic.md).

Usage bookkeeping: `RecordedRequest.usage` holds the Anthropic usage as sent (`input_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`, `output_tokens`), the same counts under the chat
route's names (`prompt_tokens` = input + cache reads, `prompt_cache_hit_tokens` = cache reads,
`prompt_cache_miss_tokens` = input, `completion_tokens` = output, `total_tokens`, `completion_tokens_details.
reasoning_tokens` = 0 as this route does not break them out) and `thinking_tokens` (the fake's own count of
the thinking pieces inside `output_tokens`, never on the wire). Once the usage reached the client, the
per-key totals in `FakeState.issued_usage` grow by the chat-named counts (shared with the chat route) and by
`anthropic_requests`, `input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`,
`output_tokens`, `thinking_tokens`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from chatgate.demo.anthropic_rules import anthropic_error, blocks, is_thinking, served_model
from chatgate.demo.deepseek import (
    DEFAULT_TOOL_PIECES,
    HTML_GARBAGE,
    INVALID,
    STREAM_FAULTS,
    Conn,
    Event,
    FakeState,
    RecordedRequest,
    ToolScript,
    auth_error,
    bearer_key,
    error_bytes,
    header_float,
    random_tool_call_id,
    split_pieces,
    with_server_tool_use,
)
from chatgate.demo.rules import DESERIALIZE, kind
from chatgate.demo.server_tools import WebUse, anthropic_blocks, title_for, usage_field, wants_title, web_use

if TYPE_CHECKING:
    from chatgate.demo.deepseek import FakeDeepSeek

# The paths `FakeDeepSeek.route()` sends here (a query string such as Claude Code's `?beta=true` is not
# part of an ASGI path).
PATHS = frozenset({"/anthropic/v1/messages", "/anthropic/messages"})
ANTHROPIC_SUM_KEYS = (
    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens",
    "thinking_tokens",
)  # fmt: skip
TOOL_INPUT_PIECES = DEFAULT_TOOL_PIECES  # the tool input {"q": "x"}, one output token each
STREAM_ERROR = {"type": "error", "error": {"type": "api_error", "message": "Internal Server Error"}}


# ---------------------------------------------------------------------------------------------- auth


def api_key(headers: dict[str, str]) -> str | None:
    """The key DeepSeek reads: `Authorization: Bearer` if present, else `x-api-key`."""
    bearer = bearer_key(headers)
    return bearer if bearer is not None else headers.get("x-api-key")


def key_error(key: str | None, state: FakeState) -> bytes | None:
    """The chat route's 401 logic (`auth_error`) applied to the key found either way."""
    return auth_error({} if key is None else {"authorization": f"Bearer {key}"}, state)


# ---------------------------------------------------------------------------------------------- answers


@dataclass
class Block:
    """One content block the fake model "generates"; one piece = one output token (tool_use: +1)."""

    type: str  # thinking | text | tool_use | server (the server tools' blocks, whole in `payload`)
    pieces: list[str]
    id: str = ""
    name: str = ""
    payload: dict[str, Any] | None = None

    @property
    def tokens(self) -> int:
        return len(self.pieces) + (self.type == "tool_use")

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class MessagePlan:
    blocks: list[Block] = field(default_factory=list)
    stop_reason: str = "end_turn"
    web: WebUse | None = None  # the server web tools it ran (chatgate.demo.server_tools)
    title: str | None = None  # with title: {"enabled": true}

    @property
    def completion_tokens(self) -> int:  # the name `FakeDeepSeek.nonstream` reads
        return sum(block.tokens for block in self.blocks)

    @property
    def thinking_tokens(self) -> int:
        return sum(block.tokens for block in self.blocks if block.type == "thinking")


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def tool_rounds_done(messages: list[Any]) -> int:
    """The tool rounds since the user's last own message (one without tool results): its assistant turns."""
    done = 0
    for message in reversed(messages):
        if not isinstance(message, dict):
            continue
        if message.get("role") == "user" and not any(b.get("type") == "tool_result" for b in blocks(message)):
            break
        done += message.get("role") == "assistant"
    return done


def wanted_tool(body: dict[str, Any], last: dict[str, Any], script: ToolScript | None = None) -> str | None:
    """The tool the model calls: the forced one, else the script's or the first client tool, when the last
    message is a user's (its text, or tool results on fewer rounds than the script's) and tools are defined;
    None for a text answer."""
    script = script or ToolScript()
    tools, choice = body.get("tools"), body.get("tool_choice")
    choice = choice if isinstance(choice, dict) else {}
    answering = any(block.get("type") == "tool_result" for block in blocks(last))
    if not isinstance(tools, list) or last.get("role") != "user" or choice.get("type") == "none":
        return None
    if answering and tool_rounds_done(body.get("messages") or []) >= script.rounds:
        return None
    if choice.get("type") == "tool" and isinstance(choice.get("name"), str):
        return str(choice["name"])
    names = [str(tool["name"]) for tool in tools if isinstance(tool, dict)
             and tool.get("type") in (None, "custom") and isinstance(tool.get("name"), str)]
    return script.pick(names)


def answer_text(messages: list[Any], last: dict[str, Any]) -> str:
    results = [result_text(block) for block in blocks(last) if block.get("type") == "tool_result"]
    if last.get("role") == "user" and results:
        return f"Answer {len(messages)}: the tool said {' '.join(results)}"
    return f"Answer {len(messages)}: the fake DeepSeek says hello."


def make_plan(body: dict[str, Any], script: ToolScript | None = None) -> MessagePlan:
    raw_messages = body.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    last: dict[str, Any] = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    thinking = (
        split_pieces(f"The user sent {len(messages)} messages; I will answer.") if is_thinking(body) else []
    )
    script = script or ToolScript()
    tool_name = wanted_tool(body, last, script)
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    opening = " ".join(str(b.get("text", "")) for b in blocks(first)) or str(first.get("content", ""))
    title = title_for(opening) if wants_title(body) else None
    if tool_name is not None:
        call = Block("tool_use", script.pieces(), random_tool_call_id(), tool_name)
        return MessagePlan([Block("thinking", thinking), call] if thinking else [call], "tool_use",
                           title=title)
    own = last.get("role") == "user" and not any(b.get("type") == "tool_result" for b in blocks(last))
    words = " ".join(str(b.get("text", "")) for b in blocks(last)) or str(last.get("content", ""))
    web = web_use(body.get("tools"), words if own else None)
    searched = [Block("server", [], payload=b) for b in anthropic_blocks(web)] if web is not None else []
    text = split_pieces(answer_text(messages, last))
    stop_reason = "end_turn"
    max_tokens = body.get("max_tokens")  # counts the thinking too
    if (
        isinstance(max_tokens, int)
        and not isinstance(max_tokens, bool)
        and max_tokens < len(thinking) + len(text)
    ):
        budget = max(max_tokens, 0)
        thinking = thinking[:budget]
        text = text[: budget - len(thinking)]
        stop_reason = "max_tokens"
    plan = [Block("thinking", thinking)] if thinking else []
    plan += searched
    return MessagePlan([*plan, Block("text", text)] if text else plan, stop_reason, web, title)


def make_usage(raw_body: bytes, plan: MessagePlan, cached: tuple[int, int] | None = None) -> dict[str, Any]:
    """The usage as DeepSeek sends it on this route: `input_tokens` excludes the cache reads
    (docs/rules-anthropic.md)."""
    prompt, hit = cached if cached is not None else (len(raw_body) // 4 + 1, (len(raw_body) // 4 + 1) // 3)
    return {
        "input_tokens": prompt - hit,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": hit,
        "output_tokens": plan.completion_tokens,
        **(usage_field(plan.web) if plan.web is not None else {}),
    }


def recorded_usage(usage: dict[str, Any], plan: MessagePlan) -> dict[str, Any]:
    """`usage` plus the chat route's names for the same counts (see the module docstring)."""
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    return {
        **usage,
        "prompt_tokens": prompt,
        "completion_tokens": usage["output_tokens"],
        "total_tokens": prompt + usage["output_tokens"],
        "prompt_cache_hit_tokens": usage["cache_read_input_tokens"],
        "prompt_cache_miss_tokens": usage["input_tokens"],
        "completion_tokens_details": {"reasoning_tokens": 0},
        "thinking_tokens": plan.thinking_tokens,
    }


def block_json(block: Block, message_id: str) -> dict[str, Any]:
    if block.payload is not None:
        return block.payload
    if block.type == "thinking":
        return {"type": "thinking", "thinking": block.text, "signature": message_id}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": orjson.loads(block.text)}
    return {"type": "text", "text": block.text}


def message_json(message_id: str, model: str, plan: MessagePlan, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block_json(block, message_id) for block in plan.blocks],
        "stop_reason": plan.stop_reason,
        "stop_sequence": None,
        "usage": usage,
        **({"title": plan.title} if plan.title is not None else {}),  # non-stream: the fake's stand-in
    }


# ---------------------------------------------------------------------------------------------- streaming


def named_sse(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def block_start(block: Block) -> dict[str, Any]:
    if block.payload is not None:
        return block.payload
    if block.type == "thinking":
        # no signature field (docs/rules-anthropic.md, new-api #4762)
        return {"type": "thinking", "thinking": ""}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
    return {"type": "text", "text": ""}


def piece_delta(block: Block, piece: str) -> dict[str, Any]:
    if block.type == "thinking":
        return {"type": "thinking_delta", "thinking": piece}
    if block.type == "tool_use":
        return {"type": "input_json_delta", "partial_json": piece}
    return {"type": "text_delta", "text": piece}


def stream_events(
    message_id: str, model: str, plan: MessagePlan, usage: dict[str, Any], ping: bool, signature: bool
) -> list[Event]:
    empty = message_json(message_id, model, MessagePlan([], ""), {**usage, "output_tokens": 1})
    events = [Event(named_sse({"type": "message_start", "message": {**empty, "stop_reason": None}}))]
    if ping:
        events.append(Event(named_sse({"type": "ping"})))
    for index, block in enumerate(plan.blocks):
        start = {"type": "content_block_start", "index": index, "content_block": block_start(block)}
        events.append(Event(named_sse(start), tokens=int(block.type == "tool_use")))
        for piece in block.pieces:
            delta = {"type": "content_block_delta", "index": index, "delta": piece_delta(block, piece)}
            events.append(Event(named_sse(delta), tokens=1))
        if block.type == "thinking" and signature:
            delta = {"type": "signature_delta", "signature": message_id}
            events.append(Event(named_sse({"type": "content_block_delta", "index": index, "delta": delta})))
        events.append(Event(named_sse({"type": "content_block_stop", "index": index})))
    final: dict[str, Any] = {"stop_reason": plan.stop_reason, "stop_sequence": None}
    if plan.title is not None:
        final["title"] = plan.title  # message_delta.delta.title (guides/conversation_title)
    events.append(
        Event(named_sse({"type": "message_delta", "delta": final, "usage": usage}), carries_usage=True)
    )
    events.append(Event(named_sse({"type": "message_stop"})))
    return events


# ---------------------------------------------------------------------------------------------- the route


def parse_messages_body(raw: bytes, validate: bool) -> tuple[dict[str, Any] | None, str | None]:
    """(body, None) or (None, DeepSeek's 400 message)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"Failed to parse the request body as JSON: {exc}"
    if not isinstance(body, dict):
        return None, f"{DESERIALIZE} invalid type: {kind(body)}, expected a map at line 1 column 1"
    problem = anthropic_error(body, len(raw)) if validate else None
    return (None, problem) if problem else (body, None)


def note_anthropic_totals(state: FakeState, rec: RecordedRequest) -> None:
    """After `FakeState.note_usage_sent` (the chat-named per-key totals): the Anthropic-named ones."""
    if rec.usage is None:
        return
    with state._lock:
        totals = state.issued_usage.setdefault(rec.auth_key or "", {"requests": 0})
        totals["anthropic_requests"] = totals.get("anthropic_requests", 0) + 1
        for key in ANTHROPIC_SUM_KEYS:
            totals[key] = totals.get(key, 0) + int(rec.usage[key])


def header_flag(headers: dict[str, str], name: str) -> bool:
    return headers.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


async def serve_messages(app: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    """Entry point from `FakeDeepSeek.route()` for the Anthropic paths (any method)."""
    rec.auth_key = api_key(rec.headers)
    denied = key_error(rec.auth_key, app.state)
    if denied is not None:
        await app.send_error(rec, conn, 401, denied)
    elif rec.method != "POST":
        await app.send_error(rec, conn, 405, error_bytes("Method Not Allowed", INVALID))
    else:
        await messages(app, rec, conn)


async def messages(app: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    await app.fault_or_answer(rec, conn, lambda fault: answer(app, rec, conn, fault))


async def answer(app: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    body, problem = app.state.changed_mind(rec.body, *parse_messages_body(rec.body, app.state.validate))
    if body is None:
        rec.refused = problem
        await app.send_error(rec, conn, 400, error_bytes(problem or "Invalid request", INVALID))
        return
    plan = make_plan(body, ToolScript.of(app.state))
    usage = with_server_tool_use(make_usage(rec.body, plan, app.state.cached(rec, "anthropic", body)), rec)
    rec.usage = recorded_usage(usage, plan)
    rec.status = 200
    message_id = str(uuid.uuid4())
    sent_model = body.get("model")
    model = served_model(sent_model) or (sent_model if isinstance(sent_model, str) else "deepseek-flash")
    if fault == "non_json_200":
        rec.outcome = "completed"
        await conn.respond(200, HTML_GARBAGE, "text/html; charset=utf-8")
    elif rec.stream:
        ping = header_flag(rec.headers, "x-fake-ping")
        signature = header_flag(rec.headers, "x-fake-signature-delta")
        events = stream_events(message_id, model, plan, usage, ping, signature)
        await stream(app.state, rec, conn, events, fault)
    else:
        data = orjson.dumps(message_json(message_id, model, plan, usage))
        await app.nonstream(rec, conn, data, plan, fault)  # type: ignore[arg-type]  # duck-typed plan
        if rec.usage_sent:  # it ran FakeState.note_usage_sent
            note_anthropic_totals(app.state, rec)


async def stream(
    state: FakeState, rec: RecordedRequest, conn: Conn, events: list[Event], fault: str | None
) -> None:
    delay = header_float(rec.headers, "x-fake-chunk-delay", state.chunk_delay)
    cut_at = min(state.fault_after_chunks, len(events) - 2) if fault in STREAM_FAULTS else -1
    await conn.start(200, {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"})
    for index in range(state.keepalive_count):
        if index and await conn.sleep(delay):
            rec.outcome = "client_disconnected"
            return
        await conn.body(b": keep-alive\n\n")
    for index, event in enumerate(events):
        if index == cut_at and await stream_fault(state, rec, conn, fault):
            return
        if await conn.sleep(delay if index or state.keepalive_count else 0):
            rec.outcome = "client_disconnected"
            return
        await conn.body(event.data, more=index < len(events) - 1)
        rec.completion_tokens_sent += event.tokens
        if event.carries_usage:
            state.note_usage_sent(rec)
            note_anthropic_totals(state, rec)
    rec.outcome = "completed"


async def stream_fault(state: FakeState, rec: RecordedRequest, conn: Conn, fault: str | None) -> bool:
    """Apply a mid-stream fault; True if the stream is over."""
    if fault == "reset_mid_stream":
        rec.outcome = "reset"  # returning without more_body=False makes uvicorn drop the connection
        return True
    # DeepSeek's in-stream error is unknown (docs/rules-anthropic.md): Anthropic's shape
    if fault == "error_mid_stream":
        await conn.body(named_sse(STREAM_ERROR), more=False)
        rec.outcome = "stream_error"
        return True
    if await conn.sleep(header_float(rec.headers, "x-fake-delay", state.hang_seconds)):
        rec.outcome = "client_disconnected"
        return True
    return False

"""The fake DeepSeek's FIM completions (`POST /beta/completions`) and account balance (`GET /user/balance`).

Written from docs/rules-fim.md and DeepSeek's FIM reference (DOC-fim, api/create-completion), never from
the product (nothing from chatgate/ is imported). `FakeDeepSeek.route` hands these paths to `serve`.

FIM bodies are checked the way DeepSeek's deserializer and FIM rules would (`fim_error`): types first
("Failed to deserialize the JSON body into the target type: …"), then the documented limits with
DeepSeek-style texts (`Invalid max_tokens value, the valid range of max_tokens is [1, 4096]`). Fields the
FIM reference does not have (`thinking`, `reasoning_effort`, …) are unknown fields: accepted, ignored.
The deprecated penalties "will not take effect": accepted whatever they are.

The answer is deterministic: `text` is `middle(prompt, suffix)`, which names their lengths (the prompt
before it with `echo`), one token per word; `max_tokens` cuts it (finish_reason `length`). Streams are
`text_completion` chunks, usage on the last one (or, with `usage_mode = "separate_when_asked"`, in a
separate chunk only when `include_usage` is asked), then `data: [DONE]`. Faults, delays, keep-alives and
the records work as for chat (`x-fake-fault`, `FakeState`).
"""

from __future__ import annotations

from typing import Any

import orjson

from chatgate.demo.deepseek import (
    HTML_GARBAGE,
    INVALID,
    Conn,
    Event,
    FakeDeepSeek,
    Plan,
    RecordedRequest,
    auth_error,
    error_bytes,
    response_base,
    split_pieces,
    sse,
)
from chatgate.demo.rules import DESERIALIZE, STREAM_OPTIONS, Deserializer, Refused, kind, model_served

FIM_PATHS = frozenset({"/beta/completions"})
BALANCE_PATHS = frozenset({"/user/balance", "/v1/user/balance"})
PATHS = FIM_PATHS | BALANCE_PATHS
BALANCE = {
    "is_available": True,
    "balance_infos": [{"currency": "USD", "total_balance": "110.00", "granted_balance": "10.00",
                       "topped_up_balance": "100.00"}],
}  # fmt: skip
MAX_TOKENS = 4096  # "The max tokens of FIM completion is 4K"
LOGPROBS_MAX = 20
STOP_MAX = 16


def middle(prompt: str, suffix: str) -> str:
    """What the fake model puts between the prompt and the suffix."""
    return (f"    # the fake DeepSeek fills the middle here: {len(prompt)} characters before, "
            f"{len(suffix)} after")


async def serve(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    """A FIM or balance request that reached the fake (after recording)."""
    expected = "GET" if rec.path in BALANCE_PATHS else "POST"
    denied = auth_error(rec.headers, fake.state)
    if rec.method != expected:
        await fake.send_error(rec, conn, 405, error_bytes("Method Not Allowed", INVALID))
    elif denied is not None:
        await fake.send_error(rec, conn, 401, denied)
    elif rec.path in BALANCE_PATHS:
        infos = [{**BALANCE["balance_infos"][0], "currency": fake.state.balance_currency}]  # type: ignore[index]
        await fake.send_json(rec, conn, 200, orjson.dumps({**BALANCE, "balance_infos": infos}))
    else:
        await fim(fake, rec, conn)


async def fim(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    """As `FakeDeepSeek.chat`: the request's fault first, then the answer."""
    await fake.fault_or_answer(rec, conn, lambda fault: answer(fake, rec, conn, fault))


async def answer(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    body, problem = fake.state.changed_mind(rec.body, *parse_fim_body(rec.body, fake.state.validate))
    if body is None:
        rec.refused = problem
        await fake.send_error(rec, conn, 400, error_bytes(problem or "Invalid request", INVALID))
        return
    prompt, suffix = _text(body, "prompt"), _text(body, "suffix")
    pieces = split_pieces(middle(prompt, suffix))
    max_tokens = body.get("max_tokens")
    finish = "stop"
    if isinstance(max_tokens, int) and max_tokens < len(pieces):
        pieces, finish = pieces[:max_tokens], "length"
    echoed = prompt if body.get("echo") is True else ""
    rec.usage = fim_usage(rec.body, len(pieces))
    rec.status = 200
    if fault == "non_json_200":
        rec.outcome = "completed"
        await conn.respond(200, HTML_GARBAGE, "text/html; charset=utf-8")
    elif rec.stream:
        events = fim_events(body, echoed, pieces, finish, rec.usage, fake.state.usage_mode)
        await fake.stream(rec, conn, events, fault)
    else:
        data = orjson.dumps(fim_body(body, echoed + "".join(pieces), finish, rec.usage))
        await fake.nonstream(rec, conn, data, Plan(False, [], pieces, None, finish), fault)


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    return value if isinstance(value, str) else ""


def fim_usage(raw_body: bytes, completion: int) -> dict[str, Any]:
    """DeepSeek's FIM usage fields (DOC-fim): prompt = cache hit + cache miss, total = prompt + completion."""
    prompt = len(raw_body) // 4 + 1
    hit = prompt // 3
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "prompt_cache_hit_tokens": hit,
        "prompt_cache_miss_tokens": prompt - hit,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def fim_body(body: dict[str, Any], text: str, finish: str, usage: dict[str, Any]) -> dict[str, Any]:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    return {**response_base(body, "text_completion"), "choices": [choice], "usage": usage}


def fim_events(body: dict[str, Any], echoed: str, pieces: list[str], finish: str, usage: dict[str, Any],
               usage_mode: str) -> list[Event]:
    """One `text_completion` chunk per token; the last chunk (empty text, the finish reason) carries usage."""
    base = response_base(body, "text_completion")
    options = body.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    extra: dict[str, Any] = {"usage": None} if asked else {}  # "null on every chunk except the last one"

    def chunk(text: str, finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return {**base, "choices": [choice], **extra}

    events = [Event(sse(chunk(echoed)))] if echoed else []
    events += [Event(sse(chunk(piece)), tokens=1) for piece in pieces]
    final = chunk("", finish)
    if usage_mode != "separate_when_asked":
        events.append(Event(sse({**final, "usage": usage}), carries_usage=True))
    else:
        events.append(Event(sse(final)))
        if asked:
            events.append(Event(sse({**base, "choices": [], "usage": usage}), carries_usage=True))
    return events


# ------------------------------------------------------------------------------------------- validation


def parse_fim_body(raw: bytes, validate: bool) -> tuple[dict[str, Any] | None, str | None]:
    """(body, None) or (None, DeepSeek's 400 message)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"Failed to parse the request body as JSON: {exc}"
    if not isinstance(body, dict):
        return None, f"{DESERIALIZE} invalid type: {kind(body)}, expected a map at line 1 column 1"
    problem = fim_error(body, len(raw)) if validate else None
    return (None, problem) if problem else (body, None)


def fim_error(body: dict[str, Any], size: int = 0) -> str | None:
    """DeepSeek's 400 message for this FIM body, or None if it would accept it."""
    check = Deserializer(f"at line 1 column {max(size, 1)}")
    try:
        for name, value in body.items():
            field_check = FIELD_CHECKS.get(name)
            if field_check is not None:
                field_check(check, name, value)
        for name in ("model", "prompt"):
            if name not in body:
                raise check.missing("", name)
        limits(body)
        model_served(body)
    except Refused as refused:
        return str(refused)
    return None


def _string(check: Deserializer, name: str, value: Any) -> None:
    check.string(name, value)


def _nullable_string(check: Deserializer, name: str, value: Any) -> None:
    check.string(name, value, nullable=True)


def _boolean(check: Deserializer, name: str, value: Any) -> None:
    check.boolean(name, value)


def _unsigned(check: Deserializer, name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise check.wrong(name, value, "u32")


def _number(check: Deserializer, name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise check.wrong(name, value, "f32")


def _stop(check: Deserializer, name: str, value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise check.fail(name, "data did not match any variant of untagged enum Stop")


def _stream_options(check: Deserializer, name: str, value: Any) -> None:
    check.stream_options(value)


FIELD_CHECKS = {
    "model": _string, "prompt": _string, "suffix": _nullable_string, "echo": _boolean, "logprobs": _unsigned,
    "max_tokens": _unsigned, "stop": _stop, "stream": _boolean, "stream_options": _stream_options,
    "temperature": _number, "top_p": _number,
}  # fmt: skip


def limits(body: dict[str, Any]) -> None:
    """The documented limits, after deserialization (the types are right here)."""
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise Refused(STREAM_OPTIONS)
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise Refused(f"Invalid max_tokens value, the valid range of max_tokens is [1, {MAX_TOKENS}]")
    logprobs = body.get("logprobs")
    if logprobs is not None and logprobs > LOGPROBS_MAX:
        raise Refused(f"Invalid logprobs value, the valid range of logprobs is [0, {LOGPROBS_MAX}]")
    stop = body.get("stop")
    if isinstance(stop, list) and len(stop) > STOP_MAX:
        raise Refused(f"Invalid stop value, up to {STOP_MAX} stop sequences are supported")
    for name, top in (("temperature", 2), ("top_p", 1)):
        value = body.get(name)
        if value is not None and not 0 <= value <= top:
            raise Refused(f"Invalid {name} value, the valid range of {name} is [0, {top}]")

"""Tests of the fake DeepSeek itself, over real loopback HTTP, with httpx2 and the openai SDK."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam, ChatCompletionToolParam

from tests.fakes.deepseek import FakeState
from tests.fakes.server import RunningFake, run_fake_deepseek, spawn_fake_deepseek

KEY = "sk-test-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(server: RunningFake) -> Iterator[RunningFake]:
    server.state.reset()
    yield server
    server.state.wait_idle(5)
    server.state.reset()


@pytest.fixture
def client(fake: RunningFake) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.url, api_key=KEY, max_retries=0, timeout=10) as sdk:
        yield sdk


@pytest.fixture
def http(fake: RunningFake) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=fake.url, headers=AUTH, timeout=10) as raw:
        yield raw


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "messages": USER, **extra}


def sse_payloads(text: str) -> list[Any]:
    events = [event for event in text.split("\n\n") if event.startswith("data: ")]
    return [event[6:] if event == "data: [DONE]" else orjson.loads(event[6:]) for event in events]


# ------------------------------------------------------------------------------------------ answers


def test_nonstreaming_text_with_reasoning_and_usage(client: openai.OpenAI, fake: RunningFake) -> None:
    result = client.chat.completions.create(model="deepseek-flash", messages=USER)
    choice = result.choices[0]
    assert result.object == "chat.completion"
    assert result.system_fingerprint
    assert choice.finish_reason == "stop"
    assert choice.message.content == "Answer 1: the fake DeepSeek says hello."
    assert getattr(choice.message, "reasoning_content", "")
    usage = result.model_dump()["usage"]
    assert usage["prompt_tokens"] == usage["prompt_cache_hit_tokens"] + usage["prompt_cache_miss_tokens"]
    assert usage["prompt_cache_hit_tokens"] > 0 and usage["prompt_cache_miss_tokens"] > 0
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_cache_hit_tokens"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert fake.state.issued_usage[KEY]["total_tokens"] == usage["total_tokens"]


def test_same_request_gives_same_usage(http: httpx2.Client) -> None:
    first, second = (http.post("/chat/completions", json=chat()).json() for _ in range(2))
    assert first["usage"] == second["usage"]
    assert first["choices"] == second["choices"]


def test_thinking_disabled_has_no_reasoning(http: httpx2.Client) -> None:
    body = http.post("/v1/chat/completions", json=chat(thinking={"type": "disabled"})).json()
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    legacy = http.post("/chat/completions", json=chat(model="deepseek-chat")).json()
    assert "reasoning_content" not in legacy["choices"][0]["message"]


def test_tool_call_answer(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(model="deepseek-flash", messages=USER, tools=TOOLS)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content in ("", None)
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_00_") and call.type == "function"
    assert call.function.name == "search"
    assert orjson.loads(call.function.arguments) == {"q": "x"}


def test_tool_result_is_mentioned(http: httpx2.Client) -> None:
    call = {"id": "call_00_a", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    messages = [
        *USER,
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_00_a", "content": "sunny and warm"},
    ]
    body = http.post("/chat/completions", json=chat(messages=messages, tools=TOOLS)).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "sunny and warm" in body["choices"][0]["message"]["content"]


def test_max_tokens_gives_length(http: httpx2.Client) -> None:
    body = http.post("/chat/completions", json=chat(max_tokens=2, thinking={"type": "disabled"})).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_models(client: openai.OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert ids == ["deepseek-flash", "deepseek-v4-pro"]


def test_bad_body_gets_deepseek_400(http: httpx2.Client) -> None:
    missing = http.post("/chat/completions", json={"model": "deepseek-flash"})
    assert missing.status_code == 400
    assert "missing field `messages`" in missing.json()["error"]["message"]
    options = http.post("/chat/completions", json=chat(stream_options={"include_usage": True}))
    assert options.json()["error"]["message"] == "stream_options should be set along with stream = true"


# ------------------------------------------------------------------------------------------ auth


def test_missing_and_bad_keys(fake: RunningFake) -> None:
    missing = httpx2.post(f"{fake.url}/chat/completions", json=chat())
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    bad = openai.OpenAI(base_url=fake.url, api_key="sk-bad-abcd", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model="deepseek-flash", messages=USER)
    assert caught.value.body == {
        "message": "Authentication Fails, Your api key: ****abcd is invalid",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_request_error",
    }


def test_valid_keys_restriction(fake: RunningFake, http: httpx2.Client) -> None:
    fake.state.configure(valid_keys=["sk-other"])
    assert http.post("/chat/completions", json=chat()).status_code == 401


# ------------------------------------------------------------------------------------------ streaming


def test_stream_arrives_chunk_by_chunk(client: openai.OpenAI, fake: RunningFake) -> None:
    fake.state.configure(chunk_delay=0.05)
    stream = client.chat.completions.create(model="deepseek-flash", messages=USER, stream=True)
    arrivals, chunks = [], []
    for chunk in stream:
        arrivals.append(time.monotonic())
        chunks.append(chunk.model_dump())
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([piece for piece in content if piece]) >= 3
    assert "".join(piece or "" for piece in content) == "Answer 1: the fake DeepSeek says hello."
    assert arrivals[-1] - arrivals[0] > 0.2  # ~15 chunks, 0.05 s apart: not one burst
    assert len({round(t, 2) for t in arrivals}) > len(arrivals) // 2


def test_stream_wire_format(http: httpx2.Client) -> None:
    text = http.post("/chat/completions", json=chat(stream=True)).text
    assert text.startswith(": keep-alive\n\n")
    assert text.endswith("data: [DONE]\n\n")
    payloads = sse_payloads(text)
    assert payloads[-1] == "[DONE]"
    first, last = payloads[0], payloads[-2]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None, "reasoning_content": ""}
    assert last["choices"][0]["delta"] == {"content": ""}
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["usage"]["completion_tokens"] > 0  # usage although include_usage was not asked
    assert all("usage" not in p for p in payloads[:-2])
    assert len({p["id"] for p in payloads[:-1]}) == 1


def test_stream_usage_matches_nonstream(http: httpx2.Client) -> None:
    nonstream = http.post("/chat/completions", json=chat(stream=False)).json()["usage"]
    streamed = sse_payloads(http.post("/chat/completions", json=chat(stream=True)).text)[-2]["usage"]
    assert streamed["completion_tokens"] == nonstream["completion_tokens"]
    assert streamed["prompt_tokens"] in range(nonstream["prompt_tokens"] - 2, nonstream["prompt_tokens"] + 3)


def test_streamed_tool_call_fragments(http: httpx2.Client) -> None:
    payloads = sse_payloads(http.post("/chat/completions", json=chat(stream=True, tools=TOOLS)).text)
    fragments = [
        p["choices"][0]["delta"]["tool_calls"][0]
        for p in payloads[:-1]
        if "tool_calls" in p["choices"][0]["delta"]
    ]
    assert fragments[0]["id"].startswith("call_00_") and fragments[0]["function"]["name"] == "search"
    assert all("id" not in f and "name" not in f["function"] for f in fragments[1:])
    assert len(fragments) >= 3 and {f["index"] for f in fragments} == {0}
    assert orjson.loads("".join(f["function"]["arguments"] for f in fragments)) == {"q": "x"}
    assert payloads[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_separate_usage_chunk_mode(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(usage_mode="separate_when_asked")
    asked = sse_payloads(
        http.post("/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})).text
    )
    assert asked[-2]["choices"] == [] and asked[-2]["usage"]["total_tokens"] > 0
    assert all(p["usage"] is None for p in asked[:-2])
    assert asked[-3]["choices"][0]["finish_reason"] == "stop"
    silent = sse_payloads(http.post("/chat/completions", json=chat(stream=True)).text)
    assert all("usage" not in p for p in silent[:-1])
    assert fake.state.requests[-1].usage_sent is False


def test_openai_sees_usage_in_both_modes(client: openai.OpenAI, fake: RunningFake) -> None:
    for mode in ("last_chunk", "separate_when_asked"):
        fake.state.configure(usage_mode=mode)
        stream = client.chat.completions.create(
            model="deepseek-flash",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]
        assert len(usages) == 1 and usages[0].total_tokens > 0


def test_nonstream_keepalive_lines(client: openai.OpenAI, fake: RunningFake, http: httpx2.Client) -> None:
    fake.state.configure(nonstream_keepalive_lines=3)
    assert http.post("/chat/completions", json=chat()).text.startswith("\n\n\n{")
    result = client.chat.completions.create(model="deepseek-flash", messages=USER)
    assert result.choices[0].message.content


def test_client_disconnect_is_recorded(fake: RunningFake) -> None:
    headers = {**AUTH, "x-fake-chunk-delay": "0.05", "x-request-id": "req-cut"}
    with httpx2.stream(
        "POST", f"{fake.url}/chat/completions", headers=headers, json=chat(stream=True)
    ) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 5:
                break
    assert fake.state.wait_idle(5)
    (entry,) = fake.state.issued_report()["requests"]
    assert entry["request_id"] == "req-cut" and entry["outcome"] == "client_disconnected"
    assert entry["cut_short"] and not entry["usage_sent"]
    assert 0 < entry["completion_tokens_sent"] < entry["usage"]["completion_tokens"]
    assert KEY not in fake.state.issued_usage


# ------------------------------------------------------------------------------------------ faults

STATUS_FAULTS = [
    ("http_500", openai.InternalServerError, 500),
    ("http_503", openai.InternalServerError, 503),
    ("http_429", openai.RateLimitError, 429),
    ("http_402", openai.APIStatusError, 402),
    ("http_401", openai.AuthenticationError, 401),
    ("http_400", openai.BadRequestError, 400),
    ("http_422", openai.UnprocessableEntityError, 422),
]


@pytest.mark.parametrize(("fault", "error", "status"), STATUS_FAULTS)
def test_status_faults(
    client: openai.OpenAI, fault: str, error: type[openai.APIStatusError], status: int
) -> None:
    with pytest.raises(error) as caught:
        client.chat.completions.create(
            model="deepseek-flash",
            messages=USER,
            extra_headers={"x-fake-fault": fault},
        )
    assert caught.value.status_code == status
    assert type(caught.value) is error or status == 402


def test_error_bodies_are_deepseeks(http: httpx2.Client, fake: RunningFake) -> None:
    balance = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_402"})
    assert balance.headers["content-type"] == "application/json"
    assert balance.json() == {
        "error": {
            "message": "Insufficient Balance",
            "type": "unknown_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    limited = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_429"})
    assert "exceeds your concurrency limit" in limited.json()["error"]["message"]
    fake.state.configure(error_content_type="application/octet-stream")
    risky = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_400"})
    assert risky.headers["content-type"] == "application/octet-stream"
    assert orjson.loads(risky.content)["error"]["message"] == "Content Exists Risk"


def test_global_fault_with_count(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(fault="http_500", fault_count=1)
    assert http.post("/chat/completions", json=chat()).status_code == 500
    assert http.post("/chat/completions", json=chat()).status_code == 200
    assert (
        http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_503"}).status_code == 503
    )


def test_reset_mid_stream_raises(client: openai.OpenAI, fake: RunningFake) -> None:
    stream = client.chat.completions.create(
        model="deepseek-flash",
        messages=USER,
        stream=True,
        extra_headers={"x-fake-fault": "reset_mid_stream"},
    )
    received: list[ChatCompletionChunk] = []
    with pytest.raises((httpx2.TransportError, openai.APIError)):
        received.extend(stream)
    assert len(received) == 3
    assert fake.state.wait_idle(5)
    rec = fake.state.requests[-1]
    assert rec.outcome == "reset" and rec.completion_tokens_sent == 2 and not rec.usage_sent


def test_reset_mid_nonstream_body(http: httpx2.Client) -> None:
    with pytest.raises(httpx2.TransportError):
        http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "reset_mid_stream"})


def test_error_mid_stream_raises_api_error(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="deepseek-flash",
        messages=USER,
        stream=True,
        extra_headers={"x-fake-fault": "error_mid_stream"},
    )
    with pytest.raises(openai.APIError):
        list(stream)


def test_stall_mid_stream_times_out(fake: RunningFake) -> None:
    headers = {**AUTH, "x-fake-fault": "stall_mid_stream"}
    timeout = httpx2.Timeout(5, read=0.3)
    with (
        pytest.raises(httpx2.ReadTimeout),
        httpx2.stream(
            "POST", f"{fake.url}/chat/completions", headers=headers, json=chat(stream=True), timeout=timeout
        ) as response,
    ):
        for _ in response.iter_raw():
            pass
    assert fake.state.wait_idle(5)
    rec = fake.state.requests[-1]
    assert rec.outcome == "client_disconnected" and rec.completion_tokens_sent == 2


def test_short_stall_resumes(http: httpx2.Client) -> None:
    headers = {"x-fake-fault": "stall_mid_stream", "x-fake-delay": "0.1"}
    text = http.post("/chat/completions", json=chat(stream=True), headers=headers).text
    assert text.endswith("data: [DONE]\n\n")


def test_no_headers_times_out(fake: RunningFake) -> None:
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(
            f"{fake.url}/chat/completions",
            headers={**AUTH, "x-fake-fault": "no_headers"},
            json=chat(),
            timeout=httpx2.Timeout(5, read=0.3),
        )
    assert fake.state.wait_idle(5)
    assert fake.state.requests[-1].outcome == "client_disconnected"


def test_slow_then_normal(http: httpx2.Client) -> None:
    response = http.post(
        "/chat/completions", json=chat(), headers={"x-fake-fault": "slow", "x-fake-delay": "0.2"}
    )
    assert response.status_code == 200 and response.json()["choices"]


def test_non_json_200(http: httpx2.Client) -> None:
    response = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "non_json_200"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


# ------------------------------------------------------------------------------------------ records


def test_records_what_reached_it(http: httpx2.Client, fake: RunningFake) -> None:
    body = orjson.dumps(chat(user_id="u1"))
    headers = {"content-type": "application/json", "x-request-id": "req-1", "x-custom": "yes"}
    http.post("/beta/chat/completions", content=body, headers=headers)
    (rec,) = fake.state.requests
    assert (rec.method, rec.path, rec.body, rec.auth_key) == ("POST", "/beta/chat/completions", body, KEY)
    assert rec.headers["x-custom"] == "yes" and rec.request_id == "req-1"
    assert rec.json["user_id"] == "u1"
    assert rec.completed and rec.usage_sent and rec.usage is not None
    assert fake.state.issued_usage[KEY]["prompt_tokens"] == rec.usage["prompt_tokens"]


def test_control_endpoints_in_process(http: httpx2.Client, fake: RunningFake) -> None:
    assert (
        http.post("/_fake/config", json={"chunk_delay": 0.01, "fault": "http_429"}).json()["fault"]
        == "http_429"
    )
    assert http.post("/chat/completions", json=chat()).status_code == 429
    assert http.post("/_fake/config", json={"nope": 1}).status_code == 400
    assert http.post("/_fake/config", json={"fault": "nope"}).status_code == 400
    (entry,) = http.get("/_fake/requests").json()
    assert entry["status"] == 429 and entry["fault"] == "http_429"
    http.post("/_fake/reset")
    assert http.get("/_fake/requests").json() == []
    assert http.get("/_fake/config").json()["fault"] is None


def test_control_endpoints_in_separate_process() -> None:
    with spawn_fake_deepseek("--keepalive-count", "2") as fake:
        fake.control.config(usage_mode="separate_when_asked")
        sdk = openai.OpenAI(base_url=fake.url, api_key=KEY, max_retries=0, timeout=10)
        result = sdk.chat.completions.create(
            model="deepseek-flash",
            messages=USER,
            extra_headers={"x-request-id": "req-sep"},
        )
        stream = sdk.chat.completions.create(model="deepseek-flash", messages=USER, stream=True)
        assert all(chunk.usage is None for chunk in stream)
        first, second = fake.control.requests(wait_idle=2)
        assert orjson.loads(base64.b64decode(first["body_b64"])) == first["json"]
        assert first["json"]["messages"] == USER and first["headers"]["x-request-id"] == "req-sep"
        issued = fake.control.issued()
        assert result.usage is not None
        assert issued["per_key"][KEY]["total_tokens"] == result.usage.total_tokens
        assert issued["requests"][0]["request_id"] == "req-sep" and issued["requests"][0]["completed"]
        assert second["stream"] and not second["usage_sent"]
        fake.control.reset()
        assert fake.control.requests() == [] and fake.control.config()["keepalive_count"] == 2


def test_state_rejects_unknown_fault() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        FakeState(fault="explode")

"""FIM completions end to end: the real openai SDK (sync, async, streaming) -> chatgate on loopback ->
the fake DeepSeek's `/beta/completions`. Valid requests arrive byte for byte and are metered like chat
under the route `/beta/completions`; invalid ones are refused locally (one per F-rule) and never reach the
fake; `/v1/completions` is a 404 that says FIM is on /beta."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.demo.fim import middle
from chatgate.gateway.auth import fingerprint
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.fim.test_fim import INVALID, fim_body, raw
from tests.gateway.conftest import _read_usage, usage_rows
from tests.gateway.test_streaming import CHUNK_DELAY, assert_spread_over_time, data_events
from tests.harness import RunningChatgate, make_settings, run_chatgate, unreachable_url
from tests.metering.helpers import wait_for

KEY = "sk-fim-client-0001"
PROMPT = "def fib(a):"
SUFFIX = "    return fib(a-1) + fib(a-2)"
MIDDLE = middle(PROMPT, SUFFIX)
FIM = "/beta/completions"


class Sent:
    """The bytes the SDK put on the wire (an httpx2 request event hook)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def hook(self, request: httpx2.Request) -> None:
        if request.url.path.endswith("/completions"):
            self.bodies.append(request.read())

    async def ahook(self, request: httpx2.Request) -> None:
        self.hook(request)


def post(gate: RunningChatgate, body: dict[str, Any] | bytes, path: str = FIM, key: str | None = KEY,
         **headers: str) -> httpx2.Response:
    sent = {"content-type": "application/json", **headers}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    return httpx2.post(gate.url + path, content=raw(body), headers=sent, timeout=10)


def assert_forwarded_verbatim(fake: RunningFake, sent: Sent) -> None:
    assert fake.state.wait_idle(5)
    assert sent.bodies, "the SDK sent nothing"
    assert [r.body for r in fake.state.requests] == sent.bodies
    assert {r.path for r in fake.state.requests} == {FIM}


@pytest.fixture(params=["/beta", "/v1/beta"])
def base_url(request: pytest.FixtureRequest, gate: RunningChatgate) -> str:
    """DeepSeek's documented base (…/beta) and the /v1 spelling."""
    return gate.url + str(request.param)


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def sdk(base_url: str, sent: Sent) -> Iterator[openai.OpenAI]:
    http = httpx2.Client(event_hooks={"request": [sent.hook]}, timeout=20)
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, http_client=http) as client:
        yield client


# ------------------------------------------------------------------------------------------- happy paths


def test_sync_fim_completion(sdk: openai.OpenAI, fake: RunningFake, sent: Sent, tmp_path: Path) -> None:
    reply = sdk.completions.create(model="deepseek-flash", prompt=PROMPT, suffix=SUFFIX, max_tokens=128)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == MIDDLE and reply.choices[0].finish_reason == "stop"
    assert_forwarded_verbatim(fake, sent)
    (row,) = usage_rows(tmp_path, 1)
    usage = fake.state.requests[0].usage
    assert reply.usage is not None and usage is not None
    assert (row["route"], row["model"], row["outcome"], row["tokens_exact"], row["stream"]) == (
        FIM, "deepseek-flash", "ok", 1, 0)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (reply.usage.prompt_tokens,
                                                                reply.usage.completion_tokens)
    assert (row["prompt_cache_hit_tokens"], row["prompt_cache_miss_tokens"]) == (
        usage["prompt_cache_hit_tokens"], usage["prompt_cache_miss_tokens"])
    assert row["key_id"] == fingerprint(KEY) and row["cost_picousd"] > 0


def test_sync_streaming(sdk: openai.OpenAI, fake: RunningFake, sent: Sent, tmp_path: Path) -> None:
    chunks = list(sdk.completions.create(model="deepseek-v4-pro", prompt=PROMPT, suffix=SUFFIX,
                                         max_tokens=64, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == MIDDLE
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(MIDDLE.split())
    assert_forwarded_verbatim(fake, sent)
    (row,) = usage_rows(tmp_path, 1)
    assert (row["route"], row["model"], row["stream"], row["tokens_exact"]) == (FIM, "deepseek-v4-pro", 1, 1)
    assert row["completion_tokens"] == chunks[-1].usage.completion_tokens


def test_async_client_plain_and_streaming(fake: RunningFake, sent: Sent, base_url: str) -> None:
    async def completions() -> tuple[str, str]:
        http = httpx2.AsyncClient(event_hooks={"request": [sent.ahook]}, timeout=20)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, http_client=http) as c:
            reply = await c.completions.create(model="deepseek-flash", prompt=PROMPT, suffix=SUFFIX)
            stream = await c.completions.create(model="deepseek-flash", prompt=PROMPT, suffix=SUFFIX,
                                                stream=True, stream_options={"include_usage": True})
            streamed = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
            return reply.choices[0].text, streamed

    assert asyncio.run(completions()) == (MIDDLE, MIDDLE)
    assert_forwarded_verbatim(fake, sent)


def test_max_tokens_echo_and_unknown_fields_go_through(sdk: openai.OpenAI, fake: RunningFake,
                                                       sent: Sent) -> None:
    reply = sdk.completions.create(model="deepseek-flash", prompt=PROMPT, suffix=SUFFIX, max_tokens=3,
                                   echo=True, stop=["\n\n"], temperature=0.2, top_p=0.9, logprobs=5,
                                   extra_body={"x_editor": {"file": "fib.py"}, "frequency_penalty": "off"})
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].text == PROMPT + "    # the fake", "echo: the prompt, then 3 tokens"
    assert_forwarded_verbatim(fake, sent)
    assert fake.state.requests[0].json["x_editor"] == {"file": "fib.py"}


def test_stream_is_relayed_event_by_event_and_byte_for_byte(gate: RunningChatgate, fake: RunningFake) -> None:
    fake.state.configure(chunk_delay=CHUNK_DELAY)
    received = b""
    arrivals: list[float] = []
    body = fim_body(prompt=PROMPT, suffix=SUFFIX, stream=True, echo=True)
    with httpx2.Client(timeout=10) as client, client.stream(
            "POST", gate.url + FIM, content=orjson.dumps(body),
            headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for piece in response.iter_raw():
            received += piece
            events = sum(block.startswith(b"data: {") for block in received.split(b"\n\n")[:-1])
            arrivals += [time.monotonic()] * (events - len(arrivals))
    rec = fake.state.requests[0]
    assert received == bytes(rec.sent), "the client got exactly the bytes DeepSeek sent"
    assert received.endswith(b"data: [DONE]\n\n") and b": keep-alive" in received
    assert {e["object"] for e in data_events(received)} == {"text_completion"}
    assert_spread_over_time(arrivals)


# ------------------------------------------------------------------------------------------- metering


def test_stream_without_usage_is_estimated_from_the_text(gate: RunningChatgate, fake: RunningFake,
                                                         tmp_path: Path) -> None:
    """An upstream that sends usage only when asked, and nobody asked: counted locally, flagged estimated."""
    fake.state.configure(usage_mode="separate_when_asked")
    response = post(gate, fim_body(prompt=PROMPT, suffix=SUFFIX, stream=True))
    assert response.status_code == 200 and b'"usage"' not in response.content
    (row,) = usage_rows(tmp_path, 1)
    assert (row["route"], row["outcome"], row["tokens_exact"]) == (FIM, "ok", 0)
    assert row["prompt_tokens"] > 0 and row["completion_tokens"] >= 5
    assert row["prompt_cache_miss_tokens"] == row["prompt_tokens"]


def test_chatgate_asks_for_stream_usage_and_hides_it(start_gate: Callable[..., RunningChatgate],
                                                      fake: RunningFake, tmp_path: Path) -> None:
    fake.state.configure(usage_mode="separate_when_asked")
    gate = start_gate(upstream={"request_stream_usage": True})
    response = post(gate, fim_body(prompt=PROMPT, suffix=SUFFIX, stream=True, x_kept=1))
    sent = fake.state.requests[0].json
    assert sent["stream_options"] == {"include_usage": True} and sent["x_kept"] == 1
    assert b'"usage"' not in response.content and response.content.endswith(b"data: [DONE]\n\n")
    assert all(event["choices"] for event in data_events(response.content))
    (row,) = usage_rows(tmp_path, 1)
    issued = fake.state.requests[0].usage
    assert issued is not None and (row["tokens_exact"], row["completion_tokens"]) == (
        1, issued["completion_tokens"])


def test_deepseek_errors_pass_through_and_are_recorded(gate: RunningChatgate, fake: RunningFake,
                                                       tmp_path: Path) -> None:
    declined = post(gate, fim_body(), **{"x-fake-fault": "http_402"})
    assert declined.status_code == 402 and declined.json()["error"]["message"] == "Insufficient Balance"
    bad_key = post(gate, fim_body(), key="sk-bad-0000")
    assert bad_key.status_code == 401 and "Authentication Fails" in bad_key.json()["error"]["message"]
    rows = usage_rows(tmp_path, 2)
    assert sorted((r["outcome"], r["upstream_status"]) for r in rows) == [
        ("upstream_error", 401), ("upstream_error", 402)]
    metrics = httpx2.get(gate.url + "/metrics").text
    counted = 'chatgate_requests_total{model="deepseek-flash",route="/beta/completions",status="402"} 1.0'
    assert counted in metrics


def test_a_stream_broken_by_deepseek_ends_with_an_error_event(gate: RunningChatgate, fake: RunningFake,
                                                              tmp_path: Path) -> None:
    response = post(gate, fim_body(prompt=PROMPT, suffix=SUFFIX, stream=True),
                    **{"x-fake-fault": "reset_mid_stream"})
    assert response.status_code == 200
    last = data_events(response.content)[-1]
    assert last["error"]["code"] == "upstream_stream_broken"
    (row,) = usage_rows(tmp_path, 1)
    assert (row["route"], row["outcome"], row["tokens_exact"]) == (FIM, "upstream_failed", 0)
    assert row["completion_tokens"] >= 1, "the text relayed before the break is estimated"


def test_unreachable_upstream_is_502(start_gate: Callable[..., RunningChatgate], tmp_path: Path) -> None:
    gate = start_gate(upstream_url=unreachable_url())
    response = post(gate, fim_body())
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    (row,) = usage_rows(tmp_path, 1)
    assert (row["route"], row["outcome"]) == (FIM, "upstream_failed")


# ------------------------------------------------------------------------------------------- rejections


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningChatgate, RunningFake, Path]]:
    """One chatgate and fake for the rejection cases, which never reach the fake."""
    tmp = tmp_path_factory.mktemp("fim-rejections")
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url)) as gate:
        yield gate, fake, tmp


@pytest.mark.parametrize(("body", "code", "param", "rule"), INVALID)
def test_invalid_bodies_are_refused_locally(shared: tuple[RunningChatgate, RunningFake, Path], body: Any,
                                            code: str, param: str | None, rule: str) -> None:
    gate, fake, _ = shared
    before = len(fake.state.requests)
    response = post(gate, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert error["problems"][0]["rule"] == rule
    assert len(fake.state.requests) == before, "an invalid body never reaches DeepSeek"


def test_rejections_are_recorded_with_their_rule_code(shared: tuple[RunningChatgate, RunningFake, Path]
                                                      ) -> None:
    gate, _, tmp = shared
    response = post(gate, fim_body(max_tokens=0), **{"x-request-id": "fim-no-tokens"})
    assert response.status_code == 400
    row = record_of(tmp, "fim-no-tokens")
    assert (row["route"], row["outcome"], row["rule_code"], row["model"]) == (
        FIM, "rejected", "max_tokens_out_of_range", "deepseek-flash")


def record_of(tmp: Path, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next((r for r in _read_usage(tmp / "usage.db") if r["request_id"] == request_id), None)
    found: dict[str, Any] = wait_for(find, 10, f"the usage record of {request_id}")
    return found


def test_the_sdk_raises_bad_request_with_param(sdk: openai.OpenAI, fake: RunningFake) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model="deepseek-flash", prompt=PROMPT, suffix=SUFFIX, max_tokens=0)
    assert (caught.value.code, caught.value.param) == ("max_tokens_out_of_range", "max_tokens")
    assert "[1, 4096]" in caught.value.message
    assert fake.state.requests == []


def test_thinking_is_forwarded_with_a_warning(gate: RunningChatgate, fake: RunningFake) -> None:
    body = orjson.dumps(fim_body(thinking={"type": "enabled"}))
    response = post(gate, body)
    assert response.status_code == 200
    assert "FIM completion is non-thinking only" in response.headers["x-chatgate-warning"]
    assert fake.state.wait_idle(5) and fake.state.requests[0].body == body


def test_strict_mode_refuses_thinking_odd_penalties_and_a_long_max_tokens(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start_gate(validation={"strict": True})
    thinking = post(gate, fim_body(thinking={"type": "enabled"})).json()["error"]
    assert (thinking["code"], thinking["param"], thinking["problems"][0]["rule"]) == (
        "thinking_not_supported", "thinking.type", "F12")
    penalty = post(gate, fim_body(frequency_penalty=5)).json()["error"]
    assert (penalty["code"], penalty["param"], penalty["problems"][0]["rule"]) == (
        "out_of_range", "frequency_penalty", "F13")
    long = post(gate, fim_body(max_tokens=8192)).json()["error"]
    assert (long["code"], long["param"], long["problems"][0]["rule"]) == (
        "max_tokens_out_of_range", "max_tokens", "F6")
    assert fake.state.requests == []


def test_validate_is_a_dry_run(gate: RunningChatgate, fake: RunningFake) -> None:
    ok = post(gate, fim_body(reasoning_effort="high"), path="/beta/completions/validate").json()
    assert ok["valid"] is True and ok["model"] == "deepseek-flash"
    assert [(w["code"], w["rule"]) for w in ok["warnings"]] == [("thinking_not_supported", "F12")]
    long = post(gate, fim_body(max_tokens=8192), path="/beta/completions/validate").json()
    assert long["valid"] is True
    assert [(w["code"], w["rule"]) for w in long["warnings"]] == [("max_tokens_out_of_range", "F6")]
    bad = post(gate, fim_body(top_p=3), path="/v1/beta/completions/validate")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"
    assert fake.state.requests == []


# ------------------------------------------------------------------------------------------- not /beta


@pytest.mark.parametrize("base", ["/v1", ""])
def test_completions_off_beta_is_a_404_naming_beta(gate: RunningChatgate, fake: RunningFake,
                                                   base: str) -> None:
    with openai.OpenAI(base_url=gate.url + base, api_key=KEY, max_retries=0) as client, \
            pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="deepseek-flash", prompt=PROMPT, suffix=SUFFIX)
    assert caught.value.code == "not_found"
    assert f"{gate.url}/beta" in caught.value.message and f"{base}/completions" in caught.value.message
    got = httpx2.get(gate.url + base + "/completions")
    assert got.status_code == 404 and "/beta" in got.json()["error"]["message"]
    assert fake.state.requests == []


def test_other_methods_on_the_fim_route_are_405(gate: RunningChatgate) -> None:
    assert httpx2.get(gate.url + FIM).status_code == 405

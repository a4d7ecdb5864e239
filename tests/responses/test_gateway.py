"""DeepSeek's Responses API through a real chatgate, driven by the real openai SDK (`client.responses`), as
Codex and agents use it: forwarded byte for byte, streamed event by event, refused in the OpenAI shape before
DeepSeek sees it, repaired (reasoning items put back, outputs moved next to their calls), metered per key with
DeepSeek's usage (cached_tokens are cache hits), in both auth modes; /responses/compact answers a 404."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.gateway.auth import fingerprint, new_key
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate
from tests.responses.items import SHELL, call, developer, output, reasoning, request, user

KEY = "sk-codex-user-0001"
TOOLS: list[Any] = [SHELL]


def client(gate: RunningChatgate, key: str = KEY, base: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=gate.url + base, api_key=key, max_retries=0, timeout=20)


def post(gate: RunningChatgate, body: dict[str, Any] | bytes, path: str = "/v1/responses",
         key: str | None = KEY, **headers: str) -> httpx2.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    h = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {}), **headers}
    return httpx2.post(gate.url + path, content=content, headers=h, timeout=20)


def sent(fake: RunningFake, n: int = -1) -> dict[str, Any]:
    fake.state.wait_idle(5)
    body: dict[str, Any] = orjson.loads(fake.state.requests[n].body)
    return body


# --- the SDK, forwarding, streaming ---------------------------------------------------------------------


def test_the_sdk_gets_its_answer_and_the_body_arrives_byte_for_byte(gate: RunningChatgate,
                                                                   fake: RunningFake) -> None:
    answer = client(gate).responses.create(model="deepseek-flash", input="Hello", store=False)
    assert answer.output_text == "Answer 1: the fake DeepSeek says hello."
    assert [o.type for o in answer.output] == ["reasoning", "message"]
    assert answer.usage is not None and answer.usage.input_tokens_details.cached_tokens > 0
    raw = (b'{"model":"deepseek-flash",  "input":[{"role":"user","content":"Hi"}],"store":false,'
           b'"include":["reasoning.encrypted_content"],"prompt_cache_key":"019a-7f","x_unknown":[1,2]}')
    resp = post(gate, raw, path="/responses", originator="codex_cli_rs", session_id="019a-7f")
    assert resp.status_code == 200, resp.text
    assert "x-chatgate-repaired" not in resp.headers and "x-chatgate-warning" not in resp.headers
    fake.state.wait_idle(5)
    forwarded = fake.state.requests[-1]
    assert forwarded.body == raw and forwarded.path == "/responses"
    assert forwarded.headers["originator"] == "codex_cli_rs" and forwarded.headers["session_id"] == "019a-7f"
    assert resp.json()["output"][0]["encrypted_content"].endswith("-0")


def test_the_async_client_and_a_streamed_answer(gate: RunningChatgate, fake: RunningFake) -> None:
    async def go() -> tuple[list[str], Any]:
        async with openai.AsyncOpenAI(base_url=gate.url + "/v1", api_key=KEY, max_retries=0) as sdk:
            first = await sdk.responses.create(model="deepseek-v4-pro", input="Hi")
            assert first.output_text.startswith("Answer 1")
            async with sdk.responses.stream(model="deepseek-flash", input="Hello") as stream:
                kinds = [event.type async for event in stream]
                return kinds, await stream.get_final_response()

    kinds, final = asyncio.run(go())
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert final.output_text == "Answer 1: the fake DeepSeek says hello."
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens > 0


def test_a_stream_reaches_the_client_as_deepseek_sent_it(gate: RunningChatgate, fake: RunningFake) -> None:
    body = request([user("Run the tests")], stream=True)
    with httpx2.stream("POST", gate.url + "/v1/responses", content=orjson.dumps(body),
                       headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
                       timeout=20) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        received = resp.read()
    fake.state.wait_idle(5)
    assert received == bytes(fake.state.requests[-1].sent)
    assert b"event: response.completed" in received and b"[DONE]" not in received
    assert b'"sequence_number":' in received


def test_create_with_stream_true(gate: RunningChatgate) -> None:
    events = list(client(gate).responses.create(model="deepseek-flash", input="Hello", stream=True))
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


# --- the function-calling loop -------------------------------------------------------------------------


def agent_loop(gate: RunningChatgate, rounds: int, stream: bool, drop_reasoning: bool, key: str = KEY
               ) -> list[tuple[Any, dict[str, str]]]:
    """An agent with the openai SDK in thinking mode: it passes the output items back as the SDK gives them
    (or without their reasoning items), answers each call, for `rounds` user turns."""
    sdk = client(gate, key)
    history: list[Any] = []
    answers = []
    for r in range(rounds):
        history.append({"role": "user", "content": f"Round {r}: run the tests."})
        for _ in range(2):
            kwargs: dict[str, Any] = {"model": "deepseek-flash", "input": history, "tools": TOOLS,
                                      "reasoning": {"effort": "high"}, "store": False}
            if stream:
                with sdk.responses.stream(**kwargs) as s:
                    answer = s.get_final_response()
                    headers = dict(s._response.headers)
            else:
                raw = sdk.responses.with_raw_response.create(**kwargs)
                answer, headers = raw.parse(), dict(raw.headers)
            answers.append((answer, headers))
            history += [o for o in answer.output if not (drop_reasoning and o.type == "reasoning")]
            calls = [o for o in answer.output if o.type == "function_call"]
            if not calls:
                break
            history += [{"type": "function_call_output", "call_id": c.call_id, "output": "3 passed"}
                        for c in calls]
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_thinking_tool_loop_works_as_the_sdk_gives_the_items(gate: RunningChatgate, fake: RunningFake,
                                                              stream: bool) -> None:
    answers = agent_loop(gate, 3, stream, drop_reasoning=False)
    assert len(answers) == 6 and answers[-1][0].output_text.startswith("Answer ")
    assert "the tool said 3 passed" in answers[-1][0].output_text
    assert not any("x-chatgate-repaired" in h for _, h in answers)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_dropped_reasoning_items_are_restored_from_what_chatgate_relayed_p11(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path, stream: bool) -> None:
    answers = agent_loop(gate, 3, stream, drop_reasoning=True)
    assert "the tool said 3 passed" in answers[-1][0].output_text
    assert "x-chatgate-repaired" not in answers[0][1]
    assert answers[1][1]["x-chatgate-repaired"] == "responses_reasoning@input[1]"
    last = sent(fake)
    relayed = [next(o for o in a.output if o.type == "reasoning") for a, _ in answers[0::2]]
    turns = [k for k, item in enumerate(last["input"]) if item.get("type") == "function_call"]
    assert len(turns) == 3
    for k, reasoning_item in zip(turns, relayed, strict=True):
        restored = last["input"][k - 1]
        assert restored["type"] == "reasoning" and restored["id"] == reasoning_item.id
        assert restored["content"] == [c.model_dump() for c in reasoning_item.content or ()]
    rows = usage_rows(tmp_path, 6)
    assert [r["repairs"] for r in rows] == [None, *["responses_reasoning"] * 5]


def test_another_key_replaying_the_ids_gets_the_400_and_no_reasoning(gate: RunningChatgate,
                                                                    fake: RunningFake) -> None:
    first = client(gate).responses.create(model="deepseek-flash", input=[user()], tools=TOOLS)
    fc = next(o for o in first.output if o.type == "function_call")
    body = request([user(), fc.model_dump(exclude_none=True), output(fc.call_id)], tools=TOOLS)
    before = len(fake.state.requests)
    refused = post(gate, body, key="sk-someone-else-0002")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("reasoning_text_missing", "input[1]")
    assert "chatgate could not restore it: it has no record of this turn for your key" in error["message"]
    assert "The user sent" not in refused.text, "another caller's reasoning never leaks"
    assert len(fake.state.requests) == before
    assert post(gate, body).status_code == 200, "the caller it belongs to gets it restored"


def test_a_hook_message_between_call_and_output_is_moved_p10(gate: RunningChatgate,
                                                             fake: RunningFake) -> None:
    body = request([user(), reasoning(), call("call_1"), developer(), output("call_1")])
    resp = post(gate, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "responses_output_order@input[4]"
    assert [i.get("type") for i in sent(fake)["input"]][2:4] == ["function_call", "function_call_output"]


# --- refusals in the OpenAI shape ------------------------------------------------------------------------

HEARTBEAT = {"type": "function_call_output", "id": "automation_heartbeat", "output": "ok"}
REFUSED: list[Any] = [
    pytest.param(request([user(), HEARTBEAT]), "input[1].call_id", "missing_call_id", id="P8-no-call_id"),
    pytest.param(request([user(), output("call_automation_update")]), "input[1].call_id",
                 "tool_output_without_call", id="P9-orphan"),
    pytest.param(request([user(), reasoning(), call("c")]), "input[2]", "tool_output_missing",
                 id="P10-unanswered"),
    pytest.param(request([user(), reasoning(None), call("c"), output("c")]), "input[1].content",
                 "reasoning_text_missing", id="P11-empty-reasoning"),
    pytest.param({"model": "deepseek-flash", "input": "x", "tools": [{"type": "custom", "name": "grep"}]},
                 "tools[0].name", "unsupported_custom_tool", id="P13-custom"),
    pytest.param({"model": "deepseek-flash", "input": "x", "tool_choice": {"type": "web_search"}},
                 "tool_choice.type", "web_search_not_enabled", id="P14-web-search"),
    pytest.param({"model": "deepseek-flash", "input": "x", "max_output_tokens": 400_000},
                 "max_output_tokens", "max_output_tokens_out_of_range", id="P17-max-output"),
    pytest.param({"model": "deepseek-flash", "input": "x", "user": "用" * 171}, "user", "invalid_user",
                 id="P15-user-bytes"),
]


@pytest.mark.parametrize(("body", "param", "code"), REFUSED)
def test_invalid_requests_are_refused_in_openais_shape_and_never_reach_deepseek(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path, body: dict[str, Any], param: str,
        code: str) -> None:
    resp = post(gate, body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["problems"][0]["rule"].startswith("P")
    with pytest.raises(openai.BadRequestError) as caught:
        client(gate).responses.create(**body)
    assert caught.value.code == code and caught.value.param == param
    assert fake.state.requests == []
    rows = usage_rows(tmp_path, 2)
    assert {(r["outcome"], r["rule_code"], r["route"]) for r in rows} == {("rejected", code, "/responses")}


def test_what_deepseek_ignores_is_forwarded_with_a_warning(gate: RunningChatgate, fake: RunningFake) -> None:
    resp = post(gate, request([user()], previous_response_id="resp_123"))
    assert resp.status_code == 200
    assert "previous_response_id" in resp.headers["x-chatgate-warning"]


def test_a_warning_about_a_clients_text_is_a_valid_header(gate: RunningChatgate, fake: RunningFake) -> None:
    """A role with a newline is forwarded with a warning that quotes it: the header value must stay
    printable, or the server drops the answer DeepSeek has already given (and billed)."""
    odd = {"type": "message", "role": "robot\r\nx-injected: 1", "content": "hi"}
    resp = post(gate, request([user(), odd]))
    assert len(fake.state.requests) == 1
    warning = resp.headers["x-chatgate-warning"]
    assert "x-injected" in warning and "\n" not in warning and "\r" not in warning
    assert "x-injected" not in resp.headers


def test_many_warnings_make_one_header_of_bounded_size(gate: RunningChatgate, fake: RunningFake) -> None:
    """A long Codex history can carry a warning per turn; Node's fetch (openai-node) refuses response
    headers over 16 KB, so the header is cut and says how many were left out."""
    items: list[Any] = [user()]
    for k in range(60):  # reasoning items with only DeepSeek's own blob: a warning each
        items += [{"type": "reasoning", "id": f"rs_{k}", "summary": [], "encrypted_content": "d8b79690-0-0"},
                  {"type": "custom_tool_call", "call_id": f"c{k}", "name": "apply_patch", "input": "*"},
                  {"type": "custom_tool_call_output", "call_id": f"c{k}", "output": "Done"}]
    resp = post(gate, request(items))
    assert len(fake.state.requests) == 1  # forwarded (the fake wants the reasoning's text: its 400 relayed)
    warning = resp.headers["x-chatgate-warning"]
    assert 1000 < len(warning) <= 4096
    assert warning.endswith("more: POST .../validate lists them all)")


def test_strict_mode_refuses_what_is_uncertain(start_gate: Callable[..., RunningChatgate],
                                               fake: RunningFake) -> None:
    gate = start_gate(validation={"strict": True})
    resp = post(gate, {"model": "deepseek-v4-pro", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "image_not_supported"
    assert fake.state.requests == []


def test_the_dry_run_answers_the_same_without_forwarding(gate: RunningChatgate, fake: RunningFake) -> None:
    body = request([user(), reasoning(), call("c"), developer(), output("c")], previous_response_id="r")
    answer = post(gate, body, path="/v1/responses/validate").json()
    assert answer["valid"] is True and [w["rule"] for w in answer["warnings"]] == ["P20"]
    assert answer["repairs"] == [{"code": "responses_output_order", "path": "input[4]", "rules": ["P10"],
                                  "detail": "moved after input[2]"}]
    refused = post(gate, {**body, "max_output_tokens": 0}, path="/responses/validate")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "max_output_tokens_out_of_range"
    assert fake.state.requests == []


@pytest.mark.parametrize("path", ["/v1/responses/compact", "/responses/compact"])
def test_remote_compaction_is_a_clear_404(gate: RunningChatgate, fake: RunningFake, path: str) -> None:
    resp = post(gate, {"model": "deepseek-flash", "input": [user()], "instructions": "x"}, path=path)
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["code"] == "compaction_not_supported" and "no remote compaction" in error["message"]
    assert 'named "OpenAI"' in error["message"] and "compacts locally" in error["message"]
    assert httpx2.get(gate.url + path).status_code == 404
    with pytest.raises(openai.NotFoundError):
        client(gate).post("/responses/compact", body={"model": "deepseek-flash"}, cast_to=object)
    assert fake.state.requests == []


# --- metering and keys -------------------------------------------------------------------------------------

# DeepSeek's peak prices (docs/metering.md#prices) in picoUSD per token: cache hit, miss, output; off peak
# half.
PEAK_PICOUSD_PER_TOKEN = {"deepseek-flash": (6_000, 300_000, 1_200_000),
                          "deepseek-v4-pro": (44_000, 1_320_000, 3_960_000)}
PEAK_HOURS_UTC = {1, 2, 3, 6, 7, 8, 9}


def expected_cost(r: dict[str, Any]) -> int:
    hit, miss, out = PEAK_PICOUSD_PER_TOKEN[r["model"]]
    cost = r["prompt_cache_hit_tokens"] * hit + r["prompt_cache_miss_tokens"] * miss
    cost += r["completion_tokens"] * out
    peak = dt.datetime.fromtimestamp(r["ts"], dt.UTC).hour in PEAK_HOURS_UTC
    return cost if peak else cost // 2


def test_usage_is_metered_per_key_as_deepseek_issued_it(gate: RunningChatgate, fake: RunningFake,
                                                       tmp_path: Path) -> None:
    keys = ("sk-team-red-0001", "sk-team-blue-002")
    for n, key in enumerate(keys * 3):
        sdk = client(gate, key)
        model = ("deepseek-flash", "deepseek-v4-pro")[n % 2]
        if n < 2:
            sdk.responses.create(model=model, input=f"question {n} " * (n + 1))
        elif n < 4:
            with sdk.responses.stream(model=model, input=[user(f"q{n}")], tools=TOOLS) as s:
                s.get_final_response()
        else:
            list(sdk.responses.create(model=model, input="x", max_output_tokens=4, stream=True))
    rows = usage_rows(tmp_path, 6)
    fake.state.wait_idle(5)
    for key in keys:
        issued = fake.state.issued_usage[key]
        mine = [r for r in rows if r["key_id"] == fingerprint(key)]
        assert len(mine) == 3 == issued["responses_requests"]
        assert sum(r["prompt_tokens"] for r in mine) == issued["input_tokens"]
        assert sum(r["prompt_cache_hit_tokens"] for r in mine) == issued["cached_tokens"]
        misses = issued["input_tokens"] - issued["cached_tokens"]
        assert sum(r["prompt_cache_miss_tokens"] for r in mine) == misses
        assert sum(r["completion_tokens"] for r in mine) == issued["output_tokens"]
        assert sum(r["reasoning_tokens"] for r in mine) == issued["reasoning_tokens"] > 0
    assert {r["model"] for r in rows} == {"deepseek-flash", "deepseek-v4-pro"}
    assert all(r["route"] == "/responses" and r["tokens_exact"] == 1 and r["outcome"] == "ok" for r in rows)
    assert all(r["cost_picousd"] == expected_cost(r) > 0 for r in rows)
    report = httpx2.get(gate.url + "/metrics").text
    assert 'route="/responses"' in report


def test_a_stream_without_its_terminal_event_is_estimated(gate: RunningChatgate, fake: RunningFake,
                                                         tmp_path: Path) -> None:
    body = {"model": "deepseek-flash", "input": "Hello", "stream": True}
    resp = post(gate, body, **{"x-fake-terminal": "none"})
    assert resp.status_code == 200 and b"response.completed" not in resp.content
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["tokens_exact"], row["route"]) == ("ok", 0, "/responses")
    assert row["completion_tokens"] >= 10 and row["reasoning_tokens"] >= 5 and row["prompt_tokens"] > 0


def test_a_broken_stream_ends_with_an_error_event_the_sdk_raises(gate: RunningChatgate, fake: RunningFake,
                                                                 tmp_path: Path) -> None:
    body = {"model": "deepseek-flash", "input": "Hello", "stream": True}
    resp = post(gate, body, **{"x-fake-fault": "reset_mid_stream"})
    tail = resp.content.rstrip().split(b"\n\n")[-1]
    assert tail.startswith(b"event: error\ndata: ")
    event = json.loads(tail.split(b"data: ", 1)[1])
    assert event["type"] == "error" and event["code"] == "upstream_stream_broken"
    with pytest.raises(openai.APIError):
        list(client(gate).responses.create(model="deepseek-flash", input="Hello", stream=True,
                                           extra_headers={"x-fake-fault": "reset_mid_stream"}))
    rows = usage_rows(tmp_path, 2)
    assert {r["outcome"] for r in rows} == {"upstream_failed"} and not any(r["tokens_exact"] for r in rows)


def test_deepseeks_own_failure_event_is_relayed_and_metered_as_its_error(gate: RunningChatgate,
                                                                         fake: RunningFake,
                                                                         tmp_path: Path) -> None:
    resp = post(gate, {"model": "deepseek-flash", "input": "Hello", "stream": True},
                **{"x-fake-fault": "error_mid_stream"})
    assert resp.status_code == 200 and b"event: response.failed" in resp.content
    (row,) = usage_rows(tmp_path, 1)
    assert row["outcome"] == "upstream_error" and row["route"] == "/responses"


def test_managed_keys_work_and_never_reach_deepseek(start_gate: Callable[..., RunningChatgate],
                                                    fake: RunningFake) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house-key"})
    key_id, secret, digest, prefix = new_key()
    gate.state.store.create_key(key_id, digest, prefix, "platform", "codex")
    answer = client(gate, secret).responses.create(model="deepseek-flash", input="hi")
    assert answer.output_text
    fake.state.wait_idle(5)
    assert fake.state.requests[-1].headers["authorization"] == "Bearer sk-house-key"
    with pytest.raises(openai.AuthenticationError):
        client(gate, "cg-not-a-key").responses.create(model="deepseek-flash", input="hi")

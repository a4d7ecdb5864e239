"""DeepSeek's November 2026 surface through a real chatgate, on every family, with the real SDKs: the server
web tools (declared, answered with the fake's stand-in results, passed back in a second round), `title`,
`safety_check`, `latest_reminder` and user ids of up to 512 UTF-8 bytes
(docs/rules-chat.md#the-november-2026-surface). Streamed and not; what the answers carry is relayed as
DeepSeek sent it and is not metered as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest

from chatgate.demo.server_tools import usage_counts
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate

KEY = "sk-web-tools-user-0001"
USER_ID = "张伟 zhang.wei@example.com"  # spaces, @ and Chinese: recommended against, valid (29 bytes)
REMINDER = {"role": "latest_reminder", "content": "2026-11-11,Wednesday,Singapore,Web,English"}
CHAT_WEB = [{"type": "deepseek_web_search"}, {"type": "deepseek_read_url"}]
MESSAGES_WEB = [{"type": "deepseek_web_search", "name": "deepseek_web_search"},
                {"type": "deepseek_read_url", "name": "deepseek_read_url"}]


def openai_client(gate: RunningChatgate) -> openai.OpenAI:
    return openai.OpenAI(base_url=gate.url + "/v1", api_key=KEY, max_retries=0, timeout=20)


def anthropic_client(gate: RunningChatgate) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key=KEY, max_retries=0, timeout=20)


def forwarded(fake: RunningFake, n: int = -1) -> dict[str, Any]:
    fake.state.wait_idle(5)
    body: dict[str, Any] = orjson.loads(fake.state.requests[n].body)
    return body


# --- chat completions ------------------------------------------------------------------------------------


def test_chat_server_tools_answer_and_the_second_round_passes_them_back(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path) -> None:
    client = openai_client(gate)
    first_messages: list[Any] = [REMINDER, {"role": "user", "content": "See https://example.org/a now"}]
    raw = client.chat.completions.with_raw_response.create(
        model="deepseek-flash", messages=first_messages, tools=CHAT_WEB,  # type: ignore[arg-type]
        extra_body={"title": {"enabled": True}, "safety_check": {"level": "high"}, "user_id": USER_ID})
    said = raw.headers["x-chatgate-warning"]  # the user id's characters, and nothing else (R37)
    assert "'user_id' has characters" in said and "server tool" not in said
    answer = raw.parse()
    message = answer.choices[0].message
    extra = message.model_extra or {}
    assert extra["title"].startswith("Chat: ")
    assert [r["url"] for r in extra["web_search_results"]][-1] == "https://example.org/a"
    assert usage_counts(answer.usage.model_dump() if answer.usage else None) == (1, 1)
    sent = forwarded(fake)
    assert sent["user_id"] == USER_ID and sent["safety_check"] == {"level": "high"}
    # round 2: the assistant message exactly as returned (its unknown fields too), then a new question
    replay = message.model_dump(exclude_none=True)
    second = client.chat.completions.create(
        model="deepseek-flash", tools=CHAT_WEB,  # type: ignore[arg-type]
        messages=[*first_messages, replay, REMINDER, {"role": "user", "content": "And tomorrow?"}])
    assert second.choices[0].finish_reason == "stop"
    again = forwarded(fake)["messages"][2]
    assert again["web_search_results"] == extra["web_search_results"] and again["title"] == extra["title"]
    rows = usage_rows(tmp_path, 2)
    assert [r["outcome"] for r in rows] == ["ok", "ok"]
    assert rows[0]["completion_tokens"] == answer.usage.completion_tokens  # type: ignore[union-attr]


def test_chat_stream_relays_the_title_on_the_last_chunk(gate: RunningChatgate, fake: RunningFake,
                                                        tmp_path: Path) -> None:
    stream = openai_client(gate).chat.completions.create(
        model="deepseek-flash", messages=[{"role": "user", "content": "Search the news"}], tools=CHAT_WEB,  # type: ignore[arg-type]
        stream=True, extra_body={"title": {"enabled": True}})
    chunks = list(stream)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert (finals[-1].choices[0].delta.model_extra or {})["title"] == "Chat: Search the news"
    assert any("web_search_results" in (c.choices[0].delta.model_extra or {}) for c in chunks if c.choices)
    (row,) = usage_rows(tmp_path, 1)
    assert row["outcome"] == "ok" and row["tokens_exact"]


def test_title_and_server_results_are_not_metered_as_streamed_text(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path) -> None:
    """Without DeepSeek's usage chatgate estimates the output from the streamed text: a title and the
    server tools' results add nothing to it."""
    fake.state.configure(usage_mode="separate_when_asked")  # no usage unless include_usage is asked for
    plain = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "Search the news"}],
             "stream": True}
    decorated = {**plain, "tools": CHAT_WEB, "title": {"enabled": True}}
    for body in (plain, decorated):
        resp = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(body), timeout=20,
                           headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
        assert resp.status_code == 200
    assert b'"title":"Chat: Search the news"' in resp.content
    rows = usage_rows(tmp_path, 2)
    assert [r["tokens_exact"] for r in rows] == [0, 0]
    assert rows[0]["completion_tokens"] == rows[1]["completion_tokens"] > 0


@pytest.mark.parametrize(("extra", "code", "param"), [
    ({"safety_check": {"level": "medium"}}, "invalid_safety_check", "safety_check.level"),
    ({"user_id": "用" * 171}, "invalid_user_id", "user_id"),
])
def test_chat_refuses_a_bad_safety_level_and_a_long_user_id(
        gate: RunningChatgate, fake: RunningFake, extra: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(gate).chat.completions.create(
            model="deepseek-flash", messages=[{"role": "user", "content": "hi"}], extra_body=extra)
    assert (caught.value.code, caught.value.param) == (code, param)
    assert fake.state.requests == []


def test_chat_server_tools_on_another_model_are_forwarded_with_a_warning(gate: RunningChatgate,
                                                                         fake: RunningFake) -> None:
    raw = openai_client(gate).chat.completions.with_raw_response.create(
        model="deepseek-v4-pro", messages=[{"role": "user", "content": "hi"}],
        tools=CHAT_WEB[:1])  # type: ignore[arg-type]
    assert raw.http_response.status_code == 200
    assert "documented for deepseek-flash only" in raw.headers["x-chatgate-warning"]
    assert forwarded(fake)["tools"] == CHAT_WEB[:1]


# --- Messages --------------------------------------------------------------------------------------------


def test_messages_server_tools_blocks_and_the_second_round(gate: RunningChatgate, fake: RunningFake,
                                                          tmp_path: Path) -> None:
    client = anthropic_client(gate)
    first: list[Any] = [REMINDER, {"role": "user", "content": "What is new on https://example.org/b?"}]
    raw = client.messages.with_raw_response.create(
        model="deepseek-flash", max_tokens=2048, messages=first, tools=MESSAGES_WEB,  # type: ignore[arg-type]
        metadata={"user_id": USER_ID},
        extra_body={"title": {"enabled": True}, "safety_check": {"level": "low"}})
    assert "x-chatgate-warning" not in raw.headers
    data = orjson.loads(raw.http_response.content)
    kinds = [b["type"] for b in data["content"]]
    assert kinds == ["thinking", "server_tool_use", "web_search_tool_result", "server_tool_use",
                     "web_search_tool_result", "text"]
    assert data["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 1}
    assert data["title"].startswith("Chat: ")
    second = client.messages.create(
        model="deepseek-flash", max_tokens=2048, tools=MESSAGES_WEB,  # type: ignore[arg-type]
        messages=[*first, {"role": "assistant", "content": data["content"]}, REMINDER,
                  {"role": "user", "content": "Thanks. And tomorrow?"}])
    assert second.content[-1].type == "text"
    assert forwarded(fake)["messages"][2]["content"] == data["content"]
    assert [r["outcome"] for r in usage_rows(tmp_path, 2)] == ["ok", "ok"]


def test_messages_stream_relays_the_title_and_the_server_blocks(gate: RunningChatgate, fake: RunningFake,
                                                                tmp_path: Path) -> None:
    with anthropic_client(gate).messages.stream(
            model="claude-sonnet-4-5", max_tokens=2048, tools=MESSAGES_WEB,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "Search it"}],
            extra_body={"title": {"enabled": True}}) as s:
        events = list(s)
        final = s.get_final_message()
    deltas = [e for e in events if e.type == "message_delta"]
    assert (deltas[-1].delta.model_extra or {})["title"] == "Chat: Search it"
    assert [b.type for b in final.content] == ["thinking", "server_tool_use", "web_search_tool_result",
                                                "text"]
    (row,) = usage_rows(tmp_path, 1)
    assert row["outcome"] == "ok" and row["tokens_exact"]


def test_messages_refuses_a_bad_safety_level_and_a_long_user_id(gate: RunningChatgate,
                                                                fake: RunningFake) -> None:
    client = anthropic_client(gate)
    for kwargs in ({"extra_body": {"safety_check": {"level": "HIGH"}}}, {"metadata": {"user_id": "x" * 513}}):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="deepseek-flash", max_tokens=64,
                                   messages=[{"role": "user", "content": "hi"}], **kwargs)  # type: ignore[arg-type]
        assert caught.value.status_code == 400
    assert fake.state.requests == []


# --- Responses -------------------------------------------------------------------------------------------


def test_responses_server_tools_items_and_the_second_round(gate: RunningChatgate, fake: RunningFake,
                                                          tmp_path: Path) -> None:
    client = openai_client(gate)
    first: list[Any] = [{"role": "user", "content": "Find the news"}]
    raw = client.responses.with_raw_response.create(
        model="deepseek-flash", input=first, tools=CHAT_WEB,  # type: ignore[arg-type]
        user=USER_ID, extra_body={"title": {"enabled": True}, "safety_check": {"level": "high"}})
    said = raw.headers["x-chatgate-warning"]  # the user id's characters, and nothing else (P15)
    assert "'user' has characters" in said and "server tool" not in said
    data = orjson.loads(raw.http_response.content)
    assert [i["type"] for i in data["output"]] == ["reasoning", "deepseek_web_search_call", "message"]
    assert data["title"] == "Chat: Find the news"
    assert usage_counts(data["usage"]) == (1, 0)
    second = client.responses.with_raw_response.create(
        model="deepseek-flash", tools=CHAT_WEB,  # type: ignore[arg-type]
        input=[*first, *data["output"], {"role": "user", "content": "More?"}])
    assert second.http_response.status_code == 200 and "x-chatgate-warning" not in second.headers
    assert forwarded(fake)["input"][1:4] == data["output"]
    assert [r["outcome"] for r in usage_rows(tmp_path, 2)] == ["ok", "ok"]


def test_responses_stream_carries_the_title_in_the_completed_response(gate: RunningChatgate,
                                                                      fake: RunningFake) -> None:
    stream = openai_client(gate).responses.create(
        model="deepseek-flash", input="Find the news", tools=CHAT_WEB, stream=True,  # type: ignore[arg-type]
        extra_body={"title": {"enabled": True}})
    events = list(stream)
    completed = [e for e in events if e.type == "response.completed"]
    assert (completed[0].response.model_extra or {})["title"] == "Chat: Find the news"
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert "deepseek_web_search_call" in added


def test_responses_refuses_a_bad_safety_level(gate: RunningChatgate, fake: RunningFake) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(gate).responses.create(model="deepseek-flash", input="x",
                                             extra_body={"safety_check": {"level": "medium"}})
    assert (caught.value.code, caught.value.param) == ("invalid_safety_check", "safety_check.level")
    assert fake.state.requests == []

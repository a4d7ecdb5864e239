"""`chatgate demo` as a new user runs it: a process, talked to with the real SDKs, no key, no network."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest

from tests import lifeline
from tests.harness import free_port

pytestmark = pytest.mark.slow
LABEL = "offline stand-in, not DeepSeek"


@dataclass
class Demo:
    url: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def said(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def demo() -> Iterator[Demo]:
    port = free_port()
    # a DeepSeek key, a chatgate config and a proxy in the environment change nothing: the demo ignores them
    env = {**os.environ, "DEEPSEEK_API_KEY": "sk-real-key-never-sent", "CHATGATE_AUTH_MODE": "managed",
           "CHATGATE_CONFIG": "/nonexistent/chatgate.toml", "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "ALL_PROXY": "http://127.0.0.1:9"}
    process = lifeline.Popen([sys.executable, "-m", "chatgate", "demo", "--port", str(port)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    running = Demo(f"http://127.0.0.1:{port}", process)

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            running.lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx2.get(f"{running.url}/healthz", timeout=1).status_code == 200:
                break
        except httpx2.TransportError:
            pass
        assert process.poll() is None, f"chatgate demo exited: {running.said()}"
        assert time.monotonic() < deadline, f"chatgate demo did not start: {running.said()}"
        time.sleep(0.1)
    try:
        yield running
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_banner_says_it_is_not_deepseek_and_what_to_try(demo: Demo) -> None:
    said = demo.said()
    assert "NOT from DeepSeek" in said
    assert f"x-chatgate-demo: {LABEL}" in said
    assert f"curl -s {demo.url}/v1/chat/completions" in said
    assert f'OpenAI(base_url="{demo.url}/v1", api_key="sk-demo")' in said
    assert f"{demo.url}/admin/dashboard" in said
    assert "sk-real-key-never-sent" not in said


def test_the_openai_sdk_gets_labelled_answers(demo: Demo) -> None:
    client = openai.OpenAI(base_url=f"{demo.url}/v1", api_key="sk-demo", max_retries=0)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]

    raw = client.chat.completions.with_raw_response.create(model="deepseek-flash", messages=messages)
    assert raw.headers["x-chatgate-demo"] == LABEL
    first = raw.parse()
    assert first.choices[0].message.content == "Answer 1: the fake DeepSeek says hello."
    again = client.chat.completions.create(model="deepseek-flash", messages=messages)
    assert again.choices[0].message.content == first.choices[0].message.content  # deterministic

    with client.chat.completions.with_streaming_response.create(
            model="deepseek-flash", messages=messages, stream=True,
            stream_options={"include_usage": True}) as streamed:
        assert streamed.headers["x-chatgate-demo"] == LABEL
        chunks = list(streamed.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0

    tools: list[openai.types.chat.ChatCompletionToolParam] = [
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    called = client.chat.completions.create(model="deepseek-flash", messages=messages, tools=tools)
    assert called.choices[0].finish_reason == "tool_calls"
    assert called.choices[0].message.tool_calls
    assert called.choices[0].message.tool_calls[0].function.name == "lookup"


def test_refusals_anthropic_and_responses_routes(demo: Demo) -> None:
    client = openai.OpenAI(base_url=f"{demo.url}/v1", api_key="sk-demo", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="deepseek-flash", n=2,
                                       messages=[{"role": "user", "content": "Hello"}])
    assert refused.value.response.headers["x-chatgate-demo"] == LABEL
    assert "n = 1" in str(refused.value)
    for _ in range(2):  # the first is confirmed with the stand-in (issue 47), the second refused at once
        with pytest.raises(openai.BadRequestError) as unknown:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hello"}])
        assert "did you mean 'deepseek-flash'" in str(unknown.value)

    answer = client.responses.with_raw_response.create(model="deepseek-flash", input="Hello")
    assert answer.headers["x-chatgate-demo"] == LABEL
    assert answer.parse().output_text

    claude = anthropic.Anthropic(base_url=f"{demo.url}/anthropic", api_key="sk-demo", max_retries=0)
    message = claude.messages.with_raw_response.create(
        model="deepseek-flash", max_tokens=100, messages=[{"role": "user", "content": "Hello"}])
    assert message.headers["x-chatgate-demo"] == LABEL
    assert message.parse().content


def test_it_stops_cleanly_and_leaves_no_store(demo: Demo) -> None:
    store = next(line for line in demo.lines if line.strip().startswith("store"))
    path = Path(store.split("SQLite ", 1)[1].split(" (", 1)[0])
    openai.OpenAI(base_url=f"{demo.url}/v1", api_key="sk-demo").chat.completions.create(
        model="deepseek-flash", messages=[{"role": "user", "content": "Hello"}])
    assert path.exists()
    demo.process.send_signal(signal.SIGINT)
    assert demo.process.wait(timeout=15) == 0
    assert not path.parent.exists()


def test_the_dashboard_says_it_is_the_demo(demo: Demo, tmp_path: Path) -> None:
    from tests.web.test_dashboard import chromium

    admin = next(line for line in demo.lines if "admin key:" in line).rsplit("admin key: ", 1)[1].strip()
    openai.OpenAI(base_url=f"{demo.url}/v1", api_key="sk-demo").chat.completions.create(
        model="deepseek-flash", messages=[{"role": "user", "content": "Hello"}])
    page = f"{demo.url}/admin/dashboard#key={admin}&bucket=hour&span=2"
    dom = chromium(tmp_path, "--dump-dom", page).stdout
    assert 'data-state="ready"' in dom, dom[-2000:]
    assert "DEMO: the answers come from chatgate demo's offline stand-in, not from DeepSeek." in dom
    assert "Passthrough mode: each client's key has its own balance" in dom


def test_a_long_running_demo_keeps_only_the_newest_requests() -> None:
    from chatgate.demo.deepseek import FakeState
    from tests.fakes.server import run_fake_deepseek

    with run_fake_deepseek(FakeState(keep_requests=2)) as fake:
        for i in range(5):
            httpx2.post(f"{fake.url}/chat/completions", headers={"authorization": "Bearer sk-demo"}, json={
                "model": "deepseek-flash", "messages": [{"role": "user", "content": f"n{i}"}]}, timeout=10)
        assert [b'"n3"' in r.body for r in fake.state.requests] == [True, False]
        assert b'"n4"' in fake.state.requests[-1].body

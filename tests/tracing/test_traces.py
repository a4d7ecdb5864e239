"""Traces end to end: chatgate with tracing on, in front of the fake DeepSeek, exporting over OTLP/HTTP to
a real receiver on loopback that decodes the protobuf (tests/tracing/receiver.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.settings import TracingSettings
from chatgate.store.base import UsageRecord
from chatgate.tracing.setup import build_tracing, protocol_of, tracing_on
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import (
    RunningChatgate,
    make_settings,
    run_chatgate,
    spawn_chatgate,
    unreachable_url,
)
from tests.tracing.receiver import CLIENT, SERVER, STATUS_ERROR, Receiver, Span, run_receiver

CLIENT_KEY = {"authorization": "Bearer sk-test-client-0001"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
QUESTION = "What is the capital of France?"
CHAT = {"model": "deepseek-flash", "messages": [{"role": "user", "content": QUESTION}]}

# (path, body) of each family; the streamed variant adds "stream": true
FAMILIES = {
    "chat": ("/v1/chat/completions", {**CHAT, "max_tokens": 64}),
    "fim": ("/beta/completions", {"model": "deepseek-flash", "prompt": "def fib(a):", "max_tokens": 32}),
    "anthropic": ("/anthropic/v1/messages", {"model": "deepseek-flash", "max_tokens": 64,
                                              "messages": [{"role": "user", "content": "Hello there"}]}),
    "responses": ("/v1/responses",
                  {"model": "deepseek-flash", "input": "Hello there", "max_output_tokens": 64}),
}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with run_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


def tracing_gate(tmp: Path, fake: RunningFake, endpoint: str, **tracing: Any) -> Any:
    settings = make_settings(tmp, fake.url, tracing={"enabled": True, "endpoint": endpoint,
                                                     "service_name": "chatgate-test", **tracing},
                             upstream={"retries": 2, "retry_base_ms": 10})
    return run_chatgate(settings)


@pytest.fixture(scope="module")
def gate(receiver: Receiver, fake: RunningFake, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[RunningChatgate]:
    with tracing_gate(tmp_path_factory.mktemp("traces"), fake, receiver.url) as running:
        yield running


def send(gate: RunningChatgate, path: str, body: dict[str, Any], request_id: str, **headers: str
         ) -> httpx2.Response:
    resp = httpx2.post(gate.url + path, content=orjson.dumps(body), timeout=15,
                       headers={**CLIENT_KEY, "content-type": "application/json", "x-request-id": request_id,
                                **headers})
    gate.state.tracing.force_flush(5000)
    return resp


def spans_of(receiver: Receiver, request_id: str, count: int) -> tuple[Span, list[Span]]:
    spans = receiver.by_request(request_id, count)
    server = next(s for s in spans if s.kind == SERVER)
    return server, [s for s in spans if s.kind == CLIENT]


def fake_request(fake: RunningFake, request_id: str) -> Any:
    fake.state.wait_idle(5)
    return next(r for r in fake.state.requests if r.request_id == request_id)


def test_a_clients_trace_is_continued_and_chatgate_sends_its_own_context_upstream(
        gate: RunningChatgate, receiver: Receiver, fake: RunningFake) -> None:
    resp = send(gate, "/v1/chat/completions", CHAT, "trace-continued",
                traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01", tracestate="vendor=opaque")
    assert resp.status_code == 200
    server, clients = spans_of(receiver, "trace-continued", 2)
    assert server.trace_id == TRACE_ID and server.parent_id == PARENT_ID
    assert server.name == "POST /v1/chat/completions"
    assert server.resource["service.name"] == "chatgate-test"
    assert server.schema_url == "https://opentelemetry.io/schemas/1.44.0"
    a = server.attributes
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == 200 and a["chatgate.outcome"] == "ok"
    assert a["chatgate.team"] == "default" and a["chatgate.key_id"].startswith("fp-")
    assert a["chatgate.cost_usd"] > 0 and "error.type" not in a
    [client] = clients
    assert client.parent_id == server.span_id and client.name == "chat deepseek-flash"
    upstream = fake_request(fake, "trace-continued").headers
    assert upstream["traceparent"] == f"00-{TRACE_ID}-{client.span_id}-01"
    assert upstream["tracestate"] == "vendor=opaque"


def test_without_a_traceparent_the_request_starts_a_trace(gate: RunningChatgate, receiver: Receiver,
                                                         fake: RunningFake) -> None:
    send(gate, "/v1/chat/completions", CHAT, "trace-new")
    server, [client] = spans_of(receiver, "trace-new", 2)
    assert server.parent_id == "" and client.trace_id == server.trace_id
    assert fake_request(fake, "trace-new").headers["traceparent"].split("-")[2] == client.span_id


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_client_span_has_the_genai_attributes_and_the_fakes_usage(
        gate: RunningChatgate, receiver: Receiver, fake: RunningFake, family: str, stream: bool) -> None:
    path, body = FAMILIES[family]
    request_id = f"usage-{family}-{stream}"
    resp = send(gate, path, {**body, "stream": stream}, request_id)
    assert resp.status_code == 200, resp.text
    server, [client] = spans_of(receiver, request_id, 2)
    usage = fake_request(fake, request_id).usage
    a = client.attributes
    operation = "text_completion" if family == "fim" else "chat"
    assert client.name == f"{operation} deepseek-flash"
    assert a["gen_ai.operation.name"] == operation and a["gen_ai.provider.name"] == "deepseek"
    assert a["gen_ai.request.model"] == "deepseek-flash" and a["gen_ai.request.stream"] is stream
    assert a["gen_ai.request.max_tokens"] == body.get("max_tokens", body.get("max_output_tokens"))
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.usage.cache_read.input_tokens"] == usage["prompt_cache_hit_tokens"]
    assert a["gen_ai.usage.reasoning.output_tokens"] == usage["completion_tokens_details"]["reasoning_tokens"]
    assert a["gen_ai.response.model"] and a["gen_ai.response.id"]
    assert a["gen_ai.response.finish_reasons"] and a["http.response.status_code"] == 200
    assert ("gen_ai.response.time_to_first_chunk" in a) is stream
    assert client.status != STATUS_ERROR and "error.type" not in a
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a  # no content by default
    assert server.attributes["chatgate.outcome"] == "ok"
    assert client.start_ns >= server.start_ns and client.end_ns <= server.end_ns


def test_a_refused_request_has_its_server_span_with_the_rules_and_no_client_span(
        gate: RunningChatgate, receiver: Receiver, fake: RunningFake) -> None:
    body = {"model": "deepseek-flash", "messages": [{"role": "developer", "content": "x"}]}
    assert send(gate, "/v1/chat/completions", body, "trace-refused").status_code == 400
    server, _ = spans_of(receiver, "trace-refused", 1)
    time.sleep(0.2)  # a CLIENT span would have been exported with it (they end before the SERVER span)
    assert [s for s in receiver.spans if s.trace_id == server.trace_id and s.kind == CLIENT] == []
    a = server.attributes
    assert a["error.type"] == "400" and a["chatgate.rules"] == ["R5"] and a["chatgate.outcome"] == "rejected"
    assert a["http.response.status_code"] == 400
    assert not any(r.request_id == "trace-refused" for r in fake.state.requests)


def test_a_body_refused_before_it_is_read_has_its_server_span(gate: RunningChatgate, receiver: Receiver
                                                             ) -> None:
    resp = httpx2.post(gate.url + "/v1/chat/completions", content=b"hello", timeout=10,
                       headers={**CLIENT_KEY, "content-type": "text/plain", "x-request-id": "trace-early"})
    gate.state.tracing.force_flush(5000)
    assert resp.status_code == 415
    server, clients = spans_of(receiver, "trace-early", 1)
    assert clients == [] and server.attributes["chatgate.outcome"] == "refused"
    assert server.attributes["error.type"] == "415" and server.attributes["http.response.status_code"] == 415


def test_deepseeks_error_is_the_client_spans_error(gate: RunningChatgate, receiver: Receiver) -> None:
    resp = send(gate, "/v1/chat/completions", CHAT, "trace-422", **{"x-fake-fault": "http_422"})
    assert resp.status_code == 422
    server, [client] = spans_of(receiver, "trace-422", 2)
    assert client.status == STATUS_ERROR and client.attributes["error.type"] == "422"
    assert client.attributes["http.response.status_code"] == 422
    assert server.attributes["error.type"] == "422"
    assert server.attributes["chatgate.outcome"] == "upstream_error"


def test_an_upstream_that_cannot_be_reached_ends_the_attempt_as_failed(
        receiver: Receiver, fake: RunningFake, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, unreachable_url(),
                             tracing={"enabled": True, "endpoint": receiver.url})
    with run_chatgate(settings) as down:
        resp = send(down, "/v1/chat/completions", CHAT, "trace-unreachable")
        assert resp.status_code == 502
        server, [client] = spans_of(receiver, "trace-unreachable", 2)
    assert client.status == STATUS_ERROR and client.attributes["error.type"] == "upstream_failed"
    assert server.status == STATUS_ERROR and server.attributes["error.type"] == "502"


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_chatgates_retries_are_a_client_span_each(gate: RunningChatgate, receiver: Receiver,
                                                  fake: RunningFake, stream: bool) -> None:
    request_id = f"trace-retried-{stream}"
    resp = send(gate, "/v1/chat/completions", {**CHAT, "stream": stream}, request_id,
                **{"x-fake-fault": "http_503", "x-fake-fault-attempts": "2"})
    assert resp.status_code == 200
    server, clients = spans_of(receiver, request_id, 4)
    first, second, last = sorted(clients, key=lambda s: s.start_ns)
    for failed in (first, second):
        assert failed.status == STATUS_ERROR and failed.attributes["error.type"] == "503"
        assert failed.attributes["http.response.status_code"] == 503
        assert failed.end_ns <= last.start_ns
    usage = [r for r in fake.state.requests if r.request_id == request_id][-1].usage
    assert last.status != STATUS_ERROR
    assert last.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert {c.parent_id for c in clients} == {server.span_id}
    sent = [r.headers["traceparent"].split("-")[2] for r in fake.state.requests if r.request_id == request_id]
    assert sent == [first.span_id, second.span_id, last.span_id]  # each attempt its own span's context


def test_each_upstream_attempt_is_a_client_span_of_its_own(gate: RunningChatgate, receiver: Receiver
                                                           ) -> None:
    """The retry engine's hook: `start_attempt` per attempt, `attempt_failed` for one it gives up on."""
    tracing = gate.state.tracing
    route = "/v1/chat/completions"
    # a traceparent that is not valid: a new trace, and not sent on
    scope = {"path": route, "headers": [(b"traceparent", b"00-client-ctx")]}
    trace = tracing.start("POST", route, route, scope, "trace-attempts")
    first = trace.start_attempt([(b"traceparent", b"00-client-ctx")], "deepseek-flash", False)
    trace.attempt_failed("503", 503)
    second = trace.start_attempt([], "deepseek-flash", False)
    assert first[-1][0] == b"traceparent" and first[-1] != second[-1]
    assert not any(v == b"00-client-ctx" for _, v in first)
    trace.finish(UsageRecord("r", 0.0, "trace-attempts", "key_1", "k", "team", "deepseek-flash",
                             "/v1/chat/completions", False, "ok", upstream_status=200, prompt_tokens=3,
                             completion_tokens=4), 200)
    tracing.force_flush(5000)
    server, clients = spans_of(receiver, "trace-attempts", 3)
    failed, ok = sorted(clients, key=lambda s: s.start_ns)
    assert failed.status == STATUS_ERROR and failed.attributes["error.type"] == "503"
    assert ok.status != STATUS_ERROR and ok.attributes["gen_ai.usage.output_tokens"] == 4
    assert {failed.parent_id, ok.parent_id} == {server.span_id}


def test_content_is_on_the_spans_only_with_capture_content(receiver: Receiver, fake: RunningFake,
                                                           tmp_path: Path) -> None:
    with tracing_gate(tmp_path, fake, receiver.url, capture_content=True) as gate:
        for stream in (False, True):
            send(gate, "/v1/chat/completions", {**CHAT, "stream": stream}, f"trace-content-{stream}")
            _, [client] = spans_of(receiver, f"trace-content-{stream}", 2)
            sent = orjson.loads(client.attributes["gen_ai.input.messages"])
            assert sent == [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
            answer = orjson.loads(client.attributes["gen_ai.output.messages"])
            assert answer[0]["role"] == "assistant" and answer[0]["parts"][0]["content"]


def test_an_exporter_that_is_down_costs_requests_nothing_and_drops_are_counted(fake: RunningFake,
                                                                              tmp_path: Path) -> None:
    with (tracing_gate(tmp_path, fake, unreachable_url(), max_queue_size=4, export_timeout_seconds=1) as gate,
          httpx2.Client(timeout=10) as client):
        started = time.monotonic()
        for i in range(40):
            resp = client.post(gate.url + "/v1/chat/completions", json=CHAT,
                               headers={**CLIENT_KEY, "x-request-id": f"down-{i}"})
            assert resp.status_code == 200
        assert time.monotonic() - started < 20  # each request is a few ms; an export would take 1 s
        deadline = time.monotonic() + 10
        while True:
            metrics = client.get(gate.url + "/metrics").text
            dropped = {line.split("}")[0].split('"')[1]: float(line.rsplit(" ", 1)[1])
                       for line in metrics.splitlines()
                       if line.startswith("chatgate_trace_spans_dropped_total{")}
            if dropped.get("queue_full", 0) > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert dropped["queue_full"] > 0  # 80 spans into a queue of 4 that cannot drain


def test_on_by_the_standard_variables_and_off_otherwise() -> None:
    off = TracingSettings()
    assert not tracing_on(off, {})
    assert tracing_on(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_on(off, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing_on(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not tracing_on(TracingSettings(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert build_tracing(off, {}) is None
    assert protocol_of(off, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert protocol_of(TracingSettings(protocol="http/protobuf"), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) \
        == "http/protobuf"


@pytest.mark.slow  # chatgate as a process
def test_chatgate_serve_traces_by_the_otel_variables(receiver: Receiver, fake: RunningFake,
                                                     tmp_path: Path) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "gate-by-env",
           "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test", "OTEL_BSP_SCHEDULE_DELAY": "50",
           "CHATGATE_STORE_URL": f"sqlite:///{tmp_path}/usage.db"}
    with spawn_chatgate(tmp_path, "--upstream", fake.url, env=env) as spawned:
        resp = httpx2.post(spawned.url + "/v1/chat/completions", json=CHAT, timeout=10,
                           headers={**CLIENT_KEY, "x-request-id": "trace-by-env"})
        assert resp.status_code == 200
        server, [client] = spans_of(receiver, "trace-by-env", 2)
    assert server.resource["service.name"] == "gate-by-env"
    assert server.resource["deployment.environment"] == "test"
    assert client.attributes["gen_ai.usage.input_tokens"] > 0


def test_over_grpc_the_sdks_grpc_exporter_delivers_the_same_spans(fake: RunningFake, tmp_path: Path) -> None:
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got = Receiver("grpc")

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            got.take(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with tracing_gate(tmp_path, fake, f"http://127.0.0.1:{port}", protocol="grpc") as gate:
            resp = send(gate, "/v1/chat/completions", {**CHAT, "stream": True}, "trace-grpc")
            assert resp.status_code == 200
            server_span, [client] = spans_of(got, "trace-grpc", 2)
    finally:
        server.stop(0)
    usage = fake_request(fake, "trace-grpc").usage
    assert client.parent_id == server_span.span_id and client.name == "chat deepseek-flash"
    assert client.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert server_span.attributes["chatgate.outcome"] == "ok"
    assert server_span.schema_url == "https://opentelemetry.io/schemas/1.44.0"

"""The compatibility zoo: every client library (tests/compat/zoo/model.py, CLIENTS) runs tool loops through a
real chatgate on default settings (passthrough auth) in front of the fake DeepSeek, with thinking on and off,
streaming and not, at the base URL DeepSeek's docs give (bare root or /v1).

The expectation table (EXPECTED) says what DeepSeek does with what each client sends; per scenario:
- completes: the client gets its final answer, every request reached the fake byte for byte as the client
  sent it to chatgate, and the fake (which refuses what DeepSeek refuses) accepted each one: 0 false alarms;
- refused_<rule>: the client really sends what DeepSeek refuses (e.g. a thinking-mode tool turn without its
  reasoning_content, R17); chatgate answers it locally with the precise 400 and forwards nothing of it;
- repaired_<rule>: the same, but a repair on by default (issue 12) fixes it: the client completes, the one
  repaired request says so (x-chatgate-repaired) and differs from what the client sent only by the repair;
- for both, the control run (the same client straight against the fake) gets DeepSeek's own 400 for the
  very request chatgate refused or repaired.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from chatgate.demo.deepseek import RecordedRequest
from tests.ci import missing
from tests.compat.zoo.model import (
    CLIENTS,
    COMPLETES,
    CONTROL_KEY,
    EXPECTED,
    FINAL_TOOL_ANSWER,
    HANDOFF,
    HANDOFF_ANSWER,
    MIN_REQUESTS,
    REFUSED,
    REPAIRED,
    STRUCTURED,
    STRUCTURED_TOOL,
    TOOLS,
    Outcome,
    Scenario,
    renumber_call_ids,
    scenarios,
)
from tests.compat.zoo.runner import ScenarioRun, Unavailable, Zoo

# litellm's TypedDicts use ReadOnly, which pydantic notes with a UserWarning on first use.
pytestmark = [pytest.mark.filterwarnings("ignore:.*`ReadOnly` qualifier:UserWarning"), pytest.mark.slow]

SCENARIOS = list(scenarios())
COMPLETING = [s for s in SCENARIOS if s.expected == COMPLETES]
REFUSED_LOCALLY = [s for s in SCENARIOS if s.expected.startswith(REFUSED)]
REPAIRED_LOCALLY = [s for s in SCENARIOS if s.expected.startswith(REPAIRED)]
DEEPSEEK_REFUSES = [s for s in SCENARIOS if s.deepseek != COMPLETES]


def scenario_id(scenario: Scenario) -> str:
    return f"{scenario.id}-{scenario.expected}"


def run_of(zoo: Zoo, scenario: Scenario) -> ScenarioRun:
    try:
        return zoo.run(scenario)
    except Unavailable as exc:
        missing(str(exc))


def thinking_off(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return (isinstance(thinking, dict) and thinking.get("type") == "disabled") \
        or body.get("reasoning_effort") == "none"


def check_answer(scenario: Scenario, outcome: Outcome) -> None:
    if scenario.kind == TOOLS:
        assert outcome.text is not None and outcome.text.endswith(FINAL_TOOL_ANSWER), outcome
    elif scenario.kind == HANDOFF:
        assert outcome.text is not None and outcome.text.endswith(HANDOFF_ANSWER), outcome
        assert outcome.output == {"last_agent": "forecaster"}
    elif scenario.kind == STRUCTURED:
        assert outcome.output["ok"] is True and outcome.output["answer"].startswith("Answer "), outcome
    else:
        assert scenario.kind == STRUCTURED_TOOL and outcome.output == {"q": "x"}, outcome


def check_sent_as_scenario_says(scenario: Scenario, run: ScenarioRun) -> None:
    """Streaming and thinking as the scenario says, in every request (the drivers really did it)."""
    for exchange in run.sent:
        body = json.loads(exchange.body)
        assert (body.get("stream") is True) == scenario.stream, body
        assert thinking_off(body) == (not scenario.thinking), body


def check_warned_only_of_strict_tools(run: ScenarioRun) -> None:
    """The one warning these clients get: `strict: true` tools off /beta (R32), forwarded as they are."""
    for exchange in run.sent:
        tools = json.loads(exchange.body).get("tools") or []
        strict = any(tool.get("function", {}).get("strict") is True for tool in tools)
        warning = exchange.response_headers.get("x-chatgate-warning", "")
        assert bool(warning) == strict and (not strict or "only enforced on DeepSeek's /beta" in warning)


def test_zoo_table_covers_every_client() -> None:
    assert {client for client, _ in EXPECTED} == set(CLIENTS)
    assert all((client, TOOLS) in EXPECTED for client in CLIENTS)
    assert len(COMPLETING) + len(REFUSED_LOCALLY) + len(REPAIRED_LOCALLY) == 4 * len(EXPECTED)


@pytest.mark.parametrize("scenario", COMPLETING, ids=scenario_id)
def test_zoo_client_completes_through_chatgate_byte_for_byte(zoo: Zoo, scenario: Scenario) -> None:
    run = run_of(zoo, scenario)
    assert run.outcome.ok, run.outcome.error
    check_answer(scenario, run.outcome)
    assert len(run.sent) >= MIN_REQUESTS[scenario.kind]
    check_sent_as_scenario_says(scenario, run)
    assert [e.status for e in run.sent] == [200] * len(run.sent), [bytes(e.response) for e in run.sent]
    check_warned_only_of_strict_tools(run)
    # What reached DeepSeek is what the client sent, byte for byte, and DeepSeek accepted all of it.
    assert [r.body for r in run.upstream] == [bytes(e.body) for e in run.sent]
    assert [r.status for r in run.upstream] == [200] * len(run.upstream)
    assert run.network == []  # the library fetched nothing from outside (cost maps, encodings, telemetry)


@pytest.mark.parametrize("scenario", REFUSED_LOCALLY, ids=scenario_id)
def test_zoo_client_refused_locally_with_the_400_deepseek_gives(zoo: Zoo, scenario: Scenario) -> None:
    rule = scenario.refusal
    assert rule is not None
    run = run_of(zoo, scenario)
    assert not run.outcome.ok and run.outcome.status == 400, run.outcome
    check_sent_as_scenario_says(scenario, run)
    *forwarded, refused = run.sent
    assert [e.status for e in forwarded] == [200] * len(forwarded)
    assert refused.status == 400
    error = json.loads(refused.response)["error"]
    assert error["code"] == rule.code and error["type"] == "invalid_request_error"
    assert error["param"] == rule.param(json.loads(refused.body))
    assert error["problems"][0]["rule"] == rule.rule
    # The requests before it were forwarded byte for byte; nothing of the refused one reached DeepSeek.
    assert [r.body for r in run.upstream] == [bytes(e.body) for e in forwarded]
    assert run.network == []


def reasoning_answered(record: RecordedRequest) -> str | None:
    """The reasoning_content the fake DeepSeek answered with (a JSON body, or the deltas of a stream)."""
    data = bytes(record.sent)
    if not record.stream:
        message: dict[str, Any] = json.loads(data)["choices"][0]["message"]
        return message.get("reasoning_content")
    pieces = [choice["delta"].get("reasoning_content")
              for line in data.split(b"\n") if line.startswith(b"data: {")
              for choice in json.loads(line[6:])["choices"]]
    found = [piece for piece in pieces if piece is not None]
    return "".join(found) if found else None


@pytest.mark.parametrize("scenario", REPAIRED_LOCALLY, ids=scenario_id)
def test_zoo_client_completes_because_chatgate_repairs_by_default(zoo: Zoo, scenario: Scenario) -> None:
    rule = scenario.refusal
    assert rule is not None and rule.rule == "R17", "only restore_reasoning is checked here: add the others"
    run = run_of(zoo, scenario)
    assert run.outcome.ok, run.outcome.error
    check_answer(scenario, run.outcome)
    check_sent_as_scenario_says(scenario, run)
    assert [e.status for e in run.sent] == [200] * len(run.sent), [bytes(e.response) for e in run.sent]
    assert [r.status for r in run.upstream] == [200] * len(run.sent)
    repaired = [i for i, e in enumerate(run.sent) if "x-chatgate-repaired" in e.response_headers]
    assert repaired and repaired[0] > 0
    for i, (exchange, record) in enumerate(zip(run.sent, run.upstream, strict=True)):
        if i not in repaired:
            assert record.body == bytes(exchange.body)  # no repair needed: forwarded byte for byte
            continue
        assert "restore_reasoning" in exchange.response_headers["x-chatgate-repaired"]
        sent, forwarded = json.loads(exchange.body), json.loads(record.body)
        index = int(rule.param(sent).removeprefix("messages[").split("]")[0])
        # Exactly the reasoning DeepSeek gave with that tool call, put back; nothing else changed.
        restored = forwarded["messages"][index].pop("reasoning_content")
        assert restored == reasoning_answered(run.upstream[i - 1])
        assert forwarded == sent
    assert run.network == []


@pytest.mark.parametrize("scenario", DEEPSEEK_REFUSES, ids=scenario_id)
def test_zoo_control_deepseek_itself_refuses_what_the_client_sends(zoo: Zoo, scenario: Scenario) -> None:
    rule = scenario.refusal
    assert rule is not None
    run = run_of(zoo, scenario)
    assert run.control is not None and run.control.status == 400, run.control
    *accepted, refused = run.control_upstream
    assert [r.status for r in accepted] == [200] * len(accepted)
    assert refused.status == 400 and refused.refused is not None
    assert rule.deepseek_message in refused.refused
    # The very request chatgate refused or repaired (the fake's tool-call ids are random: renumbered).
    client_sent = bytes(run.sent[len(accepted)].body)
    assert renumber_call_ids(refused.body, {}) == renumber_call_ids(client_sent, {})


@pytest.mark.parametrize("scenario", DEEPSEEK_REFUSES, ids=scenario_id)
def test_zoo_what_deepseek_refuses_gets_chatgates_local_400_when_not_repairable(zoo: Zoo,
                                                                                 scenario: Scenario) -> None:
    """The control's refused request replayed to chatgate by a caller it never relayed anything for (so
    nothing can be restored): the precise local 400, and nothing reaches DeepSeek."""
    rule = scenario.refusal
    assert rule is not None
    run = run_of(zoo, scenario)
    refused = run.control_upstream[-1]
    zoo.fake.wait_idle(5)
    before = len(zoo.fake.requests)
    url = zoo.gate_url + CLIENTS[scenario.client].route + "/chat/completions"
    headers = {"authorization": f"Bearer {CONTROL_KEY}", "content-type": "application/json"}
    reply = httpx2.post(url, content=refused.body, headers=headers, timeout=10)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == rule.code and error["param"] == rule.param(json.loads(refused.body))
    assert error["problems"][0]["rule"] == rule.rule
    zoo.fake.wait_idle(5)
    assert len(zoo.fake.requests) == before

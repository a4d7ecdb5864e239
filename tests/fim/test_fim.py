"""The FIM family as pure code: the F-rules over request bytes (exact code, param and rule; valid neighbours
pass), the same verdicts from the fake DeepSeek's own FIM validation (written from the spec, not from
chatgate/), the `text_completion` stream meter, and the family's small parts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from chatgate.demo.fim import fim_error, parse_fim_body
from chatgate.errors import Problem
from chatgate.fim.family import FimFamily, not_on_beta, prompt_text
from chatgate.fim.rules import check_fim
from chatgate.fim.stream import FimStreamMeter
from chatgate.metering.usage import TokenCounts
from chatgate.repair.base import RepairOptions
from chatgate.rules.kernel import CheckOptions
from chatgate.rules.models import Policy
from tests.metering.test_pricing_usage import DEEPSEEK_USAGE

DROP = object()
STRICT = Policy(options=CheckOptions(strict=True))
REJECT_UNKNOWN = Policy(options=CheckOptions(unknown_models="reject"))


def fim_body(**changes: Any) -> dict[str, Any]:
    """DeepSeek's own FIM example (DOC-fim), changed; a field set to DROP is removed."""
    body: dict[str, Any] = {"model": "deepseek-flash", "prompt": "def fib(a):",
                            "suffix": "    return fib(a-1) + fib(a-2)", "max_tokens": 128}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not DROP}


def raw(body: dict[str, Any] | bytes) -> bytes:
    return body if isinstance(body, bytes) else orjson.dumps(body)


# (body, code, param, rule): every rule that refuses by default, and the type errors of each field.
INVALID: list[Any] = [
    pytest.param(b"[1, 2]", "invalid_json", None, "F1", id="F1-array"),
    pytest.param(b'{"model": "deepseek-flash", "prompt": "x"', "invalid_json", None, "F1", id="F1-truncated"),
    pytest.param(fim_body(model=DROP), "missing_required_parameter", "model", "F2", id="F2-missing"),
    pytest.param(fim_body(model=7), "invalid_type", "model", "F2", id="F2-type"),
    pytest.param(fim_body(prompt=DROP), "missing_required_parameter", "prompt", "F4", id="F4-missing"),
    pytest.param(fim_body(prompt=["def a():", "def b():"]), "invalid_type", "prompt", "F4", id="F4-array"),
    pytest.param(fim_body(suffix={"text": "x"}), "invalid_type", "suffix", "F5", id="F5-type"),
    pytest.param(fim_body(max_tokens=0), "max_tokens_out_of_range", "max_tokens", "F6", id="F6-zero"),
    pytest.param(fim_body(max_tokens=-1), "max_tokens_out_of_range", "max_tokens", "F6", id="F6-negative"),
    pytest.param(fim_body(max_tokens="128"), "invalid_type", "max_tokens", "F6", id="F6-type"),
    pytest.param(fim_body(echo="yes"), "invalid_type", "echo", "F7", id="F7-type"),
    pytest.param(fim_body(logprobs=21), "out_of_range", "logprobs", "F8", id="F8-above-20"),
    pytest.param(fim_body(logprobs=True), "invalid_type", "logprobs", "F8", id="F8-boolean"),
    pytest.param(fim_body(stop=[f"s{i}" for i in range(17)]), "too_many_stop_sequences", "stop", "F9",
                 id="F9-17-stops"),
    pytest.param(fim_body(stop=["\n\n", 3]), "invalid_type", "stop[1]", "F9", id="F9-item-type"),
    pytest.param(fim_body(temperature=2.5), "out_of_range", "temperature", "F10", id="F10-temperature"),
    pytest.param(fim_body(top_p=1.5), "out_of_range", "top_p", "F10", id="F10-top_p"),
    pytest.param(fim_body(temperature="0.2"), "invalid_type", "temperature", "F10", id="F10-type"),
    pytest.param(fim_body(stream="true"), "invalid_type", "stream", "F11", id="F11-stream-type"),
    pytest.param(fim_body(stream_options={"include_usage": True}), "stream_options_without_stream",
                 "stream_options", "F11", id="F11-options-without-stream"),
    pytest.param(fim_body(stream=True, stream_options={"include_usage": "yes"}), "invalid_type",
                 "stream_options.include_usage", "F11", id="F11-include_usage-type"),
]

VALID: list[Any] = [
    pytest.param(fim_body(), id="doc-example"),
    pytest.param(fim_body(suffix=DROP, max_tokens=DROP), id="prompt-only"),
    pytest.param(fim_body(suffix=None, echo=None, logprobs=None, stop=None, stream=None, temperature=None,
                          top_p=None, max_tokens=None), id="all-null"),
    pytest.param(fim_body(max_tokens=4096, logprobs=20, echo=True, stop=[f"s{i}" for i in range(16)],
                          temperature=2, top_p=0), id="every-limit-at-its-edge"),
    pytest.param(fim_body(max_tokens=1, logprobs=0, stop="\n", temperature=0.0, top_p=1), id="low-edges"),
    pytest.param(fim_body(stream=True, stream_options={"include_usage": False}), id="stream-options"),
    pytest.param(fim_body(stream=False), id="stream-false"),
    pytest.param(fim_body(model="deepseek-v4-pro", prompt=""), id="v4-pro-empty-prompt"),
    pytest.param(fim_body(n=1, best_of=1, user="u-1", seed=7, frequency_penalty="0", presence_penalty=9),
                 id="F14-unknown-and-deprecated-fields"),
    pytest.param(fim_body(thinking={"type": "disabled"}, reasoning_effort="none"), id="F12-thinking-off"),
    pytest.param(fim_body(thinking="on"), id="F12-thinking-not-an-object-is-ignored"),
]


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, problems
    return problems[0]


@pytest.mark.parametrize(("body", "code", "param", "rule"), INVALID)
def test_invalid_bodies_are_refused_with_code_param_and_rule(body: Any, code: str, param: str | None,
                                                             rule: str) -> None:
    problem = only(check_fim(raw(body), Policy()).problems)
    assert (problem.code, problem.param, problem.rule) == (code, param, rule)
    assert not problem.warning


@pytest.mark.parametrize(("body", "code", "param", "rule"), INVALID)
def test_the_fake_deepseek_refuses_the_same_bodies(body: Any, code: str, param: str | None,
                                                   rule: str) -> None:
    """The fake's FIM validation is written from the spec alone: it agrees on every refusal."""
    accepted, refused = parse_fim_body(raw(body), validate=True)
    assert accepted is None and refused


@pytest.mark.parametrize("body", VALID)
def test_valid_bodies_pass_here_and_at_the_fake(body: dict[str, Any]) -> None:
    checked = check_fim(raw(body), Policy())
    assert checked.problems == [] and checked.warnings == []
    assert fim_error(body) is None


def test_messages_say_how_to_fix() -> None:
    def message(body: dict[str, Any]) -> str:
        return only(check_fim(raw(body), Policy()).problems).message

    assert message(fim_body(max_tokens=0)) == (
        "Invalid max_tokens value, the valid range of max_tokens is [1, 4096] for FIM completions (4K, "
        "whatever the model); got 0.")
    assert "one prompt string" in message(fim_body(prompt=["a", "b"]))
    assert message(fim_body(logprobs=21)) == "Invalid 'logprobs': expected a value in [0, 20], got 21."
    assert message(fim_body(stop=list("abcdefghijklmnopq"))) == (
        "Invalid 'stop': 17 sequences; DeepSeek accepts up to 16.")
    assert message(fim_body(temperature=3)) == "Invalid 'temperature': expected a value in [0, 2], got 3."
    assert message(fim_body(stream_options={})).startswith("stream_options should be set along with stream")


def test_every_problem_is_listed() -> None:
    body = fim_body(max_tokens=0, temperature=9, top_p=2, logprobs=30)
    problems = check_fim(raw(body), Policy()).problems
    assert [(p.param, p.rule) for p in problems] == [("max_tokens", "F6"), ("logprobs", "F8"),
                                                     ("temperature", "F10"), ("top_p", "F10")]


def test_f3_unknown_model_is_refused() -> None:
    problem = only(check_fim(raw(fim_body(model="deepseek-coder")), REJECT_UNKNOWN).problems)
    assert (problem.code, problem.param, problem.rule) == ("model_not_found", "model", "F3")
    assert "deepseek-flash" in problem.message
    assert check_fim(raw(fim_body()), REJECT_UNKNOWN).problems == []
    extra = Policy(extra_models=frozenset({"some-future-model"}))
    assert check_fim(raw(fim_body(model="some-future-model")), extra).problems == []
    warn = Policy(options=CheckOptions(unknown_models="warn"))
    assert [p.rule for p in check_fim(raw(fim_body(model="deepseek-coder")), warn).warnings] == ["F3"]


@pytest.mark.parametrize("value", [4097, 8192, 10**6])
def test_f6_max_tokens_above_4k_is_a_warning_by_default_and_refused_in_strict_mode(value: int) -> None:
    """DeepSeek's FIM reference lists no range; only the guide says "The max tokens of FIM completion is
    4K" (docs/rules-fim.md): forwarded with a warning. Below 1 and a wrong type stay refused (INVALID)."""
    body = raw(fim_body(max_tokens=value))
    default = check_fim(body, Policy())
    assert default.problems == []
    warning = only(default.warnings)
    assert (warning.code, warning.param, warning.rule, warning.warning) == (
        "max_tokens_out_of_range", "max_tokens", "F6", True)
    assert f"max_tokens {value} is above 4096" in warning.message and "at most 4096" in warning.message
    refused = only(check_fim(body, STRICT).problems)
    assert (refused.code, refused.param, refused.rule, refused.warning) == (
        "max_tokens_out_of_range", "max_tokens", "F6", False)
    assert refused.message == ("Invalid max_tokens value, the valid range of max_tokens is [1, 4096] for FIM "
                               f"completions (4K, whatever the model); got {value}.")
    assert check_fim(raw(fim_body(max_tokens=4096)), Policy()).warnings == []


@pytest.mark.parametrize(("changes", "param"), [
    ({"thinking": {"type": "enabled"}}, "thinking.type"),
    ({"thinking": {"type": "adaptive"}}, "thinking.type"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"model": "deepseek-reasoner"}, "model"),
], ids=["enabled", "adaptive", "effort", "legacy-reasoner"])
def test_f12_thinking_is_a_warning_by_default_and_refused_in_strict_mode(changes: dict[str, Any],
                                                                         param: str) -> None:
    body = raw(fim_body(**changes))
    default = check_fim(body, Policy())
    assert default.problems == []
    warning = only(default.warnings)
    assert (warning.code, warning.param, warning.rule, warning.warning) == (
        "thinking_not_supported", param, "F12", True)
    assert "non-thinking only" in warning.message
    refused = only(check_fim(body, STRICT).problems)
    assert (refused.code, refused.param, refused.rule) == ("thinking_not_supported", param, "F12")
    assert fim_error(orjson.loads(body)) is None, "DeepSeek ignores these fields on FIM: the fake accepts"


@pytest.mark.parametrize(("value", "code"), [(3, "out_of_range"), ("0.5", "invalid_type")])
def test_f13_penalties_are_checked_in_strict_mode_only(value: Any, code: str) -> None:
    body = raw(fim_body(presence_penalty=value))
    assert check_fim(body, Policy()).problems == []
    problem = only(check_fim(body, STRICT).problems)
    assert (problem.code, problem.param, problem.rule) == (code, "presence_penalty", "F13")


# --- the family ---------------------------------------------------------------------------------


def test_family_verdict_and_no_repairs() -> None:
    family = FimFamily(Policy())
    verdict = family.check(raw(fim_body(stream=True, max_tokens=64)), beta=True, origin=None)
    assert (verdict.model, verdict.stream, verdict.thinking, verdict.tools, verdict.max_tokens) == (
        "deepseek-flash", True, False, False, 64)
    assert verdict.profile is not None and verdict.profile.name == "deepseek-flash"
    bad = family.check(b'{"prompt": 1}', beta=True, origin=None)
    assert bad.model is None and {p.param for p in bad.problems} == {"model", "prompt"}
    assert not family.repairable(bad.problems, RepairOptions())
    assert family.turns_to_restore({}, bad.problems, RepairOptions()) == {}
    assert family.repair({}, bad.problems, RepairOptions(), None, {}) == []
    assert family.answer_turn({"choices": [{"text": "x"}]}) is None
    assert family.stream_turns().turn(lambda: "") is None
    assert family.usage({"usage": DEEPSEEK_USAGE}) == TokenCounts(120, 45, 64, 56, 30)
    assert family.usage("not a dict") is None


def test_prompt_text_is_prompt_then_suffix() -> None:
    assert prompt_text({"prompt": "def f(", "suffix": "):\n"}) == "def f():\n"
    assert prompt_text({"prompt": "x", "suffix": None}) == "x"
    assert prompt_text({}) == ""


def test_ask_stream_usage_adds_include_usage_only_when_missing() -> None:
    family = FimFamily(Policy())
    asked = family.ask_stream_usage({"model": "m", "prompt": "p", "stream": True})
    assert asked is not None and orjson.loads(asked)["stream_options"] == {"include_usage": True}
    assert family.ask_stream_usage({"stream": True, "stream_options": {"include_usage": True}}) is None


def test_not_on_beta_names_the_beta_route() -> None:
    error = not_on_beta("/v1/completions", "http://127.0.0.1:8787")
    assert error.status == 404 and error.code == "not_found"
    assert "http://127.0.0.1:8787/beta" in error.message and "/v1/completions" in error.message


# --- the stream meter ---------------------------------------------------------------------------


def sse(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(text: str, finish: str | None = None, **extra: object) -> dict[str, object]:
    return {"id": "f1", "object": "text_completion", "model": "deepseek-flash",
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}], **extra}


def fed(stream: bytes, piece: int) -> FimStreamMeter:
    meter = FimStreamMeter()
    for start in range(0, len(stream), piece):
        meter.feed(stream[start:start + piece])
    meter.finish()
    return meter


@pytest.mark.parametrize("piece", [1, 5, 4096])
def test_meter_finds_usage_on_the_last_chunk_and_collects_text(piece: int) -> None:
    stream = (b": keep-alive\n\n" + sse(chunk("    if a < 2:")) + sse(chunk('\n        return "a\\b"'))
              + sse(chunk("", "stop", usage=DEEPSEEK_USAGE)) + b"data: [DONE]\n\n")
    meter = fed(stream, piece)
    assert meter.usage == TokenCounts(120, 45, 64, 56, 30)
    assert meter.text == '    if a < 2:\n        return "a\\b"'
    assert meter.reasoning == "" and meter.done and not meter.ended_with_error
    assert meter.final_in(b"data: [DONE]\n\n") and not meter.final_in(sse(chunk("x")))


def test_meter_without_usage_keeps_the_text_for_an_estimate() -> None:
    text = "é" * 9000 + " end"  # longer than a batch: the text survives compaction
    meter = fed(sse(chunk(text)) + sse(chunk("", "length")) + b"data: [DONE]\n\n", 1000)
    assert meter.usage is None and meter.text == text


def test_meter_sees_a_separate_usage_chunk_and_an_error_event() -> None:
    separate = sse(chunk("x", usage=None)) + sse({"id": "f1", "choices": [], "usage": DEEPSEEK_USAGE})
    assert fed(separate + b"data: [DONE]\n\n", 7).usage == TokenCounts(120, 45, 64, 56, 30)
    broken = sse(chunk("x")) + sse({"error": {"message": "Internal Server Error", "type": "unknown_error"}})
    meter = fed(broken, 3)
    assert meter.ended_with_error and not meter.done

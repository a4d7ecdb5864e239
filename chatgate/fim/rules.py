"""FIM completion rules F1-F14 (docs/rules-fim.md) as pure functions over the parsed request.

Same error shape, codes and `param` paths as the chat rules (chatgate/openai/rules.py); the numbers are FIM's
own:

F1 JSON object · F2 `model` string · F3 known model (validation.unknown_models) · F4 `prompt` string ·
F5 `suffix` string · F6 `max_tokens` at least 1, and above 4096 a warning refused in strict mode ("The max
tokens of FIM completion is 4K" is the guide's; the reference gives no range) · F7 `echo` boolean ·
F8 `logprobs` integer in [0, 20] · F9 `stop` string or ≤ 16 strings · F10 `temperature` in [0, 2], `top_p`
in [0, 1] · F11 `stream` boolean, `stream_options` only with `stream: true` (R29) ·
F12 FIM is non-thinking only: a request for thinking is a warning (DeepSeek ignores these fields here),
refused in strict mode · F13 `frequency_penalty` / `presence_penalty` in [-2, 2], strict mode only
(deprecated, ignored) · F14 unknown fields: never rejected, never dropped.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic

from chatgate.errors import Problem
from chatgate.fim.protocol import FimRequest
from chatgate.openai.rules import STOP_MAX
from chatgate.openai.type_errors import problems_from_validation_error
from chatgate.profiles import ModelProfile
from chatgate.rules.kernel import Ordering, Rule, RuleContext, in_range, run_rules
from chatgate.rules.models import Policy, unknown_model
from chatgate.wire import json_type, validate_body

FIM_MAX_TOKENS = 4096  # DOC-fim: "The max tokens of FIM completion is 4K"
LOGPROBS_MAX = 20  # DOC-fim: "The maximum value for `logprobs` is 20"
THINKING_ON = ("enabled", "adaptive")

# The rule a type error belongs to, by the top-level field it is about.
_PARAM_RULES = {
    "model": "F2", "prompt": "F4", "suffix": "F5", "max_tokens": "F6", "echo": "F7", "logprobs": "F8",
    "stop": "F9", "temperature": "F10", "top_p": "F10", "stream": "F11", "stream_options": "F11",
}  # fmt: skip
_ROOT = re.compile(r"^[^.\[]+")


@dataclass(slots=True)
class FimContext(RuleContext):
    policy: Policy


@dataclass(frozen=True, slots=True)
class FimChecked:
    request: FimRequest | None
    problems: list[Problem]
    profile: ModelProfile | None = None
    warnings: list[Problem] = field(default_factory=list)


def check_fim(body: bytes, policy: Policy, parse: object = None) -> FimChecked:
    """Parse and check a FIM request body (`parse`: R1's, chatgate/wire.py `validate_body`); never raises."""
    try:
        request = validate_body(FimRequest, body, parse)
    except pydantic.ValidationError as exc:
        return FimChecked(None, [_as_fim(p) for p in problems_from_validation_error(exc, body)])
    return check_fim_request(request, policy)


def check_fim_request(request: FimRequest, policy: Policy) -> FimChecked:
    profile, known = policy.profile_for(request.model)
    ctx = FimContext(profile, known, policy.options, policy)
    problems, warnings = run_rules(FIM_RULES, request, ctx, ORDERING)
    return FimChecked(request, problems, profile, warnings)


ORDERING = Ordering("prompt")


def _as_fim(problem: Problem) -> Problem:
    """A type error worded by type_errors.py, numbered as a FIM rule (F1 for the body itself)."""
    if problem.param is None:
        return dataclasses.replace(problem, rule="F1")
    root = _ROOT.match(problem.param)
    rule = _PARAM_RULES.get(root.group(0) if root else "")
    message = problem.message
    if problem.param == "prompt" and problem.code == "invalid_type":
        message += " DeepSeek's FIM takes one prompt string (not an array of prompts or token ids)."
    return dataclasses.replace(problem, rule=rule, message=message)


# --- the rules ------------------------------------------------------------------------


def rule_model_known(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    """F3, as R3: a model DeepSeek does not serve."""
    if not ctx.known and not ctx.policy.served(req.model):
        yield unknown_model(req.model, "fim", "F3", ctx.policy.suggestions(), ctx.options, "Model Not Exist")


def rule_max_tokens(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    """F6: below 1 is refused; above 4096 is a warning, refused in strict mode."""
    value = req.max_tokens
    if value is None or 1 <= value <= FIM_MAX_TOKENS:
        return
    if value < 1 or ctx.strict:
        yield Problem("max_tokens_out_of_range", "max_tokens",
                      f"Invalid max_tokens value, the valid range of max_tokens is [1, {FIM_MAX_TOKENS}] for "
                      f"FIM completions (4K, whatever the model); got {value}.", "F6")
        return
    # docs/rules-fim.md: the 4K is the FIM guide's ("The max tokens of FIM completion is 4K"); the reference
    # gives no range.
    yield Problem("max_tokens_out_of_range", "max_tokens",
                  f"max_tokens {value} is above {FIM_MAX_TOKENS}: DeepSeek's FIM guide says \"The max "
                  "tokens of FIM completion is 4K\" (its reference gives no range), so DeepSeek may refuse "
                  f"it or stop at 4K. Set max_tokens to at most {FIM_MAX_TOKENS} to be sure.", "F6",
                  warning=True)


def rule_logprobs(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    yield from in_range("logprobs", req.logprobs, 0, LOGPROBS_MAX, "F8")


def rule_stop(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    if isinstance(req.stop, list) and len(req.stop) > STOP_MAX:
        yield Problem("too_many_stop_sequences", "stop",
                      f"Invalid 'stop': {len(req.stop)} sequences; DeepSeek accepts up to {STOP_MAX}.", "F9")


def rule_sampling(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    """F10: FIM never thinks, so the ranges always apply (chat skips them in thinking mode)."""
    yield from in_range("temperature", req.temperature, 0, 2, "F10")
    yield from in_range("top_p", req.top_p, 0, 1, "F10")


def rule_stream_options(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    if req.stream_options is not None and req.stream is not True:
        yield Problem("stream_options_without_stream", "stream_options",
                      "stream_options should be set along with stream = true. Set \"stream\": true or remove "
                      "'stream_options'.", "F11")


def rule_non_thinking(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    """F12: FIM runs in non-thinking mode only (docs/rules-fim.md). Its reference has no `thinking` or
    `reasoning_effort`, so DeepSeek ignores them there (unknown fields, R39): a warning by default, refused in
    strict mode."""
    warning = not ctx.strict
    thinking = req.thinking.get("type") if isinstance(req.thinking, dict) else None
    if thinking in THINKING_ON:
        yield Problem("thinking_not_supported", "thinking.type",
                      f"FIM completion is non-thinking only: thinking.type '{thinking}' has no effect on "
                      "/beta/completions (DeepSeek ignores 'thinking' there). Remove it, or use "
                      "/beta/chat/completions with prefix completion to have the model think.", "F12",
                      warning=warning)
    effort = req.reasoning_effort
    if effort is not None and effort != "none":
        shown = effort if isinstance(effort, str) else json_type(effort)
        yield Problem("thinking_not_supported", "reasoning_effort",
                      f"FIM completion is non-thinking only: reasoning_effort '{shown}' has no effect on "
                      "/beta/completions. Remove it.", "F12", warning=warning)
    if ctx.known and ctx.profile.thinking_only:
        yield Problem("thinking_not_supported", "model",
                      f"Model '{req.model}' always thinks, and FIM completion is non-thinking only (DeepSeek "
                      "lists FIM as not supported for deepseek-reasoner). Use 'deepseek-flash' or "
                      "'deepseek-v4-pro'.", "F12", warning=warning)


def rule_penalties(req: FimRequest, ctx: FimContext) -> Iterator[Problem]:
    """F13, strict mode only: deprecated, and DeepSeek says they "will not take effect"."""
    if not ctx.strict:
        return
    for name in ("frequency_penalty", "presence_penalty"):
        value: Any = getattr(req, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            yield Problem("invalid_type", name, f"Invalid type for '{name}': expected a number, but got "
                                                f"{json_type(value)} instead.", "F13")
        else:
            yield from in_range(name, value, -2, 2, "F13")


FIM_RULES: tuple[Rule[FimRequest, FimContext], ...] = (
    rule_model_known,
    rule_max_tokens,
    rule_logprobs,
    rule_stop,
    rule_sampling,
    rule_stream_options,
    rule_non_thinking,
    rule_penalties,
)

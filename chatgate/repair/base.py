"""What a repair is: a name, the rule it fixes, whether it is on by default; and what one did to a request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RepairSpec:
    name: str
    rules: tuple[str, ...]  # the rules whose problems it fixes (R, A, P numbers of docs/rules-*.md)
    default: bool
    what: str


# Every repair (issue 12 for chat, issue 13 for the Anthropic route, issue 17 for Responses); rule numbers
# say which family's problems each fixes (R: chat, A: Anthropic, P: Responses). A family applies the ones it
# knows, in its own order.
CATALOG: tuple[RepairSpec, ...] = (
    RepairSpec("restore_reasoning", ("R17",), True,
               "puts back the reasoning_content of a tool-call turn chatgate relayed to the same caller"),
    RepairSpec("restore_thinking", ("A10",), True,
               "puts back the thinking blocks of a tool-use turn chatgate relayed to the same caller, or "
               "the empty thinking block DeepSeek accepts where it never saw the turn"),
    RepairSpec("thinking_conflict", ("R41", "A12"), True,
               "drops the effort (reasoning_effort, output_config.effort) when thinking is disabled "
               "(lossless)"),
    RepairSpec("developer_role", ("R5",), False, "developer messages become system messages"),
    RepairSpec("flatten_content", ("R6",), False,
               "joins all-text content arrays of system, assistant and tool messages into one string"),
    RepairSpec("strip_images", ("R8",), False,
               "on models without vision, replaces image and file parts by a short text placeholder"),
    RepairSpec("forced_tool_choice", ("R34", "A13"), False,
               "a forced tool_choice in thinking mode: thinking is disabled for the request (choice kept)"),
    RepairSpec("clamp_max_tokens", ("R27",), False, "lowers max_tokens to the model's maximum"),
    RepairSpec("user_id", ("R37", "A15"), False,
               "replaces characters outside [a-zA-Z0-9_-] in user_id (metadata.user_id) and truncates it to "
               "512"),
    RepairSpec("orphan_tool_messages", ("R14", "R15"), False,
               "drops tool messages that answer no call of the assistant turn before them"),
    RepairSpec("unanswered_tool_calls", ("R16",), False,
               "inserts a tool message with a fixed text after each call left unanswered"),
    RepairSpec("system_messages", ("A3",), True,
               "system messages inside messages are appended to the top-level system, their text blocks "
               "as sent (lossless: every text kept, in order, with the system's authority)"),
    RepairSpec("split_tool_results", ("A7",), True,
               "tool_result blocks spread over later messages are merged into the message after the "
               "tool_use (lossless: nothing dropped, only moved)"),
    RepairSpec("empty_assistant", ("A6",), True,
               "an assistant message with an empty content array gets one text block (a space; lossless)"),
    RepairSpec("model_suffix", ("A19",), True,
               "strips a trailing [1m] from the model name (a client-side context hint DeepSeek does not "
               "know; lossless)"),
    RepairSpec("redacted_thinking", ("A5",), False, "drops redacted_thinking blocks"),
    # The Responses route (issue 17), rules P1-P23.
    RepairSpec("responses_output_order", ("P10",), True,
               "moves each function_call_output directly after its batch of calls (what stood between, a "
               "developer message or a later turn's reasoning, now follows the outputs; lossless)"),
    RepairSpec("responses_reasoning", ("P11",), True,
               "puts back the reasoning item of a tool-call turn chatgate relayed to the same caller (or, "
               "where it never saw the turn, makes a summary-only reasoning item's summary its content)"),
    RepairSpec("responses_strip_encrypted", ("P22",), False,
               "removes OpenAI's encrypted_content (gAAAAA…) from reasoning items; DeepSeek ignores it"),
    RepairSpec("responses_orphan_outputs", ("P8", "P9"), False,
               "drops function_call_output items that answer no call or have no call_id"),
    RepairSpec("responses_unanswered_calls", ("P10",), False,
               "adds a function_call_output with a fixed text after each call that has none"),
)
NAMES: tuple[str, ...] = tuple(spec.name for spec in CATALOG)
DEFAULT_ON: frozenset[str] = frozenset(spec.name for spec in CATALOG if spec.default)
RULES: dict[str, tuple[str, ...]] = {spec.name: spec.rules for spec in CATALOG}


@dataclass(frozen=True, slots=True)
class RepairOptions:
    enabled: frozenset[str] = DEFAULT_ON
    unanswered_tool_text: str = "no result: the call was interrupted"
    image_placeholder: str = "[image removed: this model does not accept images]"

    def on(self, name: str) -> bool:
        return name in self.enabled


@dataclass(slots=True)  # not frozen: made per repaired request, and frozen costs a call per field
class Applied:
    """One repair applied at one place; `path` uses the request's own (original) indices."""

    code: str
    path: str
    detail: str = ""

    def label(self) -> str:
        return f"{self.code}@{self.path}"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "path": self.path, "rules": list(RULES.get(self.code, ()))}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True, slots=True)
class Turn:
    """One relayed answer's tool calls and what to remember about them (chat: the reasoning_content)."""

    call_ids: tuple[str, ...]
    names: tuple[str, ...]
    payload: str


@dataclass(slots=True)
class Repaired:
    """The repairs applied to one request, and what they could not do."""

    applied: list[Applied] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # problem param -> why it was not repaired

    def labels(self) -> list[str]:
        return [a.label() for a in self.applied]

    def codes(self) -> list[str]:
        seen: dict[str, None] = {}
        for a in self.applied:
            seen.setdefault(a.code)
        return list(seen)


TurnCalls = tuple[tuple[str, ...], tuple[str, ...]]  # (call ids, tool names) of one tool-call turn


@dataclass(frozen=True, slots=True)
class InPlace:
    """A restore that needs no new parse of the body: the turns it wants (message index -> (call ids, tool
    names)), and how to put their recalled pieces into the body's bytes (-> the new body, what it did)."""

    wanted: dict[int, TurnCalls]
    apply: Callable[[dict[int, str]], tuple[bytes, list[Applied]]]

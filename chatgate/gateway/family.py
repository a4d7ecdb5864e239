"""What the gateway needs from an API family (OpenAI chat, Anthropic messages, …): its rules, its repairs,
its error shape, its usage and stream formats. A family is a package of pure code that provides one object
of this shape; the gateway does the rest (auth, limits, forwarding, relaying, metering) the same for all.

`FamilyBase` holds the defaults (no repairs, no turns to remember, OpenAI's error shape and usage object,
no usage to ask for in a stream): a family's adapter subclasses it and holds only what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from chatgate.errors import APIError, Problem
from chatgate.metering.cache import PromptShape
from chatgate.metering.calls import ModelCalls, ToolUnits, server_tool_use
from chatgate.metering.usage import TokenCounts, tokens_from_usage
from chatgate.profiles import ModelProfile
from chatgate.repair.base import Applied, InPlace, RepairOptions, Turn
from chatgate.repair.loop import Repairable
from chatgate.sse import LineWatcher
from chatgate.verdict import Verdict

# Paths DeepSeek does not serve that a family's clients ask for, each with the error made from (path, origin)
NotServed = Sequence[tuple[str, Callable[[str, str | None], APIError]]]
# Paths where chatgate counts a request's prompt tokens itself: (path, label, the text to count from the
# parsed body, or an APIError raised)
CountRoutes = Sequence[tuple[str, str, Callable[[Any], str]]]


@dataclass(frozen=True, slots=True)
class ToolRoute:
    """A tool API's route (chatgate/tools/): the tool, the model of its records, and its body: JSON, or a
    multipart upload of at most `upload` bytes (read whole: checked, and sent again by a retry)."""

    name: str
    upload: int = 0


class StreamMeter(Protocol):
    """Watches the relayed stream's bytes: its usage, its end, and its text for a local estimate."""

    @property
    def usage(self) -> TokenCounts | None: ...

    def feed(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...

    def final_in(self, lines: bytes) -> bool:
        """Whether these complete lines hold the stream's last event (the record is made before they are
        sent, as for a non-streaming answer)."""

    @property
    def text(self) -> str: ...

    @property
    def reasoning(self) -> str: ...

    @property
    def ended_with_error(self) -> bool: ...

    @property
    def model(self) -> str | None:
        """The model DeepSeek says it served, when the family meters by it (else None)."""

    @property
    def calls(self) -> ModelCalls | None:
        """The web searches and page reads the model made (server tools), when the stream says or shows
        any (chatgate/metering/calls.py)."""


class StreamTurns(LineWatcher, Protocol):
    """Collects the tool calls of a relayed stream, for the memory of turns (restore repairs), from the lines
    the stream's meter takes (it watches them: `family.meter(turns)`)."""

    def turn(self, reasoning: Callable[[], str]) -> Turn | None:
        """The turn, if the stream ended in one; `reasoning` (the meter's) is asked for only then."""


class ChunkFilter(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...


class Family(Repairable, Protocol):
    """An API family: its checks (Rules) and repairs (Repairable), and what follows."""

    # (path chatgate serves, label in records and metrics, DeepSeek's path, is it a /beta route)
    routes: Sequence[tuple[str, str, str, bool]]
    validate_routes: Sequence[tuple[str, bool]]  # the dry-run paths (and whether they check as /beta)
    # Paths DeepSeek does not serve that the family's clients ask for (FIM's /v1/completions, Responses'
    # /compact): answered by chatgate whatever the method, with the error made from (path, origin).
    not_served: NotServed
    # Paths where chatgate counts a request's prompt tokens itself (Anthropic's count_tokens): (path, label,
    # the text to count from the parsed body, or an APIError raised). The function is a module-level one:
    # it runs in a checker process for a large body (chatgate/web/count_tokens.py).
    token_counts: CountRoutes
    # The path prefix whose every route is this family's ("/anthropic/"): a path chatgate does not serve there
    # is answered in the family's error shape. "" for the families under the OpenAI shape's default paths.
    path_prefix: str
    # A tool API (chatgate/tools/): its route's tool; None for the model families
    tool: ToolRoute | None
    # How the context cache sees the family's requests (their parts in DeepSeek's order), for the cache
    # advisor (chatgate/metering/cache.py); None: no prompt cache to advise on
    prompt: PromptShape | None
    # How agent runs (chatgate/runs/) read the history its requests carry: "chat", "anthropic" or
    # "responses"; None: its requests are in no run
    history: str | None

    def render_error(self, error: APIError, request_id: str | None) -> tuple[bytes, dict[str, str]]:
        """The error in this family's shape: body and extra headers."""

    def stream_error(self, error: APIError) -> bytes:
        """The event that ends a stream broken after it started."""

    def usage(self, answer: Any) -> TokenCounts | None: ...

    def served_model(self, answer: Any) -> str | None:
        """The model DeepSeek says it served (the Anthropic route maps claude-* names), to meter by; None
        keeps the requested name."""

    def answer_turn(self, answer: Any) -> Turn | None: ...

    def model_calls(self, answer: Any) -> ModelCalls | None:
        """The web searches and page reads the model made for a whole answer (server tools)."""

    def billed_units(self, request: dict[str, Any], answer: bytes) -> ToolUnits | None:
        """A tool API's successful answer: what it is billed for (None: not a tool API)."""

    def meter(self, watcher: LineWatcher | None = None) -> StreamMeter:
        """The stream's meter; `watcher` also sees the lines it takes (the turn collector)."""

    def stream_turns(self) -> StreamTurns: ...

    def prompt_text(self, data: dict[str, Any]) -> str: ...

    def ask_stream_usage(self, data: dict[str, Any]) -> bytes | None:
        """The body re-serialised to ask for streamed usage, or None when it need not (or cannot)."""

    def usage_filter(self) -> ChunkFilter | None:
        """Removes from the stream the usage chatgate asked for and the client did not."""


class NoTurns:
    """The turn collector of a family whose answers are never tool-call turns: nothing to remember."""

    def lines(self, batch: bytes) -> None:
        return None

    def turn(self, reasoning: Callable[[], str]) -> Turn | None:
        return None


class FamilyBase:
    """The defaults of `Family`; a family sets `name`, `turn_kind`, `routes`, `validate_routes` and defines
    `check`, `meter` and `prompt_text`, and whatever else differs."""

    restore_codes: frozenset[str] = frozenset()
    restore_repair: str | None = None
    not_served: NotServed = ()
    token_counts: CountRoutes = ()
    path_prefix = ""
    tool: ToolRoute | None = None
    prompt: PromptShape | None = None
    history: str | None = None

    # --- repairs: none ---

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool:
        return False

    def turns_to_restore(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                         ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        return {}

    def restore_in_place(self, body: bytes, verdict: Verdict, options: RepairOptions) -> InPlace | None:
        return None

    def turn_of(self, data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
        return None

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]:
        return []

    # --- errors: OpenAI's shape ---

    def render_error(self, error: APIError, request_id: str | None) -> tuple[bytes, dict[str, str]]:
        return error.to_json(), {}

    def stream_error(self, error: APIError) -> bytes:
        """A chat-completions chunk holding the error (the openai SDKs raise it)."""
        return b"data: " + orjson.dumps({"error": error.body()["error"]}) + b"\n\n"

    # --- the answer: OpenAI's usage object, the model asked for, no turn ---

    def usage(self, answer: Any) -> TokenCounts | None:
        return tokens_from_usage(answer.get("usage")) if isinstance(answer, dict) else None

    def served_model(self, answer: Any) -> str | None:
        return None

    def answer_turn(self, answer: Any) -> Turn | None:
        return None

    def model_calls(self, answer: Any) -> ModelCalls | None:
        """As the answer's usage says (`usage.server_tool_use`); the families that know the result blocks
        of their answers count those when it does not."""
        return server_tool_use(answer.get("usage")) if isinstance(answer, dict) else None

    def billed_units(self, request: dict[str, Any], answer: bytes) -> ToolUnits | None:
        return None

    def stream_turns(self) -> StreamTurns:
        return NoTurns()

    # --- streams: their usage comes without asking ---

    def ask_stream_usage(self, data: dict[str, Any]) -> bytes | None:
        return None

    def usage_filter(self) -> ChunkFilter | None:
        return None

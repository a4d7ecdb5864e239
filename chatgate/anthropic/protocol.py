"""Wire models of DeepSeek's Anthropic-format request (docs/rules-anthropic.md).

Types and shapes only; the rules live in `rules.py`. Unknown fields are accepted (A23): chatgate forwards
the client's bytes. Content blocks are a union discriminated by `type`; a type this module does not model
is kept as an `OtherBlock`, so the rules can name it (A4, A5) instead of a generic type error.
What repeats is a `TypedDict` (as in the chat family: validating into dicts is much faster).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, with_config
from typing_extensions import TypedDict

WIRE = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class MessagesWireModel(BaseModel):
    model_config = ConfigDict(**WIRE, frozen=True)


# Block types DeepSeek documents as supported, and those it documents as not supported
# (docs/rules-anthropic.md, A4 and A5).
SUPPORTED_BLOCKS = ("text", "image", "thinking", "tool_use", "tool_result", "server_tool_use",
                    "web_search_tool_result")
UNSUPPORTED_BLOCKS = ("document", "search_result", "redacted_thinking", "code_execution_tool_result",
                      "mcp_tool_use", "mcp_tool_result", "container_upload")


@with_config(WIRE)
class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


@with_config(WIRE)
class ImageSource(TypedDict):
    type: str
    media_type: NotRequired[str | None]
    data: NotRequired[str | None]
    url: NotRequired[str | None]
    file_id: NotRequired[str | None]


@with_config(WIRE)
class ImageBlock(TypedDict):
    type: Literal["image"]
    source: ImageSource


@with_config(WIRE)
class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: NotRequired[str | None]


@with_config(WIRE)
class RedactedThinkingBlock(TypedDict):
    type: Literal["redacted_thinking"]
    data: NotRequired[str | None]


@with_config(WIRE)
class ToolUseBlock(TypedDict):
    type: Literal["tool_use", "server_tool_use"]
    id: str
    name: str
    input: dict[str, Any]


@with_config(WIRE)
class OtherBlock(TypedDict):
    """A block type chatgate does not model: A4/A5 say what DeepSeek does with it."""

    type: str


def _inner_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "image") else "other"


InnerBlock = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImageBlock, Tag("image")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_inner_kind),
]


@with_config(WIRE)
class ToolResultBlock(TypedDict):
    type: Literal["tool_result", "web_search_tool_result"]
    tool_use_id: str
    content: NotRequired[str | list[InnerBlock] | Any]
    is_error: NotRequired[bool | None]


_TAGS = {"text": "text", "image": "image", "thinking": "thinking", "redacted_thinking": "redacted_thinking",
         "tool_use": "tool_use", "server_tool_use": "tool_use", "tool_result": "tool_result",
         "web_search_tool_result": "tool_result"}


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return _TAGS.get(kind, "other") if isinstance(kind, str) else "other"


Block = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImageBlock, Tag("image")]
    | Annotated[ThinkingBlock, Tag("thinking")] | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[ToolUseBlock, Tag("tool_use")] | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "blocks"
    return None


Content = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[Block], Tag("blocks")],
    Discriminator(_content_kind, custom_error_type="content_type",
                  custom_error_message="content must be a string or an array of content blocks"),
]


@with_config(WIRE)
class Message(TypedDict):
    role: str  # user, assistant or latest_reminder (A3: checked by the rules, with DeepSeek's words)
    content: Content


@with_config(WIRE)
class MessagesTool(TypedDict):
    name: NotRequired[str]  # a client tool's is required (A17, checked by the rules); a new type may lack one
    type: NotRequired[str | None]  # absent or "custom" for client tools; server tools such as web_search_*
    description: NotRequired[str | None]
    input_schema: NotRequired[dict[str, Any] | None]


class MessagesThinking(MessagesWireModel):
    type: str
    budget_tokens: int | None = None


class MessagesToolChoice(MessagesWireModel):
    type: str
    name: str | None = None


class OutputConfig(MessagesWireModel):
    effort: str | None = None


class Metadata(MessagesWireModel):
    user_id: str | None = None


class MessagesSafetyCheck(MessagesWireModel):
    level: str | None = None


def _system_kind(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "blocks" if isinstance(value, list) else None


System = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[InnerBlock], Tag("blocks")],
    Discriminator(_system_kind, custom_error_type="content_type",
                  custom_error_message="system must be a string or an array of text blocks"),
]


class MessagesRequest(MessagesWireModel):
    model: str
    messages: list[Message]
    max_tokens: int
    system: System | None = None
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    thinking: MessagesThinking | None = None
    tools: list[MessagesTool] | None = None
    tool_choice: MessagesToolChoice | None = None
    output_config: OutputConfig | None = None
    safety_check: MessagesSafetyCheck | None = None

"""Wire models of DeepSeek's native Responses API request (`POST /responses`, docs/rules-responses.md).

Types and shapes only; the rules live in `rules.py`. Unknown fields are accepted (chatgate forwards the
client's bytes; DeepSeek silently ignores what it does not support), and so are unknown input item, content
part and tool types: each is kept as an `Other…` entry so that the rules can name it instead of a generic type
error. Unions are discriminated by `type` with a callable discriminator; its tags start with `~` so that the
type errors can drop them from the `param` path (type_errors.py). A message item may omit `type` (OpenAI's
"easy input message", `{"role": "user", "content": "hi"}`, which the SDKs send).

What repeats (items, parts, tools) is a `TypedDict`, as in the other families: validating a long Codex history
into plain dicts is much faster than into model instances.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, with_config
from typing_extensions import TypedDict

WIRE = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class ResponsesWireModel(BaseModel):
    model_config = ConfigDict(**WIRE, frozen=True)


# --- content parts -----------------------------------------------------------------------------------

TEXT_PARTS = ("input_text", "output_text")
ROLES = ("user", "assistant", "system", "developer")  # documented; another role is forwarded (P4)


@with_config(WIRE)
class ResponsesTextPart(TypedDict):
    type: Literal["input_text", "output_text"]
    text: str


@with_config(WIRE)
class ImagePart(TypedDict):
    type: Literal["input_image"]
    image_url: NotRequired[str | None]
    file_id: NotRequired[str | None]
    detail: NotRequired[str | None]


@with_config(WIRE)
class RefusalPart(TypedDict):
    type: Literal["refusal"]
    refusal: str


@with_config(WIRE)
class ResponsesOtherPart(TypedDict):
    """input_file, input_audio, … : P5 says what DeepSeek does with them."""

    type: str


_PART_TAGS = {"input_text": "~text", "output_text": "~text", "input_image": "~image", "refusal": "~refusal"}


def _part_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    return _PART_TAGS.get(kind, "~other") if isinstance(kind, str) else None


Part = Annotated[
    Annotated[ResponsesTextPart, Tag("~text")] | Annotated[ImagePart, Tag("~image")]
    | Annotated[RefusalPart, Tag("~refusal")] | Annotated[ResponsesOtherPart, Tag("~other")],
    Discriminator(_part_kind, custom_error_type="part_type",
                  custom_error_message="a content part must be an object with a 'type'"),
]


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~string"
    if isinstance(value, list):
        return "~parts"
    return None


Content = Annotated[
    Annotated[str, Tag("~string")] | Annotated[list[Part], Tag("~parts")],
    Discriminator(_content_kind, custom_error_type="content_type",
                  custom_error_message="content must be a string or an array of content parts"),
]

# --- input items -------------------------------------------------------------------------------------


@with_config(WIRE)
class MessageItem(TypedDict):
    type: NotRequired[Literal["message"]]
    role: str  # user / assistant / system / developer (P4: checked by the rules)
    content: Content
    id: NotRequired[str | None]
    status: NotRequired[str | None]


@with_config(WIRE)
class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # a JSON *string*, as DeepSeek returned it
    id: NotRequired[str | None]
    status: NotRequired[str | None]


@with_config(WIRE)
class FunctionCallOutputItem(TypedDict):
    type: Literal["function_call_output"]
    call_id: NotRequired[str]  # required by DeepSeek (P8: "missing field `call_id`"), checked by the rules
    output: str | list[Part]
    id: NotRequired[str | None]
    status: NotRequired[str | None]


@with_config(WIRE)
class ReasoningText(TypedDict):
    type: str  # "reasoning_text"
    text: str


@with_config(WIRE)
class ReasoningItem(TypedDict):
    type: Literal["reasoning"]
    id: NotRequired[str | None]
    summary: NotRequired[Any]  # accepted and ignored by DeepSeek
    content: NotRequired[list[ReasoningText] | None]
    encrypted_content: NotRequired[str | None]
    status: NotRequired[str | None]


@with_config(WIRE)
class CustomToolCallItem(TypedDict):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: NotRequired[str | None]


@with_config(WIRE)
class CustomToolCallOutputItem(TypedDict):
    type: Literal["custom_tool_call_output"]
    call_id: NotRequired[str]
    output: str | list[Part]


@with_config(WIRE)
class WebSearchCallItem(TypedDict):
    """Passed back as DeepSeek returned it; the server restores the search results."""

    type: Literal["web_search_call"]
    id: NotRequired[str | None]
    status: NotRequired[str | None]
    action: NotRequired[Any]


@with_config(WIRE)
class OtherItem(TypedDict):
    """A type DeepSeek ignores (agent_message, compaction, local_shell_call, item_reference, …): P21."""

    type: str


_ITEM_TAGS = {"message": "~message", "function_call": "~function_call",
              "function_call_output": "~function_call_output", "reasoning": "~reasoning",
              "custom_tool_call": "~custom_tool_call", "custom_tool_call_output": "~custom_tool_call_output",
              "web_search_call": "~web_search_call"}
ITEM_TYPES = tuple(_ITEM_TAGS)


def _item_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind is None:
        return "~message" if "role" in value else None
    return _ITEM_TAGS.get(kind, "~other") if isinstance(kind, str) else None


Item = Annotated[
    Annotated[MessageItem, Tag("~message")] | Annotated[FunctionCallItem, Tag("~function_call")]
    | Annotated[FunctionCallOutputItem, Tag("~function_call_output")]
    | Annotated[ReasoningItem, Tag("~reasoning")] | Annotated[CustomToolCallItem, Tag("~custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("~custom_tool_call_output")]
    | Annotated[WebSearchCallItem, Tag("~web_search_call")] | Annotated[OtherItem, Tag("~other")],
    Discriminator(_item_kind, custom_error_type="item_type",
                  custom_error_message="an input item must be an object with a 'type' (or a message 'role')"),
]


def _input_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~string"
    if isinstance(value, list):
        return "~items"
    return None


Input = Annotated[
    Annotated[str, Tag("~string")] | Annotated[list[Item], Tag("~items")],
    Discriminator(_input_kind, custom_error_type="input_type",
                  custom_error_message="input must be a string or an array of input items"),
]

# --- tools -------------------------------------------------------------------------------------------


@with_config(WIRE)
class FunctionTool(TypedDict):
    """Responses tools are flat: {type, name, parameters}, not chat's {type, function: {…}}."""

    type: Literal["function"]
    name: str
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[bool | None]


@with_config(WIRE)
class CustomTool(TypedDict):
    type: Literal["custom"]
    name: str
    description: NotRequired[str | None]
    format: NotRequired[Any]


@with_config(WIRE)
class OtherTool(TypedDict):
    """web_search / web_search_2025_08_26 (run by DeepSeek) and the types it ignores (file_search, mcp, …)."""

    type: str


def _tool_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if not isinstance(kind, str):
        return None
    return {"function": "~function", "custom": "~custom"}.get(kind, "~other")


Tool = Annotated[
    Annotated[FunctionTool, Tag("~function")] | Annotated[CustomTool, Tag("~custom")]
    | Annotated[OtherTool, Tag("~other")],
    Discriminator(_tool_kind, custom_error_type="tool_type",
                  custom_error_message="a tool must be an object with a 'type'"),
]


class ResponsesToolChoice(ResponsesWireModel):
    type: str
    name: str | None = None


class Reasoning(ResponsesWireModel):
    effort: str | None = None
    summary: str | None = None


class TextFormat(ResponsesWireModel):
    type: str


class TextOptions(ResponsesWireModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesSafetyCheck(ResponsesWireModel):
    level: str | None = None


class ResponsesRequest(ResponsesWireModel):
    model: str
    input: Input | None = None
    instructions: str | list[Any] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    max_output_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: str | ResponsesToolChoice | None = None
    reasoning: Reasoning | None = None
    text: TextOptions | None = None
    user: str | None = None
    safety_check: ResponsesSafetyCheck | None = None
    # Ignored by DeepSeek (stateless): read only to warn (P20), any type accepted.
    previous_response_id: Any = None
    conversation: Any = None
    truncation: Any = None
    background: Any = None
    thinking: Any = None  # chat's switch; on /responses its effect is unknown (thinking counts as unsure)

"""What DeepSeek's November 2026 release added to every API family's request: its server web tools,
`safety_check`, and the 512-byte limit of user ids (docs/rules-chat.md#the-november-2026-surface). The
families' rules use these; each family words its own problems."""

from __future__ import annotations

# Declared in `tools` on chat ({"type": …}), Messages ({"type": …, "name": …}) and Responses (web_tools
# guide, 2026-11); DeepSeek runs them itself.
SERVER_TOOLS = frozenset({"deepseek_web_search", "deepseek_read_url"})
# The models DeepSeek documents the server tools for; on another one its answer is not documented.
SERVER_TOOL_MODELS = frozenset({"deepseek-flash"})

SAFETY_LEVELS = ("high", "low")  # guides/safety: any other value is a 400
# rate_limit page (2026-11): at most 512 UTF-8 bytes; the character set is only recommended
USER_ID_MAX_BYTES = 512


def server_tool_model_note(kind: str, model: str, served_by: str) -> str | None:
    """The warning for a server tool on a model DeepSeek does not document it for, or None."""
    if served_by in SERVER_TOOL_MODELS:
        return None
    return (f"'{kind}' is DeepSeek's server tool, documented for deepseek-flash only; what DeepSeek does "
            f"with it on model '{model}' is not documented (forwarded).")


def safety_level_message(param: str, level: object) -> str:
    """DeepSeek's deserializer (serde) wording for a `safety_check.level` it does not know."""
    shown = f"`{level}`" if isinstance(level, str) else repr(level)
    return (f"Failed to deserialize the JSON body into the target type: {param}: unknown variant {shown}, "
            "expected `high` or `low`.")


def user_id_too_long(value: str) -> int | None:
    """The UTF-8 size of a user id over the limit, or None (the common case costs one len())."""
    if len(value) * 4 <= USER_ID_MAX_BYTES:
        return None
    size = len(value.encode("utf-8", "surrogatepass"))
    return size if size > USER_ID_MAX_BYTES else None


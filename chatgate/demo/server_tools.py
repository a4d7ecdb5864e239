"""What the fake DeepSeek answers for its server web tools, in one place (spec deepseek-api.md §13.1).

A request that declares `deepseek_web_search` (chat `{"type": …}`, Messages `{"type": …, "name": …}`,
Responses `{"type": …}`) gets an answer that "used" it: one search per answer to a user's own message, and
one fetch with `deepseek_read_url` when that message holds a link. DeepSeek runs them itself; the client
passes what comes back unchanged in the next round.

Only the Messages shapes are documented (Anthropic's server-tool blocks and `usage.server_tool_use`). The
Chat Completions and Responses shapes of the results and of the billed-call count are NOT documented in any
source read: the ones below are stand-ins chosen for the tests, so that a test can prove that chatgate relays
them and that a client passing them back in the next round is not refused. Anyone metering billed calls (the
`tools` work) should read the counts through `usage_counts` and treat the chat/Responses shapes as guesses.

- chat: the assistant message gets `web_search_results` (a list of {url, title, snippet}); a stream sends
  it in a delta before the content; `usage.server_tool_use = {"web_search_requests": N,
  "web_fetch_requests": M}`.
- Messages: `server_tool_use` + `web_search_tool_result` blocks before the text (a fetch: a second
  `server_tool_use` named deepseek_read_url + its result, in the same result block type: DeepSeek lists no
  other); `usage.server_tool_use` as Anthropic's `{"web_search_requests": N, "web_fetch_requests": M}`.
- Responses: one `deepseek_web_search_call` output item (and `deepseek_read_url_call`) before the message,
  with `action` and `results`; `usage.server_tool_use` as on chat.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

WEB_SEARCH = "deepseek_web_search"
READ_URL = "deepseek_read_url"
SERVER_TOOLS = (WEB_SEARCH, READ_URL)
_LINK = re.compile(r"https?://\S+")


@dataclass(frozen=True)
class WebUse:
    """The searches and fetches the fake model made for one answer."""

    query: str
    searches: int
    urls: tuple[str, ...]

    @property
    def fetches(self) -> int:
        return len(self.urls)

    def results(self) -> list[dict[str, str]]:
        return [{"url": f"https://example.com/search/{n}", "title": f"Result {n} for {self.query[:40]}",
                 "snippet": f"What the web says about {self.query[:40]} ({n})."} for n in (1, 2)]


def declared(tools: Any) -> set[str]:
    """The server tools a request declares (every family spells them by `type`)."""
    if not isinstance(tools, list):
        return set()
    return {t["type"] for t in tools if isinstance(t, dict) and t.get("type") in SERVER_TOOLS}


def web_use(tools: Any, user_text: str | None) -> WebUse | None:
    """What the fake model runs when answering a user's own message (`user_text`; None: it is answering tool
    results or nothing), or None when it runs nothing."""
    kinds = declared(tools)
    if not kinds or user_text is None:
        return None
    urls = tuple(_LINK.findall(user_text)) if READ_URL in kinds else ()
    searches = int(WEB_SEARCH in kinds)
    if not searches and not urls:
        return None
    return WebUse(user_text.strip()[:128] or "the question", searches, urls[:1])


def usage_field(use: WebUse) -> dict[str, Any]:
    """`usage.server_tool_use`: Anthropic's documented shape on Messages; the same stand-in on chat and
    Responses (undocumented there)."""
    return {"server_tool_use": {"web_search_requests": use.searches, "web_fetch_requests": use.fetches}}


def usage_counts(usage: Any) -> tuple[int, int] | None:
    """(searches, fetches) as the fake reports them in a `usage` object, or None without the field."""
    counts = usage.get("server_tool_use") if isinstance(usage, dict) else None
    if not isinstance(counts, dict):
        return None
    return int(counts.get("web_search_requests") or 0), int(counts.get("web_fetch_requests") or 0)


# --- chat ----------------------------------------------------------------------------------------------


def chat_message_field(use: WebUse) -> dict[str, Any]:
    """The stand-in extra field of the assistant message (and of one stream delta)."""
    return {"web_search_results": [*use.results(), *({"url": url, "title": "Fetched page",
                                                      "snippet": "The page's text."} for url in use.urls)]}


# --- Messages --------------------------------------------------------------------------------------------


def anthropic_blocks(use: WebUse) -> list[dict[str, Any]]:
    """server_tool_use + result blocks, as Anthropic's web search returns them (the spec's §9 names
    `server_tool_use` and `web_search_tool_result` among the blocks DeepSeek's route supports)."""
    out: list[dict[str, Any]] = []
    if use.searches:
        sid = f"srvtoolu_{uuid.uuid4().hex[:24]}"
        out.append({"type": "server_tool_use", "id": sid, "name": WEB_SEARCH, "input": {"query": use.query}})
        out.append({"type": "web_search_tool_result", "tool_use_id": sid, "content": [
            {"type": "web_search_result", "url": r["url"], "title": r["title"], "page_age": None,
             "encrypted_content": r["snippet"]} for r in use.results()]})
    for url in use.urls:  # DeepSeek lists no fetch-result block: the fake uses its search-result block
        fid = f"srvtoolu_{uuid.uuid4().hex[:24]}"
        out.append({"type": "server_tool_use", "id": fid, "name": READ_URL, "input": {"url": url}})
        out.append({"type": "web_search_tool_result", "tool_use_id": fid, "content": [
            {"type": "web_search_result", "url": url, "title": "Fetched page", "page_age": None,
             "encrypted_content": "The page's text."}]})
    return out


# --- Responses -------------------------------------------------------------------------------------------


def responses_items(use: WebUse) -> list[dict[str, Any]]:
    """The stand-in output items (undocumented shape), one per server tool used."""
    out: list[dict[str, Any]] = []
    if use.searches:
        out.append({"id": f"ws_{uuid.uuid4().hex[:24]}", "type": "deepseek_web_search_call",
                    "status": "completed", "action": {"type": "search", "query": use.query},
                    "results": use.results()})
    for url in use.urls:
        out.append({"id": f"ru_{uuid.uuid4().hex[:24]}", "type": "deepseek_read_url_call",
                    "status": "completed", "action": {"type": "open_page", "url": url},
                    "results": [{"url": url, "title": "Fetched page", "snippet": "The page's text."}]})
    return out


def title_for(text: str) -> str:
    """The conversation title the fake gives with `title: {"enabled": true}` (guides/conversation_title)."""
    words = text.split()[:6]
    return "Chat: " + (" ".join(words) if words else "untitled")


def wants_title(body: dict[str, Any]) -> bool:
    title = body.get("title")
    return isinstance(title, dict) and title.get("enabled") is True

"""Writes tests/corpus/november/november.jsonl: requests shaped as DeepSeek's November 2026 release documents
them (spec deepseek-api.md §13.1-§13.2, and the "2026-11/12 changes" of the Anthropic and Responses notes):
its server web tools on every family, `title`, `safety_check`, `latest_reminder`, user ids outside the old
pattern, server-tool results passed back, Claude Code's and Codex's newest tool types. Each case says whether
DeepSeek accepts it (`valid`) or which code chatgate must refuse it with. Run
`python -m tests.corpus.november.build` after changing a case; `python -m tests.corpus.november.measure`
counts what a tree's rules make of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("november.jsonl")

CHAT = "/v1/chat/completions"
MESSAGES = "/anthropic/v1/messages"
RESPONSES = "/v1/responses"

REMINDER = {"role": "latest_reminder", "content": "2026-11-11,Wednesday,Singapore,Web,English"}
CHAT_SEARCH = {"type": "deepseek_web_search"}
CHAT_READ = {"type": "deepseek_read_url"}
MSG_SEARCH = {"type": "deepseek_web_search", "name": "deepseek_web_search"}
MSG_READ = {"type": "deepseek_read_url", "name": "deepseek_read_url"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array",
                                                                      "items": {"type": "string"}}},
                        "required": ["command"], "additionalProperties": False}}
RESULTS = [{"url": "https://example.com/news/1", "title": "Markets today", "snippet": "Stocks rose."}]


def chat(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "messages": messages, **extra}


def messages(msgs: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "max_tokens": 4096, "messages": msgs, **extra}


def responses(items: list[Any] | str, **extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "input": items, "store": False, **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


CASES: list[dict[str, Any]] = [
    # --- chat completions: valid
    {"name": "chat-web-search", "path": CHAT,
     "body": chat([user("What happened in the markets today?")], tools=[CHAT_SEARCH],
                  thinking={"type": "disabled"})},
    {"name": "chat-read-url-and-a-function", "path": CHAT,
     "body": chat([user("Summarise https://example.com/post and tell me the weather in Oslo.")],
                  tools=[CHAT_READ, WEATHER], tool_choice="auto")},
    {"name": "chat-deep-search-with-a-title", "path": CHAT,
     "body": chat([{"role": "system", "content": "You are a research assistant."},
                   user("Compare the last three DeepSeek releases.")],
                  tools=[CHAT_SEARCH, CHAT_READ], title={"enabled": True}, stream=True)},
    {"name": "chat-safety-high-and-a-user-id-with-spaces-at-and-chinese", "path": CHAT,
     "body": chat([user("Hello")], safety_check={"level": "high"}, user_id="张伟 zhang.wei@example.com")},
    {"name": "chat-latest-reminder-before-the-user-message", "path": CHAT,
     "body": chat([{"role": "system", "content": "Be brief."}, REMINDER, user("What day is it?")],
                  safety_check={"level": "low"})},
    {"name": "chat-server-tool-results-passed-back", "path": CHAT,
     "body": chat([REMINDER, user("What happened in the markets today?"),
                   {"role": "assistant", "content": "Stocks rose today.", "reasoning_content": "Searched.",
                    "web_search_results": RESULTS, "title": "Chat: markets today"},
                   REMINDER, user("And bonds?")], tools=[CHAT_SEARCH], title={"enabled": True})},
    # --- Messages: valid
    {"name": "messages-web-search-and-read-url", "path": MESSAGES,
     "body": messages([user("What is new on https://example.com/blog?")], tools=[MSG_SEARCH, MSG_READ])},
    {"name": "messages-latest-reminder-before-the-user-message", "path": MESSAGES,
     "body": messages([REMINDER, user("Plan my day.")], system="You are a helpful assistant.")},
    {"name": "messages-title-safety-and-a-chinese-user-id", "path": MESSAGES,
     "body": messages([user("Hi")], title={"enabled": True}, safety_check={"level": "high"},
                      metadata={"user_id": "用户 42 @ 上海"})},
    {"name": "messages-server-tool-blocks-passed-back", "path": MESSAGES,
     "body": messages([
         REMINDER, user("Search the news"),
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "I will search.", "signature": "sig"},
             {"type": "server_tool_use", "id": "srvtoolu_01", "name": "deepseek_web_search",
              "input": {"query": "news"}},
             {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
                 {"type": "web_search_result", "url": "https://example.com/n", "title": "News",
                  "encrypted_content": "x", "page_age": None}]},
             {"type": "text", "text": "Here is the news."}]},
         REMINDER, user("More detail?")], tools=[MSG_SEARCH])},
    {"name": "messages-claude-code-newest-tool-types", "path": MESSAGES,
     "body": messages([user("Fix the test")], stream=True, thinking={"type": "adaptive"},
                      tools=[READ, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                             {"type": "advisor_20260301", "name": "advisor"},
                             {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
                             MSG_SEARCH],
                      metadata={"user_id": '{"device_id":"ea10","account_uuid":"","session_id":"db60"}'})},
    {"name": "messages-safety-low-streamed", "path": MESSAGES,
     "body": messages([user("Hi")], safety_check={"level": "low"}, stream=True)},
    # --- Responses: valid
    {"name": "responses-web-search-and-read-url", "path": RESPONSES,
     "body": responses([user("Find the latest news on https://example.com")],
                       tools=[CHAT_SEARCH, CHAT_READ])},
    {"name": "responses-title-safety-and-a-chinese-user", "path": RESPONSES,
     "body": responses("Hello", title={"enabled": True}, safety_check={"level": "high"}, user="王芳 42")},
    {"name": "responses-server-tool-item-passed-back", "path": RESPONSES,
     "body": responses([
         user("Find the news"),
         {"id": "rs_1", "type": "reasoning", "summary": [],
          "content": [{"type": "reasoning_text", "text": "I will search."}]},
         {"id": "ws_1", "type": "deepseek_web_search_call", "status": "completed",
          "action": {"type": "search", "query": "news"}, "results": RESULTS},
         {"type": "message", "role": "assistant",
          "content": [{"type": "output_text", "text": "Stocks rose."}]},
         user("And bonds?")], tools=[CHAT_SEARCH])},
    {"name": "responses-codex-newest-tool-types", "path": RESPONSES,
     "body": responses([user("Run the tests")], stream=True, tool_choice="auto",
                       tools=[SHELL, {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                              {"type": "web_search"}, CHAT_SEARCH,
                              {"type": "namespace", "name": "agents", "tools": []},
                              {"type": "tool_search"}])},
    {"name": "responses-user-with-spaces-and-at-safety-low", "path": RESPONSES,
     "body": responses("Hi", user="ana maria@example.com", safety_check={"level": "low"})},
    # --- invalid: DeepSeek refuses these
    {"name": "chat-safety-check-medium", "path": CHAT, "refused": "invalid_safety_check",
     "body": chat([user("Hi")], safety_check={"level": "medium"})},
    {"name": "chat-user-id-over-512-bytes", "path": CHAT, "refused": "invalid_user_id",
     "body": chat([user("Hi")], user_id="用户" * 86)},  # 172 characters, 516 bytes
    {"name": "messages-safety-check-strict", "path": MESSAGES, "refused": "invalid_safety_check",
     "body": messages([user("Hi")], safety_check={"level": "strict"})},
    {"name": "responses-safety-check-max", "path": RESPONSES, "refused": "invalid_safety_check",
     "body": responses("Hi", safety_check={"level": "max"})},
]


def main() -> None:
    OUT.write_text("".join(json.dumps(case, ensure_ascii=False) + "\n" for case in CASES))
    print(f"wrote {len(CASES)} cases to {OUT}")


if __name__ == "__main__":
    main()

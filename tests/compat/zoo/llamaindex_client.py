"""The zoo's LlamaIndex driver, run by the interpreter of its own virtualenv (llamaindex_env.py):
`python llamaindex_client.py JOBS.json` runs each job (a scenario made by tests/compat/zoo/model.py) with
`OpenAILike(is_chat_model=True, is_function_calling_model=True)` and prints the outcomes as one JSON line.

Standard library and LlamaIndex only: this file does not import the repository."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "::1")
tried: list[str] = []
_getaddrinfo = socket.getaddrinfo


def _loopback_only(host: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name not in LOOPBACK:
        tried.append(name)
        raise socket.gaierror(socket.EAI_NONAME, f"zoo: no network beyond this machine ({name})")
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _loopback_only  # before LlamaIndex is imported: nothing may be fetched at run time

from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.llms.openai_like import OpenAILike  # noqa: E402


def search_forecast(q: str) -> str:
    """Search the weather forecast."""
    return f"forecast for {q}: light rain"


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    tool = FunctionTool.from_defaults(fn=search_forecast)
    extra = {} if job["thinking"] else {"additional_kwargs": {"extra_body": job["no_thinking"]}}
    llm = OpenAILike(model=job["model"], api_base=job["base_url"], api_key=job["api_key"], is_chat_model=True,
                     is_function_calling_model=True, max_retries=0, timeout=10, **extra)
    messages = [ChatMessage(role="user", content=job["prompt"])]
    while True:
        if job["stream"]:
            response = None
            for chunk in llm.stream_chat_with_tools([tool], chat_history=messages):
                response = chunk  # the last one carries the whole message
        else:
            response = llm.chat_with_tools([tool], chat_history=messages)
        assert response is not None
        calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
        if not calls:
            return {"text": response.message.content}
        messages.append(response.message)
        for call in calls:
            messages.append(ChatMessage(role="tool", content=search_forecast(**call.tool_kwargs),
                                        additional_kwargs={"tool_call_id": call.tool_id}))


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        try:
            outcome = run_job(job)
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            outcome = {"status": status, "error": f"{type(exc).__name__}: {exc}"[:4000]}
        results.append({"id": job["id"], "target": job["target"], **outcome})
    print(json.dumps({"results": results, "network": tried}))


if __name__ == "__main__":
    main()

"""An offline stand-in for DeepSeek: chat, streams, thinking, tool calls, FIM, files, the Anthropic and
Responses routes, answered deterministically from the request. The tests' upstream, and what `chatgate demo`
serves (it is not DeepSeek: every answer says so).

`chatgate.demo.deepseek` holds the ASGI app and its state; the other modules add routes to it.
"""

"""The OpenAI chat-completions family: wire models, rules, type errors."""

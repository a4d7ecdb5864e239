"""The OpenAI chat-completions family: wire models, rules, type errors (FIM, its sibling, is
chatgate/fim/)."""

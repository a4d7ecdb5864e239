"""The OpenAI Responses API family (DeepSeek's native `/responses`, used by Codex): its wire models,
rules P1-P23 (README, Codex and the Responses API), repairs, error shape and stream."""

"""The Anthropic Messages family (DeepSeek's `/anthropic` route, used by Claude Code and the `anthropic`
SDKs): its wire models, rules A1-A23 (deepseek-anthropic.md §7), repairs, error shape and stream."""

"""The Anthropic Messages family (DeepSeek's `/anthropic` route, used by Claude Code and the `anthropic`
SDKs): its wire models, rules A1-A24 (docs/rules-anthropic.md), repairs, error shape and stream."""

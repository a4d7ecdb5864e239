"""Rules that keep themselves true: refusals confirmed with DeepSeek, and what its answers teach
(docs/confirmation.md)."""

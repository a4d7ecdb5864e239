"""chatgate: a local, OpenAI-compatible, validating and metering proxy for DeepSeek."""

__version__ = "0.1.0"

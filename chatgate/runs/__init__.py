"""Agent runs (issue 52): the requests of one agent task seen as one thing, metered and bounded."""

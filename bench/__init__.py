"""Benchmark harness: chatgate side by side with reference passthroughs (see bench/README.md)."""

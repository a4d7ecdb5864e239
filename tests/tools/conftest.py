"""The tool APIs' end-to-end tests run chatgate in front of the fake DeepSeek, as the gateway's do: the same
fixtures (tests/gateway/conftest.py)."""

from tests.gateway.conftest import event_loop_name, fake, fake_server, gate, start_gate

__all__ = ["event_loop_name", "fake", "fake_server", "gate", "start_gate"]

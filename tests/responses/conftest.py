"""The gateway fixtures (a fake DeepSeek, chatgate in front of it) for the Responses tests."""

from tests.gateway.conftest import event_loop_name, fake, fake_server, gate, start_gate

__all__ = ["event_loop_name", "fake", "fake_server", "gate", "start_gate"]

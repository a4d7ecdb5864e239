"""Which problems are claims about DeepSeek, and what DeepSeek's words credit
(chatgate/confirmation/claims.py)."""

from __future__ import annotations

from chatgate.confirmation.claims import (
    Claim,
    claims_of,
    credited,
    error_message,
    masked,
    named_only,
    warned_claims,
)
from chatgate.errors import Problem

FLASH = "deepseek-flash"


def problem(rule: str | None, **extra: bool) -> Problem:
    return Problem("code", None, "message", rule, **extra)


def test_only_rules_of_the_catalogue_about_deepseek_are_claims() -> None:
    assert claims_of([problem("R29"), problem("R27"), problem("R29")], FLASH) == [
        Claim("R27", "chat", FLASH), Claim("R29", "chat", FLASH)]
    assert claims_of([problem("A2")], FLASH) == [Claim("A2", "anthropic", FLASH)]
    for own in ("R1", "F1", "R40", "T2", None, "X9", "R12"):  # protections, tools, strict-only, unknown
        assert claims_of([problem("R29"), problem(own)], FLASH) is None, own


def test_warnings_are_claims_unless_a_notice() -> None:
    warnings = [problem("R41", warning=True), problem("A4", warning=True, notice=True)]
    assert warned_claims(warnings, FLASH) == [Claim("R41", "chat", FLASH)]


def test_deepseeks_words_credit_the_rule_they_name() -> None:
    r27, r29 = Claim("R27", "chat", FLASH), Claim("R29", "chat", FLASH)
    words = "stream_options should be set along with stream = true"
    assert credited([r27, r29], words) == [r29]
    assert credited([r27, r29], "something else entirely") == [r27, r29]  # none named: each confirmed
    assert named_only([r27], "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]") == [r27]


def test_messages_are_grouped_with_numbers_and_ids_masked() -> None:
    assert masked("Invalid 'user': 42 is not allowed for req-1234abcd") == \
        "Invalid 'user': N is not allowed for X"
    assert masked("No tool output found for tool call call_0_9f2c") == "No tool output found for tool call X"
    assert error_message(b'{"error": {"message": "m1", "type": "x"}}') == "m1"
    assert error_message(b'{"type": "error", "error": {"type": "x", "message": "m2"}}') == "m2"
    assert error_message(b"plain text") == "plain text"

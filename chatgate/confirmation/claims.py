"""Which of a request's problems are claims about DeepSeek (a rule of the catalogue, checked against DeepSeek
by forwarding), and what DeepSeek's words say about them. Pure functions (docs/confirmation.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from chatgate.errors import Problem
from chatgate.rules.catalogue import RuleEntry, lookup, matching

# chatgate's own protections, not claims about DeepSeek: R1/F1 (bodies that are not JSON, nesting, NaN,
# duplicate keys), the context guard (its own token count) and the tool APIs' checks (uploads)
OWN_RULES = frozenset({"R1", "F1", "R40", "A22"})
CLAIM_LEVELS = frozenset({"refused", "mixed", "warned"})
# the gateway's family names as the catalogue names them
CATALOGUE_FAMILY = {"openai-chat": "chat", "anthropic-messages": "anthropic", "openai-responses": "responses",
                    "openai-fim": "fim"}
OTHER_MODEL = "*"  # the evidence of a model chatgate does not serve: one key for all of them


@dataclass(frozen=True, slots=True, order=True)
class Claim:
    """A rule of a family as it applies to a model: the unit evidence is kept by."""

    rule: str
    family: str
    model: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.family, self.model)


def claim_of(problem: Problem, model: str) -> Claim | None:
    """The claim a problem makes about DeepSeek, None for chatgate's own protections."""
    entry = _entry(problem)
    if entry is None:
        return None
    return Claim(entry.id, entry.family, model)


def _entry(problem: Problem) -> RuleEntry | None:
    if problem.rule is None or problem.rule in OWN_RULES:
        return None
    entry = lookup(problem.rule)
    if entry is None or entry.family == "tools" or entry.level not in CLAIM_LEVELS:
        return None
    return entry


def claims_of(problems: Sequence[Problem], model: str) -> list[Claim] | None:
    """The claims of the problems (each once, sorted), None when one of them is not a claim (then the
    request is refused as it always was)."""
    found: set[Claim] = set()
    for problem in problems:
        claim = claim_of(problem, model)
        if claim is None:
            return None
        found.add(claim)
    return sorted(found)


def warned_claims(warnings: Iterable[Problem], model: str) -> list[Claim]:
    """The claims a request's warnings make (those its caller is told of)."""
    return sorted({c for w in warnings if not w.notice and (c := claim_of(w, model)) is not None})


def credited(claims: Sequence[Claim], message: str) -> list[Claim]:
    """The claims a refusal of DeepSeek's confirms: those its `message` names in their rule's words; when it
    names none, all of them (DeepSeek refused a request that broke each: else every such request would be
    forwarded again)."""
    return named_only(claims, message) or list(claims)


def named_only(claims: Sequence[Claim], message: str) -> list[Claim]:
    """The claims whose rule's words DeepSeek's message carries (a warned request's refusal)."""
    named = {(e.family, e.id) for e in matching(message)}
    return [c for c in claims if (c.family, c.rule) in named]


_MASK = re.compile(r"\b(?:call|toolu|fc|msg|resp|req|file|rs)[_-][\w-]+|\b[0-9a-f]{8,}\b|\d+(?:\.\d+)?"
                   r"|'[^']{24,}'|\"[^\"]{24,}\"")
MESSAGE_MAX = 300


def masked(message: str) -> str:
    """A DeepSeek message with its numbers, ids and long quoted values masked: the key of its group."""
    return _MASK.sub(lambda m: "N" if m.group(0)[0].isdigit() else "X", message)[:MESSAGE_MAX]


def error_message(content: bytes) -> str:
    """The message of DeepSeek's error body (OpenAI's and Anthropic's shapes), else its text."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content[:MESSAGE_MAX].decode("utf-8", "replace").strip()
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return content[:MESSAGE_MAX].decode("utf-8", "replace").strip()

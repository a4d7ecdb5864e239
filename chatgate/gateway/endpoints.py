"""Which API family serves which path: the one place the families are wired into the gateway."""

from __future__ import annotations

from chatgate.anthropic.family import MessagesFamily
from chatgate.fim.family import FimFamily
from chatgate.gateway.exchange import Route
from chatgate.gateway.family import Family
from chatgate.gateway.proxy import Endpoint
from chatgate.openai.chat import ChatFamily
from chatgate.responses.family import ResponsesFamily
from chatgate.settings import Settings
from chatgate.tools.family import tool_families


def families(settings: Settings) -> list[Family]:
    policy = settings.policy()
    return [ChatFamily(policy), FimFamily(policy), MessagesFamily(policy), ResponsesFamily(policy),
            *tool_families(settings.validation.strict)]


def build_endpoints(settings: Settings) -> tuple[dict[str, Endpoint], dict[str, Endpoint]]:
    """(POST routes that are forwarded, POST dry-run routes), by path."""
    forwarded: dict[str, Endpoint] = {}
    dry_runs: dict[str, Endpoint] = {}
    for family in families(settings):
        for path, label, upstream_path, beta in family.routes:
            forwarded[path] = Endpoint(Route(label, upstream_path, beta, family.tool, family.prompt,
                                             family.history), family)
        for path, beta in family.validate_routes:
            dry_runs[path] = Endpoint(Route(path, "", beta, family.tool), family)
    return forwarded, dry_runs

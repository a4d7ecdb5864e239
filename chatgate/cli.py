"""`chatgate serve | demo | keys | usage | refusals | rules | cache | config check | lint`."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from chatgate import __version__
from chatgate.settings import ConfigError, LoadedSettings, effective, load_settings
from chatgate.store.base import GROUP_BYS

FLAGS_ENV = "_CHATGATE_SERVE_FLAGS"  # how `serve` hands its flags to uvicorn's worker processes
SINCE_HELP = "from this time, inclusive: a date or datetime (UTC), 24h, 7d, 2w (back from now), today"
UNTIL_HELP = "to this time, exclusive: a date or datetime (UTC), 24h, 7d, 2w (back from now), today"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result: int = args.func(args)
    except ConfigError as exc:
        print(f"chatgate: config error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        from chatgate.metering.reports import ReportError

        if not isinstance(exc, ReportError):
            raise
        print(f"chatgate: {exc}", file=sys.stderr)  # a bad --since, --until, --at or --by
        return 2
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatgate", description="Validating, metering proxy for DeepSeek.")
    parser.add_argument("--version", action="version", version=f"chatgate {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the proxy", description="Run the proxy (OpenAI-compatible).")
    _config_arg(serve)
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8787)")
    serve.add_argument("--workers", type=int, help="worker processes (default 1)")
    serve.add_argument("--upstream", help="DeepSeek base URL (default https://api.deepseek.com)")
    serve.add_argument("--auth", choices=["passthrough", "managed"], help="client key mode")
    _store_arg(serve)
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser("demo", help="try chatgate without a DeepSeek key: an offline stand-in answers",
                          description="Run chatgate in front of a built-in offline stand-in for DeepSeek "
                          "(not "
                          "DeepSeek: deterministic answers, no key, no network; every answer carries the "
                          "header x-chatgate-demo). Chat, streams, thinking, tool calls, the Anthropic and "
                          "Responses routes; a throw-away store and admin key for the dashboard. Ignores the "
                          "config file and the CHATGATE_*/DEEPSEEK_* variables.")
    demo.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    demo.set_defaults(func=cmd_demo)

    keys = sub.add_parser("keys", help="manage client keys (managed mode) and their limits",
                          description="Manage client keys and their limits.")
    keys_sub = keys.add_subparsers(metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key; prints it once",
                                 description="Create a key, optionally with its own limits (its team's apply "
                                 "too); the secret is printed once, on the last line.")
    create.add_argument("--team", required=True)
    create.add_argument("--name", required=True)
    _limit_args(create)
    listing = keys_sub.add_parser("list", help="list keys and their limits",
                                  description="List keys (never the secrets) with their limits, and the "
                                  "passthrough fingerprints that have limits.")
    listing.add_argument("--format", choices=["table", "json"], default="table",
                         help="json: the document GET /admin/keys answers (with the period's spend)")
    revoke = keys_sub.add_parser("revoke", help="revoke a key", description="Revoke a key by id.")
    revoke.add_argument("key_id")
    key_set = keys_sub.add_parser("set", help="set a key's limits",
                                  description="Set the limits of a managed key (key_…) or of a passthrough "
                                  "caller (its fingerprint fp-…, as in usage reports); prints the result.")
    key_set.add_argument("key_id", metavar="KEY_ID")
    _limit_args(key_set)
    _lang_arg(listing)
    for p, func in ((create, cmd_keys_create), (listing, cmd_keys_list), (revoke, cmd_keys_revoke),
                    (key_set, cmd_keys_set)):
        _config_arg(p)
        _store_arg(p)
        p.set_defaults(func=func)

    teams = sub.add_parser("teams", help="team limits and budget use", description="Team limits and budgets.")
    teams_sub = teams.add_subparsers(metavar="ACTION")
    team_set = teams_sub.add_parser("set", help="set a team's limits",
                                    description="Set a team's limits (they apply to every key of the team "
                                    "together; passthrough callers are in the team 'default'); prints the "
                                    "result.")
    team_set.add_argument("team", metavar="TEAM")
    _limit_args(team_set)
    team_list = teams_sub.add_parser("list", help="teams, their limits and budget use",
                                     description="Every team that has limits or keys (and 'default'): its "
                                     "limits, the current period's spend and what is left.")
    team_list.add_argument("--format", choices=["table", "json"], default="table",
                           help="json: the document GET /admin/teams answers")
    _lang_arg(team_list)
    for p, func in ((team_set, cmd_teams_set), (team_list, cmd_teams_list)):
        _config_arg(p)
        _store_arg(p)
        p.set_defaults(func=func)

    usage = sub.add_parser("usage", help="usage report", description=(
        "Token usage and cost, grouped, with the requests refused by chatgate's rules (rejected), by its "
        "limits (limited), by DeepSeek (ds_refused: its 4xx) and failed at DeepSeek (ds_failed: 5xx, no "
        "answer) counted apart (docs/metering.md)."))
    usage.add_argument("--by", choices=list(GROUP_BYS), default="team",
                       help="group by client key, team, model, UTC day, rejecting rule or limit, repair, or "
                       "the DeepSeek account that answered")
    usage.add_argument("--since", help=SINCE_HELP)
    usage.add_argument("--until", help=UNTIL_HELP)
    usage.add_argument("--format", choices=["table", "csv", "json"], default="table")
    _lang_arg(usage)
    _config_arg(usage)
    _store_arg(usage)
    usage.set_defaults(func=cmd_usage)

    prices = sub.add_parser("prices", help="the prices in force, the peak calendar, the next peak window",
                            description="DeepSeek's prices as chatgate bills them (the catalogue and the "
                            "configuration): per model, peak and off-peak, with sources and dates; the peak "
                            "calendar and the holidays; when the next peak window starts and ends.")
    prices.add_argument("--at", help="at this date/datetime (UTC unless it says otherwise) or unix seconds; "
                        "default now")
    prices.add_argument("--currency", choices=["USD", "CNY", "both"],
                        help="default: pricing.currency (auto: both)")
    prices.add_argument("--format", choices=["table", "json"], default="table")
    _lang_arg(prices)
    _config_arg(prices)
    prices.set_defaults(func=cmd_prices)

    cache = sub.add_parser("cache", help="context-cache report: hit rates, savings, prefix breaks",
                           description="Per caller: DeepSeek context-cache hit rate, the money hits saved, "
                           "and the prompt-prefix breaks that cost money (estimated; docs/cache.md).")
    cache.add_argument("--by", choices=["key", "team", "model"], default="key")
    cache.add_argument("--since", help=SINCE_HELP)
    cache.add_argument("--until", help=UNTIL_HELP)
    cache.add_argument("--format", choices=["table", "json"], default="table",
                       help="json: the document GET /admin/cache answers")
    _lang_arg(cache)
    _config_arg(cache)
    _store_arg(cache)
    cache.set_defaults(func=cmd_cache)

    config = sub.add_parser("config", help="configuration tools", description="Configuration tools.")
    config_sub = config.add_subparsers(metavar="ACTION")
    check = config_sub.add_parser("check", help="print the effective configuration and where each value "
                                  "comes from", description="Print the effective configuration.")
    _config_arg(check)
    check.set_defaults(func=cmd_config_check)

    refusals = sub.add_parser("refusals", help="the requests chatgate or DeepSeek refused lately",
                              description="The refused requests kept in the store (server.capture_refusals): "
                              "chatgate's 400s and DeepSeek's 4xx answers, bodies redacted.")
    refusals_sub = refusals.add_subparsers(metavar="ACTION")
    r_list = refusals_sub.add_parser("list", help="newest first", description="The kept refusals, newest "
                                     "first.")
    r_list.add_argument("--team")
    r_list.add_argument("--key", help="a key id (key_…) or passthrough fingerprint (fp-…)")
    r_list.add_argument("--rule", help="a rule (R16, A3, …) or problem code")
    r_list.add_argument("--since", help=SINCE_HELP)
    r_list.add_argument("--limit", type=int, default=100, help="at most this many (1 to 1000)")
    r_list.add_argument("--cursor", help="the page after this one's last (printed when there are more)")
    r_list.add_argument("--format", choices=["table", "json"], default="table")
    _lang_arg(r_list)
    r_show = refusals_sub.add_parser("show", help="one refusal, its problems marked on its body",
                                     description="One refusal: its problems marked on its redacted body.")
    r_show.add_argument("request_id", help="its refusal id, or its request id")
    r_show.add_argument("--key", help="of this key's refusals only")
    r_show.add_argument("--team", help="of this team's refusals only")
    r_show.add_argument("--fix", action="store_true", help="also print what `chatgate lint --fix` would "
                        "repair in it, and the repaired body; an opt-in repair that is off but would apply "
                        "is named with the setting that turns it on")
    r_show.add_argument("--format", choices=["text", "json"], default="text")
    for p, func in ((r_list, cmd_refusals_list), (r_show, cmd_refusals_show)):
        _config_arg(p)
        _store_arg(p)
        p.set_defaults(func=func)

    runs = sub.add_parser("runs", help="agent runs: each agent task's requests, tokens, cost and context",
                          description="Agent runs (docs/runs.md): the requests of one agent task, told apart "
                          "by x-chatgate-run, the agent's session, or its history; the latest begun first.")
    runs.add_argument("--team")
    runs.add_argument("--key", help="a key id (key_…) or passthrough fingerprint (fp-…)")
    runs.add_argument("--since", help=SINCE_HELP + " (default 7d)")
    runs.add_argument("--limit", type=int, default=50, help="at most this many runs (1 to 1000)")
    runs.add_argument("--format", choices=["table", "json"], default="table")
    _lang_arg(runs)
    runs_sub = runs.add_subparsers(metavar="ACTION")
    run_show = runs_sub.add_parser("show", help="one run, request by request, with its context growth",
                                   description="One run request by request: tokens, cost, the tools its "
                                   "model called, the context it sent and how it grew.")
    run_show.add_argument("run_id", metavar="RUN", help="its id, or the start of it")
    run_show.add_argument("--format", choices=["text", "json"], default="text")
    for p, func in ((runs, cmd_runs), (run_show, cmd_runs_show)):
        _config_arg(p)
        _store_arg(p)
        p.set_defaults(func=func)

    rules = sub.add_parser("rules", help="what DeepSeek answered about chatgate's rules",
                           description="The rules' evidence from DeepSeek (docs/confirmation.md): each "
                           "rule's status per family and model (enforced, warned, disputed), and DeepSeek's "
                           "refusals no rule predicted.")
    rules.add_argument("--family", choices=["chat", "anthropic", "responses", "fim"])
    rules.add_argument("--since", help=SINCE_HELP)
    rules.add_argument("--format", choices=["table", "json"], default="table")
    _lang_arg(rules)
    rules_sub = rules.add_subparsers(metavar="ACTION")
    reset = rules_sub.add_parser("reset", help="forget a rule's evidence",
                                 description="Forget a rule's evidence (of one family, or all): it refuses "
                                 "again, unconfirmed, and is confirmed with DeepSeek anew.")
    reset.add_argument("rule", help="a rule's number (R37, A2, …)")
    reset.add_argument("--family", choices=["chat", "anthropic", "responses", "fim"])
    for p, func in ((rules, cmd_rules), (reset, cmd_rules_reset)):
        _config_arg(p)
        _store_arg(p)
        p.set_defaults(func=func)

    lint = sub.add_parser("lint", help="check request bodies offline",
                          description="Check chat-completions request bodies without any network: a JSON "
                          "body, a JSONL file of bodies, or an OpenAI batch-input file.")
    lint.add_argument("files", nargs="+", metavar="FILE")
    lint.add_argument("--format", choices=["text", "json"], default="text")
    lint.add_argument("--beta", action="store_true", help="check as if sent to /beta")
    lint.add_argument("--fix", action="store_true",
                      help="apply the repairs enabled in [repair] and write the repaired bodies (same form "
                      "as the input) to stdout or --output; repairs and problems go to stderr; exit 0 when "
                      "everything is valid after repair")
    lint.add_argument("--output", help="with --fix: the file to write (a directory for several files)")
    _config_arg(lint)
    lint.set_defaults(func=cmd_lint)
    return parser


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="config file (TOML); default $CHATGATE_CONFIG")


def _lang_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", choices=["en", "zh"],
                   help="the table's language (default: Chinese when LANG/LC_ALL is zh_…, else English)")


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="sqlite:///path.db, postgresql://user@host:port/db, or none")


def _limit_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("limits", "'none' clears a limit; a limit not given stays as it is")
    group.add_argument("--budget-usd", metavar="USD",
                       help="budget in USD over the period: a decimal, e.g. 50 or 12.50 (kept exactly)")
    group.add_argument("--budget-cny", metavar="CNY",
                       help="budget in yuan over the period, for chatgate pricing in CNY (pricing.currency)")
    group.add_argument("--budget-period", metavar="PERIOD",
                       help="day, week or month (calendar, UTC), or total; month when a budget is set")
    group.add_argument("--rpm", metavar="N", help="requests per minute")
    group.add_argument("--tpm", metavar="N", help="tokens per minute (prompt + completion)")
    group.add_argument("--max-concurrent", metavar="N", help="requests in flight at once")
    group.add_argument("--run-max-turns", metavar="N", help="requests per agent run (docs/runs.md)")
    group.add_argument("--run-max-cost-usd", metavar="AMOUNT",
                       help="an agent run's cost, in the prices' currency (pricing.currency)")
    group.add_argument("--run-max-repeats", metavar="K",
                       help="the same tool call with the same arguments K times in a row in an agent run")


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    names = {"host": "server.host", "port": "server.port", "workers": "server.workers",
             "upstream": "upstream.base_url", "auth": "auth.mode", "store": "store.url"}
    return {dotted: getattr(args, name, None) for name, dotted in names.items()}


def _load(args: argparse.Namespace) -> LoadedSettings:
    return load_settings(getattr(args, "config", None), os.environ, _flags(args))


# --- serve ----------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from chatgate import banner, server
    from chatgate.uvicorn_protocol import UvicornMismatch

    loaded = _load(args)  # fail here, once, with exit code 2
    s = loaded.settings.server
    try:
        banner.check_port(s.host, s.port)
    except OSError as exc:
        print(banner.bind_failure(s.host, s.port, exc), file=sys.stderr)
        return 3
    for line in banner.banner(loaded, os.environ) + banner.warnings(loaded, os.environ):
        print(line, file=sys.stderr)
    os.environ[FLAGS_ENV] = json.dumps({"config": loaded.config_path, "flags": _flags(args)})
    _configure_logging(s.log_format)
    _absorb_replayed_stop_signals()
    grace = int(s.shutdown_grace_seconds) or None
    try:
        protocol = server.protocol_options(loaded.settings.limits, s)
    except UvicornMismatch as exc:
        print(f"chatgate: {exc}", file=sys.stderr)
        return 3
    config = uvicorn.Config("chatgate.cli:app_from_env", factory=True, host=s.host, port=s.port,
                            workers=s.workers, loop="uvloop", lifespan="on", access_log=False,
                            server_header=False, timeout_graceful_shutdown=grace, backlog=4096,
                            log_config=None, timeout_keep_alive=30, proxy_headers=False, **protocol)
    if not server.run(config, s.accept_listeners):
        return 3  # uvicorn's STARTUP_FAILURE: the app or the socket did not come up
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import secrets
    import tempfile

    import uvicorn

    from chatgate import banner, server
    from chatgate.demo.deepseek import FakeState
    from chatgate.demo.serve import serve_in_thread

    try:
        banner.check_port(args.host, args.port)
    except OSError as exc:
        print(banner.bind_failure(args.host, args.port, exc).replace("chatgate serve", "chatgate demo"),
              file=sys.stderr)
        return 3
    admin_key = "demo-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="chatgate-demo-") as scratch, \
            serve_in_thread(FakeState(prefix_cache=True, keep_requests=100)) as upstream:
        flags = {"server.host": args.host, "server.port": args.port, "server.workers": 1,
                 "upstream.base_url": upstream, "auth.mode": "passthrough", "auth.admin_key": admin_key,
                 "store.url": f"sqlite:///{scratch}/demo.db", "store.spool_dir": f"{scratch}/spool"}
        loaded = load_settings(None, _demo_env(os.environ), flags)
        for line in banner.demo_banner(loaded, admin_key):
            print(line, file=sys.stderr, flush=True)
        os.environ[FLAGS_ENV] = json.dumps({"config": None, "flags": flags})
        _configure_logging(loaded.settings.server.log_format)
        _absorb_replayed_stop_signals()
        config = uvicorn.Config("chatgate.cli:demo_app_from_env", factory=True, host=args.host,
                                port=args.port, loop="uvloop", lifespan="on", access_log=False,
                                server_header=False, timeout_graceful_shutdown=1, log_config=None,
                                timeout_keep_alive=30,
                                **server.protocol_options(loaded.settings.limits, loaded.settings.server))
        return 0 if server.run(config, 1) else 3


def _demo_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment without chatgate's and DeepSeek's variables: the demo is the same everywhere."""
    return {k: v for k, v in env.items() if not k.startswith(("CHATGATE_", "DEEPSEEK_", "OTEL_"))}


def demo_app_from_env() -> Any:
    """uvicorn's factory for `chatgate demo`: chatgate as configured by cmd_demo, every answer labelled."""
    from chatgate.demo.label import Labelled
    from chatgate.web.app import create_app

    spec = json.loads(os.environ.get(FLAGS_ENV, "{}"))
    loaded = load_settings(None, _demo_env(os.environ), spec.get("flags") or {})
    return Labelled(create_app(loaded.settings))


def _absorb_replayed_stop_signals() -> None:
    """Exit 0 after a graceful SIGTERM/SIGINT shutdown.

    uvicorn (>= 0.29) handles the signal, shuts down gracefully, then re-raises it against the handler that
    was installed before it started; with the default handler the process would die with -15 after a clean
    drain. A no-op handler here lets `serve` return normally once uvicorn is done.
    """
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)


def app_from_env() -> Any:
    """uvicorn's factory, also in worker processes: the same sources, loaded again."""
    from chatgate import server
    from chatgate.web.app import create_app

    spec = json.loads(os.environ.get(FLAGS_ENV, "{}"))
    loaded = load_settings(spec.get("config"), os.environ, spec.get("flags") or {})
    server.configure(loaded.settings.server)  # in a worker process, the protocol's class is a fresh import
    _configure_logging(loaded.settings.server.log_format)
    app = create_app(loaded.settings)
    tune_gc()
    return app


def tune_gc() -> None:
    """A request allocates thousands of short-lived objects (a validated history is one per field), and
    the default thresholds run a collection every 700 allocations. Refcounting frees nearly all of them;
    collect cycles less often, and never scan the objects that live as long as the server."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def _configure_logging(log_format: str) -> None:
    import logging

    from chatgate.gateway.accesslog import log_formatter

    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(log_formatter(log_format))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per upstream call is noise


# --- keys -------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Any:
    from chatgate.store import open_store

    loaded = _load(args)
    if not loaded.settings.store.enabled:
        raise ConfigError("store.url: metering and keys need a store, got none")
    store = open_store(loaded.settings.store.url)
    store.migrate()
    return store, loaded


def _report_store(args: argparse.Namespace, refusals: bool = False) -> tuple[Any, LoadedSettings] | None:
    """A report's store, named on stderr; None (and why, on stderr) when its SQLite file is not there: a
    report never creates a store."""
    from chatgate import banner
    from chatgate.refusals.store import open_refusal_store
    from chatgate.store import open_store

    loaded = _load(args)
    url = loaded.settings.store.url
    if not loaded.settings.store.enabled:
        raise ConfigError("store.url: reports read a store, got none")
    path = banner.sqlite_path(url)
    if path is not None and not path.is_file():
        print(banner.missing_store(url, loaded.sources.get("store.url", "default"), path), file=sys.stderr)
        return None
    print(f"chatgate: store {banner.describe_store(url)}", file=sys.stderr)
    legacy = banner.legacy_store(loaded, os.environ)
    if legacy is not None:
        print(f"chatgate: {legacy}", file=sys.stderr)
    store = open_refusal_store(url) if refusals else open_store(url)
    store.migrate()
    return store, loaded


def _limit_change(args: argparse.Namespace) -> dict[str, Any]:
    """The limit flags given, parsed (LimitsError for a bad value): budget_usd in picoUSD, None clears."""
    from chatgate.web.admin import parse_count, parse_period, parse_usd

    change: dict[str, Any] = {}
    if args.budget_usd is not None:
        change["budget_usd"] = parse_usd(args.budget_usd)
    if args.budget_cny is not None:
        change["budget_cny"] = parse_usd(args.budget_cny, "budget_cny")
    if args.budget_period is not None:
        change["budget_period"] = parse_period(args.budget_period)
    for name in ("rpm", "tpm", "max_concurrent", "run_max_turns", "run_max_repeats"):
        value = getattr(args, name)
        if value is not None:
            change[name] = parse_count(value, name)
    if args.run_max_cost_usd is not None:
        change["run_max_cost_usd"] = parse_usd(args.run_max_cost_usd, "run_max_cost_usd")
    return change


def _admin(args: argparse.Namespace, work: Callable[[Any], Awaitable[Any]]) -> int:
    """Run `work(admin)` over the store (and the limits settings) of the config; the CLI's exit codes: 2 for a
    bad value (one line naming the flag), 1 for an unknown key."""
    import asyncio

    from chatgate.quotas.gate import Quotas
    from chatgate.web.admin import Admin, KeyNotFound, LimitsError

    async def run() -> Any:
        store, loaded = _store(args)
        quotas = Quotas(loaded.settings, store, currency=_currency(loaded))
        try:
            return await work(Admin(store, quotas, loaded.settings.auth.passthrough_team))
        finally:
            await quotas.close()
            store.close()

    try:
        result: int = asyncio.run(run())
    except LimitsError as exc:
        print(f"chatgate: {_flag(exc.param)}: {exc.detail}", file=sys.stderr)
        return 2
    except KeyNotFound as exc:
        print(f"chatgate: {exc}", file=sys.stderr)
        return 1
    return result


def _currency(loaded: LoadedSettings) -> str:
    """The currency of costs and budgets (pricing.currency); "auto" is resolved by the server only (it asks
    DeepSeek): here it is USD."""
    currency = loaded.settings.pricing.currency
    return "USD" if currency == "auto" else currency


def _flag(param: str) -> str:
    """The limit flag a LimitsError is about (team and name: as they are)."""
    return "--" + param.replace("_", "-") if param not in ("team", "name") else param


def _parsed_change(args: argparse.Namespace) -> dict[str, Any] | None:
    """The limit flags, or None after printing the one line saying which one is wrong."""
    from chatgate.web.admin import LimitsError

    try:
        return _limit_change(args)
    except LimitsError as exc:
        print(f"chatgate: {_flag(exc.param)}: {exc.detail}", file=sys.stderr)
        return None


def cmd_keys_create(args: argparse.Namespace) -> int:
    change = _parsed_change(args)
    if change is None:
        return 2

    async def work(admin: Any) -> int:
        from chatgate.web.admin import limits_text

        entry, secret = await admin.create_key(args.team, args.name, change)
        if change:
            print(f"limits: {limits_text(entry['limits'])}")
        print(f"created key {entry['id']} (team {entry['team']}, name {entry['name']}); it is shown once, "
              "store it now:")
        print(secret)
        return 0
    return _admin(args, work)


def cmd_keys_set(args: argparse.Namespace) -> int:
    change = _parsed_change(args)
    if change is None:
        return 2

    async def work(admin: Any) -> int:
        from chatgate.web.admin import limits_text

        entry = await admin.set_key_limits(args.key_id, change)
        who = (f"team {entry['team']}, name {entry['name']}" if entry["kind"] == "managed"
               else f"passthrough, team {entry['team']}")
        print(f"key {entry['id']} ({who}): {limits_text(entry['limits'])}")
        return 0
    return _admin(args, work)


def cmd_keys_list(args: argparse.Namespace) -> int:
    async def work(admin: Any) -> int:
        from chatgate.web.admin import limits_cells

        entries = await admin.keys()
        if args.format == "json":
            _print_json({"object": "list", "data": entries})
            return 0
        # within 120 columns: days, not seconds (the JSON has the times); revoked only when a key is
        revoked = any(e["revoked_at"] for e in entries)
        rows = [("key_id", "name", "team", "prefix", "budget_usd", "period", "rpm", "tpm", "concurrent",
                 "created", *(("revoked",) if revoked else ()))]
        for e in entries:
            limits = limits_cells(e["limits"])
            rows.append((e["id"], e["name"], e["team"], e["prefix"] + "…" if e["prefix"] else "-", *limits,
                         _when(e["created_at"])[:10] if e["created_at"] else "-",
                         *((_when(e["revoked_at"])[:10] if e["revoked_at"] else "",) if revoked else ())))
        _print_table(rows, args)
        return 0
    return _admin(args, work)


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    store, _ = _store(args)
    done = store.revoke_key(args.key_id)
    store.close()
    if not done:
        print(f"chatgate: no active key {args.key_id}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}")
    return 0


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts or 0, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print_table(rows: Sequence[tuple[str, ...]], args: argparse.Namespace) -> None:
    """Rows under their heads (the first row), the heads in --lang or the locale's language."""
    from chatgate.metering import text

    for line in text.lines(rows, text.language(args.lang, os.environ)):
        print(line)


def _print_json(document: Any) -> None:
    import orjson

    print(orjson.dumps(document).decode())


# --- teams ------------------------------------------------------------------------------------------


def cmd_teams_set(args: argparse.Namespace) -> int:
    change = _parsed_change(args)
    if change is None:
        return 2

    async def work(admin: Any) -> int:
        from chatgate.web.admin import limits_text

        entry = await admin.set_team_limits(args.team, change)
        print(f"team {entry['team']}: {limits_text(entry['limits'])}")
        return 0
    return _admin(args, work)


def cmd_teams_list(args: argparse.Namespace) -> int:
    async def work(admin: Any) -> int:
        from chatgate.web.admin import limits_cells

        entries = await admin.teams()
        if args.format == "json":
            _print_json({"object": "list", "data": entries})
            return 0
        cur = _currency(_load(args)).lower()
        rows = [("team", "keys", "budget_usd", "period", "rpm", "tpm", "concurrent", f"spent_{cur}",
                 f"remaining_{cur}", "used", "since")]
        for e in entries:
            spend = e["spend"]
            used = "-" if spend["used_percent"] is None else f"{spend['used_percent']:g}%"
            rows.append((e["team"], str(e["key_count"]), *limits_cells(e["limits"]),
                         _plain(spend.get(f"spent_{cur}")), _plain(spend.get(f"remaining_{cur}")), used,
                         _when(spend["period_start"])[:10] if spend["period_start"] else "ever"))
        _print_table(rows, args)
        return 0
    return _admin(args, work)


def _plain(usd: float | None) -> str:
    """A USD float from the spend figures in plain decimal notation (no exponent), '-' for none."""
    from decimal import Decimal

    return "-" if usd is None else format(Decimal(repr(usd)), "f")


# --- usage ----------------------------------------------------------------------------------


def cmd_usage(args: argparse.Namespace) -> int:
    from chatgate import banner
    from chatgate.metering import text
    from chatgate.metering.recorder import replay_spools
    from chatgate.metering.reports import build_report, make_query, render_csv, render_table

    query = make_query(args.by, args.since, args.until)
    opened = _report_store(args)
    if opened is None:
        return 1
    store, loaded = opened
    replay_spools(store, loaded.settings.store.spool_dir)
    report = build_report(store, query, loaded.settings.pricing.currency)
    store.close()
    if not report["rows"]:
        print(banner.empty_period(loaded.settings.store.url, query.since, query.until, "usage records"),
              file=sys.stderr)
    if args.format == "json":
        print(json.dumps(report))
    elif args.format == "csv":
        sys.stdout.write(render_csv(report))
    else:
        sys.stdout.write(render_table(report, text.language(args.lang, os.environ)))
    return 0


def cmd_prices(args: argparse.Namespace) -> int:
    import time

    from chatgate.metering import text
    from chatgate.metering.price_table import price_table, render_price_table
    from chatgate.metering.reports import parse_time

    loaded = _load(args)
    at = parse_time(args.at, "at")
    configured = loaded.settings.pricing.currency
    wanted = args.currency or ("both" if configured == "auto" else configured)
    currencies = ["USD", "CNY"] if wanted == "both" else [wanted]
    books = [loaded.settings.pricing_book(c) for c in currencies]
    table = price_table(books, time.time() if at is None else at)
    if args.format == "json":
        _print_json(table)
    else:
        sys.stdout.write(render_price_table(table, text.language(args.lang, os.environ)))
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from chatgate import banner
    from chatgate.metering import text
    from chatgate.metering.cache_report import build_cache_report, cache_query, render_cache_table
    from chatgate.metering.recorder import replay_spools
    by, since, until = cache_query(args.by, args.since, args.until)
    opened = _report_store(args)
    if opened is None:
        return 1
    store, loaded = opened
    replay_spools(store, loaded.settings.store.spool_dir)
    report = build_cache_report(store, by, since, until, _currency(loaded))
    store.close()
    if not report["rows"]:
        print(banner.empty_period(loaded.settings.store.url, since, until, "usage records"), file=sys.stderr)
    if args.format == "json":
        print(json.dumps(report))
    else:
        sys.stdout.write(render_cache_table(report, text.language(args.lang, os.environ)))
    return 0


# --- config ----------------------------------------------------------------------------------


def cmd_config_check(args: argparse.Namespace) -> int:
    loaded = load_settings(args.config, os.environ, {})
    print(f"# config file: {loaded.config_path or '(none)'}")
    rows = effective(loaded)
    width = max(len(r[0]) for r in rows)
    for dotted, value, source in rows:
        print(f"{dotted.ljust(width)}  = {value}  [{source}]")
    for warning in loaded.deprecated:
        print(f"# {warning}")
    settings = loaded.settings
    if settings.auth.mode == "managed":
        # the pool of DeepSeek accounts: names and the variables that hold their keys, never a key
        pool = settings.upstream.accounts
        print("# upstream accounts (managed mode):" if pool else
              "# upstream accounts (managed mode): one, 'default', keyed by DEEPSEEK_API_KEY "
              f"({'set' if settings.auth.upstream_api_key else 'NOT SET'})")
        for account in pool:
            state = "set" if os.environ.get(account.key_env) else "NOT SET"
            print(f"#   {account.name}: key in ${account.key_env} ({state}), weight {account.weight:g}")
    print("# configuration is valid")
    return 0


# --- rules ---------------------------------------------------------------------------------------


def cmd_rules(args: argparse.Namespace) -> int:
    from chatgate.confirmation.service import rules_report
    from chatgate.metering import text
    from chatgate.metering.reports import parse_time

    since = parse_time(args.since, "since")
    opened = _report_store(args)
    if opened is None:
        return 1
    store, _ = opened
    report = rules_report(store, args.family, since)
    store.close()
    if args.format == "json":
        _print_json(report)
        return 0
    if not report["rules"]:
        print("No evidence about the rules yet (validation.confirm_every_s: docs/confirmation.md).")
    else:
        table: list[tuple[str, ...]] = [("rule", "family", "model", "status", "certainty", "confirmed",
                                         "disputed", "score w/r/a", "last confirmed", "last disputed")]
        table += [(r["rule"], r["family"], _cut(r["model"], 16), r["status"], str(r["certainty"]),
                   str(r["confirmed"]), str(r["disputed"]), f"{r['warned']}/{r['refused']}/{r['accepted']}",
                   _day_time(r["last_confirmed"]), _day_time(r["last_disputed"]))
                  for r in report["rules"]]
        _print_table(table, args)
    if report["unpredicted"]:
        print("\n" + text.note("unpredicted", text.language(args.lang, os.environ)))
        groups: list[tuple[str, ...]] = [("count", "family", "model", "last seen", "message")]
        groups += [(str(g["count"]), g["family"], _cut(g["model"], 16), _day_time(g["last_seen"]),
                    _cut(g["message"], 70)) for g in report["unpredicted"]]
        _print_table(groups, args)
    return 0


def _day_time(iso: str | None) -> str:
    """An ISO time as month, day, hour and minute (UTC): the JSON has it whole."""
    return "-" if iso is None else iso[5:16].replace("T", " ")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def cmd_rules_reset(args: argparse.Namespace) -> int:
    opened = _report_store(args)
    if opened is None:
        return 1
    store, _ = opened
    gone = store.reset_evidence(args.rule, args.family)
    store.close()
    print(f"{args.rule}: {gone} row(s) of evidence forgotten" + (f" ({args.family})" if args.family else ""))
    return 0


# --- refusals -----------------------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    import time

    from chatgate.metering import text
    from chatgate.metering.reports import parse_time
    from chatgate.runs import reading
    from chatgate.runs.summary import runs_document, table

    since = parse_time(args.since or "7d", "since")
    if not 1 <= args.limit <= 1000:
        print("chatgate: --limit: expected 1 to 1000", file=sys.stderr)
        return 2
    opened = _report_store(args)
    if opened is None:
        return 1
    store, _ = opened
    document = runs_document(reading.find(store, args.team, args.key, since or 0.0, args.limit), time.time())
    store.close()
    if args.format == "json":
        _print_json(document)
    elif not document["runs"]:
        print("No agent runs in this period (docs/runs.md says how requests make runs).")
    else:
        sys.stdout.write(table(document, text.language(args.lang, os.environ)))
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    from chatgate.runs.summary import show, show_text

    opened = _report_store(args)
    if opened is None:
        return 1
    store, _ = opened
    found = show(store, args.run_id)
    store.close()
    if found is None:
        print(f"chatgate: no run {args.run_id!r} (nor one run whose id starts with it)", file=sys.stderr)
        return 1
    if args.format == "json":
        _print_json(found)
    else:
        sys.stdout.write(show_text(found["run"], found["rounds"]))
    return 0


def cmd_refusals_list(args: argparse.Namespace) -> int:
    from chatgate.metering.reports import parse_time
    from chatgate.refusals.service import list_refusals
    from chatgate.refusals.store import RefusalQuery, parse_cursor

    since = parse_time(args.since, "since")
    try:
        after = parse_cursor(args.cursor) if args.cursor else None
    except ValueError as exc:
        print(f"chatgate: --cursor: {exc}", file=sys.stderr)
        return 2
    opened = _report_store(args, refusals=True)
    if opened is None:
        return 1
    store, loaded = opened
    query = RefusalQuery(args.team, args.key, args.rule, since, args.limit, after)
    rows, cursor = list_refusals(store, query, loaded.settings.server.refusal_ttl_hours)
    store.close()
    if args.format == "json":
        _print_json({"object": "list", "data": rows, "has_more": cursor is not None, "next_cursor": cursor})
        return 0
    if not rows:
        print("No refusals kept (server.capture_refusals keeps the last ones of each process).")
        return 0
    table = [("time", "request id", "status", "by", "team", "key", "route", "rules")]
    table += [(_when(r["ts"]), r["request_id"], str(r["status"]), r["source"], r["team"], r["key_id"],
               r["route"], ",".join(r["rules"])) for r in rows]
    _print_table(table, args)
    if cursor is not None:
        print(f"(more: --cursor {cursor})")
    return 0


def cmd_refusals_show(args: argparse.Namespace) -> int:
    from chatgate.gateway.endpoints import build_endpoints
    from chatgate.refusals.service import Ambiguous, show_refusal

    opened = _report_store(args, refusals=True)
    if opened is None:
        return 1
    store, loaded = opened
    settings = loaded.settings
    endpoints = build_endpoints(settings)[0]

    def family_of(route: str) -> Any:
        endpoint = endpoints.get(route)
        return (endpoint.family, endpoint.route.beta) if endpoint is not None else None

    try:
        found = show_refusal(store, args.request_id, settings.server.refusal_ttl_hours,
                             family_of if args.fix else None, settings.repair.options() if args.fix else None,
                             args.key, args.team)
    except Ambiguous as many:
        print(f"chatgate: refusals of several keys carry request id {args.request_id!r}; show one by its "
              "refusal id, or narrow with --key / --team:", file=sys.stderr)
        for r in many.candidates:
            print(f"  {r['refusal_id']}  {_when(r['ts'])}  team {r['team']}  key {r['key_id']}",
                  file=sys.stderr)
        return 1
    finally:
        store.close()
    if found is None:
        print(f"chatgate: no refusal kept with request id {args.request_id!r}", file=sys.stderr)
        return 1
    if args.format == "json":
        _print_json(found)
        return 0
    print(f"{found['request_id']}  {_when(found['ts'])}  {found['status']} by {found['source']}  "
          f"{found['route']}  team {found['team']}  key {found['key_id']}  model {found['model']}")
    for p in found["problems"]:
        where = f" at {p['param']}" if p.get("param") else ""
        print(f"  {p.get('rule') or p.get('code')}{where}: {p.get('message')}")
    note = " (strings over 64 characters cut: server.log_content is off)" if found["redacted"] else ""
    print(f"\nbody{note}:")
    print(found["marked"])
    if "fix" in found:
        fix = found["fix"]
        print("\nchatgate lint --fix would repair:" if fix["repairs"] else "\nchatgate lint --fix repairs "
              "nothing here.")
        for a in fix["repairs"]:
            print(f"  {a['code']} at {a['path']}" + (f": {a['detail']}" if a.get("detail") else ""))
        if fix["repairs"] or fix.get("note"):
            left = fix["problems_left"]
            print(fix.get("note") or (f"problems left after it: {len(left)}" if left else
                                      "the body is valid after it."))
        if fix["repairs"]:
            print("\nrepaired body:")
            print(json.dumps(fix["fixed_body"], indent=2, ensure_ascii=False))
        _print_opt_in(fix.get("opt_in"))
    return 0


def _print_opt_in(opt_in: dict[str, Any] | None) -> None:
    """The repairs that are off but would apply: the setting that turns each on, and the body they make."""
    if not opt_in:
        return
    print("\nopt-in repairs (off in this configuration) would also repair:")
    for a in opt_in["repairs"]:
        print(f"  {a['code']} at {a['path']}" + (f": {a['detail']}" if a.get("detail") else "")
              + f"\n    enable: [repair] {a['code']} = true  (or {a['env']}=true)")
    left = opt_in["problems_left"]
    print(f"problems left with them: {len(left)}" if left else "the body is valid with them.")
    print("\nrepaired body with them:")
    print(json.dumps(opt_in["fixed_body"], indent=2, ensure_ascii=False))


# --- lint ---------------------------------------------------------------------------------------


def cmd_lint(args: argparse.Namespace) -> int:
    from chatgate.lint import run_lint

    loaded = load_settings(args.config, os.environ, {})
    if args.output and not args.fix:
        print("chatgate lint: --output needs --fix", file=sys.stderr)
        return 2
    fix = loaded.settings.repair.options() if args.fix else None
    return run_lint(args.files, loaded.settings.policy(), fmt=args.format, beta=args.beta, fix=fix,
                    output=args.output)

"""What `chatgate serve` says on stderr as it starts: what it runs as (the banner), what is missing (a
managed mode with no DeepSeek key), and why it could not listen (a port in use)."""

from __future__ import annotations

import datetime as dt
import errno
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from chatgate.settings import LEGACY_STORE_URL, LoadedSettings, data_dir, redact_url


def sqlite_path(url: str) -> Path | None:
    """The absolute path of a `sqlite:///…` store (a relative one is read from the current directory, as
    the store opens it); None for another store."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "sqlite" or not rest.startswith("/") or len(rest) < 2:
        return None
    return Path(os.path.abspath(rest[1:]))


def describe_store(url: str) -> str:
    if url == "none":
        return "none (nothing metered, no keys)"
    path = sqlite_path(url)
    return f"SQLite {path}" if path is not None else f"PostgreSQL {redact_url(url)}"


def banner(loaded: LoadedSettings, env: Mapping[str, str]) -> list[str]:
    from chatgate.tracing.setup import tracing_on

    s = loaded.settings
    host = f"[{s.server.host}]" if ":" in s.server.host else s.server.host
    base = f"http://{host}:{s.server.port}"
    config = os.path.abspath(loaded.config_path) if loaded.config_path else "none (defaults, env, flags)"
    admin = "set" if s.auth.admin_key is not None else "not set (the dashboard and /admin/* need it)"
    return [
        f"chatgate {_version()}: {s.auth.mode} mode on {base}",
        f"  upstream   {redact_url(s.upstream.base_url)}",
        f"  store      {describe_store(s.store.url)}",
        f"  config     {config}",
        f"  dashboard  {base}/admin/dashboard",
        f"  admin key  {admin}",
        f"  tracing    {'on' if tracing_on(s.tracing, env) else 'off'}",
    ]


def demo_banner(loaded: LoadedSettings, admin_key: str) -> list[str]:
    """What `chatgate demo` says: that the answers are not DeepSeek's, where things are, what to try."""
    from chatgate.demo.label import HEADER, LABEL

    s = loaded.settings
    host = f"[{s.server.host}]" if ":" in s.server.host else s.server.host
    base = f"http://{host}:{s.server.port}"
    body = '{"model": "deepseek-flash", "messages": [{"role": "user", "content": "Hello"}]}'
    return [
        f"chatgate {_version()} DEMO on {base}: the answers come from an offline stand-in, NOT from DeepSeek",
        f"  (deterministic, no key, no network; every answer carries the header `{HEADER}: {LABEL}`)",
        f"  stand-in   {s.upstream.base_url} (in this process)",
        f"  store      {describe_store(s.store.url)} (deleted when the demo stops)",
        f"  dashboard  {base}/admin/dashboard  admin key: {admin_key}",
        "",
        "Try it (any key but sk-bad… is accepted; chatgate checks, forwards and meters as for DeepSeek):",
        f"  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer sk-demo' \\",
        f"       -H 'Content-Type: application/json' -d '{body}'",
        "",
        "  from openai import OpenAI",
        f'  client = OpenAI(base_url="{base}/v1", api_key="sk-demo")',
        '  reply = client.chat.completions.create(model="deepseek-flash",',
        '                                         messages=[{"role": "user", "content": "Hello"}])',
        "  print(reply.choices[0].message.content)",
        "",
        "  A body DeepSeek would refuse gets chatgate's 400 naming every problem: add \"n\": 2 to the curl.",
        "  Streams (\"stream\": true), thinking (\"thinking\": {\"type\": \"enabled\"}), tools, "
        f"{base}/anthropic (Claude Code) and {base}/v1/responses (Codex) answer too.",
        "  Then the real thing: stop this, and `chatgate serve` with your DeepSeek key (README.md).",
    ]


def legacy_store(loaded: LoadedSettings, env: Mapping[str, str]) -> str | None:
    """The notice for a store found at the old default, ./data/chatgate.db (read until it is moved)."""
    if "store.url" in loaded.sources or loaded.settings.store.url != LEGACY_STORE_URL:
        return None
    here, new = os.path.abspath("data"), data_dir(env)
    return (f"notice: using the store at the old default place, {here}/chatgate.db (relative to the current "
            f"directory). The default is now {new}/chatgate.db, the same from any directory: stop chatgate "
            f"and move it there (mkdir -p {new} && mv {here}/chatgate.db* {here}/spool {new}/), or keep it "
            f"here with store.url = \"sqlite:///{here}/chatgate.db\" and store.spool_dir = \"{here}/spool\".")


def warnings(loaded: LoadedSettings, env: Mapping[str, str]) -> list[str]:
    """What will go wrong later and can be fixed now."""
    legacy = legacy_store(loaded, env)
    if legacy is not None:
        return [legacy, *warnings_of_mode(loaded, env)]
    return warnings_of_mode(loaded, env)


def warnings_of_mode(loaded: LoadedSettings, env: Mapping[str, str]) -> list[str]:
    s = loaded.settings
    if s.auth.mode != "managed":
        return []
    if not s.upstream.accounts:
        if s.auth.upstream_api_key is None or not s.auth.upstream_api_key.get_secret_value():
            return ["warning: managed mode without a DeepSeek key: DEEPSEEK_API_KEY is not set (nor "
                    "auth.upstream_api_key), so chatgate has nothing to send DeepSeek and every forwarded "
                    "request will fail. Set DEEPSEEK_API_KEY=sk-… (or configure [[upstream.accounts]]) and "
                    "restart."]
        return []
    missing = [f"{a.name} ({a.key_env})" for a in s.upstream.accounts if not env.get(a.key_env)]
    if missing:
        return [f"warning: managed mode: the key variable of account(s) {', '.join(missing)} is not set; "
                "requests sent to them will fail until it is set and chatgate restarted."]
    return []


def check_port(host: str, port: int) -> None:
    """Binds the address once (as uvicorn will) and lets it go: an OSError names it, before uvicorn would
    log a bare `[Errno 98]`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def bind_failure(host: str, port: int, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"chatgate: port {port} on {host} is already in use (another chatgate, or another program, "
                f"listens there). Stop it, or pick another port: `chatgate serve --port {port + 1}` (or "
                "server.port in the config file, CHATGATE_SERVER_PORT).")
    if error.errno == errno.EACCES:
        return (f"chatgate: not allowed to listen on port {port} ({error.strerror}): ports below 1024 need "
                "privileges; pick another with `chatgate serve --port 8787`.")
    return (f"chatgate: cannot listen on {host}:{port}: {error.strerror or error}. Check the address "
            "(`--host`, server.host) and the port (`--port`, server.port).")


def _version() -> str:
    from chatgate import __version__

    return __version__


def missing_store(url: str, source: str, path: Path) -> str:
    """A report's store is a file that is not there: where it was looked for, and how to name the right one
    (a report never creates a store)."""
    given = "the default" if source == "default" else f"from the {source}"
    relative = "" if url.startswith("sqlite:////") else f", relative to the current directory {Path.cwd()}"
    return (f"chatgate: no store at {path} (store.url = {url}, {given}{relative}); nothing was created. "
            "Point at the store `chatgate serve` writes: --store sqlite:////absolute/path/chatgate.db, "
            "CHATGATE_STORE_URL, or store.url in the config file (--config FILE, CHATGATE_CONFIG).")


def empty_period(url: str, since: float | None, until: float | None, what: str) -> str:
    def when(ts: float | None, open_end: str) -> str:
        if ts is None:
            return open_end
        return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

    return (f"chatgate: the store {describe_store(url)} holds no {what} from "
            f"{when(since, 'the first record')} to {when(until, 'now')}.")

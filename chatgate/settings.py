"""Settings: defaults < config file < environment (CHATGATE_*) < command-line flags.

`load_settings` records where each setting came from, for `chatgate config check`.
A bad setting raises ConfigError naming it; `serve` turns that into one line and exit code 2.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal
from urllib.parse import urlsplit

import pydantic
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from chatgate.metering.pricing import Override, Pricing, build_calendar, build_pricing
from chatgate.profiles import DEFAULT_PROFILES, ModelProfile
from chatgate.repair.base import NAMES as REPAIR_NAMES
from chatgate.repair.base import RepairOptions
from chatgate.rules.kernel import CheckOptions, UnknownModels
from chatgate.rules.models import Policy

ADMIN_KEY_MIN = 32
PLACEHOLDERS = frozenset({"change-me", "changeme", "secret", "admin", "password"})


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    accept_listeners: int = Field(default=16, ge=1, le=256)  # connections accepted per event-loop round
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    access_log: bool = True
    log_format: Literal["json", "text"] = "json"  # the access log's and the other log lines' form
    log_content: bool = False  # prompt and completion text in logs: off unless asked for
    capture_refusals: int = Field(default=1000, ge=0)  # refused requests kept per process (0: off)
    refusal_ttl_hours: float = Field(default=72.0, gt=0)
    # A connection that sends no request head within this (from when it opens), or stops sending a head or
    # body for this long, is closed.
    head_timeout_seconds: float = Field(default=30.0, gt=0)
    # Connections open at once; beyond, a new one is answered 503. 0: what the descriptor limit allows
    # ((RLIMIT_NOFILE - 64) / 2: a client connection may need an upstream one).
    max_connections: int = Field(default=0, ge=0)
    metrics_token: SecretStr | None = None  # when set, GET /metrics needs 'Authorization: Bearer <it>'


# Statuses no retry can change: the request itself, or the account, is wrong.
NEVER_RETRIED = frozenset({400, 401, 402, 403, 404, 413, 422})


class AccountSettings(Section):
    """One DeepSeek account of the managed-mode pool: its key is read from the variable `key_env`."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    key_env: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    weight: float = Field(default=1.0, gt=0)
    # The teams this account serves, and only it (with the others pinned to them): a team's context cache
    # and its hit counts are then its own (docs/security.md). Empty: any team not pinned to an account.
    teams: list[str] = []


class UpstreamSettings(Section):
    base_url: str = "https://api.deepseek.com"
    transport: Literal["aiohttp", "httpx"] = "aiohttp"
    connect_timeout: float = Field(default=10.0, gt=0)
    read_timeout: float = Field(default=660.0, gt=0)  # DeepSeek keeps a queued request up to 10 minutes
    total_timeout: float = Field(default=3600.0, gt=0)
    max_connections: int = Field(default=4096, ge=1)
    request_stream_usage: bool = False  # ask for stream_options.include_usage, hide it from clients
    models_cache_seconds: float = Field(default=60.0, ge=0)
    # Retries before the first data event (docs/retries.md): up to `retries` more attempts, each after
    # DeepSeek's Retry-After or an exponential back-off with full jitter from retry_base_ms, all within
    # retry_max_wait_s of the first attempt.
    retries: int = Field(default=2, ge=0, le=10)
    retry_statuses: list[int] = [429, 500, 502, 503, 504]
    retry_base_ms: float = Field(default=200.0, ge=0)
    retry_max_wait_s: float = Field(default=20.0, ge=0)
    # Managed mode: the pool of DeepSeek accounts (none: DEEPSEEK_API_KEY is the one account "default"),
    # and how long an account that answered 401 or 402 is set aside.
    accounts: list[AccountSettings] = []
    account_cooldown_s: float = Field(default=300.0, ge=0)

    @field_validator("retry_statuses")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        never = sorted(set(value) & NEVER_RETRIED)
        if never:
            raise ValueError(f"{never} can never be retried (the same request gets the same answer)")
        if any(not 400 <= s <= 599 for s in value):
            raise ValueError("must be HTTP error statuses (400-599)")
        return value

    @field_validator("accounts")
    @classmethod
    def _accounts(cls, value: list[AccountSettings]) -> list[AccountSettings]:
        names = [a.name for a in value]
        if len(set(names)) != len(names):
            raise ValueError(f"account names must be unique, got {names}")
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"must be an http(s) URL, got {redact_url(value)!r}")
        return value.rstrip("/")


class AuthSettings(Section):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)  # a refused key unsaid
    mode: Literal["passthrough", "managed"] = "passthrough"
    key_cache_seconds: float = Field(default=2.0, ge=0)
    upstream_api_key: SecretStr | None = None  # DEEPSEEK_API_KEY, used in managed mode
    admin_key: SecretStr | None = None  # CHATGATE_ADMIN_KEY, for /admin/*
    passthrough_team: str = "default"
    admin_failures_per_minute: int = Field(default=10, ge=1)  # wrong admin keys per address, then 429s

    @field_validator("admin_key")
    @classmethod
    def _strong_admin_key(cls, value: SecretStr | None) -> SecretStr | None:
        """A placeholder or short admin key is refused at start (issue 48): one was guessed in 200 tries."""
        if value is None or not value.get_secret_value():
            return None
        secret = value.get_secret_value()
        if len(secret) < ADMIN_KEY_MIN or secret.strip().lower() in PLACEHOLDERS:
            raise ValueError(f"the admin key (CHATGATE_ADMIN_KEY) must be at least {ADMIN_KEY_MIN} "
                             "characters and not a placeholder; make one with `openssl rand -hex 32`")
        return value


LEGACY_STORE_URL = "sqlite:///data/chatgate.db"  # the default before issue 50, from the current directory
LEGACY_SPOOL_DIR = "data/spool"


def data_dir(env: Mapping[str, str]) -> str:
    """chatgate's per-user data directory: $XDG_DATA_HOME/chatgate, else ~/.local/share/chatgate."""
    xdg = env.get("XDG_DATA_HOME", "")
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(xdg if os.path.isabs(xdg) else os.path.join(home, ".local", "share"), "chatgate")


def default_store(env: Mapping[str, str]) -> tuple[str, str]:
    """(store.url, store.spool_dir) when neither is set: in the per-user data directory, whatever the current
    directory; but an existing ./data/chatgate.db (the old default) is kept, with its spool, until moved."""
    if os.path.isfile(LEGACY_STORE_URL.removeprefix("sqlite:///")):
        return LEGACY_STORE_URL, LEGACY_SPOOL_DIR
    base = data_dir(env)
    return f"sqlite:///{os.path.join(base, 'chatgate.db')}", os.path.join(base, "spool")


class StoreSettings(Section):
    # load_settings puts default_store()'s in place of these two when they are not set
    url: str = LEGACY_STORE_URL
    spool_dir: str = LEGACY_SPOOL_DIR
    batch_max: int = Field(default=1000, ge=1)
    flush_interval_ms: float = Field(default=100.0, ge=0)
    retry_seconds: float = Field(default=1.0, gt=0)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value != "none" and not re.match(r"^(sqlite:///.+|postgres(ql)?://.+)$", value):
            raise ValueError("must be sqlite:///path, postgresql://user@host:port/db or none, "
                             f"got {redact_url(value)!r}")
        return value

    @property
    def enabled(self) -> bool:
        return self.url != "none"


class TracingSettings(Section):
    """OpenTelemetry traces (chatgate/tracing). Off unless `enabled`, or unset and an OTEL_EXPORTER_OTLP_*
    endpoint is in the environment; the OTEL_* variables fill in what is not set here."""

    enabled: bool | None = None
    endpoint: str | None = None  # the OTLP endpoint (http/protobuf: .../v1/traces is added to a base URL)
    protocol: Literal["http/protobuf", "grpc"] | None = None
    service_name: str | None = None
    sample_ratio: float | None = Field(default=None, ge=0, le=1)  # None: OTEL_TRACES_SAMPLER, else all
    capture_content: bool = False  # prompts and answers on spans: sensitive, off unless asked for
    max_queue_size: int = Field(default=2048, ge=1)  # spans waiting (a request's two as one); beyond, dropped
    export_timeout_seconds: float = Field(default=10.0, gt=0)


class ValidationSettings(Section):
    enabled: bool = True
    strict: bool = False
    unknown_models: UnknownModels = "reject"  # a model DeepSeek does not serve (R3); "warn" forwards it
    extra_models: tuple[str, ...] = ()  # names DeepSeek serves that chatgate has no profile for
    legacy_reasoner_rules: bool = False
    context_guard: bool = False
    # Confirm a refusal with DeepSeek once per rule, family, model and this many seconds
    # (docs/confirmation.md); 0: never forward a refused request
    confirm_every_s: float = Field(default=3600.0, ge=0)
    promote_after: int = Field(default=0, ge=0)  # enforce a warned rule DeepSeek refused this often (0: off)


class RepairSettings(Section):
    """Named repairs (chatgate/repair/base.py CATALOG), each on or off; the lossless ones are on by
    default."""

    restore_reasoning: bool = True
    restore_thinking: bool = True
    thinking_conflict: bool = True
    developer_role: bool = False
    flatten_content: bool = False
    strip_images: bool = False
    forced_tool_choice: bool = False
    clamp_max_tokens: bool = False
    user_id: bool = False
    orphan_tool_messages: bool = False
    unanswered_tool_calls: bool = False
    system_messages: bool = True
    split_tool_results: bool = True
    empty_assistant: bool = True
    model_suffix: bool = True
    redacted_thinking: bool = False
    responses_output_order: bool = True
    responses_reasoning: bool = True
    responses_strip_encrypted: bool = False
    responses_orphan_outputs: bool = False
    responses_unanswered_calls: bool = False
    unanswered_tool_text: str = Field(default="no result: the call was interrupted", min_length=1)
    image_placeholder: str = Field(default="[image removed: this model does not accept images]", min_length=1)
    # How long a relayed tool-call turn's reasoning is kept for restoring (then deleted), and how much of it
    # each process caches in memory (a shared store holds it all; with SQLite and one worker the cache's ring
    # file is all there is).
    reasoning_ttl_seconds: float = Field(default=86_400.0, gt=0)
    reasoning_cache_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    purge_interval_seconds: float = Field(default=60.0, gt=0)

    def options(self) -> RepairOptions:
        enabled = frozenset(name for name in REPAIR_NAMES if getattr(self, name))
        return RepairOptions(enabled, self.unanswered_tool_text, self.image_placeholder)


class PricingSettings(Section):
    """Prices come from DeepSeek's catalogue shipped with chatgate (chatgate/metering/catalogue.toml,
    docs/metering.md#prices); these settings adjust it."""

    # USD or CNY: the table costs, budgets, alerts and reports use; "auto": the DeepSeek account's currency
    # (managed mode: asked from /user/balance at start; passthrough: USD).
    currency: Literal["USD", "CNY", "auto"] = "USD"
    # "HH:MM-HH:MM" UTC, end exclusive; an end before the start crosses midnight ("22:00-02:00").
    # None: the catalogue's (DeepSeek's 01:00-04:00 and 06:00-10:00).
    peak_hours_utc: list[str] | None = None
    # Off-peak = peak x this for every peak/off-peak price. None: the catalogue's off-peak prices (half of
    # peak), and half for a configured price.
    off_peak_multiplier: Decimal | None = Field(default=None, ge=0)
    holidays: list[dt.date] = []  # more Chinese public holidays (Beijing dates): off-peak all day
    peak_days: list[dt.date] = []  # days priced as weekdays although on a weekend (make-up working days)

    @field_validator("peak_hours_utc")
    @classmethod
    def _windows(cls, value: list[str] | None) -> list[str] | None:
        for window in value or []:
            if not re.match(r"^([01]\d|2[0-3]):[0-5]\d-(([01]\d|2[0-3]):[0-5]\d|24:00)$", window):
                raise ValueError(f"window {window!r} must look like '06:00-10:00'")
            start, end = window.split("-")
            if start == end:
                raise ValueError(f"window {window!r} is empty: it ends where it starts (all day is "
                                 "'00:00-24:00')")
        return value


class ModelSettings(Section):
    context_window: int | None = Field(default=None, ge=1)
    max_tokens_max: int | None = Field(default=None, ge=1)
    vision: bool | None = None
    thinking_default: bool | None = None
    legacy_reasoner: bool | None = None
    # peak prices per 1M tokens (off-peak: half, or pricing.off_peak_multiplier), USD and CNY, in force from
    # price_since (UTC unless it says otherwise; unset: always)
    price_input_cache_hit: Decimal | None = Field(default=None, ge=0)
    price_input_cache_miss: Decimal | None = Field(default=None, ge=0)
    price_output: Decimal | None = Field(default=None, ge=0)
    price_cny_input_cache_hit: Decimal | None = Field(default=None, ge=0)
    price_cny_input_cache_miss: Decimal | None = Field(default=None, ge=0)
    price_cny_output: Decimal | None = Field(default=None, ge=0)
    price_since: dt.datetime | None = None

    @field_validator("price_since")
    @classmethod
    def _since(cls, value: dt.datetime | None) -> dt.datetime | None:
        return value.replace(tzinfo=dt.UTC) if value is not None and value.tzinfo is None else value


class LimitsSettings(Section):
    # DeepSeek's documented limit (docs/rules-chat.md, R9)
    max_body_bytes: int = Field(default=48 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_file_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)  # a Files API upload, streamed
    # an upload gets server.head_timeout_seconds plus 1 s per this many bytes (slower: 408); 0: no minimum
    upload_min_bytes_per_second: float = Field(default=1024.0, ge=0)
    body_timeout_seconds: float = Field(default=120.0, gt=0)  # to receive a JSON body whole (slow clients)
    # count_tokens counts exactly up to this many bytes of prompt text (about 2 s of one core per 4 MiB);
    # above, it answers an upper bound (the text's bytes) and says so
    count_tokens_exact_bytes: int = Field(default=4 * 1024 * 1024, ge=0)
    # the most of DeepSeek's answer chatgate holds at once: a JSON body, or one line of a stream (issue 48)
    max_upstream_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    # Budgets, rates and concurrency per team and key (set with `chatgate teams set` / `keys set` or the
    # admin API). Where the counters live: rates and concurrency in Redis when redis_url is set (replicas
    # share them), else in this process; budgets in the store ("store": atomic, shared by replicas) or in
    # this process seeded from the store ("local"); "auto" = store on PostgreSQL, local on SQLite.
    redis_url: str | None = None
    # Seconds a Redis call, and a connection to Redis, may take before it counts as a backend error
    # (on_backend_error decides then): too short, and a slow connect under load fails open.
    redis_timeout_s: float = Field(default=2.0, gt=0)
    redis_connect_timeout_s: float = Field(default=2.0, gt=0)
    budgets: Literal["auto", "local", "store"] = "auto"
    # When Redis or the store cannot be asked: admit the request ("fail_open", logged and counted) or
    # refuse it with a 503 ("fail_closed").
    on_backend_error: Literal["fail_open", "fail_closed"] = "fail_open"
    # The completion reserved for a request that sets no max_tokens (the reservation is settled to the
    # actual cost when the request ends).
    default_max_tokens: int = Field(default=32_768, ge=1)
    # A model without a price (docs/metering.md#models-without-a-price): reserved and recorded at the
    # catalogue's highest price ("max_price"), or refused where a budget applies ("refuse").
    unpriced: Literal["max_price", "refuse"] = "max_price"
    cache_seconds: float = Field(default=2.0, ge=0)  # how long a replica caches the limits it looked up

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^rediss?://.+", value):
            raise ValueError(f"must be redis://host:port[/db], got {redact_url(value)!r}")
        return value


class AlertSettings(Section):
    webhook_url: str | None = None  # POSTed JSON when a budget crosses soft_percent and when it is spent
    soft_percent: float = Field(default=80.0, gt=0, le=100)
    timeout_seconds: float = Field(default=5.0, gt=0)
    retries: int = Field(default=4, ge=0)  # after the first attempt, with 1, 2, 4, … s between

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://.+", value):
            raise ValueError(f"must be an http(s) URL, got {redact_url(value)!r}")
        return value


class CacheSettings(Section):
    """The cache advisor (docs/cache.md): prefix fingerprints of each caller's recent requests, to find what
    breaks DeepSeek's context cache. Only hashes and sizes are kept, never text."""

    breaks: bool = True  # fingerprint requests and record prefix breaks
    memory_per_caller: int = Field(default=8, ge=1, le=256)  # recent requests remembered per caller
    # all callers' fingerprints together (8 bytes per part and per tool, ~300 per request); the callers
    # not seen for longest are forgotten first
    memory_bytes: int = Field(default=16 * 1024 * 1024, ge=0)


class RunsSettings(Section):
    """Agent runs (docs/runs.md): which agent task each request belongs to, metered per run, with the run
    bounds of keys and teams. Off: no request is in a run and the run bounds are not enforced."""

    enabled: bool = True


class Settings(Section):
    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    auth: AuthSettings = AuthSettings()
    store: StoreSettings = StoreSettings()
    validation: ValidationSettings = ValidationSettings()
    repair: RepairSettings = RepairSettings()
    pricing: PricingSettings = PricingSettings()
    limits: LimitsSettings = LimitsSettings()
    alerts: AlertSettings = AlertSettings()
    tracing: TracingSettings = TracingSettings()
    cache: CacheSettings = CacheSettings()
    runs: RunsSettings = RunsSettings()
    models: dict[str, ModelSettings] = {}

    def profiles(self) -> dict[str, ModelProfile]:
        profiles = dict(DEFAULT_PROFILES)
        for name, override in self.models.items():
            profiles[name] = _apply_override(profiles.get(name, ModelProfile(name)), override)
        return profiles

    def pricing_book(self, currency: str) -> Pricing:
        """Every model's tariff in `currency` (USD or CNY: `pricing.currency` resolved), built once when the
        app starts (docs/metering.md#prices)."""
        p = self.pricing
        overrides = {
            name: Override(
                {"USD": (o.price_input_cache_hit, o.price_input_cache_miss, o.price_output),
                 "CNY": (o.price_cny_input_cache_hit, o.price_cny_input_cache_miss, o.price_cny_output)},
                o.price_since.timestamp() if o.price_since is not None else None)
            for name, o in self.models.items()}
        calendar = build_calendar(p.peak_hours_utc, p.holidays, p.peak_days)
        return build_pricing(currency, calendar, p.off_peak_multiplier, overrides)

    def policy(self) -> Policy:
        v = self.validation
        options = CheckOptions(v.strict, v.unknown_models, v.legacy_reasoner_rules)
        return Policy(self.profiles(), options, frozenset(v.extra_models))


def _apply_override(profile: ModelProfile, o: ModelSettings) -> ModelProfile:
    changes = {k: v for k, v in o.model_dump().items() if v is not None and not k.startswith("price_")}
    return profile.updated(**changes)


class ConfigError(Exception):
    """A setting is wrong; the message names it."""


Source = Literal["default", "file", "env", "flag"]
SECTIONS = ("server", "upstream", "auth", "store", "validation", "repair", "pricing", "limits", "alerts",
            "tracing", "cache", "runs")
SPECIAL_ENV = {"DEEPSEEK_API_KEY": "auth.upstream_api_key", "CHATGATE_ADMIN_KEY": "auth.admin_key"}
IGNORED_ENV = {"CHATGATE_CONFIG"}
# Settings that no longer do anything: still accepted, with a warning, so that older configuration files and
# environments load; then dropped.
DEPRECATED = {
    "store.turn_flush_interval_ms": "no longer used (relayed turns are not spooled): remove it",
}
SECRETS = {"auth.upstream_api_key", "auth.admin_key", "alerts.webhook_url"}  # webhook URLs carry tokens


@dataclass(frozen=True)
class LoadedSettings:
    settings: Settings
    sources: dict[str, Source]
    config_path: str | None
    deprecated: tuple[str, ...] = ()  # a warning for each deprecated setting given (DEPRECATED)


def load_settings(config_path: str | None = None, env: Mapping[str, str] | None = None,
                  flags: Mapping[str, Any] | None = None) -> LoadedSettings:
    env = os.environ if env is None else env
    config_path = config_path or env.get("CHATGATE_CONFIG") or None
    layers: list[tuple[Source, dict[str, Any]]] = [
        ("file", _read_file(config_path) if config_path else {}),
        ("env", _from_env(env)),
        ("flag", _nest({k: v for k, v in (flags or {}).items() if v is not None})),
    ]
    merged: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for source, layer in layers:
        _merge(merged, layer, source, sources, "")
    deprecated = _drop_deprecated(merged, sources)
    url, spool_dir = default_store(env)
    store = merged.setdefault("store", {})
    if isinstance(store, dict):  # else the validation below names the bad section
        store.setdefault("url", url)
        store.setdefault("spool_dir", spool_dir)
    try:
        settings = Settings.model_validate(merged)
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None
    return LoadedSettings(settings, sources, config_path, deprecated)


def _drop_deprecated(merged: dict[str, Any], sources: dict[str, Source]) -> tuple[str, ...]:
    warnings = []
    for dotted, why in DEPRECATED.items():
        section, _, key = dotted.partition(".")
        values = merged.get(section)
        if isinstance(values, dict) and key in values:
            del values[key]
            warning = f"{dotted} (from {sources.pop(dotted, 'file')}) is deprecated: {why}"
            logging.getLogger("chatgate").warning("config: %s", warning)
            warnings.append(warning)
    return tuple(warnings)


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in env.items():
        if name in SPECIAL_ENV and value:
            flat[SPECIAL_ENV[name]] = value
        elif name.startswith("CHATGATE_") and name not in IGNORED_ENV and name not in SPECIAL_ENV:
            flat[_env_key(name)] = _env_value(value)
    return _nest(flat)


def _env_key(name: str) -> str:
    rest = name[len("CHATGATE_"):].lower()
    for section in SECTIONS:
        if rest.startswith(section + "_"):
            return f"{section}.{rest[len(section) + 1:]}"
    raise ConfigError(f"environment variable {name}: unknown setting (expected CHATGATE_<SECTION>_<KEY>, "
                      f"sections: {', '.join(SECTIONS)})")


def _env_value(value: str) -> Any:
    if value.startswith("["):
        try:
            return tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            return value
    return value


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        section, _, key = dotted.partition(".")
        out.setdefault(section, {})[key] = value
    return out


def _merge(into: dict[str, Any], layer: Mapping[str, Any], source: Source, sources: dict[str, Source],
           prefix: str) -> None:
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key, {}), dict):
            _merge(into.setdefault(key, {}), value, source, sources, dotted + ".")
        else:
            into[key] = value
            sources[dotted] = source


def _describe(exc: pydantic.ValidationError, sources: Mapping[str, Source]) -> str:
    error = exc.errors(include_url=False)[0]
    dotted = ".".join(str(p) for p in error["loc"])
    where = sources.get(dotted, "file")
    msg = "unknown setting" if error["type"] == "extra_forbidden" else error["msg"]
    return f"{dotted}: {msg} (from {where})"


def effective(loaded: LoadedSettings) -> list[tuple[str, str, Source]]:
    """Every setting with its value (secrets, and passwords inside URLs, masked) and where it came from."""
    rows: list[tuple[str, str, Source]] = []
    data = loaded.settings.model_dump(mode="json")
    for section, values in data.items():
        if not values:  # models = {}: no overrides
            rows.append((section, "{}", "default"))
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted in SECRETS and value is not None:
                shown = "****"
            elif isinstance(value, str) and "://" in value:
                shown = repr(redact_url(value))
            else:
                shown = repr(value)
            source = loaded.sources.get(dotted) or _nested_source(loaded.sources, dotted)
            rows.append((dotted, shown, source))
    return rows


def redact_url(url: str) -> str:
    """The URL with any password replaced by ****: safe to print or log."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1****@", url)


def _nested_source(sources: Mapping[str, Source], dotted: str) -> Source:
    found = [s for k, s in sources.items() if k.startswith(dotted + ".")]
    return found[-1] if found else "default"


"""The store interface, one protocol per concern (usage, keys, limits and holds, turns, file owners, alerts),
shared by every replica; `Store` is all of them in one database.

Implementations are synchronous and are called from worker threads (the usage
writer thread, `asyncio.to_thread` for key look-ups, the CLI), never on the
event loop.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from chatgate.store.runs import RunStore

GroupBy = Literal["key", "team", "model", "day", "rule", "repair", "account", "break_key", "break_team",
                  "break_model"]
GROUP_BYS: tuple[GroupBy, ...] = ("key", "team", "model", "day", "rule", "repair", "account")
# the cache report's: the requests with a prefix break, per caller (or team, model) and break path
BREAK_GROUP_BYS: tuple[GroupBy, ...] = ("break_key", "break_team", "break_model")

OUTCOMES = ("ok", "rejected", "limited", "upstream_error", "client_disconnected", "upstream_failed",
            "aborted")
BUDGET_PERIODS = ("day", "week", "month", "total")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request that reached the handler. `record_id` makes inserts idempotent."""

    record_id: str
    ts: float  # unix seconds (UTC) when the request arrived
    request_id: str
    key_id: str
    key_name: str
    team: str
    model: str
    route: str
    stream: bool
    outcome: str
    rule_code: str | None = None
    upstream_status: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_cache_hit_tokens: int = 0
    prompt_cache_miss_tokens: int = 0
    reasoning_tokens: int = 0
    cost_picousd: int = 0  # 1e-12 of `currency` (USD unless said), integer so sums are exact
    latency_ms: float = 0.0
    ttfb_ms: float | None = None
    tokens_exact: bool = True
    repairs: str | None = None  # codes of the repairs applied, comma-separated
    unpriced: bool = False  # tokens were used but the model has no price: its cost 0 is not a price
    attempts: int = 1  # upstream attempts made for it (chatgate/gateway/retry.py)
    account: str | None = None  # the pool's DeepSeek account of the attempt that answered (managed mode)
    # the context cache (chatgate/metering/cache.py): what the hits saved; a prefix break, if the request had
    # one
    cache_saved_picousd: int = 0  # the hits as misses minus the hits as billed
    cache_break: str | None = None  # where the prefix first differed (`messages[0].content`, `tools`)
    cache_lost_tokens: int = 0  # estimated tokens the cache could have served but for the break
    cache_lost_picousd: int = 0  # those tokens as misses minus as hits, at this request's prices
    # non-token charges (chatgate/metering/calls.py): a tool API's units (search/fetch calls, OCR pages, TTS
    # characters) or the searches and fetches a model made; their cost, part of cost_picousd (0 unknown)
    billed_units: int = 0
    billed_unit: str | None = None  # "call", "page", "character"
    billed_estimated: bool = False  # counted from the answer's result blocks, not read from its usage
    billed_picousd: int = 0
    # the currency of the costs above (USD or CNY: pricing.currency); the *_picousd fields hold 1e-12 of it
    currency: str = "USD"
    # the agent run it is part of (chatgate/runs/, chatgate/store/runs.py): its id, the print of the
    # request's history, and its part in the run (a JSON array, store.runs.DETAIL)
    run_id: str | None = None
    run_thread: str | None = None
    run_detail: str | None = None

    @property
    def day(self) -> str:
        return dt.datetime.fromtimestamp(self.ts, dt.UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    name: str
    team: str
    prefix: str  # first characters of the secret, for people to recognise it
    created_at: float
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(slots=True)  # not frozen: built per relayed turn and per recall, and frozen costs a call per field
class TurnRow:
    """One tool call of an answer chatgate relayed, remembered for its caller until `expires_at`: what the
    caller's client may drop from the history and chatgate may put back (`payload`: the reasoning)."""

    caller: str  # key id or passthrough fingerprint
    kind: str  # which family's turns: "chat", "anthropic", "responses"
    call_id: str
    turn: str  # the same for every call of one answer
    names: str  # the answer's tool names, in order, comma-separated
    payload: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class FileOwner:
    """Who uploaded a file through the Files API in managed mode: its team owns it (every key of the team
    sees it), `key_id` is the key that uploaded it."""

    file_id: str
    team: str
    key_id: str
    created_at: float  # unix seconds, when chatgate recorded it
    tokens: int | None = None  # what DeepSeek bills for it in a request, at most; None: not known


@dataclass(frozen=True, slots=True)
class LimitRow:
    """The limits set for a team, or for a key (a managed key id or a passthrough fingerprint).
    None means no limit of that kind."""

    scope: str  # "team" or "key"
    subject: str
    budget_picousd: int | None = None
    budget_period: str | None = None  # day, week, month (calendar, UTC) or total
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    updated_at: float = 0.0
    budget_currency: str = "USD"  # the budget's (budget_picousd holds 1e-12 of it)
    # an agent run's bounds (chatgate/runs/): its requests, its cost (pico-units of the prices' currency), and
    # the same tool call with the same arguments in a row
    run_max_turns: int | None = None
    run_max_cost_picousd: int | None = None
    run_max_repeats: int | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.budget_picousd, self.rpm, self.tpm, self.max_concurrent,
                                       self.run_max_turns, self.run_max_cost_picousd, self.run_max_repeats))


LIMIT_FIELDS = ("budget_picousd", "budget_period", "rpm", "tpm", "max_concurrent", "budget_currency",
                "run_max_turns", "run_max_cost_picousd", "run_max_repeats")


@dataclass(slots=True)  # not frozen: one per budget per request, and a frozen __init__ pays a call per field
class Hold:
    """A reservation against a budget: admitted only if spent + held + amount fits."""

    hold_id: str
    scope: str
    subject: str
    period_start: float
    budget_picousd: int
    amount_picousd: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """One replica's slice of a budget (a lease), held in the store as one hold, `hold_id`, and renewed by
    replacing that hold. The replica admits requests against its slice without asking the store."""

    hold_id: str
    scope: str
    subject: str
    period_start: float
    budget_picousd: int
    spent_picousd: int  # settled under the lease since its last renewal: added to the ledger now
    # settled under the lease and added to the ledger by the renewals answered so far: the store adds only
    # flushed + spent - what its hold says the ledger has, so a renewal applied whose answer was lost, tried
    # again, counts nothing twice (a lease given back keeps its hold, at 0, until it expires, for this)
    flushed_picousd: int
    keep_picousd: int  # reserved by requests in flight: held again whatever the budget says
    need_picousd: int  # keep + what the request asking for room reserves (keep alone: a flush)
    extra_picousd: int  # asked on top, for the requests to come: granted up to a quarter of what is free
    expires_at: float


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    amount_picousd: int  # the lease's new size (keep_picousd when refused)
    ledger_spent_picousd: int  # the period's spend in the ledger, this renewal's included


@dataclass(frozen=True, slots=True)
class ReportQuery:
    group_by: GroupBy
    since: float | None = None  # unix seconds, inclusive
    until: float | None = None  # unix seconds, exclusive
    team: str | None = None  # only this team's records
    key_id: str | None = None  # only this client key's (or passthrough fingerprint's) records


COUNTERS = (
    "requests",
    "rejected",  # refused by chatgate: a rule (rule_code), or a file the caller's team does not own
    "limited",  # refused by a limit with a 429 (rule_code: rpm, tpm, concurrency, budget, unpriced: scope)
    "upstream_refused",  # DeepSeek answered 4xx (its 400, 401, 402, 422, 429 ...)
    "upstream_failed",  # DeepSeek answered 5xx after the retries, broke off, or never answered
    "prompt_tokens",
    "completion_tokens",
    "prompt_cache_hit_tokens",
    "prompt_cache_miss_tokens",
    "reasoning_tokens",
    "cost_picousd",
    "estimated_requests",
    "unpriced_requests",
    "cache_saved_picousd",
    "cache_breaks",
    "cache_lost_tokens",
    "cache_lost_picousd",
    "billed_calls",
    "billed_pages",
    "billed_characters",
    "billed_picousd",
    "billed_estimated_requests",
    "billed_picocny",
    "cost_picocny",
    "cache_saved_picocny",
    "cache_lost_picocny",
)


@dataclass(slots=True)
class ReportRow:
    group: dict[str, str]  # key: key_id, key_name, team; team: team; model: model; day: day
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))


class StoreError(Exception):
    """The store could not be reached or refused the operation."""


class StoreRefused(StoreError):
    """The store refuses this data (a value it cannot hold, a broken constraint): unlike an outage,
    retrying cannot help."""


class UsageStore(Protocol):
    """The usage records: written by the usage writer, read by reports and the dashboard."""

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        """Insert records in one transaction; a record_id already stored is skipped."""

    def insert_batch(self, records: Sequence[UsageRecord], turns: Sequence[TurnRow]) -> None:
        """`insert_usage` and `remember_turns` in one transaction (the usage writer's batch: one commit,
        not two)."""

    def usage_report(self, query: ReportQuery) -> list[ReportRow]:
        """Aggregated counters per group, ordered by group."""

    def latencies(self, query: ReportQuery, limit: int) -> list[tuple[str, float]]:
        """(model, latency in ms) of the newest `limit` answered requests (outcome ok) the query selects
        (its group_by is ignored): the dashboard's percentiles."""


class KeyStore(Protocol):
    """The managed client keys (only their hashes)."""

    def create_key(self, key_id: str, key_hash: str, prefix: str, team: str, name: str) -> ApiKey: ...

    def list_keys(self) -> list[ApiKey]: ...

    def revoke_key(self, key_id: str) -> bool:
        """True when the key existed and was active."""

    def find_key(self, key_hash: str) -> ApiKey | None: ...


class LimitStore(Protocol):
    """The limits set per team and key, and the budgets' ledger: spend, holds and leases."""

    def get_limits(self, scope: str, subject: str) -> LimitRow | None: ...

    def list_limits(self, scope: str) -> list[LimitRow]: ...

    def set_limits(self, row: LimitRow) -> None:
        """Insert or replace; a row with no limit left is deleted."""

    def spend(self, scope: str, subject: str, since: float, currency: str | None = None) -> int:
        """Pico-units of `currency` recorded in usage for the team or key since `since` (inclusive); None:
        the currency of its budget (USD without one)."""

    def reserve(self, holds: Sequence[Hold], now: float) -> Hold | None:
        """Insert all the holds, or none: None when every budget fits, else the first hold that does not.
        Atomic against every replica (one transaction; the ledger rows locked)."""

    def settle(self, holds: Sequence[Hold], amount_picousd: int) -> None:
        """Drop the holds and add the request's actual cost to their ledgers (an expired hold's too)."""

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        """Replace each lease's hold, all or nothing, atomically against every replica: each ledger gets the
        lease's spend; each lease is granted need + min(extra, a quarter of what is then free) if every need
        fits (spent + the other unexpired holds + need <= budget), else every lease keeps only `keep`.
        (0, grants) or (the 1-based position of the first ask that did not fit, grants). A flush (need ==
        keep) adds nothing to a ledger that does not exist: it was dropped with the subject's budget, and
        the usage table, from which a budget set again starts, has that spend."""

    def budget_state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        """(spent, held) in picoUSD for that period."""

    def purge_holds(self, now: float) -> int:
        """Delete expired holds (left by a replica that died mid-request); how many."""


class TurnStore(Protocol):
    """The relayed turns remembered for their callers (what a repair may put back)."""

    server: bool  # a server is never written from the event loop (try_remember_turns), a local file may be

    def remember_turns(self, rows: Sequence[TurnRow]) -> None:
        """Insert or replace, keyed by (caller, kind, call_id)."""

    def try_remember_turns(self, rows: Sequence[TurnRow]) -> bool:
        """`remember_turns` at once on the calling thread (the event loop's) if that cannot wait on
        anything (a lock, the network, a checkpoint); False, having written nothing, when it would."""

    def recall_turns(self, caller: str, kind: str, call_ids: Sequence[str], now: float) -> list[TurnRow]:
        """The caller's unexpired rows for these call ids (never another caller's)."""

    def purge_turns(self, now: float) -> int:
        """Delete the expired rows; how many."""


class FileOwnerStore(Protocol):
    """Who owns the files uploaded through the Files API in managed mode."""

    def own_file(self, owner: FileOwner) -> bool:
        """Record a file's owner; False, changing nothing, when the file already has one."""

    def file_owner(self, file_id: str) -> FileOwner | None: ...

    def files_owned(self, team: str, file_ids: Sequence[str]) -> set[str]:
        """Those of `file_ids` that `team` owns."""

    def disown_file(self, file_id: str) -> bool:
        """Forget a file's owner (the file was deleted); True when it had one."""

    def file_tokens(self, file_ids: Sequence[str]) -> dict[str, int | None]:
        """The token counts of those of `file_ids` chatgate recorded (None: recorded, count not known)."""


class AlertStore(Protocol):
    """Which budget alerts were sent, so that one replica sends each."""

    def mark_alert(self, scope: str, subject: str, period_start: float, level: str, now: float) -> bool:
        """True for the one caller (of every replica) that marks this alert first in the period."""


EVIDENCE_EVENTS = ("confirmed", "disputed", "warned", "refused", "accepted")
RULE_STATUSES = ("enforced", "warned", "disputed")


@dataclass(frozen=True, slots=True)
class RuleEvidence:
    """What DeepSeek answered the requests one rule refused or warned about, for one family and model."""

    rule: str
    family: str
    model: str
    status: str  # enforced, warned or disputed
    confirmed: int = 0  # DeepSeek refused a request the rule refused (or re-enforced it)
    disputed: int = 0  # DeepSeek accepted a request the rule refused
    warned: int = 0  # requests forwarded with the rule's warning
    refused: int = 0  # of those, refused by DeepSeek in the rule's words
    accepted: int = 0  # of those, accepted by DeepSeek
    last_confirmed: float | None = None
    last_disputed: float | None = None
    example_request_id: str | None = None
    updated_at: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.family, self.model)


@dataclass(frozen=True, slots=True)
class EvidenceEvent:
    """One answer of DeepSeek about a rule: `event` is one of EVIDENCE_EVENTS; `status` the rule's status
    when it has no row yet; `promote_after` > 0 enforces a warned rule once DeepSeek refused it that many
    times in its words and never accepted it."""

    rule: str
    family: str
    model: str
    event: str
    status: str
    request_id: str
    promote_after: int = 0
    count: int = 1  # warned and accepted: that many at once (a replica adds its scores up between writes)


@dataclass(frozen=True, slots=True)
class Unpredicted:
    """DeepSeek's refusals that no rule predicted, grouped by their message with numbers and ids masked."""

    family: str
    model: str
    message: str
    count: int
    first_seen: float
    last_seen: float
    example_request_ids: tuple[str, ...]


class EvidenceStore(Protocol):
    """The evidence about the rules (chatgate/confirmation/), shared by every replica."""

    def rule_evidence(self, keys: Sequence[tuple[str, str, str]] | None = None, since: float | None = None
                      ) -> list[RuleEvidence]:
        """The rows of those (rule, family, model) keys (all rows: None), updated at or after `since`."""

    def record_evidence(self, events: Sequence[EvidenceEvent], now: float) -> list[RuleEvidence]:
        """Apply the events in one transaction; the rows as they are after it."""

    def reset_evidence(self, rule: str, family: str | None = None) -> int:
        """Forget a rule's evidence (of one family, or all); the number of rows gone."""

    def take_rule_lease(self, key: tuple[str, str, str], holder: str, now: float, expires_at: float) -> bool:
        """True for the one caller (of every replica) that holds the rule's confirmation lease now: none
        held it, or its holder's lease expired."""

    def release_rule_lease(self, key: tuple[str, str, str], holder: str) -> None: ...

    def record_unpredicted(self, family: str, model: str, message: str, request_id: str, now: float) -> None:
        """Count one more refusal of DeepSeek in the group of `message` (masked already)."""

    def unpredicted(self, since: float | None = None, limit: int = 100) -> list[Unpredicted]:
        """The groups seen at or after `since`, the most frequent first."""


class Store(UsageStore, KeyStore, LimitStore, TurnStore, FileOwnerStore, AlertStore, RunStore, EvidenceStore,
            Protocol):
    """Every concern in one database (what SQLiteStore and PostgresStore are); a user types against the
    concern it uses."""

    url: str
    server: bool  # a database server that replicas share (PostgreSQL), not a file of this machine (SQLite)

    def migrate(self) -> None:
        """Create or upgrade the schema (versioned); safe to run concurrently from replicas."""

    def ping(self) -> None:
        """Raise StoreError unless the store is reachable and writable."""

    def close(self) -> None: ...

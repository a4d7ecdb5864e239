"""The admin API (issue 15): client keys and the limits of teams and keys, for the admin key only.

- `GET /admin/keys`, `POST /admin/keys` (201, the secret shown this once), `GET|PATCH|DELETE /admin/keys/{id}`
  (a managed key id `key_…`, or a passthrough fingerprint `fp-…` for its limits),
- `GET /admin/teams`, `GET|PUT|PATCH /admin/teams/{team}` (PUT replaces the limits, PATCH changes the fields
  sent).

Limits are `budget_usd` (or `budget_cny`: yuan, for chatgate pricing in CNY) over `budget_period` (day,
week, month: calendar, UTC; or total; month when a budget is set without one), `rpm`, `tpm` and
`max_concurrent`; `null` clears one. Amounts are decimals, kept exactly as integer pico-units (1e-12 USD or
CNY): a body's numbers are parsed as `Decimal`, never as floats. A change
applies to this replica at once (`Quotas.forget`), to the others within `limits.cache_seconds`.

`Admin` is shared with `chatgate teams …` and `chatgate keys …` (chatgate.cli), so that both say the same.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation, localcontext
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import Response

from chatgate.errors import APIError
from chatgate.gateway.auth import address_of, new_key, require_admin
from chatgate.gateway.responses import json_response
from chatgate.quotas.gate import Quotas
from chatgate.quotas.periods import period_end
from chatgate.store.base import BUDGET_PERIODS, LIMIT_FIELDS, ApiKey, LimitRow, Store

if TYPE_CHECKING:
    from chatgate.gateway.state import State

PICO_PER_USD = 10**12
BIGINT = 2**63 - 1  # the store's columns are BIGINT
MAX_BUDGET_USD = Decimal(BIGINT) / PICO_PER_USD  # exact: 9223372.036854775807
MAX_NAME = 200
LIMIT_INPUTS = ("budget_usd", "budget_period", "rpm", "tpm", "max_concurrent")
# an agent run's bounds (chatgate/runs/): its requests, its cost (the prices' currency), one tool call in a
# row
RUN_INPUTS = ("run_max_turns", "run_max_cost_usd", "run_max_repeats")
FINGERPRINT = re.compile(r"fp-[0-9a-f]{12}")  # chatgate.gateway.auth.fingerprint
NO_STORE = "no-store"

BUDGETS = {"budget_usd": "USD", "budget_cny": "CNY"}  # a budget's input, by its currency
EXPECTED = {
    "budget_usd": "expected an amount of USD >= 0 with at most 12 decimal places (a number, or a string such "
                  "as \"12.50\"), or null to clear it",
    "budget_cny": "expected an amount of CNY (yuan) >= 0 with at most 12 decimal places (a number, or a "
                  "string such as \"80.50\"), or null to clear it",
    "budget_period": f"expected one of {', '.join(BUDGET_PERIODS)}, or null",
    "rpm": "expected a whole number >= 0, or null to clear it",
    "tpm": "expected a whole number >= 0, or null to clear it",
    "max_concurrent": "expected a whole number >= 0, or null to clear it",
    "run_max_turns": "expected a whole number >= 0 (requests per agent run), or null to clear it",
    "run_max_cost_usd": "expected an amount >= 0 with at most 12 decimal places (an agent run's cost, in "
                        "the prices' currency), or null to clear it",
    "run_max_repeats": "expected a whole number >= 0 (the same tool call in a row in an agent run), or null "
                       "to clear it",
    "team": f"expected a non-empty string of at most {MAX_NAME} printable characters, without surrounding "
            "spaces",
    "name": f"expected a non-empty string of at most {MAX_NAME} printable characters, without surrounding "
            "spaces",
}


class LimitsError(ValueError):
    """A limit's value is wrong: which one (`param`, as in the API) and why (`detail`)."""

    def __init__(self, param: str, detail: str) -> None:
        super().__init__(f"{param}: {detail}")
        self.param = param
        self.detail = detail

    def api_error(self) -> APIError:
        return APIError(400, f"Invalid value for '{self.param}': {self.detail}.", "invalid_request_error",
                        self.param, "invalid_value")


class KeyNotFound(LookupError):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"no key {key_id}: key ids look like key_… (`chatgate keys list`, GET /admin/keys) "
                         "and passthrough fingerprints like fp-… (as in usage reports)")
        self.key_id = key_id

    def api_error(self) -> APIError:
        return APIError(404, f"No key {self.key_id!r}. List the keys with GET /admin/keys; a passthrough "
                        "caller's id is its fingerprint fp-… (12 hex digits) as in usage reports.",
                        "invalid_request_error", None, "key_not_found")


# --- values ---------------------------------------------------------------------------------------


def usd_to_picousd(value: Decimal, param: str = "budget_usd") -> int:
    """An exact amount of USD (or of CNY, for budget_cny) as integer pico-units; anything finer than a
    pico-unit is refused, not rounded."""
    if not value.is_finite():
        raise LimitsError(param, f"expected a finite amount of {BUDGETS.get(param, 'USD')}")
    if value < 0:
        raise LimitsError(param, f"must be 0 or more, got {value}")
    if value > MAX_BUDGET_USD:
        raise LimitsError(param, f"must be at most {MAX_BUDGET_USD}, got {value}")
    with localcontext() as ctx:
        ctx.prec = len(value.as_tuple().digits) + 14  # enough for the scaled value: the product is exact
        pico = value.scaleb(12)
    if pico != pico.to_integral_value():
        raise LimitsError(param, f"has more than 12 decimal places (the unit is the picoUSD, 1e-12 USD), got "
                                 f"{value}")
    return int(pico)


def usd_text(pico: int) -> str:
    """picoUSD as an exact decimal number of USD, without trailing zeros or an exponent: 12.5, 0.000001."""
    whole, frac = divmod(pico, PICO_PER_USD)
    return f"{whole}.{frac:012d}".rstrip("0").rstrip(".")


def parse_usd(text: str, param: str = "budget_usd") -> int | None:
    """`--budget-usd` (`--budget-cny`: param budget_cny): a decimal amount, or none."""
    if text.strip().lower() == "none":
        return None
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise LimitsError(param, f"expected an amount of {BUDGETS.get(param, 'money')} such as 50 or 12.50, "
                                 f"or none; got {text!r}") from None
    return usd_to_picousd(value, param)


def parse_count(text: str, param: str) -> int | None:
    """`--rpm`, `--tpm`, `--max-concurrent`: a whole number >= 0, or none."""
    value = text.strip()
    if value.lower() == "none":
        return None
    if not re.fullmatch(r"[0-9]+", value):
        raise LimitsError(param, f"expected a whole number >= 0, or none; got {text!r}")
    if int(value) > BIGINT:
        raise LimitsError(param, f"must be at most {BIGINT}, got {value}")
    return int(value)


def parse_period(text: str) -> str | None:
    value = text.strip().lower()
    if value == "none":
        return None
    if value not in BUDGET_PERIODS:
        raise LimitsError("budget_period", f"expected one of {', '.join(BUDGET_PERIODS)}, or none; got "
                                           f"{text!r}")
    return value


def check_name(param: str, value: str) -> str:
    if not value or len(value) > MAX_NAME or not value.isprintable() or value.strip() != value:
        raise LimitsError(param, f"{EXPECTED[param]}; got {value!r}")
    return value


def merge(current: LimitRow | None, scope: str, subject: str, change: dict[str, Any], replace: bool,
          now: float) -> LimitRow:
    """The limits after a change: `change` maps LIMIT_INPUTS sent (and budget_cny) to their value (a
    budget in pico-units of its currency; None clears); the others stay (PATCH, `--flag`s) or are cleared
    (`replace`: PUT). A budget without a period is a month's; a period without a budget is refused."""
    values: dict[str, Any] = dict.fromkeys(LIMIT_FIELDS)
    if current is not None and not replace:
        values.update({name: getattr(current, name) for name in LIMIT_FIELDS})
    if sum(change.get(name) is not None for name in BUDGETS) > 1:
        raise LimitsError("budget_cny", "a budget is in one currency: set budget_usd or budget_cny, not both")
    for name, value in change.items():
        if name in BUDGETS:
            if value is not None or values["budget_currency"] == BUDGETS[name] or not any(
                    change.get(n) is not None for n in BUDGETS):
                values["budget_picousd"], values["budget_currency"] = value, BUDGETS[name]
        elif name == "run_max_cost_usd":
            values["run_max_cost_picousd"] = value
        else:
            values[name] = value
    values["budget_currency"] = values["budget_currency"] or "USD"
    if values["budget_picousd"] is None:
        if change.get("budget_period") is not None:
            raise LimitsError("budget_period", "a budget period needs a budget: set the budget too")
        values["budget_period"] = None
    elif values["budget_period"] is None:
        values["budget_period"] = "month"
    return LimitRow(scope, subject, updated_at=now, **values)


def limits_json(row: LimitRow | None) -> dict[str, Any]:
    """A row's limits as the API shows them (and takes them in a PUT). `budget_usd` is the exact decimal: a
    JSON number written from the integer picoUSD, never through a float."""
    row = row or LimitRow("", "")
    budget = None if row.budget_picousd is None else orjson.Fragment(usd_text(row.budget_picousd).encode())
    run_cost = None if row.run_max_cost_picousd is None else orjson.Fragment(
        usd_text(row.run_max_cost_picousd).encode())
    shown = {f"budget_{row.budget_currency.lower()}": budget, "budget_period": row.budget_period,
             "rpm": row.rpm, "tpm": row.tpm, "max_concurrent": row.max_concurrent}
    runs = {"run_max_turns": row.run_max_turns, "run_max_cost_usd": run_cost,
            "run_max_repeats": row.run_max_repeats}
    if any(v is not None for v in runs.values()):  # an agent run's bounds, when one is set (docs/runs.md)
        shown.update(runs)
    return shown


def _shown(limits: dict[str, Any]) -> list[str]:
    """LIMIT_INPUTS, the budget's name in its own currency (budget_usd or budget_cny)."""
    budget = next((name for name in BUDGETS if name in limits), "budget_usd")
    return [budget if name == "budget_usd" else name for name in LIMIT_INPUTS]


def limits_cells(limits: dict[str, Any], none: str = "-") -> tuple[str, ...]:
    """The values of `limits_json` as text, in LIMIT_INPUTS order (for the CLI); a budget in CNY says so."""
    names = _shown(limits)
    cells = [none if limits[name] is None else orjson.dumps(limits[name]).decode().strip('"')
             for name in names]
    if names[0] == "budget_cny" and limits["budget_cny"] is not None:
        cells[0] += " CNY"
    return tuple(cells)


def limits_text(limits: dict[str, Any]) -> str:
    """`budget_usd=50 budget_period=month rpm=60 tpm=none max_concurrent=4`, for the CLI."""
    names = _shown(limits) + [n for n in RUN_INPUTS if limits.get(n) is not None]
    cells = ["none" if limits[n] is None else orjson.dumps(limits[n]).decode().strip('"') for n in names]
    return " ".join(f"{name}={cell}" for name, cell in zip(names, cells, strict=True))


def spend_json(status: dict[str, Any]) -> dict[str, Any]:
    """The current period's spend, from `Quotas.status` (the calendar month's when there is no budget)."""
    period = status.get("budget_period") or "month"
    start = status["period_start"]
    end = status["period_end"] if "period_end" in status else period_end(start + 1, period)
    cur = status["currency"].lower()
    return {"period": period, "period_start": start, "period_end": end, "currency": status["currency"],
            f"spent_{cur}": status[f"spent_{cur}"], f"held_{cur}": status[f"held_{cur}"],
            f"remaining_{cur}": status[f"remaining_{cur}"], "used_percent": status.get("used_percent")}


# --- the operations (API and CLI) -----------------------------------------------------------------


class Admin:
    """Keys and limits over a store, with the spend from `Quotas.status`."""

    def __init__(self, store: Store, quotas: Quotas, passthrough_team: str,
                 clock: Callable[[], float] = time.time, on_revoke: Callable[[str], None] | None = None
                 ) -> None:
        self.store = store
        self.quotas = quotas
        self.passthrough_team = passthrough_team
        self.clock = clock
        self.on_revoke = on_revoke  # the server's key cache forgets the key

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def _key(self, key_id: str) -> ApiKey | None:
        keys: list[ApiKey] = await self._call(self.store.list_keys)
        return next((k for k in keys if k.key_id == key_id), None)

    async def _entry(self, key_id: str, key: ApiKey | None, row: LimitRow | None) -> dict[str, Any]:
        status = await self.quotas.status("key", key_id)
        if key is None:  # a passthrough fingerprint
            head: dict[str, Any] = {"id": key_id, "object": "chatgate.key", "kind": "passthrough",
                                    "name": key_id, "team": self.passthrough_team, "prefix": None,
                                    "created_at": None, "revoked": False, "revoked_at": None}
        else:
            head = {"id": key.key_id, "object": "chatgate.key", "kind": "managed", "name": key.name,
                    "team": key.team, "prefix": key.prefix, "created_at": key.created_at,
                    "revoked": not key.active, "revoked_at": key.revoked_at}
        return {**head, "limits": limits_json(row), "spend": spend_json(status)}

    async def keys(self) -> list[dict[str, Any]]:
        """Every managed key (revoked ones too), then the fingerprints that have limits."""
        keys: list[ApiKey] = await self._call(self.store.list_keys)
        rows = {r.subject: r for r in await self._call(self.store.list_limits, "key")}
        out = [await self._entry(k.key_id, k, rows.get(k.key_id)) for k in keys]
        for subject, row in sorted(rows.items()):
            if FINGERPRINT.fullmatch(subject):
                out.append(await self._entry(subject, None, row))
        return out

    async def key(self, key_id: str) -> dict[str, Any]:
        key = await self._subject(key_id)
        return await self._entry(key_id, key, await self._call(self.store.get_limits, "key", key_id))

    async def _subject(self, key_id: str) -> ApiKey | None:
        """The managed key, or None for a passthrough fingerprint; KeyNotFound for anything else."""
        if FINGERPRINT.fullmatch(key_id):
            return None
        key = await self._key(key_id) if key_id.startswith("key_") else None
        if key is None:
            raise KeyNotFound(key_id)
        return key

    async def create_key(self, team: str, name: str, change: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """(the new key's entry, its secret): the secret exists only here, the store keeps its hash."""
        check_name("team", team)
        check_name("name", name)
        key_id, secret, digest, prefix = new_key()
        row = merge(None, "key", key_id, change, False, self.clock())  # refused before the key is created
        key: ApiKey = await self._call(self.store.create_key, key_id, digest, prefix, team, name)
        if not row.empty:
            await self._call(self.store.set_limits, row)
        self.quotas.forget("key", key_id)
        return await self._entry(key_id, key, None if row.empty else row), secret

    async def set_key_limits(self, key_id: str, change: dict[str, Any], replace: bool = False
                             ) -> dict[str, Any]:
        key = await self._subject(key_id)
        row = await self._set("key", key_id, change, replace)
        return await self._entry(key_id, key, None if row.empty else row)

    async def revoke(self, key_id: str) -> tuple[dict[str, Any], bool]:
        """(the key's entry, whether it was revoked before)."""
        key = await self._subject(key_id)
        if key is None:
            raise APIError(400, f"{key_id} is a passthrough fingerprint: its DeepSeek key is not "
                           "chatgate's to revoke. Clear or tighten its limits with PATCH instead.",
                           "invalid_request_error", None, "not_revocable")
        already = not key.active
        if not already:
            await self._call(self.store.revoke_key, key_id)
        if self.on_revoke is not None:
            self.on_revoke(key_id)
        return await self.key(key_id), already

    async def _set(self, scope: str, subject: str, change: dict[str, Any], replace: bool) -> LimitRow:
        current = await self._call(self.store.get_limits, scope, subject)
        row = merge(current, scope, subject, change, replace, self.clock())
        await self._call(self.store.set_limits, row)
        self.quotas.forget(scope, subject)  # this replica applies it at once; the others within cache_seconds
        return row

    async def teams(self) -> list[dict[str, Any]]:
        """Every team that has limits or keys, and the passthrough team (`default`), by name."""
        keys: list[ApiKey] = await self._call(self.store.list_keys)
        rows = {r.subject: r for r in await self._call(self.store.list_limits, "team")}
        active = Counter(k.team for k in keys if k.active)
        names = sorted({k.team for k in keys} | set(rows) | {self.passthrough_team})
        return [await self._team_entry(name, active[name], rows.get(name)) for name in names]

    async def team(self, team: str) -> dict[str, Any]:
        check_name("team", team)
        keys: list[ApiKey] = await self._call(self.store.list_keys)
        count = sum(1 for k in keys if k.team == team and k.active)
        return await self._team_entry(team, count, await self._call(self.store.get_limits, "team", team))

    async def set_team_limits(self, team: str, change: dict[str, Any], replace: bool = False
                              ) -> dict[str, Any]:
        check_name("team", team)
        row = await self._set("team", team, change, replace)
        keys: list[ApiKey] = await self._call(self.store.list_keys)
        count = sum(1 for k in keys if k.team == team and k.active)
        return await self._team_entry(team, count, None if row.empty else row)

    async def _team_entry(self, team: str, key_count: int, row: LimitRow | None) -> dict[str, Any]:
        status = await self.quotas.status("team", team)
        return {"team": team, "object": "chatgate.team", "key_count": key_count, "limits": limits_json(row),
                "spend": spend_json(status)}


# --- the HTTP API ---------------------------------------------------------------------------------


Count = Annotated[int, Field(strict=True, ge=0, le=BIGINT)]
Name = Annotated[str, Field(strict=True)]


class LimitsBody(BaseModel):
    """PATCH and PUT bodies: the limits to set (`null` clears one)."""

    model_config = ConfigDict(extra="forbid")

    budget_usd: Annotated[Decimal, Field(allow_inf_nan=False)] | None = None
    budget_cny: Annotated[Decimal, Field(allow_inf_nan=False)] | None = None
    budget_period: Literal["day", "week", "month", "total"] | None = None
    rpm: Count | None = None
    tpm: Count | None = None
    max_concurrent: Count | None = None
    run_max_turns: Count | None = None
    run_max_cost_usd: Annotated[Decimal, Field(allow_inf_nan=False)] | None = None
    run_max_repeats: Count | None = None

    def change(self) -> dict[str, Any]:
        """The fields sent, a budget (and a run's cost) as pico-units of its currency."""
        out: dict[str, Any] = {}
        for name in (*LIMIT_INPUTS, "budget_cny", *RUN_INPUTS):
            if name in self.model_fields_set:
                value = getattr(self, name)
                money = name in BUDGETS or name == "run_max_cost_usd"
                out[name] = usd_to_picousd(value, name) if money and value is not None else value
        return out


class NewKeyBody(LimitsBody):
    """POST /admin/keys: the key's team and name, and optionally its limits."""

    team: Name
    name: Name

    @field_validator("team", "name")
    @classmethod
    def _printable(cls, value: str, info: Any) -> str:
        try:
            return check_name(info.field_name, value)
        except LimitsError as exc:
            raise ValueError(exc.detail) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, numbers with a fraction or exponent as exact Decimals."""
    raw = await request.body()
    try:
        data = json.loads(raw, parse_float=Decimal, parse_constant=_refuse_constant) if raw else None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, NaN or Infinity
        raise APIError(400, f"The body is not valid JSON ({exc}); send a JSON object.",
                       "invalid_request_error", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "The body must be a JSON object (Content-Type: application/json).",
                       "invalid_request_error", None, "invalid_json")
    return data


def parse_body(model: type[LimitsBody], data: dict[str, Any]) -> LimitsBody:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, model) from None


def validation_error(exc: ValidationError, model: type[LimitsBody]) -> APIError:
    """The first problem pydantic found, with its `param`."""
    error = exc.errors()[0]
    param = ".".join(str(p) for p in error["loc"]) or None
    kind = error["type"]
    accepted = ", ".join(model.model_fields)
    if kind == "extra_forbidden":
        return APIError(400, f"Unknown parameter '{param}'. Accepted: {accepted}.", "invalid_request_error",
                        param, "unknown_parameter")
    if kind == "missing":
        return APIError(400, f"Missing required parameter '{param}'.", "invalid_request_error", param,
                        "missing_required_parameter")
    got = json.dumps(error.get("input"), default=str)
    got = got if len(got) <= 60 else got[:57] + "..."
    expected = EXPECTED.get(str(param), error["msg"])
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    return APIError(400, f"Invalid value for '{param}': {expected}; got {got}.", "invalid_request_error",
                    param, code)


Handler = Callable[[Request, Admin], Awaitable[Response]]


def add_admin(app: FastAPI, state: State) -> None:
    """Register the admin API's routes (admin key only; 503 without a store)."""

    def admin_route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
            if state.store is None or state.quotas is None:
                raise APIError(503, "Keys and limits need a store; set store.url.", "server_error", None,
                               "no_store")
            admin = Admin(state.store, state.quotas, state.settings.auth.passthrough_team,
                          on_revoke=state.gw.auth.forget_key)
            try:
                return await handler(request, admin)
            except LimitsError as exc:
                raise exc.api_error() from None
            except KeyNotFound as exc:
                raise exc.api_error() from None
        return route

    async def keys(request: Request, admin: Admin) -> Response:
        if request.method == "POST":
            body = parse_body(NewKeyBody, await read_json(request))
            assert isinstance(body, NewKeyBody)
            entry, secret = await admin.create_key(body.team, body.name, body.change())
            return _json(201, {**entry, "secret": secret})
        return _json(200, {"object": "list", "data": await admin.keys()})

    async def key(request: Request, admin: Admin) -> Response:
        key_id = request.path_params["key_id"]
        if request.method == "PATCH":
            change = parse_body(LimitsBody, await read_json(request)).change()
            return _json(200, await admin.set_key_limits(key_id, change))
        if request.method == "DELETE":
            entry, already = await admin.revoke(key_id)
            return _json(200, {**entry, "already_revoked": already})
        return _json(200, await admin.key(key_id))

    async def teams(request: Request, admin: Admin) -> Response:
        return _json(200, {"object": "list", "data": await admin.teams()})

    async def team(request: Request, admin: Admin) -> Response:
        name = request.path_params["team"]
        if request.method in ("PUT", "PATCH"):
            change = parse_body(LimitsBody, await read_json(request)).change()
            return _json(200, await admin.set_team_limits(name, change, replace=request.method == "PUT"))
        return _json(200, await admin.team(name))

    router = app.router
    router.add_route("/admin/keys", admin_route(keys), methods=["GET", "POST"], include_in_schema=False)
    router.add_route("/admin/keys/{key_id}", admin_route(key), methods=["GET", "PATCH", "DELETE"],
                     include_in_schema=False)
    router.add_route("/admin/teams", admin_route(teams), methods=["GET"], include_in_schema=False)
    router.add_route("/admin/teams/{team}", admin_route(team), methods=["GET", "PUT", "PATCH"],
                     include_in_schema=False)


def _json(status: int, body: dict[str, Any]) -> Response:
    return json_response(status, body, {"cache-control": NO_STORE})

"""Who is calling: a chatgate-issued key (managed), or a fingerprint of the client's own DeepSeek key
(passthrough)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.requests import HTTPConnection, Request

from chatgate.bounded import BoundedDict
from chatgate.errors import APIError, unauthorized
from chatgate.settings import AuthSettings
from chatgate.store.base import ApiKey, KeyStore

KEY_PREFIX = "cg-"
ADMIN = "admin"  # the admin key's key id, name and team where a route takes it
UNKNOWN_KEYS_CACHED = 10_000  # keys the store does not know, remembered (oldest forgotten first)
KNOWN_KEYS_CACHED = 100_000  # beyond, expired entries are dropped
PASSTHROUGH_CACHED = 4_096  # passthrough identities kept (the oldest forgotten first)
MANAGED_CACHED = 4_096  # managed identities kept (the oldest forgotten first)
ADMIN_WINDOW = 60.0  # auth.admin_failures_per_minute wrong admin keys from an address in it: then 429s
ADMIN_SOURCES = 10_000  # addresses whose failures are remembered (the oldest forgotten first)


@dataclass(frozen=True, slots=True)
class Identity:
    key_id: str
    key_name: str
    team: str
    upstream_authorization: str | None  # what goes upstream as Authorization
    # Whose relayed turns these are (the turn memory's key): the managed key's id; for a passthrough key its
    # whole hash, not the 48-bit fingerprint that reports show (a token matching that is cheap to find).
    caller: str = ""


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def new_key() -> tuple[str, str, str, str]:
    """(key_id, secret, hash, prefix) for `chatgate keys create`."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    return "key_" + secrets.token_hex(6), secret, hash_key(secret), secret[:7]


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def client_key(headers: Mapping[str, str]) -> str | None:
    """The caller's key as an Authorization value, by DeepSeek's precedence: `Authorization: Bearer <key>`,
    else `x-api-key` (Anthropic's SDKs), however the other header looks. An empty or non-Bearer
    Authorization beside an x-api-key is not a missing key: that key is the caller (and what DeepSeek bills).
    With neither, the Authorization as sent (None if absent): the caller is anonymous."""
    authorization = headers.get("authorization")
    if bearer(authorization) is not None:
        return authorization
    api_key = headers.get("x-api-key", "").strip()
    return f"Bearer {api_key}" if api_key else authorization


def unknown_key_message(token: str) -> str:
    """The managed mode's 401 for a key the store does not know (or a revoked one), naming what a chatgate
    key looks like; a DeepSeek key (`sk-…`) sent by mistake is called one (the client reads the wrong
    variable)."""
    message = (f"Invalid chatgate API key: unknown or revoked. chatgate runs in managed mode, where a client "
               f"sends a chatgate key ({KEY_PREFIX}…), made by `chatgate keys create --team T --name N`.")
    if token.startswith("sk-"):
        message += (" The key sent looks like a DeepSeek API key (sk-…): in managed mode the DeepSeek "
                    "key stays on the server (DEEPSEEK_API_KEY) and clients send their chatgate key instead "
                    "(point the client at a variable of its own, e.g. CHATGATE_API_KEY).")
    return message


def cache_digest(salt: bytes, secret: str) -> bytes:
    """What a cache keeps a secret by: a keyed BLAKE2b of it (the key is the process's own, random), so no
    cache holds a plaintext key, and no digest it holds is the store's (SHA-256) or usable elsewhere."""
    return hashlib.blake2b(secret.encode("utf-8", "surrogateescape"), digest_size=16, key=salt).digest()


def fingerprint(secret: str) -> str:
    return _fingerprint_of(hash_key(secret))


def _fingerprint_of(digest: str) -> str:
    return "fp-" + digest[:12]


class Authenticator:
    def __init__(self, settings: AuthSettings, store: KeyStore | None,
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.store = store
        self._cache: dict[str, tuple[float, ApiKey]] = {}  # the store's keys, by digest
        # digests the store does not know -> until when
        self._unknown: BoundedDict[str, float] = BoundedDict(UNKNOWN_KEYS_CACHED)
        # wrong admin keys, by address (the address that failed last is the last forgotten)
        self._admin_failures: BoundedDict[str, deque[float]] = BoundedDict(ADMIN_SOURCES)
        # identities by `cache_digest` of the key sent (a BLAKE2b, not the store's SHA-256, per request): a
        # passthrough caller's by its Authorization as sent; a managed key's until its key cache entry expires
        self._salt = secrets.token_bytes(32)
        self._passthrough_ids: BoundedDict[bytes, Identity] = BoundedDict(PASSTHROUGH_CACHED)
        self._managed_ids: BoundedDict[bytes, tuple[float, Identity]] = BoundedDict(MANAGED_CACHED)
        self.on_refused = on_refused  # told of a 401, by its source address (/metrics)
        upstream_key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        self._upstream = f"Bearer {upstream_key}" if upstream_key else None

    @property
    def managed(self) -> bool:
        return self.settings.mode == "managed"

    async def identify(self, authorization: str | None) -> Identity:
        token = bearer(authorization)
        if not self.managed:
            return self._passthrough(token, authorization)
        if token is None:
            raise unauthorized("Missing chatgate API key: send 'Authorization: Bearer cg-…' (create one with "
                               "`chatgate keys create --team T --name N`).")
        cache_key = cache_digest(self._salt, token)
        known = self._managed_ids.get(cache_key)
        if known is not None and known[0] > time.monotonic():
            return known[1]
        digest = hash_key(token)
        key = await self._lookup(digest)
        if key is None or not key.active:
            raise unauthorized(unknown_key_message(token))
        identity = Identity(key.key_id, key.name, key.team, self._upstream, key.key_id)
        cached = self._cache.get(digest)
        if cached is not None and cached[1] is key:  # kept as long as the key's cache entry
            self._managed_ids[cache_key] = (cached[0], identity)
        return identity

    async def identify_request(self, request: HTTPConnection) -> Identity:
        """`identify` with the request's key (`client_key`); a 401 is counted by the client's address."""
        try:
            return await self.identify(client_key(request.headers))
        except APIError as error:
            if error.status == 401 and self.on_refused is not None:
                self.on_refused(request.client.host if request.client is not None else "unknown")
            raise

    def admin(self, authorization: str | None) -> Identity | None:
        """The admin key's identity in managed mode, asking DeepSeek with the upstream key; None for any other
        key, and in passthrough mode (where every key is the caller's own DeepSeek key)."""
        if not self.managed or not self.is_admin(authorization):
            return None
        return Identity(ADMIN, ADMIN, ADMIN, self._upstream)

    def _passthrough(self, token: str | None, authorization: str | None) -> Identity:
        if token is None:
            return Identity("anonymous", "anonymous", self.settings.passthrough_team, authorization)
        assert authorization is not None  # a token comes from it
        cache_key = cache_digest(self._salt, authorization)
        known = self._passthrough_ids.get(cache_key)
        if known is not None:
            return known
        digest = hash_key(token)  # the fingerprint and the turn memory's key both need it
        fp = _fingerprint_of(digest)
        identity = Identity(fp, fp, self.settings.passthrough_team, authorization, "pt-" + digest)
        self._passthrough_ids[cache_key] = identity
        return identity

    async def _lookup(self, digest: str) -> ApiKey | None:
        """The store's key of this digest (SHA-256 of the secret), cached."""
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        unknown_until = self._unknown.get(digest)
        if unknown_until is not None and unknown_until > now:
            return None
        if self.store is None:
            raise APIError(503, "Managed keys need a store; set store.url.", "server_error", None, "no_store")
        # Looked up by SHA-256 of the secret: lookup timing reveals nothing an attacker can steer.
        key = await asyncio.to_thread(self.store.find_key, digest)
        until = now + self.settings.key_cache_seconds
        if key is None:
            # A flood of made-up keys evicts only other made-up keys: the valid ones stay cached.
            self._unknown[digest] = until
            self._unknown.touch(digest)
            return None
        self._unknown.pop(digest, None)
        if len(self._cache) >= KNOWN_KEYS_CACHED:
            for stale in [d for d, (t, _) in self._cache.items() if t <= now]:
                del self._cache[stale]
        self._cache[digest] = (until, key)
        return key

    def forget_key(self, key_id: str) -> None:
        """A key was revoked here: it is refused at once on this replica (the others: within
        auth.key_cache_seconds)."""
        for digest in [d for d, (_, key) in self._cache.items() if key.key_id == key_id]:
            del self._cache[digest]
        for cache_key in [c for c, (_, identity) in self._managed_ids.items() if identity.key_id == key_id]:
            del self._managed_ids[cache_key]

    def check_admin(self, authorization: str | None, source: str) -> None:
        """The admin key, or a 401 counted in /metrics; an address that sent auth.admin_failures_per_minute
        wrong keys in the last minute gets a 429 (right key or not) until the oldest of them is that old. A
        request without a key is refused, not counted: it guesses nothing. With no admin key configured every
        admin request is a 503 that says so (no key can be right: nothing to guess, nothing counted)."""
        if not self.settings.admin_key:
            raise admin_not_configured()
        now = time.monotonic()
        failures = self._admin_failures.get(source)
        if failures is not None:
            while failures and failures[0] <= now - ADMIN_WINDOW:
                failures.popleft()
            if len(failures) >= self.settings.admin_failures_per_minute:
                wait = max(1, math.ceil(failures[0] + ADMIN_WINDOW - now))
                raise APIError(429, f"Too many wrong admin keys from this address; try again in {wait} s.",
                               "rate_limit_error", None, "admin_auth_throttled",
                               headers={"retry-after": str(wait)})
        if self.is_admin(authorization):
            return
        if bearer(authorization) is None:
            raise admin_refused()
        if failures is None:
            failures = self._admin_failures[source] = deque()
        failures.append(now)
        self._admin_failures.touch(source)
        if self.on_refused is not None:
            self.on_refused(source)
        raise admin_refused()

    def is_admin(self, authorization: str | None) -> bool:
        expected = self.settings.admin_key.get_secret_value() if self.settings.admin_key else None
        token = bearer(authorization)
        if not expected or token is None:
            return False
        return hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected.encode())


def require_admin(auth: Authenticator, authorization: str | None, source: str = "unknown") -> None:
    """Admin routes take the admin key only; a client key, chatgate's or DeepSeek's, is refused. `source`
    (the client's address) is throttled after ADMIN_FAILURES wrong keys in ADMIN_WINDOW seconds."""
    auth.check_admin(authorization, source)


def admin_refused() -> APIError:
    return APIError(401, "Admin routes need 'Authorization: Bearer <CHATGATE_ADMIN_KEY>'; client keys are "
                    "refused.", "authentication_error", None, "invalid_admin_key",
                    headers={"www-authenticate": "Bearer"})


def admin_not_configured() -> APIError:
    """Not a refused key: this chatgate has none (auth.admin_key unset), so the admin routes are closed to
    everyone (a 403, not a 5xx: nothing failed, and no key would be let in)."""
    return APIError(403, "No admin key is configured on this chatgate, so the admin routes (and the "
                    "dashboard) are closed: set CHATGATE_ADMIN_KEY (make one with `openssl rand -hex 32`; at "
                    "least 32 characters) and restart chatgate.", "permission_error", None,
                    "admin_key_not_configured")


def address_of(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"

"""Who is calling: a chatgate-issued key (managed), or a fingerprint of the client's own DeepSeek key
(passthrough)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from app.errors import APIError, unauthorized
from app.settings import AuthSettings
from app.store.base import ApiKey, Store

KEY_PREFIX = "cg-"
ADMIN = "admin"  # the admin key's key id, name and team where a route takes it


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


def fingerprint(secret: str) -> str:
    return _fingerprint_of(hash_key(secret))


def _fingerprint_of(digest: str) -> str:
    return "fp-" + digest[:12]


class Authenticator:
    def __init__(self, settings: AuthSettings, store: Store | None) -> None:
        self.settings = settings
        self.store = store
        self._cache: dict[str, tuple[float, ApiKey | None]] = {}
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
        key = await self._lookup(token)
        if key is None or not key.active:
            raise unauthorized("Invalid chatgate API key: unknown or revoked. Check the key, or create a new "
                               "one with `chatgate keys create`.")
        return Identity(key.key_id, key.name, key.team, self._upstream, key.key_id)

    def admin(self, authorization: str | None) -> Identity | None:
        """The admin key's identity in managed mode, asking DeepSeek with the upstream key; None for any other
        key, and in passthrough mode (where every key is the caller's own DeepSeek key)."""
        if not self.managed or not self.is_admin(authorization):
            return None
        return Identity(ADMIN, ADMIN, ADMIN, self._upstream)

    def anonymous(self) -> Identity:
        """Whoever sent a request that needs no key (the dry-run /validate)."""
        return Identity("anonymous", "anonymous", self.settings.passthrough_team, None)

    def _passthrough(self, token: str | None, authorization: str | None) -> Identity:
        if token is None:
            return Identity("anonymous", "anonymous", self.settings.passthrough_team, authorization)
        digest = hash_key(token)  # once per request: the fingerprint and the turn memory's key both need it
        fp = _fingerprint_of(digest)
        return Identity(fp, fp, self.settings.passthrough_team, authorization, "pt-" + digest)

    async def _lookup(self, token: str) -> ApiKey | None:
        digest = hash_key(token)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        if self.store is None:
            raise APIError(503, "Managed keys need a store; set store.url.", "server_error", None, "no_store")
        # Looked up by SHA-256 of the secret: lookup timing reveals nothing an attacker can steer.
        key = await asyncio.to_thread(self.store.find_key, digest)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (now + self.settings.key_cache_seconds, key)
        return key

    def forget_key(self, key_id: str) -> None:
        """A key was revoked here: it is refused at once on this replica (the others: within
        auth.key_cache_seconds)."""
        for digest in [d for d, (_, key) in self._cache.items() if key is not None and key.key_id == key_id]:
            del self._cache[digest]

    def is_admin(self, authorization: str | None) -> bool:
        expected = self.settings.admin_key.get_secret_value() if self.settings.admin_key else None
        token = bearer(authorization)
        if not expected or token is None:
            return False
        return hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected.encode())


def require_admin(auth: Authenticator, authorization: str | None) -> None:
    """Admin routes take the admin key only; a client key, chatgate's or DeepSeek's, is refused."""
    if not auth.is_admin(authorization):
        raise APIError(401, "Admin routes need 'Authorization: Bearer <CHATGATE_ADMIN_KEY>'; client keys are "
                       "refused.", "authentication_error", None, "invalid_admin_key",
                       headers={"www-authenticate": "Bearer"})

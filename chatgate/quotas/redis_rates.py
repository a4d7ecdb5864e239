"""Requests per minute, tokens per minute and requests in flight, counted in Redis: every replica shares
the counters (`limits.redis_url`). Each admission is one Lua script, so check-then-count is atomic across
replicas; a request in flight is a member of a sorted set scored by when its reservation expires, so a
replica that dies mid-request cannot leak a concurrency slot for longer than that."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from chatgate.quotas.model import WINDOW, Ask, RateInfo, Refusal, Subject

# KEYS: per subject rq (request times), tk (token entry times), tkv (entry -> tokens, and '#sum': their
# total, kept as entries come, settle and leave, so no admission adds up the window), cc (in flight).
# ARGV: now, window, id, tokens, expires_at, then per subject rpm, tpm, max_concurrent (-1: no limit).
ACQUIRE = """
local now, window, id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local tokens, expires = tonumber(ARGV[4]), tonumber(ARGV[5])
local n = #KEYS / 4
local stats = {}
for i = 0, n - 1 do
  local rq, tk, tkv, cc = KEYS[4*i+1], KEYS[4*i+2], KEYS[4*i+3], KEYS[4*i+4]
  local rpm, tpm, maxc = tonumber(ARGV[6+3*i]), tonumber(ARGV[7+3*i]), tonumber(ARGV[8+3*i])
  redis.call('ZREMRANGEBYSCORE', rq, '-inf', now - window)
  while true do  -- in batches: Lua's unpack takes at most about 8,000 values
    local old = redis.call('ZRANGEBYSCORE', tk, '-inf', now - window, 'LIMIT', 0, 1000)
    if #old == 0 then break end
    local gone = 0
    for _, v in ipairs(redis.call('HMGET', tkv, unpack(old))) do gone = gone + (tonumber(v) or 0) end
    redis.call('HDEL', tkv, unpack(old))
    redis.call('ZREM', tk, unpack(old))
    redis.call('HINCRBY', tkv, '#sum', -gone)
  end
  redis.call('ZREMRANGEBYSCORE', cc, '-inf', now)
  local used = redis.call('ZCARD', rq)
  local first = redis.call('ZRANGE', rq, 0, 0, 'WITHSCORES')
  local sum = tonumber(redis.call('HGET', tkv, '#sum') or '0')
  local tfirst = redis.call('ZRANGE', tk, 0, 0, 'WITHSCORES')
  local inflight = redis.call('ZCARD', cc)
  local s = {tostring(used), first[2] or '-1', tostring(sum), tfirst[2] or '-1', tostring(inflight)}
  stats[#stats + 1] = table.concat(s, ' ')
  local refused = nil
  if maxc >= 0 and inflight >= maxc then refused = 'concurrency'
  elseif rpm >= 0 and used >= rpm then refused = 'rpm'
  elseif tpm >= 0 and sum + tokens > tpm then refused = 'tpm' end
  if refused then return {refused, tostring(i), unpack(stats)} end
end
for i = 0, n - 1 do
  local rq, tk, tkv, cc = KEYS[4*i+1], KEYS[4*i+2], KEYS[4*i+3], KEYS[4*i+4]
  local rpm, tpm = tonumber(ARGV[6+3*i]), tonumber(ARGV[7+3*i])
  if rpm >= 0 then redis.call('ZADD', rq, now, id); redis.call('EXPIRE', rq, math.ceil(window * 2)) end
  if tpm >= 0 then
    redis.call('ZADD', tk, now, id); redis.call('HSET', tkv, id, tokens)
    redis.call('HINCRBY', tkv, '#sum', tokens)
    redis.call('EXPIRE', tk, math.ceil(window * 2)); redis.call('EXPIRE', tkv, math.ceil(window * 2))
  end
  redis.call('ZADD', cc, expires, id)
  redis.call('EXPIRE', cc, math.ceil(expires - now + window))
end
return {'ok', '-1', unpack(stats)}
"""

# KEYS: per subject rq, tk, tkv, cc. ARGV: id, actual tokens, cancel (1: the request never went out).
RELEASE = """
for i = 0, #KEYS / 4 - 1 do
  local rq, tk, tkv, cc = KEYS[4*i+1], KEYS[4*i+2], KEYS[4*i+3], KEYS[4*i+4]
  local reserved = tonumber(redis.call('HGET', tkv, ARGV[1]) or 'nil')
  if ARGV[3] == '1' then
    redis.call('ZREM', rq, ARGV[1]); redis.call('ZREM', tk, ARGV[1]); redis.call('HDEL', tkv, ARGV[1])
    if reserved then redis.call('HINCRBY', tkv, '#sum', -reserved) end
  elseif reserved then
    redis.call('HSET', tkv, ARGV[1], ARGV[2])
    redis.call('HINCRBY', tkv, '#sum', tonumber(ARGV[2]) - reserved)
  end
  redis.call('ZREM', cc, ARGV[1])
end
return 1
"""


def _none(value: int | None) -> int:
    return -1 if value is None else value


class RedisRates:
    def __init__(self, url: str, prefix: str = "chatgate:rl", timeout: float = 2.0,
                 connect_timeout: float = 2.0) -> None:
        # limits.redis_timeout_s / redis_connect_timeout_s: past them a call fails (limits.on_backend_error)
        self.client: aioredis.Redis = aioredis.Redis.from_url(url, socket_timeout=timeout,
                                                               socket_connect_timeout=connect_timeout)
        self.prefix = prefix
        self._acquire = self.client.register_script(ACQUIRE)
        self._release = self.client.register_script(RELEASE)

    def _keys(self, subject: Subject) -> list[str]:
        base = f"{self.prefix}:{subject.scope}:{subject.name}"
        return [f"{base}:rq", f"{base}:tk", f"{base}:tkv", f"{base}:cc"]

    async def acquire(self, subjects: list[Subject], ask: Ask, now: float
                      ) -> tuple[Refusal | None, RateInfo]:
        keys: list[str] = []
        args: list[Any] = [repr(now), repr(WINDOW), ask.request_id, ask.tokens, repr(ask.expires_at)]
        for subject in subjects:
            keys += self._keys(subject)
            limits = subject.limits
            args += [_none(limits.rpm), _none(limits.tpm), _none(limits.max_concurrent)]
        reply = await self._acquire(keys=keys, args=args)
        verdict, index = _text(reply[0]), int(_text(reply[1]))
        info = RateInfo()
        refusal: Refusal | None = None
        for n, raw in enumerate(reply[2:]):
            used, first, tokens, tfirst, inflight = (float(x) for x in _text(raw).split())
            subject = subjects[n]
            limits = subject.limits
            reset = first + WINDOW - now if first >= 0 else 0.0
            treset = tfirst + WINDOW - now if tfirst >= 0 else 0.0
            adding = 0 if verdict != "ok" else 1
            if limits.rpm is not None:
                info.take_requests(limits.rpm, int(limits.rpm - used - adding), reset)
            if limits.tpm is not None:
                info.take_tokens(limits.tpm, int(limits.tpm - tokens - adding * ask.tokens), treset)
            if verdict != "ok" and n == index:
                refusal = _refusal(verdict, subject, ask, reset, treset, int(inflight))
        return refusal, info

    async def release(self, subjects: list[Subject], ask: Ask, tokens: int, cancel: bool = False) -> None:
        keys = [key for subject in subjects for key in self._keys(subject)]
        await self._release(keys=keys, args=[ask.request_id, tokens, "1" if cancel else "0"])

    async def close(self) -> None:
        await self.client.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusal(kind: str, subject: Subject, ask: Ask, reset: float, treset: float, inflight: int) -> Refusal:
    limits = subject.limits
    if kind == "concurrency":
        limit = limits.max_concurrent or 0
        return Refusal(kind, subject, limit, 1.0, f"Too many requests in flight for {subject.label}: "
                                                  f"{inflight} "
                       f"of {limit} allowed at once. Retry when one has finished.")
    if kind == "rpm":
        limit = limits.rpm or 0
        return Refusal(kind, subject, limit, reset, f"Rate limit reached for {subject.label}: {limit} "
                                                    f"requests "
                       f"per minute. Retry in {reset:.1f} s.")
    limit = limits.tpm or 0
    too_big = ask.tokens > limit
    return Refusal(kind, subject, limit, None if too_big else treset,
                   f"Rate limit reached for {subject.label}: {limit} tokens per minute; this request "
                   f"reserves "
                   f"up to {ask.tokens} (its prompt and max_tokens)."
                   + (" It can never fit: lower max_tokens." if too_big else f" Retry in {treset:.1f} s."))

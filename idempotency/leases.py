"""Redis leases: the fast path of the idempotency guard.

Key schema (one key per message and consumer group):

    <key_prefix><group>:<message_id>  ->  "L:<token>"   leased: a worker is processing it
                                                        (SET NX PX <lease>)
                                      ->  "D:<token>"   done: confirmed by that worker
                                                        (PX <ttl>, the dedup fast path)

`<token>` is the fencing token of the worker that took the lease. Every multi-step change
is one atomic Lua script that first checks the caller still holds the lease, so a worker
whose lease expired (and was taken over) can neither release nor mark done the new
holder's key. Redis is only the fast path: the confirmation row in the database decides.
"""

from __future__ import annotations

from typing import Any, Protocol

LEASED = "L:"
DONE = "D:"

# KEYS[1] key; ARGV[1] expected value; ARGV[2] new value; ARGV[3] PX milliseconds
_SWAP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
# KEYS[1] key; ARGV[1] expected value
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS[1] key; ARGV[1] expected value; ARGV[2] PX milliseconds
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class RedisLike(Protocol):
    """The few commands the guard uses (redis-py's `Redis` and cluster clients fit)."""

    def set(self, name: Any, value: Any, *args: Any, **kwargs: Any) -> Any: ...

    def get(self, name: Any) -> Any: ...

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...

    def pipeline(self, transaction: bool = ...) -> Any: ...


class Leases:
    """Lease operations over one Redis client; every method may raise `redis.RedisError`."""

    def __init__(self, client: RedisLike, prefix: str, lease_ms: int, ttl_ms: int) -> None:
        self.client = client
        self.prefix = prefix
        self.lease_ms = lease_ms
        self.ttl_ms = ttl_ms

    def key(self, group: str, message_id: str) -> str:
        return f"{self.prefix}{group}:{message_id}"

    def acquire(self, key: str, token: str) -> bool:
        """SET NX PX: True when this worker now holds the lease."""
        return bool(self.client.set(key, LEASED + token, nx=True, px=self.lease_ms))

    def acquire_many(self, keys: list[str], tokens: list[str]) -> list[bool]:
        """`acquire` of several keys in one round trip (a pipeline, not a transaction:
        each SET NX stands alone)."""
        pipe = self.client.pipeline(transaction=False)
        for key, token in zip(keys, tokens, strict=True):
            pipe.set(key, LEASED + token, nx=True, px=self.lease_ms)
        return [bool(taken) for taken in pipe.execute()]

    def state(self, key: str) -> str | None:
        value = self.client.get(key)
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def mark_done_many(self, marks: list[tuple[str, str, bool]]) -> None:
        """Leased by `token` -> done (kept for the ttl), for several (key, token, held) in
        one round trip. A lease lost meanwhile is left alone; a mark whose lease was not
        held (Redis was down when its message started) is set only if the key is absent."""
        pipe = self.client.pipeline(transaction=False)
        for key, token, held in marks:
            if held:
                pipe.eval(_SWAP, 1, key, LEASED + token, DONE + token, self.ttl_ms)
            else:
                pipe.set(key, DONE + token, nx=True, px=self.ttl_ms)
        pipe.execute()

    def renew(self, key: str, token: str) -> bool:
        """Extend the lease by another `lease_ms`, only if `token` still holds it."""
        return bool(self.client.eval(_RENEW, 1, key, LEASED + token, self.lease_ms))

    def release(self, key: str, token: str) -> bool:
        """Compare-and-delete: drop the lease only if `token` still holds it."""
        return bool(self.client.eval(_RELEASE, 1, key, LEASED + token))

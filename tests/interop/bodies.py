"""The message bodies the digest tests send, the same in every interop program (README.md).

For z = 1..4, the first three bodies `crafted-<n>` (n = 0, 1, ...; none taken twice) whose
CRC32 is below 16**(8 - z), i.e. whose 8-digit hex has at least z leading zeros: a CRC32
digest written as unpadded hex (the Java and Go clients) and as padded hex (the Python
client) differs for exactly these. Then `plain-<i>` repeated i * 512 times, i = 1..8.
"""

from __future__ import annotations

import zlib

PER_LEVEL = 3
LEVELS = 4
PLAIN = 8


def crc_hex(body: bytes) -> str:
    """The CRC32 of `body` as 8 zero-padded upper-case hex digits."""
    return f"{zlib.crc32(body):08X}"


def crafted_bodies() -> list[bytes]:
    """The bodies whose CRC32 hex has leading zeros, fewest zeros first."""
    taken: list[int] = []
    for zeros in range(1, LEVELS + 1):
        limit = 1 << (32 - 4 * zeros)
        found = 0
        n = 0
        while found < PER_LEVEL:
            if n not in taken and zlib.crc32(b"crafted-%d" % n) < limit:
                taken.append(n)
                found += 1
            n += 1
    return [b"crafted-%d" % n for n in taken]


def all_bodies() -> list[bytes]:
    """Every body a scenario sends: the crafted ones, then the plain ones (3 to 32 KiB)."""
    plain = [(b"plain-%d" % i) * (i * 512) for i in range(1, PLAIN + 1)]
    return crafted_bodies() + plain


def leading_zero_crc(bodies: list[bytes]) -> int:
    """How many of `bodies` have a CRC32 whose 8-digit hex starts with 0."""
    return sum(crc_hex(b).startswith("0") for b in bodies)

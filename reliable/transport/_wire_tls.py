"""TLS for the native wire's client (docs/wire.md, "TLS"), over memory BIOs.

The wire's connection is written by whichever thread sends (under the channel's lock) and
read by one thread at a time, which polls the socket before it reads; an `ssl.SSLSocket`
would share one OpenSSL object between a writing and a reading thread, and keep decrypted
bytes a poll of the socket cannot see. So the socket stays a plain socket, and the TLS
records go through an `ssl.SSLObject` with memory BIOs, under one lock: `sendall` seals
and sends (records leave in the order they are made), `recv_some` takes what the socket
has, opens every whole record and returns the plaintext (None while a record is still
partial), and answers anything TLS itself must say back (a key update) at once.
"""

from __future__ import annotations

import socket
import ssl
import threading


class TlsStream:
    """A TLS client session over a connected, blocking socket (see the module docstring)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str):
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_hostname=server_hostname
        )
        self._lock = threading.Lock()
        self._plain = bytearray()  # opened, not yet returned (a blocking `recv` only)
        self._eof = False

    def handshake(self) -> None:
        """The TLS handshake, blocking (the socket's timeout applies); ssl.SSLError when
        the server's certificate or name does not verify, ConnectionError when it closes."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(
                        "the server closed the connection in the TLS handshake"
                    ) from None
                self._incoming.write(data)
        self._flush()

    def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            self.sock.sendall(pending)

    def sendall(self, data: bytes) -> None:
        with self._lock:
            self._tls.write(data)
            self.sock.sendall(self._outgoing.read())

    def recv_some(self) -> bytes | None:
        """One read of the socket: the plaintext it completed, b"" at the end of the
        stream, None when it completed no record yet (read again when the socket is
        readable)."""
        if self._plain:  # left over by `recv`
            plain_left = bytes(self._plain)
            self._plain.clear()
            return plain_left
        data = self.sock.recv(1 << 18)
        if not data:
            return b""
        with self._lock:
            self._incoming.write(data)
            plain = bytearray()
            try:
                while True:
                    chunk = self._tls.read(1 << 18)
                    if not chunk:
                        self._eof = True
                        break
                    plain += chunk
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:  # the server's close_notify
                self._eof = True
            self._flush()  # whatever TLS itself answers (a key update), in order
        if plain:
            return bytes(plain)
        return b"" if self._eof else None

    def recv(self, n: int) -> bytes:
        """Up to `n` bytes of plaintext, blocking until some come (b"": the end); for
        reading one frame at a time (the hello's answer)."""
        while not self._plain:
            got = self.recv_some()
            if got == b"":
                return b""
            if got:
                self._plain += got
        out = bytes(self._plain[:n])
        del self._plain[:n]
        return out

    def close(self) -> None:
        self.sock.close()


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """The wire's client TLS context: the server's certificate verified against `ca_file`
    (else the system's CAs), as the gRPC channel of the same transport verifies it."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context

"""Byte streams under the HTTP servers (the main endpoint and the health listener): the
listening socket they come from, then plain TCP, or TLS done here with ssl.MemoryBIO.

Why not asyncio's own TLS (start_server(ssl=...) or StreamWriter.start_tls): when a handshake
fails, asyncio closes the connection without sending the alert OpenSSL prepared, so a TLS 1.1
client or one without its certificate sees a bare EOF instead of "protocol version" or
"certificate required"; and it gives no hook to log why. Driving the SSLObject over memory BIOs
keeps both, and costs one small class.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from typing import Any

READ_SIZE = 16 * 1024


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """Bound and listening now, so that EADDRINUSE reaches the caller before the privilege drop
    (and `check`'s port line says what `run` would meet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # "::" and IPv6 literals
    return socket.create_server((host, port), family=family, backlog=backlog)


class LoopServer:
    """A bound socket served by an asyncio loop on a thread of its own: the main endpoint's and
    the health listener's plumbing. A subclass writes `_main` (which calls `_enter_loop`
    first, and sets `_started` once its server listens, whether it could or not)."""

    def __init__(self, sock: socket.socket, thread_name: str) -> None:
        self.sock = sock
        self.server_address = sock.getsockname()[:2]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()),
                                        name=thread_name, daemon=True)

    @property
    def port(self) -> int:
        port: int = self.server_address[1]
        return port

    def _start_loop(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def _stop_loop(self) -> None:
        """End the loop (its `_main` returns once `_stopping` is set); never started: close."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(10)
        else:
            self.sock.close()

    def _enter_loop(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Event]:
        """In `_main`, first: the running loop and the event that stops it."""
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        return self._loop, self._stopping

    async def _main(self) -> None:
        raise NotImplementedError


class Plain:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def read(self) -> bytes:
        return await self.reader.read(READ_SIZE)

    def write(self, data: bytes) -> None:
        if data:
            self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    def goodbye(self) -> None:
        """Whatever the protocol says before the TCP close (nothing, for plain HTTP)."""

    def release(self) -> None:
        """The connection is closed: drop what it held (TLS: the SSL object and its buffers),
        now rather than when the garbage collector breaks the cycles an exception left."""


class Tls(Plain):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 ctx: ssl.SSLContext):
        super().__init__(reader, writer)
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self._in, self._out, server_side=True)
        self._eof = False

    def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.writer.write(data)

    async def _fill(self) -> bool:
        """More ciphertext from the peer; False at the end of the stream."""
        self._flush()
        data = await self.reader.read(READ_SIZE)
        if not data:
            self._in.write_eof()
            self._eof = True
            return False
        self._in.write(data)
        return True

    async def handshake(self) -> None:
        """Raises ssl.SSLError (after sending its alert) or ConnectionError."""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if not await self._fill():
                    raise ConnectionResetError("closed during the TLS handshake") from None
            except ssl.SSLError:
                self._flush()  # the alert: the client learns why
                raise
        self._flush()  # the last flight, and TLS 1.3 session tickets

    def getpeercert(self) -> dict[str, Any] | None:
        return self.tls.getpeercert()

    async def read(self) -> bytes:
        while True:
            try:
                data = self.tls.read(READ_SIZE)
                self._flush()  # a key update may want an answer
                return data
            except ssl.SSLWantReadError:
                if self._eof:
                    return b""
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def write(self, data: bytes) -> None:
        if data:
            self.tls.write(data)
            self._flush()

    def goodbye(self) -> None:
        try:
            self.tls.unwrap()  # queues our close_notify; the peer's is not waited for
        except (ssl.SSLError, ValueError, OSError):
            pass
        self._flush()

    def release(self) -> None:
        # ~48 KiB of OpenSSL state per connection; a handshake that failed leaves this object
        # in a reference cycle (exception -> traceback -> frame -> self) that only gc breaks.
        self.tls = None  # type: ignore[assignment]
        self._in = self._out = None  # type: ignore[assignment]

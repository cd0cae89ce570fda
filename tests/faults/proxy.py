"""A TCP proxy between the services and Redis that injects network faults: pass (the default), reset every
connection, blackhole for N seconds, added latency for N seconds; and a group of them, one per cluster master."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from redis_txmq.transport.embedded import free_port

CHUNK = 65536
TICK = 0.02
T = TypeVar("T")


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream_port`` on an event loop of its own thread.

    A blackhole stalls every byte and every new connection until it ends, as a network partition shorter than
    TCP's retransmission timeout does: nothing is lost, everything arrives late. A reset aborts every connection
    with a TCP RST. A delay holds each chunk for ``latency`` seconds before forwarding it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections_made = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._blackhole_until = 0.0
        self._delay_until = 0.0
        self._latency = 0.0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._thread.start()
        self.port = free_port()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def reset_all(self) -> int:
        """Abort every open connection with a RST; returns how many were open."""
        return self._call(self._reset_all())

    def blackhole(self, seconds: float) -> None:
        """Stall all traffic, and new connections, for ``seconds`` from now."""
        self._blackhole_until = time.monotonic() + seconds

    def delay(self, latency: float, seconds: float) -> None:
        """Hold every chunk ``latency`` seconds before forwarding it, for ``seconds`` from now."""
        self._latency = latency
        self._delay_until = time.monotonic() + seconds

    def heal(self) -> None:
        """End any blackhole or delay now."""
        self._blackhole_until = self._delay_until = 0.0

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()

    async def _reset_all(self) -> int:
        pairs = list(self._open)
        for client, upstream in pairs:
            _abort(client)
            _abort(upstream)
        return len(pairs)

    async def _hold(self) -> None:
        """Wait out a blackhole (in small steps, so that :meth:`heal` takes effect at once)."""
        while time.monotonic() < self._blackhole_until:
            await asyncio.sleep(TICK)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        await self._hold()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:  # Redis is down: the client sees its connection closed
            _abort(client_writer)
            return
        self.connections_made += 1
        pair = (client_writer, upstream_writer)
        self._open.add(pair)
        try:
            await asyncio.gather(
                self._pump(client_reader, upstream_writer, client_writer),
                self._pump(upstream_reader, client_writer, upstream_writer),
            )
        finally:
            self._open.discard(pair)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: asyncio.StreamWriter
    ) -> None:
        """Forward one direction until it ends, then close both sides (Redis needs no half-closed connection)."""
        try:
            while chunk := await reader.read(CHUNK):
                await self._hold()
                if time.monotonic() < self._delay_until:
                    await asyncio.sleep(self._latency)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for side in (writer, peer):
                with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                    side.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST: SO_LINGER on with a zero timeout, then abort the transport."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ProxyGroup:
    """The cluster variant's proxies, one in front of each master, faulted together: the services reach every
    master through its own (the masters announce their proxies' ports), so a reset, a blackhole or a delay hits
    all their connections at once, as :class:`FaultProxy` does for one server."""

    def __init__(self, proxies: list[FaultProxy]) -> None:
        self.proxies = proxies

    @property
    def url(self) -> str:
        """The first master's proxy: a cluster client learns the others from it."""
        return self.proxies[0].url

    @property
    def ports(self) -> list[int]:
        return [proxy.port for proxy in self.proxies]

    @property
    def connections_made(self) -> int:
        return sum(proxy.connections_made for proxy in self.proxies)

    def start(self) -> ProxyGroup:
        for proxy in self.proxies:
            proxy.start()
        return self

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()

    def reset_all(self) -> int:
        return sum(proxy.reset_all() for proxy in self.proxies)

    def blackhole(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.blackhole(seconds)

    def delay(self, latency: float, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.delay(latency, seconds)

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.heal()

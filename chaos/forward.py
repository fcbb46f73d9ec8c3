"""A TCP forwarder from the veth host address to a loopback service, with added latency.

Redis, RabbitMQ and PostgreSQL listen on 127.0.0.1 only, so a process in the chaos network
namespace reaches them through this forwarder, which listens on the host end of the veth pair
(``python -m chaos.forward 10.213.0.1 6379:6379 5432:5432``: listen port, loopback port). It
connects only to 127.0.0.1.

The kernel here has no ``netem``, so the forwarder adds the fixed part of a slow link: a
command on stdin, ``delay MS JITTER``, holds every chunk, both ways, for ``MS ± JITTER``
milliseconds (in order); ``delay 0 0`` heals. It exits when stdin closes, so it dies with the
chaos run even when the run is SIGKILLed.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass

CHUNK = 65536


@dataclass
class Latency:
    """The delay added to every chunk now (seconds)."""

    base: float = 0.0
    jitter: float = 0.0

    def draw(self) -> float:
        if self.base <= 0:
            return 0.0
        return max(0.0, self.base + random.uniform(-self.jitter, self.jitter))


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: Latency
) -> None:
    """Copy one direction; each chunk is due at its arrival plus the delay drawn for it, and
    never before the previous one (a TCP stream keeps its order)."""
    due = 0.0
    try:
        while data := await reader.read(CHUNK):
            due = max(due, time.monotonic() + latency.draw())
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(host: str, listen: int, target: int, latency: Latency) -> asyncio.Server:
    async def connected(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, latency), _pipe(server_r, client_w, latency))

    return await asyncio.start_server(connected, host, listen, reuse_address=True)


async def _control(latency: Latency) -> None:
    """Read ``delay MS JITTER`` lines until stdin closes."""
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        words = line.split()
        if len(words) == 3 and words[0] == "delay":
            latency.base, latency.jitter = float(words[1]) / 1000, float(words[2]) / 1000
            print(f"delay {words[1]} {words[2]}", flush=True)


async def main(host: str, pairs: list[tuple[int, int]]) -> None:
    latency = Latency()
    servers = [await _serve(host, listen, target, latency) for listen, target in pairs]
    print("forwarding", flush=True)
    await _control(latency)
    for server in servers:
        server.close()


if __name__ == "__main__":
    ports = [tuple(int(p) for p in arg.split(":", 1)) for arg in sys.argv[2:]]
    asyncio.run(main(sys.argv[1], [(a, b) for a, b in ports]))

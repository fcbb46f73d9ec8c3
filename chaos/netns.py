"""A network namespace of the chaos run, joined to the host by a veth pair it owns, and the
link faults applied to that pair.

The namespace ``chaos-net-<pid>`` holds one end of a veth pair (``chn<pid>n``) addressed
``10.213.a.b+2/30``; the host end (``chn<pid>h``) is ``10.213.a.b+1/30``. The namespace has no
other route, so a process in it reaches only the host address, where :mod:`chaos.forward`
relays the broker and PostgreSQL ports to 127.0.0.1. Nothing else carries traffic.

Faults, with what this kernel offers (it has no ``netem``; ``htb``, ``tbf`` and the ``u32``
classifier are there): a *cut* of one direction is a ``tbf`` on that end's egress whose bucket
is smaller than any packet, so every packet is dropped silently, as on a dead link (a cut of
some ports only steers them with ``u32`` into such a class of an ``htb``); a *slow* link is a
``tbf`` of low rate on both ends (queueing delay, tail drop), bursts in which both ends drop
everything (loss), and the forwarder's fixed delay. ``heal`` removes them all.

A namespace left by a run that died (its pid is gone) is removed, with its processes, when the
next one starts; this run's own is removed at exit, also on an exception.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PREFIX = "chaos-net-"

#: Directions of a cut: ``out`` drops what the namespace sends, ``in`` what it receives.
DIRECTIONS = ("both", "out", "in")

_LOOPBACK = ("127.0.0.1", "localhost")

#: A token bucket smaller than any packet: everything sent through it is dropped, silently.
_DROP = "tbf rate 8bit burst 1b limit 1b"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _tc(command: str, namespace: str | None = None, check: bool = True) -> str:
    """``tc COMMAND`` (split on blanks), in ``namespace`` when given; its output."""
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    argv = [*prefix, "tc", *command.split()]
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30).stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Delete the namespaces (and kill the processes in them) of chaos runs that died."""
    removed = []
    listed = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+))", listed, flags=re.MULTILINE):
        if _alive(int(name[1])):
            continue
        pids = _ip("netns", "pids", name[0], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "delete", name[0], check=False)
        removed.append(name[0])
    return removed


def probe() -> str | None:
    """``None`` when this machine lets the suite create a namespace, a veth pair and the
    qdiscs of the faults; otherwise why not (the partition faults are then skipped)."""
    name, link = f"chaos-probe-{os.getpid()}", f"chp{os.getpid()}"
    steps = [
        f"ip netns add {name}",
        f"ip link add {link} type veth peer name {link}n",
        f"tc qdisc add dev {link} root handle 1: htb default 2",
        f"tc class add dev {link} parent 1: classid 1:1 htb rate 1gbit",
        f"tc qdisc add dev {link} parent 1:1 {_DROP}",
        f"tc filter add dev {link} parent 1: protocol ip u32 match ip dport 9 0xffff flowid 1:1",
    ]
    try:
        for command in steps:
            argv = command.split()
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                return f"`{command}` failed: {done.stderr.strip() or done.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        _ip("link", "delete", link, check=False)
        _ip("netns", "delete", name, check=False)
    return None


def _subnet(pid: int, taken: str) -> tuple[str, str]:
    """A /30 of 10.213.0.0/16 chosen by pid (and moved on past one already in use)."""
    for step in range(16384):
        index = (pid + step) % 16384
        prefix, low = f"10.213.{index // 64}", (index % 64) * 4
        addresses = f"{prefix}.{low + 1}", f"{prefix}.{low + 2}"
        if f" {addresses[0]}/" not in taken and f" {addresses[1]}/" not in taken:
            return addresses
    raise RuntimeError("no free /30 in 10.213.0.0/16")


@dataclass
class Network:
    """The namespace, its veth pair and the forwarder of one chaos run."""

    ports: list[int]
    folder: Path
    name: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    host_if: str = field(default_factory=lambda: f"chn{os.getpid()}h")
    ns_if: str = field(default_factory=lambda: f"chn{os.getpid()}n")
    host_ip: str = ""
    ns_ip: str = ""
    forwarder: subprocess.Popen[str] | None = None
    state: str = "healed"
    lost: int = 0
    _flapping: threading.Event = field(default_factory=threading.Event)
    _flapper: threading.Thread | None = None

    def start(self) -> None:
        """Create the namespace and the pair, then start the forwarder; undone by
        :meth:`close` (registered with ``atexit`` at once)."""
        remove_leftovers()
        atexit.register(self.close)
        self.host_ip, self.ns_ip = _subnet(os.getpid(), _ip("-o", "-4", "addr").stdout)
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        _ip("-n", self.name, "link", "set", self.ns_if, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        ports = self.ports
        log = open(self.folder / "forwarder.log", "w")  # noqa: SIM115 - the child keeps it
        self.forwarder = subprocess.Popen(
            [sys.executable, "-m", "chaos.forward", self.host_ip, *(f"{p}:{p}" for p in ports)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        log.close()
        self._wait_forwarding()

    def _wait_forwarding(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if "forwarding" in (self.folder / "forwarder.log").read_text():
                return
            if self.forwarder is not None and self.forwarder.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the forwarder did not start: see {self.folder / 'forwarder.log'}")

    def url(self, url: str) -> str:
        """``url`` with its loopback host replaced by the veth host address."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        if host not in _LOOPBACK:
            raise ValueError(f"{url!r}: only loopback services can be reached from the namespace")
        netloc = parts.netloc.rsplit("@", 1)
        tail = netloc[-1].replace(host, self.host_ip, 1)
        return urlunsplit(parts._replace(netloc="@".join([*netloc[:-1], tail])))

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    # -- faults -----------------------------------------------------------------------------
    def _end(self, end: str) -> tuple[str, str | None, str]:
        """(device, namespace, the port field of its egress packets that names the service)."""
        if end == "out":
            return self.ns_if, self.name, "dport"
        return self.host_if, None, "sport"

    def _clear(self, end: str) -> None:
        device, namespace, _ = self._end(end)
        _tc(f"qdisc del dev {device} root", namespace, check=False)

    def cut(self, direction: str, ports: tuple[int, ...] = ()) -> None:
        """Drop every packet going ``direction`` (``both``, ``out`` of or ``in`` to the
        namespace), or only those of ``ports``; replaces whatever fault was there."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r}: one of {DIRECTIONS}")
        self.heal()
        for end in ("out", "in"):
            if direction not in ("both", end):
                continue
            device, namespace, field_name = self._end(end)
            if not ports:
                _tc(f"qdisc add dev {device} root {_DROP}", namespace)
                continue
            _tc(f"qdisc add dev {device} root handle 1: htb default 2", namespace)
            for classid in ("1:1", "1:2"):
                htb_class = f"parent 1: classid {classid} htb rate 10gbit"
                _tc(f"class add dev {device} {htb_class}", namespace)
            _tc(f"qdisc add dev {device} parent 1:1 {_DROP}", namespace)
            for port in ports:
                match = f"u32 match ip {field_name} {port} 0xffff flowid 1:1"
                _tc(f"filter add dev {device} parent 1: protocol ip {match}", namespace)
        self.state = f"cut {direction}" + (f" ports {ports}" if ports else "")

    def slow(self, delay_ms: int, jitter_ms: int, rate: str, loss: tuple[float, float]) -> None:
        """A slow, lossy link: the forwarder holds each chunk ``delay_ms ± jitter_ms`` both
        ways; both ends send at ``rate`` (queueing delay, tail drop past a 20 ms queue); and
        ``loss`` = (mean gap, mean burst) seconds: both ends drop everything for a burst of
        0.5-1.5 x the mean every 0.5-1.5 x the gap (``netem`` is missing; this is bursty loss
        of real packets, which TCP must retransmit)."""
        self.heal()
        shape = f"tbf rate {rate} burst 3000 latency 20ms"
        for end in ("out", "in"):
            device, namespace, _ = self._end(end)
            _tc(f"qdisc add dev {device} root {shape}", namespace)
        self._delay(delay_ms, jitter_ms)
        self._flapping.clear()
        self._flapper = threading.Thread(
            target=self._flap, args=(shape, loss), name="chaos-loss", daemon=True
        )
        self._flapper.start()
        self.state = f"slow {delay_ms}±{jitter_ms} ms, {rate}, loss bursts {loss[1]}s/{loss[0]}s"

    def _flap(self, shape: str, loss: tuple[float, float]) -> None:
        gap, burst = loss
        while not self._flapping.wait(random.uniform(0.5, 1.5) * gap):
            for end in ("out", "in"):
                device, namespace, _ = self._end(end)
                self.lost += self._dropped(end)
                _tc(f"qdisc replace dev {device} root {_DROP}", namespace, check=False)
            time.sleep(random.uniform(0.5, 1.5) * burst)
            for end in ("out", "in"):
                device, namespace, _ = self._end(end)
                self.lost += self._dropped(end)
                _tc(f"qdisc replace dev {device} root {shape}", namespace, check=False)

    def _delay(self, delay_ms: int, jitter_ms: int) -> None:
        if self.forwarder is not None and self.forwarder.stdin is not None:
            self.forwarder.stdin.write(f"delay {delay_ms} {jitter_ms}\n")
            self.forwarder.stdin.flush()

    def _dropped(self, end: str) -> int:
        device, namespace, _ = self._end(end)
        shown = _tc(f"-s qdisc show dev {device}", namespace, check=False)
        return sum(int(n) for n in re.findall(r"dropped (\d+)", shown))

    def dropped(self) -> int:
        """Packets dropped on both ends since the fault was put in place."""
        return self.lost + sum(self._dropped(end) for end in ("out", "in"))

    def heal(self) -> None:
        """Remove every fault: the link carries everything again, without delay."""
        self._flapping.set()
        if self._flapper is not None:
            self._flapper.join(10)
            self._flapper = None
        self.lost = 0
        for end in ("out", "in"):
            self._clear(end)
        self._delay(0, 0)
        self.state = "healed"

    def close(self) -> None:
        """Stop the forwarder, kill what still runs in the namespace, delete it and the pair."""
        if self.forwarder is not None and self.forwarder.poll() is None:
            if self.forwarder.stdin is not None:
                with contextlib.suppress(OSError):
                    self.forwarder.stdin.close()
            try:
                self.forwarder.wait(5)
            except subprocess.TimeoutExpired:
                self.forwarder.kill()
                self.forwarder.wait(5)
        for pid in _ip("netns", "pids", self.name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("link", "delete", self.host_if, check=False)
        _ip("netns", "delete", self.name, check=False)
        atexit.unregister(self.close)


if __name__ == "__main__":
    reason = probe()
    if reason is None:
        print("partition faults: available (network namespaces, veth, htb/tbf/u32)")
    else:
        print(f"partition faults: SKIPPED, this machine does not allow them: {reason}")

"""Where provider calls may go: the ``ORCH_PROVIDER_HOSTS`` allow-list and its two checks.

Workflow files are written by tenants, so every URL they name is hostile until checked. An
entry is ``HOST``, ``HOST:PORT``, an IP address, a ``CIDR``, or, for IPv6 with a port,
``[ADDR]:PORT`` / ``[CIDR]:PORT``; an entry without a port allows every port.

Two checks use the list. At launch, :meth:`AllowList.permits_url` allows a URL whose host is
listed by name, or is an IP literal inside a listed network (a name that is not listed is
looked up, see :mod:`orchestration.limits.host_lookups`); an empty list allows nothing. At
connect time, :meth:`AllowList.refusal` checks each *resolved* address: a host listed by
name may resolve anywhere, a host that is not must resolve only into listed networks. The
caller connects to the address it checked, so a second DNS answer cannot slip in.

Decision on sensitive addresses (the cloud's credentials live there): a metadata address
(:data:`METADATA`) is reachable only through an entry naming exactly that address; a
link-local address (169.254.0.0/16, fe80::/10) or an unspecified one (0.0.0.0, ::) only
through an entry lying wholly inside that range. So ``0.0.0.0/0``, ``::/0`` or a host name
never reach them, and ``169.254.0.0/16`` reaches link-local peers but not 169.254.169.254.
IPv4-mapped (``::ffff:a.b.c.d``) and NAT64 (``64:ff9b::a.b.c.d``) forms are judged as the
IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Maps a host name to the IP addresses (as text) it stands for; injectable for tests.
Resolver = Callable[[str], Sequence[str]]

#: Cloud instance-metadata and platform endpoints (AWS, GCP, Azure, OpenStack: .254; AWS ECS;
#: AWS over IPv6; Alibaba; Azure WireServer; Oracle).
METADATA: frozenset[Address] = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
    )
)
#: Ranges an address in which is reachable only through an entry inside the same range.
_GUARDED: tuple[Network, ...] = tuple(
    ipaddress.ip_network(text) for text in ("169.254.0.0/16", "fe80::/10", "0.0.0.0/32", "::/128")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


@dataclass(frozen=True)
class Entry:
    """One allow-list entry: a host name or a network, and optionally a port."""

    text: str
    name: str | None = None
    network: Network | None = None
    port: int | None = None

    def admits_port(self, port: int) -> bool:
        return self.port is None or self.port == port


def _plain(address: Address) -> Address:
    """The IPv4 address carried by an IPv4-mapped or NAT64 IPv6 address, else ``address``."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def ip_literal(host: str) -> Address | None:
    """``host`` as an IP address, or ``None`` when it is a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _network(text: str, entry: str) -> Network | None:
    """``text`` as a network (an address is a /32 or /128), or ``None`` if it is a name."""
    if "/" not in text and ":" not in text and not re.fullmatch(r"[0-9.]+", text):
        return None
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"entry {entry!r} is not a valid IP address or CIDR ({exc})") from None


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"entry {entry!r}: the port must be a number from 1 to 65535")
    return int(text)


def _name(text: str, entry: str) -> str:
    name = text.lower().removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            f"entry {entry!r} is not a host name, IP address or CIDR (write HOST, HOST:PORT, "
            "ADDRESS, CIDR, [IPV6]:PORT or [IPV6CIDR]:PORT; international names in xn-- form)"
        )
    if labels[-1].isdigit():
        raise ValueError(f"entry {entry!r}: a name cannot end in a number; write an IP address")
    return name


def parse_entry(text: str) -> Entry:
    """One entry; a ``ValueError`` names it and says what is accepted."""
    entry = text.strip()
    if "://" in entry:
        raise ValueError(f"entry {entry!r} looks like a URL; write its HOST or HOST:PORT")
    if entry.startswith("["):
        inside, sep, rest = entry[1:].partition("]")
        network = _network(inside, entry) if sep else None
        if network is None or network.version != 6 or (rest and not rest.startswith(":")):
            raise ValueError(f"entry {entry!r}: brackets hold an IPv6 address or CIDR: [::1]:8080")
        return Entry(entry, network=network, port=_port(rest[1:], entry) if rest else None)
    if entry.count(":") > 1:
        if "/" not in entry and ip_literal(entry) is None:
            raise ValueError(f"entry {entry!r}: write an IPv6 address with a port as [ADDR]:PORT")
        return Entry(entry, network=_network(entry, entry))
    host, sep, port = entry.partition(":")
    number = _port(port, entry) if sep else None
    network = _network(host, entry)
    if network is not None:
        return Entry(entry, network=network, port=number)
    return Entry(entry, name=_name(host, entry), port=number)


@dataclass(frozen=True)
class AllowList:
    """Parsed entries; see the module docstring for what each check allows."""

    entries: tuple[Entry, ...]

    @classmethod
    def parse(cls, text: str) -> AllowList:
        """Comma-separated entries (blank ones ignored); ``ValueError`` on a bad entry."""
        return cls.of(text.split(","))

    @classmethod
    def of(cls, items: Iterable[str]) -> AllowList:
        return cls(tuple(parse_entry(item) for item in items if item.strip()))

    def including(self, entry: str) -> AllowList:
        """This list and one more entry (the operator's own webhook host)."""
        return AllowList((*self.entries, parse_entry(entry)))

    def lists_name(self, host: str, port: int) -> bool:
        name = host.lower().removesuffix(".")
        return any(e.name == name and e.admits_port(port) for e in self.entries)

    def permits_address(self, address: Address, port: int) -> bool:
        """Whether some entry's network holds ``address``, with the sensitive-address rule."""
        plain = _plain(address)
        if plain in METADATA:
            return any(
                e.network is not None
                and e.network.num_addresses == 1
                and _plain(e.network.network_address) == plain
                and e.admits_port(port)
                for e in self.entries
            )
        guard = next((net for net in _GUARDED if plain in net), None)
        for e in self.entries:
            if e.network is None or not e.admits_port(port):
                continue
            if guard is not None and not _inside(e.network, guard):
                continue
            if plain in e.network or address in e.network:
                return True
        return False

    def permits_host(self, host: str, port: int) -> bool:
        """Launch check, without DNS: listed by name, or an IP literal in a listed network."""
        literal = ip_literal(host)
        if literal is not None:
            return self.permits_address(literal, port)
        return self.lists_name(host, port)

    def permits_url(self, url: str) -> bool:
        """Launch check of an absolute URL (see :meth:`permits_host`)."""
        found = host_port(url)
        return found is not None and self.permits_host(*found)

    def refusal(self, host: str, port: int, address: Address) -> str | None:
        """Connect-time check of one resolved address: why it is refused, or ``None``."""
        plain = _plain(address)
        sensitive = plain in METADATA or any(plain in net for net in _GUARDED)
        if self.lists_name(host, port) and not sensitive:
            return None
        if self.permits_address(address, port):
            return None
        if not self.entries:
            return (
                f"{host}:{port} is not reachable: ORCH_PROVIDER_HOSTS is empty, so no provider "
                "URL may be reached; the operator lists the services tenants may use"
            )
        kind = (
            "a metadata"
            if plain in METADATA
            else "a link-local or unspecified"
            if sensitive
            else "an"
        )
        return (
            f"{host}:{port} resolves to {address}, {kind} address outside ORCH_PROVIDER_HOSTS; "
            "add that address (or its network) to ORCH_PROVIDER_HOSTS if it is meant to be reached"
        )


def _inside(network: Network, guard: Network) -> bool:
    if network.version != guard.version:
        return False
    return network.subnet_of(guard)  # type: ignore[arg-type]


def host_port(url: str) -> tuple[str, int] | None:
    """The host and the effective port of an absolute http(s) URL, as httpx will use them."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return None
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.host:
        return None
    return parsed.raw_host.decode("ascii"), parsed.port or _DEFAULT_PORTS[parsed.scheme]


@lru_cache(maxsize=32)
def parse_allow_list(text: str) -> AllowList:
    """:meth:`AllowList.parse`, once per distinct setting."""
    return AllowList.parse(text)


def system_resolver(host: str) -> list[str]:
    """The addresses the operating system gives for ``host`` (TCP), in its order."""
    found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def addresses_of(host: str, resolver: Resolver = system_resolver) -> list[Address]:
    """``host``'s addresses, as long as ``resolver`` takes; ``OSError`` when it does not
    resolve."""
    literal = ip_literal(host)
    if literal is not None:
        return [literal]
    try:
        found = resolver(host)
    except Exception as exc:
        raise OSError(f"cannot resolve {host}: {exc}") from None
    addresses = [ipaddress.ip_address(text.split("%")[0]) for text in found]
    if not addresses:
        raise OSError(f"cannot resolve {host}: no addresses")
    return addresses


def resolve(host: str, timeout: float, resolver: Resolver = system_resolver) -> list[Address]:
    """``host``'s addresses, waited for at most ``timeout`` seconds.

    ``getaddrinfo`` takes no timeout, so it runs in a daemon thread that is abandoned when the
    time is up. Raises ``TimeoutError`` when it is, ``OSError`` when the name does not resolve.
    """
    if ip_literal(host) is not None:
        return addresses_of(host, resolver)
    outcome: list[list[Address] | BaseException] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            outcome.append(addresses_of(host, resolver))
        except BaseException as exc:  # handed to the waiting caller
            outcome.append(exc)
        done.set()

    threading.Thread(target=lookup, name=f"resolve {host}", daemon=True).start()
    if not done.wait(max(timeout, 0.0)):
        raise TimeoutError(f"resolving {host} took longer than {timeout:.1f}s")
    found = outcome[0]
    if isinstance(found, BaseException):
        raise found
    return found


def entry_for(host: str, port: int) -> str:
    """The allow-list entry that names exactly ``host`` and ``port``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

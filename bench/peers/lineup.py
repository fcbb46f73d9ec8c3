"""The peers of item 1 for one bench run: celery-director (:mod:`bench.peer`), DBOS Transact
and Prefect 3 (:mod:`bench.peers.driven`), started together and kept up while item 1's
rounds time them beside the engine's chain and the bare one.

Each peer's processes run at the lowest CPU priority (nice 19) outside its own turns, and at
the normal one in them: a peer's work between its chains (Prefect's API server, DBOS's queue
poller) would otherwise take the same two cores from the engine's chain, the bare one or
another peer while they are timed. Stopping the peers instead (``SIGSTOP``) broke Prefect's
own timers: its chains after the first took six times as long.

The report keeps director's entry under ``peer`` (as before) and the others under
``peers``, one entry per row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import peer, rounds
from bench.peers.driven import DBOSPeer, DrivenPeer, PrefectPeer

#: The peers a bench run can time, in the order they run in a round.
NAMES = ("director", "dbos", "prefect")
PREFECT_DATABASES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Options:
    """Which peers, from which virtualenvs, and Prefect's database."""

    names: tuple[str, ...]
    director_venv: Path
    dbos_venv: Path
    prefect_venv: Path
    prefect_database: str = "sqlite"


@dataclass
class Lineup:
    """The peers that are up, and what they measured."""

    director: peer.Director | None = None
    director_error: str | None = None
    driven: list[DrivenPeer] = field(default_factory=list)

    def contestants(self) -> list[Callable[[], None]]:
        """Each peer row's "time one chain" callable, for item 1's rounds: the peer's
        processes at the normal priority for its chain only."""
        timed = []
        if self.director is not None:
            timed.append(_turn(self.director.groups, self.director.time_chain))
        for one in self.driven:
            timed += [_turn(one.groups, contestant) for contestant in one.contestants()]
        return timed

    def groups(self) -> list[int]:
        """Every peer's process groups."""
        found = self.director.groups() if self.director is not None else []
        return found + [group for one in self.driven for group in one.groups()]

    @contextlib.contextmanager
    def yielding(self) -> Iterator[None]:
        """Every peer at the lowest priority for the ``with`` block, at the normal one after."""
        _prioritise(self.groups(), LOWEST)
        try:
            yield
        finally:
            _prioritise(self.groups(), NORMAL)

    def results(self, interleaved: bool) -> dict[str, Any]:
        """The report's ``peer`` (director) and ``peers`` (the others) entries."""
        out: dict[str, Any] = {}
        if self.director is not None:
            out["peer"] = self.director.result(interleaved=interleaved)
        elif self.director_error is not None:
            out["peer"] = {"skipped": self.director_error}
        rows = [row for one in self.driven for row in one.rows]
        if rows:
            out["peers"] = {row.key: row.result(interleaved) for row in rows}
        return out


@contextlib.contextmanager
def started(
    options: Options, admin_url: str, broker_url: str, folder: Path, links: int
) -> Iterator[Lineup]:
    """The chosen peers, each up (or holding the reason it is not) for the ``with`` block."""
    with contextlib.ExitStack() as stack:
        lineup = Lineup()
        if "director" in options.names:
            director = peer.Director(options.director_venv, admin_url, broker_url, folder, links)
            try:
                lineup.director = stack.enter_context(director)
            except Exception as exc:
                lineup.director_error = f"celery-director did not start: {exc}"
        driven: list[DrivenPeer] = []
        if "dbos" in options.names:
            driven.append(DBOSPeer(options.dbos_venv, folder, links))
        if "prefect" in options.names:
            driven.append(
                PrefectPeer(options.prefect_venv, folder, links, options.prefect_database)
            )
        for one in driven:
            stack.callback(one.close)
            one.start(admin_url)
            lineup.driven.append(one)
        stack.enter_context(lineup.yielding())
        yield lineup


#: The niceness of a peer's processes outside its turns, and in them.
LOWEST, NORMAL = 19, 0


def _prioritise(groups: list[int], nice: int) -> None:
    """Set the niceness of every process of ``groups`` (raising a priority back needs the
    right to, ``CAP_SYS_NICE``: without it the peer stays at the lowest, in its turns too)."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PGRP, group, nice)


def _turn(groups: Callable[[], list[int]], time_one: Callable[[], None]) -> Callable[[], None]:
    """``time_one`` with the peer's process groups at the normal priority, the lowest after."""

    def turn() -> None:
        _prioritise(groups(), NORMAL)
        try:
            time_one()
        finally:
            _prioritise(groups(), LOWEST)

    return turn


def run_alone(
    options: Options, admin_url: str, broker_url: str, folder: Path, links: int, repeats: int
) -> dict[str, Any]:
    """The peers without item 1 (``--only peer``): timed in rounds among themselves."""
    with started(options, admin_url, broker_url, folder, links) as lineup:
        for index in range(repeats):
            for contestant in rounds.order(index, lineup.contestants()):
                contestant()
        return lineup.results(interleaved=False)

"""How big a chaos run is, and the shrunk engine settings it runs under."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.hostile import HostileSizes

#: Engine bounds for chaos: a dead heartbeat is seen in ~8 s, the sweeper passes every second,
#: parks are short, so every fault converges within seconds. The same as the integration tests'
#: ``FAST_SETTINGS``, except the Redis visibility timeout, shrunk to just above the settings'
#: floor (twice the heartbeat timeout) so that the redelivery of a killed worker's messages
#: happens during the run, where the fence must stop it.
CHAOS_SETTINGS: dict[str, str] = {
    "ORCH_HEARTBEAT_TIMEOUT": "8",
    "ORCH_MAX_POLL_INTERVAL_LIMIT": "2",
    "ORCH_PROVIDER_TIMEOUT": "3",
    "ORCH_WEBHOOK_TIMEOUT": "3",
    "ORCH_VISIBILITY_TIMEOUT": "20",
    "ORCH_SWEEP_INTERVAL": "1",
    "ORCH_CANCEL_GRACE": "2",
    "ORCH_MAX_REARMS": "2",
    "ORCH_PARK_BUDGET_HUMAN": "8",
    "ORCH_PARK_BUDGET_ENGINE_LIMIT": "8",
    "ORCH_PARK_BUDGET_PLATFORM_INTERRUPT": "8",
    "ORCH_PARK_BUDGET_DEFAULT": "8",
    "ORCH_EFFECT_ATTEMPTS": "3",
    "ORCH_EFFECT_BACKOFF": "0.2",
    # A hostile agent reports an output just over this; 1 MiB keeps its answers within what
    # the loaded test machine moves in a poll, and far below the 16 MiB any answer may be.
    "ORCH_MAX_OUTPUT_BYTES": "1048576",
    # Loopback is granted explicitly (the default list is empty): providers there are local.
    "ORCH_PROVIDER_HOSTS": "localhost,127.0.0.0/8,::1",
}


#: Small, so the CI profile keeps its time: one run per hostile agent, a short storm, and one
#: fan-out of 12 branches.
CI_HOSTILE = HostileSizes(agent_runs=1, storm_schedules=5, fanouts=1, branches=12, owner_runs=40)
#: Raise these with the per-owner budgets (schedules per owner, live turns) as they land.
#: Once branch runs count toward ``ORCH_MAX_ACTIVE_RUNS_PER_OWNER``, it must hold two of the
#: fan-outs (49 runs each) at once, so that ``ORCH_MAX_BRANCHES`` is the budget they sit at.
FULL_HOSTILE = HostileSizes(
    agent_runs=4, storm_schedules=60, fanouts=3, branches=48, owner_runs=100
)


@dataclass(frozen=True)
class Profile:
    """A population size, the window it is launched over, the faults, and a time limit."""

    name: str
    runs: int
    window: float
    faults: int
    duration_limit: float
    #: The hostile owners beside the plain population, and the per-owner budgets of the run.
    hostile: HostileSizes = CI_HOSTILE
    #: Run the plain population alone first (same seed), to compare its step latency.
    baseline: bool = False

    @property
    def fault_window(self) -> float:
        """Faults go on a little past the last launch: late runs get faults too."""
        return self.window + 20.0


PROFILES = {
    # The CI window is longer than the full profile's rate would make it: the four partition
    # faults take ~80 s between them (a worker or beat started in the namespace, a cut past
    # the heartbeat timeout), on top of one of each other kind.
    "ci": Profile("ci", runs=80, window=130.0, faults=15, duration_limit=300.0),
    "full": Profile(
        "full",
        runs=300,
        window=540.0,
        faults=50,
        duration_limit=870.0,
        hostile=FULL_HOSTILE,
        baseline=True,
    ),
}


def custom(runs: int, duration_limit: float | None) -> Profile:
    """A profile for ``--runs N``: launches at ~0.55 runs/s, a fault every ~11 s."""
    window = max(60.0, runs * 1.8)
    faults = max(10, int(window / 11))
    limit = duration_limit or window + 300.0
    return Profile("custom", runs=runs, window=window, faults=faults, duration_limit=limit)

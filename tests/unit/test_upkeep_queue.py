"""The upkeep queue (chaos finding 12): its setting, beat's routing to it, and which workers
consume it. ``tests/integration/test_upkeep_queue.py`` shows a real worker sweeping behind a
backlog of steps."""

from __future__ import annotations

import pytest
from celery import Celery

from beat_schedule import beat_schedule
from orchestration.core.errors import ConfigurationError
from orchestration.core.settings import Settings, load_settings
from orchestration.runtime.celery_config import configure, consume_upkeep


def test_the_upkeep_queue_is_the_step_queue_and_upkeep_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().upkeep_queue == "orchestration.upkeep"
    monkeypatch.setenv("ORCH_QUEUE", "eu-1:steps")
    assert load_settings().upkeep_queue == "eu-1:steps.upkeep"
    monkeypatch.setenv("ORCH_UPKEEP_QUEUE", "eu-1:sweeps")
    assert load_settings().upkeep_queue == "eu-1:sweeps"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"ORCH_UPKEEP_QUEUE": "two words"}, "ORCH_UPKEEP_QUEUE: must be a queue name"),
        ({"ORCH_UPKEEP_QUEUE": "amq.sweeps"}, "RabbitMQ reserves"),
        ({"ORCH_QUEUE": "q", "ORCH_UPKEEP_QUEUE": "q"}, "ORCH_UPKEEP_QUEUE ('q') must differ"),
        # The derived name would be too long: the operator must name one.
        ({"ORCH_QUEUE": "q" * 195}, "ORCH_UPKEEP_QUEUE: must be a queue name"),
    ],
)
def test_a_bad_upkeep_queue_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_step_queue_is_the_only_one_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_QUEUE", "two words")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "ORCH_QUEUE:" in str(caught.value) and "UPKEEP" not in str(caught.value)


def test_beat_sends_every_pass_to_the_upkeep_queue() -> None:
    settings = Settings(queue="steps", retention_days=30.0)
    schedule = beat_schedule(settings)
    assert set(schedule) == {
        "orchestration-sweep",
        "orchestration-schedules",
        "orchestration-prune",
    }
    for entry in schedule.values():
        assert entry["options"]["queue"] == "steps.upkeep", entry


def _consumed(settings: Settings, selected: list[str]) -> set[str]:
    """The queues a worker of ``settings`` consumes after ``-Q selected`` (none: default)."""
    app = configure(Celery("consumer", set_as_current=False), settings)
    app.amqp.queues.select(selected)
    consume_upkeep(app, settings)
    return set(app.amqp.queues.consume_from)


@pytest.mark.parametrize(
    ("selected", "consumed"),
    [
        ([], {"steps", "steps.upkeep"}),  # `orchestration worker`, `celery -A tasks worker`
        (["steps"], {"steps", "steps.upkeep"}),  # -Q ORCH_QUEUE, as every deployment here
        (["steps.upkeep"], {"steps.upkeep"}),  # a dedicated upkeep worker
        (["other"], {"other"}),  # a worker of another deployment's queue
    ],
)
def test_a_worker_of_the_step_queue_consumes_the_upkeep_queue(
    selected: list[str], consumed: set[str]
) -> None:
    assert _consumed(Settings(queue="steps"), selected) == consumed

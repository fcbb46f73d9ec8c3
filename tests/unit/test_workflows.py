"""Workflow parsing, args, templating and launch: valid input gives a run, anything else an
:class:`OrchestrationError` naming the field, and a refused launch writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from orchestration.core.errors import (
    IdempotencyConflict,
    LimitExceeded,
    OrchestrationError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.core.states import RunStatus, StepStatus
from orchestration.limits import bounds
from orchestration.runs import concurrency, launching
from orchestration.runtime.executor import Executor
from orchestration.surfaces.demo import EXAMPLE_ARGS
from orchestration.workflows import parsing as workflows
from orchestration.workflows import templates
from tests.unit.support import (
    PROPERTY,
    T0,
    RecordingDispatcher,
    counts,
    events_of,
    launch,
    make_settings,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "orchestration" / "examples"


# -- valid workflows -------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_examples_parse(settings: Settings, path: Path) -> None:
    data = workflows.load_file(path)
    spec = workflows.parse(data, settings, args=EXAMPLE_ARGS.get(path.stem, {}))  # the demo's
    assert spec.name == data["name"]
    assert [step.id for step in spec.steps] == [step["id"] for step in data["steps"]]


def test_a_json_workflow_file_parses(tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(workflow(step_spec("a"), step_spec("b"))), encoding="utf-8")
    spec = workflows.parse(workflows.load_file(path), settings)
    assert [step.id for step in spec.steps] == ["a", "b"]


def test_defaults_are_filled_and_with_is_the_options_alias(settings: Settings) -> None:
    spec = workflows.parse(
        {"name": "w", "steps": [{"id": "a", "provider": "scripted", "with": {"output": 1}}]},
        settings.model_copy(update={"max_poll_interval_limit": 10.0}),
    )
    step = spec.steps[0]
    assert (step.task, step.timeout, step.poll_interval, step.max_poll_interval) == (
        "",
        1800.0,
        1.0,
        10.0,
    )
    assert step.options == {"output": 1}
    assert spec.as_dict()["steps"][0]["with"] == {"output": 1}


def test_the_canonical_form_is_a_fixed_point(settings: Settings) -> None:
    data = workflow(step_spec("a", task={"q": "{{ args.x }}"}), step_spec("b", with_={}))
    canonical = workflows.parse(data, settings).as_dict()
    assert workflows.parse(canonical, settings).as_dict() == canonical


def test_the_fingerprint_ignores_key_order_and_sees_every_change() -> None:
    one = workflows.fingerprint({"a": 1, "b": [1, 2]}, {"x": 1, "y": 2})
    assert one == workflows.fingerprint({"b": [1, 2], "a": 1}, {"y": 2, "x": 1})
    assert one != workflows.fingerprint({"a": 1, "b": [2, 1]}, {"x": 1, "y": 2})
    assert one != workflows.fingerprint({"a": 1, "b": [1, 2]}, {"x": 1, "y": 3})


# -- malformed workflows: each names its field ------------------------------------------------

_STEP: dict[str, Any] = step_spec("a")

_MALFORMED: list[tuple[str, Any, str]] = [
    ("not a mapping", ["steps"], "workflow"),
    ("a string", "name: x", "workflow"),
    ("no name", {"steps": [_STEP]}, "name"),
    ("empty name", {"name": "", "steps": [_STEP]}, "name"),
    ("long name", {"name": "n" * 201, "steps": [_STEP]}, "name"),
    ("name not text", {"name": 5, "steps": [_STEP]}, "name"),
    ("no steps", {"name": "w"}, "steps"),
    ("empty steps", {"name": "w", "steps": []}, "steps"),
    ("steps not a list", {"name": "w", "steps": "abc"}, "steps"),
    ("unknown top-level field", {"name": "w", "steps": [_STEP], "retries": 3}, "retries"),
    ("step not a mapping", {"name": "w", "steps": ["a"]}, "steps[0]"),
    ("step without id", {"name": "w", "steps": [{"provider": "scripted"}]}, "steps[0].id"),
    ("path-like id", workflow(step_spec("../etc")), "steps[0].id"),
    ("slash in id", workflow(step_spec("a/b")), "steps[0].id"),
    ("space in id", workflow(step_spec("a b")), "steps[0].id"),
    ("newline after id", workflow(step_spec("a\n")), "steps[0].id"),
    ("long id", workflow(step_spec("i" * 81)), "steps[0].id"),
    ("duplicate ids", workflow(step_spec("a"), step_spec("a")), "steps"),
    ("unknown step field", workflow({**_STEP, "retries": 2}), "steps[0].retries"),
    ("unknown provider", workflow(step_spec(provider="nope")), "steps[0].provider"),
    ("empty provider", workflow(step_spec(provider="")), "steps[0].provider"),
    ("zero timeout", workflow(step_spec(timeout=0)), "steps[0].timeout"),
    ("text timeout", workflow(step_spec(timeout="soon")), "steps[0].timeout"),
    ("nan timeout", workflow(step_spec(timeout=float("nan"))), "steps[0].timeout"),
    ("negative poll", workflow(step_spec(poll_interval=-1)), "steps[0].poll_interval"),
    ("with not a mapping", workflow(step_spec(with_=[1])), "steps[0].with"),
    ("unknown option", workflow(step_spec(with_={"bogus": 1})), "steps[0].with.bogus"),
    (
        "unknown scripted status",
        workflow(step_spec(with_={"states": [["thinking", 1]]})),
        "steps[0].with.states[0]",
    ),
    (
        "only the last state may omit seconds",
        workflow(step_spec(with_={"states": [["running"], ["completed"]]})),
        "steps[0].with.states[0]",
    ),
    ("error not text", workflow(step_spec(with_={"error": 5})), "steps[0].with.error"),
    (
        "later step",
        workflow(step_spec("a", task="{{ steps.b.output }}"), step_spec("b")),
        "steps[0].task",
    ),
    ("unknown step", workflow(step_spec("a", task="{{ steps.zz.output }}")), "steps[0].task"),
    ("itself", workflow(step_spec("a", task="{{ steps.a.output }}")), "steps[0].task"),
    ("code", workflow(step_spec(task="{{ __import__('os') }}")), "steps[0].task"),
    ("not args or steps", workflow(step_spec(task="{{ config.secret }}")), "steps[0].task"),
    ("bare args", workflow(step_spec(task="{{ args }}")), "steps[0].task"),
    (
        "steps without output",
        workflow(step_spec("b"), step_spec("c", task={"q": ["{{ steps.b }}"]})),
        "steps[1].task.q[0]",
    ),
    ("nested braces", workflow(step_spec(task="{{{{x}}}}")), "steps[0].task"),
    ("empty placeholder", workflow(step_spec(task="{{ }}")), "steps[0].task"),
]


@pytest.mark.parametrize(
    ("data", "field"), [(d, f) for _, d, f in _MALFORMED], ids=[n for n, _, _ in _MALFORMED]
)
def test_a_malformed_workflow_names_its_field(settings: Settings, data: Any, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        workflows.parse(data, settings)
    assert caught.value.field == field
    assert caught.value.problem
    assert str(caught.value).startswith(caught.value.field)


def test_max_poll_below_poll_interval_names_both(settings: Settings) -> None:
    with pytest.raises(ValidationError) as caught:
        workflows.parse(workflow(step_spec(poll_interval=1.0, max_poll_interval=0.5)), settings)
    assert caught.value.field.startswith("steps[0]")
    assert "max_poll_interval" in str(caught.value)
    assert "poll_interval" in str(caught.value)


@pytest.mark.parametrize(
    ("data", "field", "variable"),
    [
        (workflow(*(step_spec(f"s{i}") for i in range(4))), "steps", "ORCH_MAX_STEPS"),
        (workflow(step_spec(task="x" * 300)), "steps[0].task", "ORCH_MAX_TASK_BYTES"),
        (workflow(step_spec(timeout=10_000)), "steps[0].timeout", "ORCH_MAX_STEP_TIMEOUT"),
        (
            workflow(step_spec(timeout=float("inf"))),
            "steps[0].timeout",
            "ORCH_MAX_STEP_TIMEOUT",
        ),
        (
            workflow(step_spec(max_poll_interval=5)),
            "steps[0].max_poll_interval",
            "ORCH_MAX_POLL_INTERVAL_LIMIT",
        ),
    ],
)
def test_limits_are_refused_naming_the_setting(
    settings_factory: Callable[..., Settings], data: Any, field: str, variable: str
) -> None:
    small = settings_factory(max_steps=3, max_task_bytes=256, max_step_timeout=3600)
    with pytest.raises(LimitExceeded) as caught:
        workflows.parse(data, small)
    assert caught.value.field == field
    assert variable in str(caught.value)


def test_a_task_nested_too_deep_is_refused(settings: Settings) -> None:
    task: Any = "leaf"
    for _ in range(bounds.MAX_DEPTH + 1):
        task = [task]
    with pytest.raises(ValidationError, match="nested deeper"):
        workflows.parse(workflow(step_spec(task=task)), settings)


def test_unreadable_and_invalid_files_name_the_workflow(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as missing:
        workflows.load_file(tmp_path / "absent.yaml")
    assert missing.value.field == "workflow"
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(ValidationError, match="not valid YAML/JSON"):
        workflows.load_file(broken)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("!!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(ValidationError):
        workflows.load_file(unsafe)


# -- args ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [[1], "x", 3, None, {"n": float("nan")}, {"n": float("inf")}, {"s": {1, 2}}, {"b": b"x"}],
    ids=["list", "str", "int", "none", "nan", "inf", "set", "bytes"],
)
def test_args_must_be_a_plain_json_object(settings: Settings, args: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        workflows.check_args(args, settings)
    assert caught.value.field == "args"


def test_args_over_the_limit_name_the_setting(tmp_path: Path) -> None:
    small = make_settings(tmp_path, max_args_bytes=16)
    with pytest.raises(LimitExceeded, match="ORCH_MAX_ARGS_BYTES"):
        workflows.check_args({"text": "x" * 20}, small)


def test_args_placeholders_are_checked_against_the_args(settings: Settings) -> None:
    data = workflow(step_spec(task="{{ args.user.name }} / {{ args.items.1 }}"))
    workflows.parse(data, settings, args={"user": {"name": "n"}, "items": [0, 1]})
    with pytest.raises(ValidationError, match="'name' is not there"):
        workflows.parse(data, settings, args={"user": {}, "items": [0, 1]})
    with pytest.raises(ValidationError, match="'1' is not there"):
        workflows.parse(data, settings, args={"user": {"name": "n"}, "items": [0]})
    with pytest.raises(ValidationError, match="'__class__' is not there"):
        workflows.parse(workflow(step_spec(task="{{ args.__class__ }}")), settings, args={})


# -- templating ----------------------------------------------------------------------------

_CONTEXT: dict[str, Any] = {
    "args": {"topic": "tides", "n": 3, "tags": ["a", "b"], "deep": {"k": {"v": None}}},
    "steps": {"research": {"output": {"facts": ["f1", "f2"], "count": 2}}},
}


@pytest.mark.parametrize(
    ("task", "rendered"),
    [
        ("About {{ args.topic }}.", "About tides."),
        ("{{args.topic}}", "tides"),
        ("  {{ args.n }}  ", 3),
        ("{{ args.tags }}", ["a", "b"]),
        ("{{ args.deep }}", {"k": {"v": None}}),
        ("{{ args.deep.k.v }}", None),
        ("{{ args.tags.1 }}", "b"),
        ("n={{ args.n }}, tags={{ args.tags }}", 'n=3, tags=["a", "b"]'),
        ("{{ steps.research.output.facts }}", ["f1", "f2"]),
        ("{{ steps.research.output.count }} facts", "2 facts"),
        (
            {"summarize": "{{ steps.research.output.facts }}", "about": ["{{ args.topic }}"]},
            {"summarize": ["f1", "f2"], "about": ["tides"]},
        ),
        (42, 42),
        (None, None),
        ("no placeholders {here}", "no placeholders {here}"),
    ],
)
def test_render_fills_args_and_earlier_outputs(task: Any, rendered: Any) -> None:
    assert templates.render(task, _CONTEXT) == rendered


def test_rendered_values_are_never_rendered_again() -> None:
    context = {"args": {"evil": "{{ args.secret }}", "secret": "s3cret"}, "steps": {}}
    assert templates.render("say {{ args.evil }}", context) == "say {{ args.secret }}"
    assert templates.render("{{ args.evil }}", context) == "{{ args.secret }}"


@pytest.mark.parametrize(
    "task",
    [
        "{{ steps.research.output.missing }}",
        "{{ steps.other.output }}",
        "{{ args.tags.7 }}",
        "{{ args.topic.0 }}",
        "{{ args.__class__ }}",
        "{{ args.topic.__len__ }}",
        "{{ __import__('os').system('true') }}",
    ],
)
def test_render_refuses_paths_that_are_not_there(task: str) -> None:
    with pytest.raises(ValidationError) as caught:
        templates.render({"q": [task]}, _CONTEXT)
    assert caught.value.field == "task.q[0]"


# -- launch --------------------------------------------------------------------------------


def test_launch_writes_the_run_its_steps_and_one_journal_entry(settings: Settings) -> None:
    dispatcher = RecordingDispatcher()
    data = workflow(step_spec("a"), step_spec("b", task="{{ steps.a.output }}"))
    run_id = launch(settings, data, {"x": 1}, dispatcher=dispatcher)
    run = run_row(settings, run_id)
    assert run.status == RunStatus.QUEUED.value
    assert run.workflow == workflows.parse(data, settings).as_dict()
    assert run.args == {"x": 1}
    assert run.deadline_at is not None
    steps = steps_of(settings, run_id)
    assert [(step.step_id, step.status, step.attempt) for step in steps] == [
        ("a", StepStatus.PENDING.value, 1),
        ("b", StepStatus.PENDING.value, 1),
    ]
    assert [step.idempotency_key for step in steps] == [f"{run_id}:a:1", f"{run_id}:b:1"]
    assert [(e.from_status, e.to_status, e.cause) for e in events_of(settings, run_id)] == [
        (None, "queued", "launched")
    ]
    [plan] = dispatcher.chains
    assert plan.task_ids == run.task_ids == [step.celery_task_id for step in steps]
    assert [(link.index, link.tick) for link in plan.links] == [(0, 0), (1, 0)]


@pytest.mark.parametrize(
    "data",
    [
        workflow(step_spec("a", task="{{ steps.b.output }}"), step_spec("b")),
        workflow(step_spec("a"), step_spec("b", task={"x": ["{{ steps.nope.output.y }}"]})),
        workflow(step_spec("a", task="{{ args.missing }}")),
    ],
    ids=["later-step", "unknown-step", "missing-arg"],
)
def test_a_bad_reference_is_refused_at_launch_without_writing(
    settings: Settings, data: dict[str, Any]
) -> None:
    dispatcher = RecordingDispatcher()
    before = counts(settings)
    with pytest.raises(ValidationError) as caught:
        launch(settings, data, {"present": 1}, dispatcher=dispatcher)
    assert ".task" in caught.value.field
    assert counts(settings) == before
    assert dispatcher.chains == []


def test_launch_is_idempotent_per_owner_and_request_id(settings: Settings) -> None:
    first = launch(settings, request_id="req-1", args={"x": 1})
    before = counts(settings)
    assert launch(settings, request_id="req-1", args={"x": 1}) == first
    assert counts(settings) == before
    with pytest.raises(IdempotencyConflict):
        launch(settings, request_id="req-1", args={"x": 2})
    assert counts(settings) == before
    assert launch(settings, request_id="req-1", args={"x": 1}, owner="other") != first


def test_a_held_concurrency_key_rejects_without_writing(settings: Settings) -> None:
    launch(settings, concurrency_key="k")
    before = counts(settings)
    with pytest.raises(OrchestrationError, match="concurrency key 'k' is held"):
        launch(settings, concurrency_key="k")
    assert counts(settings) == before


def test_active_run_limits_refuse_without_writing(settings: Settings) -> None:
    limited = settings.model_copy(update={"max_active_runs_per_owner": 1})
    launch(limited)
    before = counts(limited)
    with pytest.raises(LimitExceeded, match="ORCH_MAX_ACTIVE_RUNS_PER_OWNER"):
        launch(limited)
    assert counts(limited) == before
    launch(limited, owner="someone-else")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("owner", ""),
        ("owner", "has space"),
        ("owner", "é"),
        ("owner", "o" * 201),
        ("request_id", "tab\there"),
        ("concurrency_key", "\x00"),
    ],
)
def test_names_must_be_printable_ascii(settings: Settings, field: str, value: str) -> None:
    before = counts(settings)
    names: dict[str, Any] = {"owner": "o", field: value}
    with pytest.raises(ValidationError) as caught:
        launch(settings, **names)
    assert caught.value.field == field
    assert counts(settings) == before


# -- property tests: hostile input never escapes as another exception, never half-writes -----

_HOSTILE = st.sampled_from(
    [
        "{{ __import__('os') }}",
        "{{ args.__class__ }}",
        "{{ args.__class__.__mro__ }}",
        "{{{{x}}}}",
        "{{ args.x }}",
        "{{ args.x.0 }}",
        "{{ args }}",
        "{{ steps.a.output }}",
        "{{ steps.a.output.k }}",
        "{{ steps.b.output }}",
        "{{ steps..output }}",
        "{% for x in y %}",
        "${HOME}",
        "%(x)s",
        "../etc",
        "a/b",
        "..",
        "",
        " ",
        "\x00",
        "\u202e",
        "e\u0301",
        "\U0001d518\U0001d52b\U0001d526",  # fraktur letters
        "🙂" * 70,
        "x" * 250,
    ]
)
# Text that JSON or YAML can carry, minus lone surrogates (tested on their own below).
_TEXT = _HOSTILE | st.text(st.characters(codec="utf-8"), max_size=24)
_TEMPLATE = st.lists(_HOSTILE | st.text(max_size=4), max_size=4).map("".join)
_NUMBER = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, -1, 1e-300, 1e300, 86_401, True, False])
)
_LEAF = st.none() | st.booleans() | _NUMBER | _TEXT | _TEMPLATE
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_STATUS_WORD = st.sampled_from(["running", "completed", "idle", "rate_limited", "thinking", ""])
# Status entries are hashable here: an unhashable one is a known bug (see test_scripted.py).
_STATE_ITEM = _STATUS_WORD | _NUMBER | st.none() | _TEXT
_STATES = (
    st.lists(
        st.lists(_STATE_ITEM, max_size=3) | st.tuples(_STATUS_WORD, _NUMBER).map(list),
        max_size=3,
    )
    | _LEAF
)
_OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "states": _STATES,
        "resume_states": _STATES,
        "output": _JSON,
        "error": _JSON,
        "prompt": _JSON,
        "poll_delay": _NUMBER | _TEXT,
        "reset_after": _NUMBER,
        "checkpoint_fails": _LEAF,
        "bogus": _JSON,
    },
)
_GOOD_STEP = st.builds(
    lambda step_id, task, options: step_spec(step_id, task=task, with_=options),
    st.sampled_from(["a", "b", "c", "step-1", "Z_9"]),
    _TEMPLATE | _JSON,
    st.just({}) | st.just({"states": [["running", 1], ["completed"]]}),
)
_FIELD = st.sampled_from(
    ["id", "provider", "task", "timeout", "poll_interval", "max_poll_interval", "with", "retries"]
)
_HOSTILE_VALUE = (
    _JSON
    | _TEMPLATE
    | _OPTIONS
    | st.sampled_from(["../etc", "a/b", "scripted", "nope", "a\n", "__import__"])
)
# A valid step with one field replaced by something hostile, or without that field.
_MUTATED_STEP = st.builds(
    lambda base, field, value, drop: (
        {k: v for k, v in base.items() if k != field} if drop else {**base, field: value}
    ),
    _GOOD_STEP,
    _FIELD,
    _HOSTILE_VALUE,
    st.booleans(),
)
_STEPS = st.lists(
    st.one_of(_GOOD_STEP, _GOOD_STEP, _MUTATED_STEP),
    min_size=1,
    max_size=4,
    unique_by=lambda step: str(step.get("id")),
)
_NAME = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40) | _HOSTILE
_LIKELY_VALID = st.fixed_dictionaries({"name": _NAME, "steps": _STEPS})
_WORKFLOW = st.one_of(
    _LIKELY_VALID,
    _LIKELY_VALID,
    _LIKELY_VALID,
    st.fixed_dictionaries(
        {"name": _TEXT | _JSON, "steps": st.lists(_MUTATED_STEP, max_size=3) | _JSON},
        optional={"description": _JSON},
    ),
    _JSON,
)
_OBJECT = st.dictionaries(st.sampled_from(["x", "y", "k"]) | _TEXT, _JSON, max_size=4)
_ARGS = st.one_of(st.none(), _OBJECT, _OBJECT, _OBJECT, _JSON)


@PROPERTY
@given(data=_WORKFLOW, args=_ARGS)
@example(data=workflow(step_spec(task="{{ args.x }}")), args={"x": {"deep": [1]}})
def test_parse_gives_a_spec_or_a_named_error(settings: Settings, data: Any, args: Any) -> None:
    try:
        clean = workflows.check_args({} if args is None else args, settings)
        spec = workflows.parse(data, settings, args=clean)
    except OrchestrationError as exc:
        assert str(exc)
        if isinstance(exc, ValidationError):
            assert isinstance(exc.field, str) and exc.field and exc.problem
        return
    canonical = spec.as_dict()
    json.dumps(canonical, allow_nan=False)  # what is stored is plain JSON
    assert workflows.parse(canonical, settings, args=clean).as_dict() == canonical


@PROPERTY
@given(args=_JSON | st.dictionaries(_TEXT, _JSON))
def test_check_args_gives_plain_json_or_a_named_error(settings: Settings, args: Any) -> None:
    try:
        clean = workflows.check_args(args, settings)
    except ValidationError as exc:
        assert exc.field == "args" and exc.problem
        return
    assert json.loads(json.dumps(clean, allow_nan=False)) == clean == args


_OWNER = st.sampled_from(["owner-1", "owner-2"]) | _TEXT


def _as_decimals(value: Any) -> Any:
    """``value`` with its JSON numbers as decimals: PostgreSQL keeps a JSON number as one
    (``1e300`` comes back as the integer ``10**300``), SQLite as it was written."""
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)


def _launch_or_refuse(settings: Settings, data: Any, args: Any, owner: str) -> None:
    dispatcher = RecordingDispatcher()
    before = counts(settings)
    try:
        run_id = launching.launch(
            Executor(settings, dispatcher),
            settings,
            data,
            args,
            owner=owner,
            request_id=None,
            concurrency_key=None,
            on_conflict=concurrency.OnConflict.REJECT,
            now=T0,
        )
    except OrchestrationError as exc:
        assert str(exc)
        assert counts(settings) == before, "a refused launch wrote rows"
        assert dispatcher.chains == [], "a refused launch sent a chain"
        return
    spec = workflows.parse(data, settings, args=workflows.check_args(args or {}, settings))
    assert counts(settings) == {
        "runs": before["runs"] + 1,
        "steps": before["steps"] + len(spec.steps),
        "run_events": before["run_events"] + 1,
    }
    run = run_row(settings, run_id)
    assert (run.status, run.owner) == (RunStatus.QUEUED.value, owner)
    assert _as_decimals(run.workflow) == _as_decimals(spec.as_dict())
    assert [step.step_id for step in steps_of(settings, run_id)] == [s.id for s in spec.steps]
    assert [plan.run_id for plan in dispatcher.chains] == [run_id]


@PROPERTY
@given(data=_WORKFLOW, args=_ARGS, owner=_OWNER)
def test_launch_gives_a_run_or_an_error_and_never_a_partial_write(
    settings: Settings, data: Any, args: Any, owner: str
) -> None:
    _launch_or_refuse(settings, data, args, owner)


@PROPERTY
@given(data=_LIKELY_VALID, args=st.none() | _OBJECT)
def test_launch_of_nearly_valid_workflows_never_half_writes(
    settings: Settings, data: Any, args: Any
) -> None:
    _launch_or_refuse(settings, data, args, "owner-1")


# -- regressions: inputs that once escaped as raw exceptions -------------------------------

_NOT_JSON: list[Any] = [{1, 2}, b"bytes", {(1, 2): "tuple key"}, object()]


@pytest.mark.parametrize("task", _NOT_JSON, ids=["set", "bytes", "tuple-key", "object"])
def test_a_task_that_is_not_json_is_a_validation_error(settings: Settings, task: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        workflows.parse(workflow(step_spec(task=task)), settings)
    assert caught.value.field == "steps[0].task"


def test_a_yaml_date_in_a_task_is_a_validation_error(tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "dated.yaml"
    path.write_text(
        "name: dated\nsteps:\n  - id: report\n    provider: scripted\n"
        "    task: {summarize: news, since: 2024-01-01}\n",
        encoding="utf-8",
    )
    with pytest.raises(ValidationError):
        workflows.parse(workflows.load_file(path), settings)


def test_a_huge_int_in_a_task_is_a_validation_error(settings: Settings) -> None:
    before = counts(settings)
    with pytest.raises(ValidationError):
        launch(settings, workflow(step_spec(task={"n": 10**5000})))
    assert counts(settings) == before


def test_a_pathologically_deep_task_is_a_validation_error(settings: Settings) -> None:
    task: Any = "leaf"
    for _ in range(5000):
        task = [task]
    with pytest.raises(ValidationError):
        workflows.parse(workflow(step_spec(task=task)), settings)


def test_pathologically_deep_args_are_a_validation_error(settings: Settings) -> None:
    value: Any = 1
    for _ in range(5000):
        value = {"k": value}
    with pytest.raises(ValidationError):
        workflows.check_args({"a": value}, settings)


def test_a_lone_surrogate_in_a_task_is_a_validation_error(settings: Settings) -> None:
    data = json.loads(
        '{"name": "w", "steps": [{"id": "a", "provider": "scripted", "task": "\\ud800"}]}'
    )
    with pytest.raises(ValidationError):
        workflows.parse(data, settings)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_file_with_a_huge_int_is_a_validation_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"big{suffix}"
    path.write_text('{"name": "w", "steps": [], "n": ' + "1" * 5000 + "}", encoding="utf-8")
    with pytest.raises(ValidationError):
        workflows.load_file(path)


def test_a_non_finite_number_in_a_task_is_refused(settings: Settings) -> None:
    with pytest.raises(ValidationError):
        workflows.parse(workflow(step_spec(task={"n": float("nan")})), settings)


@pytest.mark.parametrize(
    ("field", "definition", "args"),
    [
        ("name", workflow(name="a\x00b"), None),
        ("steps[0].task", workflow(step_spec(task={"q": ["\x00"]})), None),
        ("steps[0].with", workflow(step_spec(with_={"output": {"k\x00": 1}})), None),
        ("args", workflow(), {"x": "\\\x00"}),
        ("args_schema", {**workflow(), "args_schema": {"description": "\x00"}}, None),
    ],
    ids=["name", "task", "with-key", "args", "args-schema"],
)
def test_a_nul_character_is_a_validation_error_and_writes_nothing(
    settings: Settings, field: str, definition: dict[str, Any], args: Any
) -> None:
    """Found on PostgreSQL: text and JSON columns refuse NUL, and a launch holding one failed
    with the database's error (SQLite stored it)."""
    before = counts(settings)
    with pytest.raises(ValidationError) as caught:
        launch(settings, definition, args)
    assert (caught.value.field, "NUL" in caught.value.problem) == (field, True)
    assert counts(settings) == before


def test_the_text_backslash_u0000_is_no_nul(settings: Settings) -> None:
    launch(settings, workflow(step_spec(task="\\u0000 is six characters")), {"x": "\\u0000"})


@pytest.mark.parametrize("value", ["acme\n", "r" * 200 + "\n"])
def test_a_trailing_newline_is_not_a_printable_name(value: str) -> None:
    with pytest.raises(ValidationError):
        launching.check_name("owner", value)


# -- default poll intervals follow ORCH_MAX_POLL_INTERVAL_LIMIT (issue 10) ------------------


def _bare_step(**fields: Any) -> dict[str, Any]:
    return {"name": "w", "steps": [{"id": "a", "provider": "scripted", **fields}]}


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(30.0, (1.0, 10.0)), (10.0, (1.0, 10.0)), (5.0, (1.0, 5.0)), (0.5, (0.5, 0.5))],
)
def test_unset_intervals_follow_a_lowered_limit(
    settings: Settings, limit: float, expected: tuple[float, float]
) -> None:
    spec = workflows.parse(
        _bare_step(), settings.model_copy(update={"max_poll_interval_limit": limit})
    )
    step = spec.steps[0]
    assert (step.poll_interval, step.max_poll_interval) == expected
    stored = spec.as_dict()["steps"][0]
    assert (stored["poll_interval"], stored["max_poll_interval"]) == expected


def test_an_unset_ceiling_is_at_least_the_poll_interval_set(settings: Settings) -> None:
    spec = workflows.parse(
        _bare_step(poll_interval=12), settings.model_copy(update={"max_poll_interval_limit": 30.0})
    )
    assert spec.steps[0].max_poll_interval == 12.0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_poll_interval": 6}, "steps[0].max_poll_interval"),
        ({"poll_interval": 6}, "steps[0].poll_interval"),
    ],
)
def test_an_interval_set_over_the_limit_is_still_refused(
    settings: Settings, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(LimitExceeded) as caught:
        workflows.parse(
            _bare_step(**fields), settings.model_copy(update={"max_poll_interval_limit": 5.0})
        )
    assert caught.value.field == field
    assert "ORCH_MAX_POLL_INTERVAL_LIMIT" in str(caught.value)


def test_the_launch_record_is_the_row_as_committed(settings: Settings) -> None:
    """``Orchestrator.launch`` reads its record in the launch's own transaction: it must show
    what that transaction wrote through SQL (the claim, the chain's task ids), as a later
    ``get`` does."""
    from orchestration.service import Orchestrator

    queue = RecordingDispatcher()
    orch = Orchestrator(settings, queue)
    holder = orch.launch(workflow(), owner="o", concurrency_key="k", on_conflict="enqueue")
    queued = orch.launch(workflow(), owner="o", concurrency_key="k", on_conflict="enqueue")
    assert (holder.concurrency, queued.concurrency) == ("holding", "queued")
    assert holder.task_ids == queue.chains[0].task_ids
    assert holder.steps[0].celery_task_id == queue.chains[0].task_ids[0]
    for record in (holder, queued):
        again = orch.get(record.id, owner="o")
        assert record.model_dump(exclude={"health"}) == again.model_dump(exclude={"health"})

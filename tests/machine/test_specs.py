"""The specs are valid, and validation names what is wrong in an invalid one: field rules on the
field, rules across steps on the spec, every problem at once."""

from __future__ import annotations

import pytest
from attrs import evolve

from coldsnap.drivers import n580, n610
from coldsnap.machine import (
    CHECKPOINT,
    CUDA,
    PAYLOAD,
    RETIRE,
    Graph,
    Guard,
    Spec,
    SpecError,
    Step,
    Transition,
    fact,
    validate_graph,
)
from coldsnap.machine import steps as s

SPECS = {spec.name: spec for spec in (n610.CAPTURE, n610.RESTORE, n580.CAPTURE, n580.RESTORE)}

CONTRACT = {
    "capture-n610": [
        "choose_weights", "launch_engine", "wait_healthy", "acceptance_record", "quiesce",
        "release_memory",
        "destroy_graphs", "export_payload", "rehearse_refill", "cuda_lock", "cuda_checkpoint",
        "process_dump",
        "seal_artifact", "retire_source",
    ],
    "restore-n610": [
        "admit", "stage_payload", "verify_checkpoint", "process_restore",
        "ranks_present", "cuda_restore", "cuda_unlock", "continue_process", "resume_weights",
        "resume_rest", "tp_barrier", "wait_healthy", "acceptance",
    ],
    "capture-n580": [
        "choose_weights", "launch_template", "check_context_free", "dump_template",
        "release_template",
        "wait_healthy", "acceptance_record", "release_memory", "export_payload",
        "seal_artifact", "retire_source",
    ],
    "restore-n580": [
        "admit", "stage_payload", "verify_checkpoint", "restore_template", "release_template",
        "wait_healthy", "tp_barrier", "acceptance",
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_step_sequences_are_the_contract(name: str) -> None:
    assert [step.name for step in SPECS[name].steps] == CONTRACT[name]


def _guarded(guard: Guard) -> set[str]:
    return {step.name for spec in SPECS.values() for step in spec.steps if step.when is guard}


def test_variants_are_guards_on_capabilities() -> None:
    assert _guarded(PAYLOAD) == {"export_payload", "stage_payload"}
    assert _guarded(CHECKPOINT) == {"verify_checkpoint"}
    assert _guarded(CUDA) == {"cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock"}
    assert _guarded(RETIRE) == {"retire_source"}
    assert PAYLOAD.group == CHECKPOINT.group == "weights"


# -- field rules: attrs validators that raise SpecError naming the field -----------------------


def _step(name: str, **kw: object) -> Step:
    return Step(name, f"driver.{name}", "doc", **{"compensation": "driver.undo", **kw})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _step("Bad"), "Step field 'name': a lower_snake_case name, got 'Bad'"),
        (lambda: Step("a", "nowhere.x", "doc", side_effect=False),
         "Step field 'action': 'role.method' with role one of"),
        (lambda: _step("a", compensation="undo"), "Step field 'compensation'"),
        (lambda: _step("a", when="gpu"), "Step field 'when': a Guard, got 'gpu'"),
        (lambda: _step("a", timeout_s=0), "Step field 'timeout_s': positive, got 0"),
        (lambda: _step("a", on_interrupt="retyr"),
         "Step field 'on_interrupt': 'retry' or 'compensate', got 'retyr'"),
        (lambda: Spec("x", "captur", "n610", [_step("a")]),
         "Spec field 'operation': one of capture, restore, stop, sleep, wake, got 'captur'"),
        (lambda: Spec("x", "capture", "N-610", [_step("a")]), "Spec field 'owner'"),
    ],
)
def test_field_rules_name_the_field_and_the_value(build, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        build()


# -- rules across steps: checked when the spec is defined --------------------------------------


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([_step("a"), _step("a")], "step 'a': the name is used twice"),
        ([_step("done")], "step 'done': the name is reserved"),
        ([_step("a", compensation=None)], "step 'a': has a side effect but neither"),
        ([_step("a", no_compensation="why")], "step 'a': has both a compensation"),
        ([_step("a", side_effect=False)], "step 'a': has no side effect, so it cannot"),
    ],
)
def test_invalid_steps_are_named(steps: list[Step], message: str) -> None:
    with pytest.raises(SpecError, match=f"spec 'bad': {message}"):
        Spec("bad", "capture", "n610", steps)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        Spec("bad", "capture", "n610", [_step("a", compensation=None), _step("a")])
    assert "has a side effect but neither" in str(info.value)
    assert "the name is used twice" in str(info.value)


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_stripping_any_compensation_is_refused(spec: Spec) -> None:
    """The rule holds for the real specs: take any side effect's undo away and the spec is
    refused, naming the step."""
    side_effects = [step for step in spec.steps if step.side_effect]
    assert side_effects
    for index, step in enumerate(spec.steps):
        if not step.side_effect:
            continue
        bare = evolve(step, compensation=None, no_compensation=None)
        steps = [*spec.steps[:index], bare, *spec.steps[index + 1 :]]
        with pytest.raises(SpecError, match=f"step '{step.name}': has a side effect but neither"):
            Spec(spec.name, spec.operation, spec.owner, steps)


# -- facts: every need made by an earlier step on every guard path ------------------------------

X = fact("test_x", "a fact of the spec tests")
Y = fact("test_y", "another fact of the spec tests")


def _read(name: str, *needs, when: Guard | None = None, makes=()) -> Step:
    return Step(name, f"driver.{name}", "doc", side_effect=False, when=when,
                needs=needs, makes=makes)  # fmt: skip


def test_a_step_needing_an_unmade_fact_is_refused_naming_step_and_fact() -> None:
    with pytest.raises(SpecError) as info:
        Spec("bad", "capture", "n610", [_read("a", makes=(Y,)), _read("b", X)])
    assert "spec 'bad': step 'b' needs fact 'test_x', which no earlier step makes" in str(
        info.value
    )
    assert "(when always)" in str(info.value)


def test_a_fact_made_later_does_not_count() -> None:
    with pytest.raises(SpecError, match="step 'a' needs fact 'test_x'"):
        Spec("bad", "capture", "n610", [_read("a", X), _read("b", makes=(X,))])


def test_a_fact_made_only_under_a_guard_is_refused_on_the_path_without_it() -> None:
    with pytest.raises(SpecError) as info:
        Spec("bad", "capture", "n610", [_read("a", when=CUDA, makes=(X,)), _read("b", X)])
    assert "step 'b' needs fact 'test_x'" in str(info.value)
    assert "(when cuda=no)" in str(info.value)


def test_a_guarded_step_may_need_what_a_step_under_the_same_guard_makes() -> None:
    Spec("ok", "capture", "n610", [_read("a", when=CUDA, makes=(X,)), _read("b", X, when=CUDA)])


def test_a_guard_group_is_one_choice_of_alternatives() -> None:
    """Made by every member of the `weights` group: fine, exactly one of them holds."""
    Spec("ok", "restore", "n610", [
        _read("p", when=PAYLOAD, makes=(X,)),
        _read("c", when=CHECKPOINT, makes=(X,)),
        _read("use", X),
    ])  # fmt: skip
    with pytest.raises(SpecError, match="step 'use' needs fact 'test_x'"):
        Spec("bad", "restore", "n610", [
            _read("p", when=PAYLOAD, makes=(X,)),
            _read("c", when=CHECKPOINT, makes=(Y,)),
            _read("use", X),
        ])  # fmt: skip


def test_a_fact_made_by_one_member_of_a_group_is_refused_on_the_others_path() -> None:
    with pytest.raises(SpecError) as info:
        Spec("bad", "restore", "n610", [_read("p", when=PAYLOAD, makes=(X,)), _read("use", X)])
    message = str(info.value)
    assert "step 'use' needs fact 'test_x'" in message
    assert "checkpoint=yes" in message and "payload=no" in message


def test_two_different_guards_may_not_share_a_name() -> None:
    twin = Guard("cuda", "an impostor", lambda request, components: True)
    with pytest.raises(SpecError, match="two different guards are named 'cuda'"):
        Spec("bad", "capture", "n610", [_read("a", when=CUDA), _read("b", when=twin)])


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_dropping_what_a_real_step_makes_is_refused(spec: Spec) -> None:
    """The real specs hand facts along: drop a fact someone later needs and the spec says who."""
    for index, step in enumerate(spec.steps):
        for made in step.makes:
            later = [t for t in spec.steps[index + 1 :] if made in t.needs]
            others = [t for t in spec.steps if t is not step and made in t.makes]
            if not later or others:
                continue
            thin = evolve(step, makes=tuple(f for f in step.makes if f != made))
            steps = [*spec.steps[:index], thin, *spec.steps[index + 1 :]]
            with pytest.raises(SpecError, match=f"needs fact '{made.name}'"):
                Spec(spec.name, spec.operation, spec.owner, steps)


def test_the_shared_steps_hand_the_engine_what_it_needs() -> None:
    assert s.ENGINE_URL in s.WAIT_HEALTHY.needs
    assert s.WEIGHT_SOURCE in s.STAGE_PAYLOAD.makes and s.WEIGHT_SOURCE in s.VERIFY_CHECKPOINT.makes
    assert s.WEIGHT_SOURCE in s.RESUME_WEIGHTS.needs


# -- graphs -------------------------------------------------------------------------------------

GOOD = Graph("g", ("s", "a", "end"), "s", frozenset({"end"}),
             (Transition("go", "s", "a"), Transition("go", "a", "end")))  # fmt: skip


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        (evolve(GOOD, states=("s", "a", "end", "orphan")), "state 'orphan' is unreachable"),
        (evolve(GOOD, transitions=(*GOOD.transitions, Transition("back", "end", "s"))),
         "terminal state 'end' has a transition out"),
        (evolve(GOOD, states=("s", "a", "end", "trap"),
                transitions=(*GOOD.transitions, Transition("t", "a", "trap"))),
         "state 'trap' cannot reach a terminal state"),
        (evolve(GOOD, initial="nowhere"), "initial state 'nowhere' is not declared"),
        (evolve(GOOD, states=("s", "a", "end", "a")), "a state is declared twice"),
        (evolve(GOOD, transitions=(Transition("go", "s", "ghost"),)), "unknown state 'ghost'"),
        (evolve(GOOD, initial="end"), "initial state 'end' is terminal"),
    ],
)  # fmt: skip
def test_invalid_graphs_are_named(graph: Graph, message: str) -> None:
    validate_graph(GOOD)
    with pytest.raises(SpecError, match=message):
        validate_graph(graph)

"""The specs are valid, and validation names what is wrong in an invalid one."""

from __future__ import annotations

import pytest
from attrs import evolve

from coldsnap.machine import (
    SPECS,
    Graph,
    Spec,
    SpecError,
    Step,
    Transition,
    validate_graph,
)

CONTRACT = {
    "capture-n610": [
        "launch_engine", "wait_healthy", "acceptance_record", "quiesce", "release_memory",
        "destroy_graphs", "prepare_nccl", "tp_barrier", "export_payload", "cuda_lock",
        "cuda_checkpoint", "process_dump", "seal_artifact", "retire_source",
    ],
    "restore-n610": [
        "admit", "stage_payload", "process_restore", "cuda_restore", "cuda_unlock",
        "continue_process", "restore_nccl", "resume_weights", "hydrate", "load_checkpoint",
        "resume_rest", "open_health_gate", "acceptance",
    ],
    "capture-n580": [
        "launch_template", "check_context_free", "dump_template", "release_template",
        "wait_healthy", "acceptance_record", "release_memory", "export_payload",
        "seal_artifact", "retire_source",
    ],
    "restore-n580": [
        "admit", "stage_payload", "restore_template", "release_template", "construct_engine",
        "wait_healthy", "acceptance",
    ],
}


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_step_sequences_are_the_contract(name: str) -> None:
    assert [s.name for s in SPECS[name].steps] == CONTRACT[name]


def test_provider_variants_are_guards() -> None:
    native_only = {s.name for spec in SPECS.values() for s in spec.steps if s.when == "native"}
    recovery_only = {s.name for spec in SPECS.values() for s in spec.steps if s.when == "recovery"}
    assert native_only == {"export_payload", "hydrate"}
    assert recovery_only == {"load_checkpoint"}


def _step(name: str, **kw: object) -> Step:
    return Step(name, f"driver.{name}", "doc", **{"compensation": "driver.undo", **kw})


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([_step("a"), _step("a")], "step 'a': the name is used twice"),
        ([_step("Bad")], "step 'Bad': a step name is lower_snake_case"),
        ([_step("done")], "step 'done': the name is reserved"),
        ([_step("a", compensation=None)], "step 'a': has a side effect but neither"),
        ([_step("a", no_compensation="why")], "step 'a': has both a compensation"),
        ([_step("a", side_effect=False)], "step 'a': has no side effect, so it cannot"),
        ([Step("a", "nowhere.x", "doc", side_effect=False)], "step 'a': action 'nowhere.x'"),
        ([_step("a", when="gpu")], "step 'a': unknown guard 'gpu'"),
        ([_step("a", timeout_s=0)], "step 'a': timeout_s must be positive"),
    ],
)
def test_invalid_steps_are_named(steps: list[Step], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        Spec("bad", "capture", "n610", steps)


GOOD = Graph("g", ("s", "a", "end"), "s", frozenset({"end"}),
             (Transition("go", "s", "a"), Transition("go", "a", "end")))


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
)
def test_invalid_graphs_are_named(graph: Graph, message: str) -> None:
    validate_graph(GOOD)
    with pytest.raises(SpecError, match=message):
        validate_graph(graph)


def test_every_side_effect_is_compensated_or_explained() -> None:
    for spec in SPECS.values():
        for step in spec.steps:
            if step.side_effect:
                assert step.compensation or step.no_compensation, (spec.name, step.name)

"""Random walks over the legal transition graph, for every registered spec and every combination
of the capabilities guards read; illegal triggers are refused in every state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldsnap.machine import (
    REGISTRY,
    TERMINAL_STATES,
    TRIGGERS,
    IllegalTransition,
    Spec,
    SpecMachine,
)
from coldsnap.testing import MemoryWorld, memory_components, strategies

from ._support import capture_request, restore_request

EXAMPLES = settings(max_examples=200, deadline=None)


def _request(tmp: Path, operation: str, driver: str, provider: str, keep_source: bool = False):
    if operation == "capture":
        return capture_request(tmp, driver, provider, keep_source=keep_source)
    return restore_request(tmp, driver, provider)


def _legal(spec: Spec, request: Any, components: dict[str, Any], state: str) -> dict[str, str]:
    """The model: trigger -> destination, evaluating guards the way the spec declares them."""
    guards = {f"guard_{g.name}": g for g in spec.guards()}
    moves: dict[str, str] = {}
    for t in spec.graph().transitions:
        if t.source != state or t.trigger in moves:
            continue
        holds = all(guards[c].holds(request, components) for c in t.conditions)
        blocked = any(guards[c].holds(request, components) for c in t.unless)
        if holds and not blocked:
            moves[t.trigger] = t.dest
    return moves


@EXAMPLES
@given(
    variant=strategies.variants(),
    components=strategies.stand_ins(),
    keep_source=st.booleans(),
    choices=st.lists(st.integers(0, 10**6), max_size=40),
)
def test_random_walks_take_only_legal_transitions(
    tmp_path_factory, variant, components, keep_source, choices
) -> None:
    operation, driver, provider = variant
    request = _request(tmp_path_factory.mktemp("w"), operation, driver, provider, keep_source)
    spec = REGISTRY.spec(operation, driver)
    machine = SpecMachine(spec, request, components)
    visited = [machine.state]
    for choice in choices:
        moves = _legal(spec, request, components, machine.state)
        if not moves:
            assert machine.state in TERMINAL_STATES
            break
        trigger = sorted(moves)[choice % len(moves)]
        assert machine.fire(trigger) == moves[trigger]
        visited.append(machine.state)
    selected = {step.name for step in spec.selected(request, components)}
    guarded_out = {step.name for step in spec.steps} - selected
    assert not guarded_out & set(visited), "a guarded-out step was entered"


@EXAMPLES
@given(variant=strategies.variants(), components=strategies.stand_ins(), data=st.data())
def test_illegal_triggers_are_rejected_without_a_state_change(
    tmp_path_factory, variant, components, data
) -> None:
    operation, driver, provider = variant
    request = _request(tmp_path_factory.mktemp("i"), operation, driver, provider)
    spec = REGISTRY.spec(operation, driver)
    state = data.draw(st.sampled_from(spec.graph().states), label="state")
    machine = SpecMachine(spec, request, components, state)
    legal = _legal(spec, request, components, state)
    junk = data.draw(st.text(alphabet="abcdefghij_", min_size=1, max_size=12), label="junk")
    for trigger in [*TRIGGERS, junk]:
        if trigger in legal:
            continue
        with pytest.raises(IllegalTransition, match=f"'{trigger}' is not allowed in state"):
            machine.fire(trigger)
        assert machine.state == state


@pytest.mark.parametrize("operation", ["capture", "restore"])
@pytest.mark.parametrize("driver", ["n580", "n610"])
@pytest.mark.parametrize("provider", ["native", "recovery"])
@pytest.mark.parametrize("cuda", [True, False])
def test_advance_follows_the_selected_steps(tmp_path, operation, driver, provider, cuda) -> None:
    request = _request(tmp_path, operation, driver, provider)
    components = memory_components(MemoryWorld(cuda=cuda), request)
    spec = REGISTRY.spec(operation, driver)
    machine = SpecMachine(spec, request, components)
    path = []
    while machine.state != "done":
        path.append(machine.fire("advance"))
    selected = [step.name for step in spec.selected(request, components)]
    assert path[:-1] == selected
    cuda_steps = {"cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock"}
    assert bool(cuda_steps & set(selected)) == (cuda and driver == "n610")
    assert ("export_payload" in selected or "stage_payload" in selected) == (provider == "native")
    assert ("verify_checkpoint" in selected) == (operation == "restore" and provider == "recovery")

"""Random walks over the legal transition graph; illegal triggers are refused in every state."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldsnap.machine import (
    GUARDS,
    TERMINAL_STATES,
    TRIGGERS,
    IllegalTransition,
    SpecMachine,
    spec_for,
)
from coldsnap.testing import strategies

from ._support import capture_request, restore_request

EXAMPLES = settings(max_examples=200, deadline=None)


def _request(tmp: Path, operation: str, driver: str, provider: str):
    make = capture_request if operation == "capture" else restore_request
    return make(tmp, driver, provider)


def _legal(spec, request, state: str) -> dict[str, str]:
    """The model: trigger -> destination, evaluating guards the way the spec declares them."""
    moves: dict[str, str] = {}
    for t in spec.graph().transitions:
        if t.source != state or t.trigger in moves:
            continue
        holds = all(GUARDS[c.removeprefix("guard_")](request) for c in t.conditions)
        blocked = any(GUARDS[c.removeprefix("guard_")](request) for c in t.unless)
        if holds and not blocked:
            moves[t.trigger] = t.dest
    return moves


@EXAMPLES
@given(variant=strategies.variants(), choices=st.lists(st.integers(0, 10**6), max_size=40))
def test_random_walks_take_only_legal_transitions(tmp_path_factory, variant, choices) -> None:
    operation, driver, provider = variant
    request = _request(tmp_path_factory.mktemp("w"), operation, driver, provider)
    spec = spec_for(operation, driver)
    machine = SpecMachine(spec, request)
    visited = [machine.state]
    for choice in choices:
        moves = _legal(spec, request, machine.state)
        if not moves:
            assert machine.state in TERMINAL_STATES
            break
        trigger = sorted(moves)[choice % len(moves)]
        assert machine.fire(trigger) == moves[trigger]
        visited.append(machine.state)
    selected = {s.name for s in spec.selected(request)}
    skipped = {s.name for s in spec.steps} - selected
    assert not skipped & set(visited), "a guarded-out step was entered"


@EXAMPLES
@given(variant=strategies.variants(), data=st.data())
def test_illegal_triggers_are_rejected_without_a_state_change(tmp_path_factory, variant, data):
    operation, driver, provider = variant
    request = _request(tmp_path_factory.mktemp("i"), operation, driver, provider)
    spec = spec_for(operation, driver)
    state = data.draw(st.sampled_from(spec.graph().states), label="state")
    machine = SpecMachine(spec, request, state)
    legal = _legal(spec, request, state)
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
def test_advance_follows_the_selected_steps(tmp_path, operation, driver, provider) -> None:
    request = _request(tmp_path, operation, driver, provider)
    spec = spec_for(operation, driver)
    machine = SpecMachine(spec, request)
    path = []
    while machine.state != "done":
        path.append(machine.fire("advance"))
    assert path[:-1] == [s.name for s in spec.selected(request)]

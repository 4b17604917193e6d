"""Specs as data: steps, the transition graph derived from them, and validation at definition.

A spec is a linear list of steps, some guarded by the request (provider variants). The graph the
runner drives on `transitions` is derived from the steps, so there is one source of truth for the
runner, the validation and the diagrams.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from attrs import field, frozen

from ._errors import SpecError

COMPONENTS = ("driver", "engine", "provider", "artifacts")
"""The objects a step may call: the snapshot driver, the engine adapter, the weight provider, the
artifact store. Each is supplied by the embedder (or by coldsnap's defaults)."""

PENDING = "pending"
DONE = "done"
COMPENSATING = "compensating"
ROLLED_BACK = "rolled_back"
FAILED = "failed"
RESERVED_STATES = (PENDING, DONE, COMPENSATING, ROLLED_BACK, FAILED)
TERMINAL_STATES = frozenset({DONE, ROLLED_BACK, FAILED})

ADVANCE = "advance"
FAIL = "fail"
COMPENSATED = "compensated"
COMPENSATION_FAILED = "compensation_failed"
TRIGGERS = (ADVANCE, FAIL, COMPENSATED, COMPENSATION_FAILED)

GUARDS: Mapping[str, Callable[[Any], bool]] = {
    "native": lambda request: request.provider == "native",
    "recovery": lambda request: request.provider == "recovery",
}
"""Guards select provider variants; each is a predicate over the request."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ACTION = re.compile(r"^(?P<component>[a-z]+)\.(?P<method>[a-z][a-z0-9_]*)$")


@frozen
class Step:
    """One step: the action it calls, how it is undone, and what to do if interrupted.

    `on_interrupt` says what a resumed machine does when the journal shows this step started but
    never ended: `retry` re-runs it (the action is idempotent), `compensate` rolls the whole
    operation back (its own compensation included, since it may have half happened).
    """

    name: str
    action: str
    doc: str
    compensation: str | None = None
    no_compensation: str | None = None
    side_effect: bool = True
    when: str | None = None
    on_interrupt: Literal["retry", "compensate"] = "compensate"
    timeout_s: float = 60.0

    @property
    def component(self) -> str:
        return self.action.split(".", 1)[0]

    @property
    def method(self) -> str:
        return self.action.split(".", 1)[1]


@frozen
class Transition:
    trigger: str
    source: str
    dest: str
    conditions: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()


@frozen
class Graph:
    """States and transitions in the shape `transitions.Machine` takes."""

    name: str
    states: tuple[str, ...]
    initial: str
    terminal: frozenset[str]
    transitions: tuple[Transition, ...]


def guard_condition(guard: str) -> str:
    """The model method name under which a guard is offered to `transitions`."""
    return f"guard_{guard}"


@frozen
class Spec:
    """A capture or restore operation for one driver, validated when it is built."""

    name: str
    operation: Literal["capture", "restore"]
    driver: str
    steps: tuple[Step, ...] = field(converter=tuple)
    doc: str = ""

    def __attrs_post_init__(self) -> None:
        validate_steps(self.name, self.steps)
        validate_graph(self.graph())

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"spec '{self.name}' has no step '{name}'")

    def selected(self, request: Any) -> tuple[Step, ...]:
        """The steps a request runs: those whose guard holds (or that have none)."""
        return tuple(s for s in self.steps if s.when is None or GUARDS[s.when](request))

    def graph(self) -> Graph:
        return _derive_graph(self.name, self.steps)


def _derive_graph(name: str, steps: tuple[Step, ...]) -> Graph:
    states = (PENDING, *(s.name for s in steps), DONE, COMPENSATING, ROLLED_BACK, FAILED)
    transitions: list[Transition] = []
    sources = (PENDING, *(s.name for s in steps))
    for index, source in enumerate(sources):
        # Candidates in order: each guarded step is taken if its guard holds and no earlier
        # candidate's did; the first unguarded step (or `done`) closes the list.
        skipped: list[str] = []
        for nxt in steps[index:]:
            if nxt.when is None:
                transitions.append(Transition(ADVANCE, source, nxt.name, (), tuple(skipped)))
                break
            cond = guard_condition(nxt.when)
            transitions.append(Transition(ADVANCE, source, nxt.name, (cond,), tuple(skipped)))
            skipped.append(cond)
        else:
            transitions.append(Transition(ADVANCE, source, DONE, (), tuple(skipped)))
    for step in steps:
        transitions.append(Transition(FAIL, step.name, COMPENSATING))
    transitions.append(Transition(COMPENSATED, COMPENSATING, ROLLED_BACK))
    transitions.append(Transition(COMPENSATION_FAILED, COMPENSATING, FAILED))
    return Graph(name, states, PENDING, TERMINAL_STATES, tuple(transitions))


def validate_steps(spec: str, steps: Iterable[Step]) -> None:
    """Checks each step on its own: names, actions, guards and the compensation rule."""
    seen: set[str] = set()
    for step in steps:
        where = f"spec '{spec}', step '{step.name}'"
        if not _NAME.match(step.name):
            raise SpecError(f"{where}: a step name is lower_snake_case")
        if step.name in RESERVED_STATES:
            raise SpecError(f"{where}: the name is reserved for the machine's own states")
        if step.name in seen:
            raise SpecError(f"{where}: the name is used twice")
        seen.add(step.name)
        for label, action in (("action", step.action), ("compensation", step.compensation)):
            if action is None:
                continue
            match = _ACTION.match(action)
            if not match or match["component"] not in COMPONENTS:
                raise SpecError(
                    f"{where}: {label} '{action}' is not 'component.method' with component "
                    f"one of {', '.join(COMPONENTS)}"
                )
        if step.when is not None and step.when not in GUARDS:
            raise SpecError(f"{where}: unknown guard '{step.when}' (known: {', '.join(GUARDS)})")
        if step.side_effect and not (step.compensation or step.no_compensation):
            raise SpecError(
                f"{where}: has a side effect but neither a compensation nor a reason for none"
            )
        if step.compensation and step.no_compensation:
            raise SpecError(f"{where}: has both a compensation and a reason for none")
        if not step.side_effect and step.compensation:
            raise SpecError(f"{where}: has no side effect, so it cannot have a compensation")
        if step.timeout_s <= 0:
            raise SpecError(f"{where}: timeout_s must be positive")


def validate_graph(graph: Graph) -> None:
    """Checks the shape of a graph: one initial state, all reachable, all can end, ends are ends."""
    where = f"spec '{graph.name}'"
    if len(set(graph.states)) != len(graph.states):
        raise SpecError(f"{where}: a state is declared twice")
    states = set(graph.states)
    if graph.initial not in states:
        raise SpecError(f"{where}: initial state '{graph.initial}' is not declared")
    if graph.initial in graph.terminal:
        raise SpecError(f"{where}: initial state '{graph.initial}' is terminal")
    for terminal in sorted(graph.terminal):
        if terminal not in states:
            raise SpecError(f"{where}: terminal state '{terminal}' is not declared")
    forward: dict[str, set[str]] = {s: set() for s in graph.states}
    backward: dict[str, set[str]] = {s: set() for s in graph.states}
    for t in graph.transitions:
        for end in (t.source, t.dest):
            if end not in states:
                raise SpecError(f"{where}: transition '{t.trigger}' names unknown state '{end}'")
        if t.source in graph.terminal:
            raise SpecError(
                f"{where}: terminal state '{t.source}' has a transition out ('{t.trigger}')"
            )
        forward[t.source].add(t.dest)
        backward[t.dest].add(t.source)
    reachable = _closure(graph.initial, forward)
    for state in graph.states:
        if state not in reachable:
            raise SpecError(f"{where}: state '{state}' is unreachable from '{graph.initial}'")
    can_end: set[str] = set()
    for terminal in graph.terminal:
        can_end |= _closure(terminal, backward)
    for state in graph.states:
        if state not in can_end:
            raise SpecError(f"{where}: state '{state}' cannot reach a terminal state")


def _closure(start: str, edges: Mapping[str, set[str]]) -> set[str]:
    seen = {start}
    queue = deque([start])
    while queue:
        for nxt in edges[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen

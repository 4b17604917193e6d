"""Specs as data: steps, the transition graph derived from them, and validation at definition.

A spec is a linear list of steps, some guarded (coldsnap.machine._guards). The graph the runner
drives on `transitions` is derived from the steps, so there is one source of truth for the
runner, the validation and the diagrams. Each driver owns its specs and registers them
(coldsnap.machine._registry); steps shared by several specs live in coldsnap.machine._steps.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from attrs import Attribute, field, frozen

from ._errors import SpecError
from ._facts import Fact
from ._guards import Guard, group_members

COMPONENTS = ("driver", "engine", "provider", "artifacts")
"""The roles a step may call: the snapshot driver, the engine adapter, the weight provider, the
artifact store. Each is supplied by the embedder (or built from the registry)."""

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

OPERATIONS: dict[str, Literal["driver", "engine"]] = {
    "capture": "driver",
    "restore": "driver",
    "stop": "driver",
    "sleep": "engine",
    "wake": "engine",
}
"""Each operation and the kind of component that owns its spec. How a process is snapshotted
and brought back, and how a restored tree is stopped (an n580 restore leaves a template's
control directory), is the driver's; sleep and wake act on a running engine's memory whatever
snapshotted it, so the engine adapter owns them."""
LIFECYCLE = frozenset({"stop", "sleep", "wake"})
"""Operations that act on the engine a finished capture or restore (their target) left running:
they start from facts seeded from the target's receipt (`Spec.seeds`)."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ACTION = re.compile(rf"^(?P<component>{'|'.join(COMPONENTS)})\.(?P<method>[a-z][a-z0-9_]*)$")


def _rule(ok: Callable[[Any], bool], message: str) -> Callable[[Any, Attribute[Any], Any], None]:
    """An attrs validator that raises SpecError naming the field and the value."""

    def validate(instance: Any, attribute: Attribute[Any], value: Any) -> None:
        if not ok(value):
            raise SpecError(f"{type(instance).__name__} field '{attribute.name}': {message}, "
                            f"got {value!r}")

    return validate


def _is_action(value: Any) -> bool:
    return isinstance(value, str) and _ACTION.match(value) is not None


def _facts(value: Any) -> tuple[Fact, ...]:
    return tuple(value)


@frozen
class Step:
    """One step: the action it calls, how it is undone, what to do if interrupted, and the facts
    it needs from earlier steps and makes for later ones.

    `on_interrupt` says what a resumed machine does when the journal shows this step started but
    never ended: `retry` re-runs it (the action is idempotent), `compensate` rolls the whole
    operation back (its own compensation included, since it may have half happened).
    """

    name: str = field(validator=_rule(lambda v: bool(_NAME.match(v)), "a lower_snake_case name"))
    action: str = field(validator=_rule(_is_action, "'role.method' with role one of "
                                        + ", ".join(COMPONENTS)))
    doc: str
    compensation: str | None = field(
        default=None,
        validator=_rule(lambda v: v is None or _is_action(v), "None or 'role.method'"),
    )
    no_compensation: str | None = None
    side_effect: bool = True
    when: Guard | None = field(
        default=None, validator=_rule(lambda v: v is None or isinstance(v, Guard), "a Guard")
    )
    on_interrupt: Literal["retry", "compensate"] = field(
        default="compensate",
        validator=_rule(lambda v: v in ("retry", "compensate"), "'retry' or 'compensate'"),
    )
    timeout_s: float = field(
        default=60.0, validator=_rule(lambda v: isinstance(v, int | float) and v > 0, "positive")
    )
    needs: tuple[Fact, ...] = field(default=(), converter=_facts)
    makes: tuple[Fact, ...] = field(default=(), converter=_facts)
    uses: tuple[Fact, ...] = field(default=(), converter=_facts)
    """Facts the step reads when they are there (optional inputs); `needs` are required."""

    def reads(self) -> frozenset[str]:
        """The names of every fact the step may read: what it needs, uses and makes (a retried
        or compensating step reads what it recorded itself)."""
        return frozenset(f.name for f in (*self.needs, *self.uses, *self.makes))

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


def guard_condition(guard: Guard) -> str:
    """The model method name under which a guard is offered to `transitions`."""
    return f"guard_{guard.name}"


@frozen
class Spec:
    """One operation of one owner (a driver or an engine, per OPERATIONS), validated when it is
    built: every check runs and the SpecError lists every problem found, not only the first.

    `seeds` are the facts a lifecycle operation (stop, sleep, wake) takes from its target's
    receipt before its first step; a step may need them as if an earlier step made them. A
    seed the target does not hold is simply absent (a step that needs it fails naming it)."""

    name: str
    operation: Literal["capture", "restore", "stop", "sleep", "wake"] = field(
        validator=_rule(lambda v: v in OPERATIONS, "one of " + ", ".join(OPERATIONS))
    )
    owner: str = field(validator=_rule(lambda v: bool(_NAME.match(v)), "a lower_snake_case name"))
    steps: tuple[Step, ...] = field(converter=tuple)
    doc: str = ""
    seeds: tuple[Fact, ...] = field(default=(), converter=_facts)

    @property
    def owner_kind(self) -> Literal["driver", "engine"]:
        """The kind of component that owns this spec: 'driver' or 'engine'."""
        return OPERATIONS[self.operation]

    def __attrs_post_init__(self) -> None:
        problems = [p for check in SPEC_CHECKS for p in check(self)]
        if problems:
            raise SpecError("\n".join(f"spec '{self.name}': {p}" for p in problems))

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"spec '{self.name}' has no step '{name}'")

    def guards(self) -> tuple[Guard, ...]:
        return tuple(dict.fromkeys(s.when for s in self.steps if s.when is not None))

    def selected(self, request: Any, components: Mapping[str, Any]) -> tuple[Step, ...]:
        """The steps a request runs with these components: those whose guard holds."""
        return tuple(
            s for s in self.steps if s.when is None or s.when.holds(request, components)
        )

    def makes(self) -> tuple[Fact, ...]:
        """Every fact some step of this spec makes."""
        return tuple(dict.fromkeys(f for s in self.steps for f in s.makes))

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


# -- checks run when a spec is defined; each yields every problem it finds ----------------------


def _check_names(spec: Spec) -> Iterator[str]:
    seen: set[str] = set()
    for step in spec.steps:
        if step.name in RESERVED_STATES:
            yield f"step '{step.name}': the name is reserved for the machine's own states"
        if step.name in seen:
            yield f"step '{step.name}': the name is used twice"
        seen.add(step.name)


def _check_compensations(spec: Spec) -> Iterator[str]:
    for step in spec.steps:
        where = f"step '{step.name}'"
        if step.side_effect and not (step.compensation or step.no_compensation):
            yield f"{where}: has a side effect but neither a compensation nor a reason for none"
        if step.compensation and step.no_compensation:
            yield f"{where}: has both a compensation and a reason for none"
        if not step.side_effect and step.compensation:
            yield f"{where}: has no side effect, so it cannot have a compensation"


def _check_guard_groups(spec: Spec) -> Iterator[str]:
    by_name: dict[str, Guard] = {}
    for guard in spec.guards():
        if by_name.setdefault(guard.name, guard) is not guard:
            yield f"two different guards are named '{guard.name}'"


def _check_seeds(spec: Spec) -> Iterator[str]:
    if spec.seeds and spec.operation not in LIFECYCLE:
        yield (f"a {spec.operation} spec has no target to seed facts from "
               f"(seeds: {', '.join(f.name for f in spec.seeds)})")


def _check_uses(spec: Spec) -> Iterator[str]:
    """Each fact a step uses is made by some step of the spec or seeded: a `uses` nothing can
    fill is a name typed wrong, or a read of another operation's fact."""
    available = {f.name for f in (*spec.seeds, *spec.makes())}
    for step in spec.steps:
        for used in step.uses:
            if used.name not in available:
                yield (f"step '{step.name}' uses fact '{used.name}', which no step of the spec "
                       "makes and no seed brings")


def _check_facts(spec: Spec) -> Iterator[str]:
    """On every combination of guards, each fact a step needs is made by an earlier step (or
    seeded from the target)."""
    missing: dict[tuple[str, str], list[str]] = {}
    seeded = {f.name for f in spec.seeds}
    for assignment in _guard_paths(spec.guards()):
        made: set[str] = set(seeded)
        for step in spec.steps:
            if step.when is not None and not assignment[step.when.name]:
                continue
            for need in step.needs:
                if need.name not in made:
                    path = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in assignment.items())
                    missing.setdefault((step.name, need.name), []).append(path or "always")
            made.update(f.name for f in step.makes)
    for (step, need), paths in missing.items():
        yield (f"step '{step}' needs fact '{need}', which no earlier step makes and no seed "
               f"brings (when {paths[0]})")


def _guard_paths(guards: Iterable[Guard]) -> Iterator[dict[str, bool]]:
    """Every assignment of the guards: one member of each group holds, the others are free."""
    groups: dict[str, list[Guard]] = {}
    free: list[Guard] = []
    for guard in guards:
        if guard.group is None:
            free.append(guard)
        elif guard.group not in groups:
            groups[guard.group] = list(group_members(guard.group))
    choices: list[list[dict[str, bool]]] = [
        [{g.name: g is chosen for g in members} for chosen in members]
        for members in groups.values()
    ]
    choices += [[{g.name: True}, {g.name: False}] for g in free]
    for combo in itertools.product(*choices):
        yield {name: value for part in combo for name, value in part.items()}


def _check_graph(spec: Spec) -> Iterator[str]:
    try:
        validate_graph(spec.graph())
    except SpecError as exc:
        yield str(exc)


SPEC_CHECKS: tuple[Callable[[Spec], Iterable[str]], ...] = (
    _check_names,
    _check_compensations,
    _check_guard_groups,
    _check_seeds,
    _check_facts,
    _check_uses,
    _check_graph,
)
"""What a spec must satisfy when it is defined."""


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

"""Mermaid diagrams and step tables generated from the specs, for docs/state-machines.md."""

from __future__ import annotations

from collections.abc import Iterable

from ._spec import Spec, Transition

_HEADER = """# State machines

Generated from the registered specs (the drivers' capture, restore and stop in
`coldsnap/drivers/*/_specs.py`, the engines' sleep and wake, with the shared steps of
`coldsnap/machine/_steps.py`) by `coldsnap docs`; a test fails when this file is stale.
Each operation is a linear sequence of steps; a guarded step runs only when its guard holds (the
guards are listed under each spec). `needs` and `makes` are the facts a step reads from earlier
steps and records for later ones, `uses` those it reads when they are there; a spec whose step
needs a fact no earlier step makes is refused when it is defined. Stop, sleep and wake act on
the engine a finished capture or restore (their target) left running: they start from the
target's facts the spec `seeds`. Any step's failure, timeout or cancellation moves the machine to
`compensating`, which runs the failed step's compensation and then those of the completed steps
in reverse order, each exactly once, ending in `rolled_back` (or `failed` if a compensation fails
too). `on interrupt` says what a machine resuming a journal does with a step that started but
never ended.
"""


def _label(t: Transition) -> str:
    guards = [c.removeprefix("guard_") for c in t.conditions]
    guards += [f"not {c.removeprefix('guard_')}" for c in t.unless]
    return t.trigger + (f" [{', '.join(guards)}]" if guards else "")


def mermaid(spec: Spec) -> str:
    graph = spec.graph()
    lines = ["stateDiagram-v2", f"    [*] --> {graph.initial}"]
    lines += [f"    {t.source} --> {t.dest}: {_label(t)}" for t in graph.transitions]
    lines += [f"    {state} --> [*]" for state in graph.states if state in graph.terminal]
    return "\n".join(lines)


def step_table(spec: Spec) -> str:
    rows = [
        "| # | step | action | compensation | guard | on interrupt | timeout | needs | uses "
        "| makes | what it does |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, step in enumerate(spec.steps, 1):
        comp = (
            f"`{step.compensation}`"
            if step.compensation
            else (
                f"none: {step.no_compensation}" if step.no_compensation else "none (no side effect)"
            )
        )
        guard = step.when.name if step.when else ""
        needs = ", ".join(f.name for f in step.needs)
        uses = ", ".join(f.name for f in step.uses)
        makes = ", ".join(f.name for f in step.makes)
        rows.append(
            f"| {number} | `{step.name}` | `{step.action}` | {comp} | {guard} | "
            f"{step.on_interrupt} | {step.timeout_s:g} s | {needs} | {uses} | {makes} | "
            f"{step.doc} |"
        )
    guards = spec.guards()
    if guards:
        rows.append("")
        rows += [f"- guard `{g.name}`: {g.doc}" for g in guards]
    return "\n".join(rows)


def document(specs: Iterable[Spec]) -> str:
    parts = [_HEADER]
    for spec in specs:
        owner = f"Owned by the {spec.owner_kind} `{spec.owner}`."
        seeds = ", ".join(f.name for f in spec.seeds)
        seeded = f" Seeded from the target: {seeds}." if seeds else ""
        parts.append(f"## {spec.name}\n\n{spec.doc}\n\n{owner}{seeded}\n\n{step_table(spec)}\n")
        parts.append(f"```mermaid\n{mermaid(spec)}\n```\n")
    return "\n".join(parts)

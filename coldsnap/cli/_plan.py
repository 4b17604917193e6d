"""`coldsnap plan`: the steps a request would run, decided by the same guards the Machine uses,
over the components the registry builds for it. Nothing is started, written or read but the
request itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coldsnap.machine import Fact, Request, Spec


def _names(facts: tuple[Fact, ...]) -> str:
    return ", ".join(f.name for f in facts) or "-"


def plan_text(spec: Spec, request: Request, components: Mapping[str, Any]) -> str:
    """One entry per step of `spec`: whether it runs, its action and guard; for a step that
    runs, the facts it needs and makes."""
    chosen = spec.selected(request, components)
    names = {role: getattr(c, "name", "?") for role, c in components.items()}
    lines = [
        f"{spec.name}: driver {names['driver']}, provider {names['provider']}, engine "
        f"{names['engine']}, store {names['artifacts']} ({len(chosen)} of {len(spec.steps)} "
        "steps run)"
    ]
    width = max(len(step.name) for step in spec.steps)
    indent = " " * 11  # under the step's name
    for number, step in enumerate(spec.steps, 1):
        runs = step in chosen
        guard = ""
        if step.when is not None:
            guard = f"  [guard {step.when.name}: {'holds' if runs else 'does not hold'}]"
        lines.append(
            f"{number:>4} {'run ' if runs else 'skip'}  {step.name:<{width}}  {step.action}{guard}"
        )
        if runs:
            lines.append(f"{indent}needs  {_names(step.needs)}")
            lines.append(f"{indent}makes  {_names(step.makes)}")
    return "\n".join(lines)


__all__ = ["plan_text"]

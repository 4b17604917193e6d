"""Fault injection for any component, without its cooperation: proxies raise on chosen calls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from attrs import define, field

from coldsnap.machine import COMPONENTS, StepContext


class InjectedFault(RuntimeError):
    """The failure a FaultPlan raises in place of a step or compensation."""


class Abandoned(BaseException):
    """Stands for the orchestrator dying: the runner lets it through without journaling."""


@define
class FaultPlan:
    """Which calls fail or abandon the run. Keys are actions such as `driver.dump`; a call to a
    compensation is keyed `comp:driver.discard_dump`. Each entry fires once, on the first call.

    `abandon_at` counts calls (actions and compensations, in order, from 0) across every machine
    that shares the plan; `abandon_after` says whether the call's effect happens first.
    """

    fail: set[str] = field(factory=set, converter=set)
    abandon_at: int | None = None
    abandon_after: bool = False
    delay: Mapping[str, float] = field(factory=dict)
    calls: list[str] = field(factory=list)
    _lock: threading.Lock = field(factory=threading.Lock)

    def _before(self, key: str) -> bool:
        with self._lock:
            index = len(self.calls)
            self.calls.append(key)
        abandon = self.abandon_at == index
        if abandon and not self.abandon_after:
            raise Abandoned(f"abandoned before {key}")
        if key in self.fail:
            self.fail.discard(key)
            raise InjectedFault(f"injected fault in {key}")
        return abandon


class _Faulty:
    def __init__(self, role: str, inner: Any, plan: FaultPlan) -> None:
        self._role = role
        self._inner = inner
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        return self._wrap(name, attr)

    def _wrap(self, name: str, attr: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            ctx = args[0] if args and isinstance(args[0], StepContext) else None
            if ctx is None:
                return attr(*args, **kwargs)
            key = ("comp:" if ctx.compensating else "") + f"{self._role}.{name}"
            delay = self._plan.delay.get(key)
            if delay:
                _sleep_checked(ctx, delay)
            abandon_after = self._plan._before(key)
            result = attr(*args, **kwargs)
            if abandon_after:
                raise Abandoned(f"abandoned after {key}")
            return result

        return call


def _sleep_checked(ctx: StepContext, seconds: float) -> None:
    """A slow step that still honours cancellation and its deadline, as real steps must."""
    end = threading.Event()
    waited = 0.0
    while waited < seconds:
        ctx.check()
        end.wait(0.01)
        waited += 0.01


def inject_faults(
    components: Mapping[str, Any],
    plan: FaultPlan,
    roles: Iterable[str] = COMPONENTS,
) -> dict[str, Any]:
    """Wraps each component so that the plan decides which of its step calls fail. A proxy
    passes everything else through (`name`, `capabilities`, `launcher`, `build()`), so guards
    and the Machine's checks see the component itself."""
    return {
        role: _Faulty(role, comp, plan) if role in roles else comp
        for role, comp in components.items()
    }

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from coldsnap.machine import (
    CaptureRequest,
    Machine,
    ModelRef,
    Request,
    RestoreRequest,
    StepContext,
)
from coldsnap.testing import FaultPlan, MemoryWorld, inject_faults

from ._lifecycle import lifecycle_registry


def capture_request(tmp: Path, driver: str = "n610", provider: str = "native", *,
                    workdir: str = "cap", name: str = "tiny", **kw) -> CaptureRequest:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    return CaptureRequest(
        driver=driver, provider=provider, workdir=str(tmp / workdir), store=str(tmp / "store"),
        model=ModelRef(id="tiny", revision="r1", path=str(model)), name=name, **kw,
    )


def restore_request(tmp: Path, driver: str = "n610", provider: str = "native", *,
                    workdir: str = "res", artifact: str = "tiny") -> RestoreRequest:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    return RestoreRequest(
        driver=driver, provider=provider, workdir=str(tmp / workdir), store=str(tmp / "store"),
        artifact=artifact, model=ModelRef(id="tiny", revision="r1", path=str(model)),
    )


def memory_machine(world: MemoryWorld, request: Request, plan: FaultPlan | None = None,
                   **kw) -> Machine:
    """A Machine over the doubles of `world` that `request` names (faults injected by `plan`),
    with the real capture and restore specs (and the lifecycle doubles of ._lifecycle)."""
    registry = lifecycle_registry(world)
    components = registry.components(request).by_role()
    if plan is not None:
        components = inject_faults(components, plan)
    return Machine(**components, registry=registry, **kw)


class Gate:
    """Holds a step in the middle of its work until the test opens it, without a clock: the
    step says it `entered`, then waits (polling `ctx.check()`, so cancellation and the step's
    own timeout still stop it) until `open()`. `hold(component, method)` wraps one method of a
    component instance; `block(component, method)` makes it ignore everything until opened
    (a step that does not poll, which the runner must abandon at its timeout)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()

    def open(self) -> None:
        self._open.set()

    def hold(self, component: Any, method: str) -> None:
        inner = getattr(component, method)

        def held(ctx: StepContext) -> Any:
            self.entered.set()
            while not self._open.wait(0.01):
                ctx.check()
            return inner(ctx)

        setattr(component, method, held)

    def block(self, component: Any, method: str) -> None:
        inner = getattr(component, method)

        def blocked(ctx: StepContext) -> Any:
            self.entered.set()
            self._open.wait()
            return inner(ctx)

        setattr(component, method, blocked)

from __future__ import annotations

from pathlib import Path

from coldsnap.machine import CaptureRequest, Machine, ModelRef, Request, RestoreRequest
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

"""Our in-memory doubles, under the real specs, pass the conformance kit third parties run
against theirs."""

from __future__ import annotations

from pathlib import Path

from hypothesis import settings

from coldsnap.machine import CaptureRequest, ModelRef, RestoreRequest
from coldsnap.testing import MachineConformance, MemoryWorld

from ._lifecycle import lifecycle_registry


class MemoryConformance(MachineConformance):
    def __init__(self) -> None:
        super().__init__()
        self.world = MemoryWorld()
        self.registry = lifecycle_registry(self.world)  # the kit stops what it restores
        (self._tmp / "model").mkdir()

    def transient(self) -> frozenset[str]:
        return self.world.transient()

    def _model(self) -> ModelRef:
        return ModelRef(id="tiny", revision="r1", path=str(self._tmp / "model"))

    def capture_request(self, workdir: Path, driver: str, provider: str, name: str):
        return CaptureRequest(driver=driver, provider=provider, model=self._model(),
                              workdir=str(workdir), store=str(self._tmp / "store"), name=name)

    def restore_request(self, workdir: Path, driver: str, provider: str, artifact: str):
        return RestoreRequest(driver=driver, provider=provider, model=self._model(),
                              artifact=artifact, workdir=str(workdir),
                              store=str(self._tmp / "store"))


MemoryConformance.TestCase.settings = settings(
    max_examples=80, stateful_step_count=8, deadline=None
)
TestMemoryConformance = MemoryConformance.TestCase

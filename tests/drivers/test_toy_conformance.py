"""The real drivers pass the conformance kit on real processes (toy engine, CRIU), with faults
injected at random steps: every failure compensates back and leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from coldsnap.testing import MachineConformance
from coldsnap.testing.toy_engine import build_toy_model

from ._toy import capture_request, live_engines, needs_criu, restore_request

pytestmark = [needs_criu, pytest.mark.criu, pytest.mark.slow, pytest.mark.xdist_group("toys")]


class ToyConformance(MachineConformance):
    """The registered components (the real drivers, providers and store, and the toy engine
    through the SGLang adapter), built by the registry for each request."""

    drivers = ("n580", "n610")
    providers = ("native", "recovery")

    def __init__(self) -> None:
        super().__init__()
        self.model = build_toy_model(self._tmp / "model", hidden=256, layers=2)

    def transient(self) -> frozenset[str]:
        return live_engines()

    def capture_request(self, workdir: Path, driver: str, provider: str, name: str):
        request = capture_request(self._tmp, self.model, driver, provider, name)
        return type(request)(**{**_fields(request), "workdir": str(workdir)})

    def restore_request(self, workdir: Path, driver: str, provider: str, artifact: str):
        return restore_request(self._tmp, self.model, driver, provider, artifact, str(workdir))


def _fields(request) -> dict:
    import attrs

    return {f.name: getattr(request, f.name) for f in attrs.fields(type(request))}


ToyConformance.TestCase.settings = settings(
    max_examples=6,
    stateful_step_count=4,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestToyConformance = ToyConformance.TestCase

"""Protocols split by capability: a role's protocol holds what every component of the role has;
what a capability brings is its own protocol (a payload provider's export, an engine's CUDA
graph and rank steps); a component that declares a capability must have its methods, and one
without it carries none of them."""

from __future__ import annotations

import pytest

from coldsnap.machine import (
    CAPABILITY_PROTOCOLS,
    ComponentError,
    GraphEngine,
    Machine,
    PayloadProvider,
    RankedEngine,
    WeightProvider,
    declared_methods,
)
from coldsnap.providers._steps import NativeProvider, RecoveryProvider
from coldsnap.testing import MemoryProvider, MemoryWorld

from ._lifecycle import lifecycle_registry
from ._support import capture_request


def test_a_roles_declared_methods_include_its_capabilities() -> None:
    assert {"launch_weights", "stage", "export", "discard_export"} <= declared_methods("provider")
    assert {"destroy_graphs", "check_ranks", "tp_barrier"} <= declared_methods("engine")
    assert set(CAPABILITY_PROTOCOLS) == {
        ("engine", "cuda_graphs"), ("engine", "rank_reports"), ("provider", "payload"),
    }  # fmt: skip


def test_the_shipped_providers_implement_their_capabilitys_protocol_only() -> None:
    assert isinstance(NativeProvider(), PayloadProvider)
    assert isinstance(RecoveryProvider(), WeightProvider)
    assert not isinstance(RecoveryProvider(), PayloadProvider), "no method that only raises"
    assert not hasattr(RecoveryProvider, "export")


class _NoExport(MemoryProvider):
    export = None  # type: ignore[assignment]
    discard_export = None  # type: ignore[assignment]


@pytest.mark.parametrize("provider", ["native", "recovery"])
def test_a_component_lacking_its_capabilitys_methods_is_refused(tmp_path, provider) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path, provider=provider)
    registry = lifecycle_registry(world)
    components = registry.components(request).by_role()
    components["provider"] = _NoExport(world, provider)
    machine = Machine(**components, registry=registry)
    if provider == "recovery":  # no `payload`: export is not its to have
        assert machine.capture(request).ok
        return
    with pytest.raises(ComponentError, match=r"provider 'native' \(capabilities: payload\) "
                       r"lacks discard_export, export"):  # fmt: skip
        machine.capture(request)
    assert not world.calls


def test_an_engine_declaring_graphs_or_rank_reports_needs_their_steps(tmp_path) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    registry = lifecycle_registry(world)
    components = registry.components(request).by_role()
    engine = components["engine"]
    assert isinstance(engine, GraphEngine)

    class Flat(type(engine)):  # type: ignore[misc]
        destroy_graphs = None
        recapture_graphs = None

    flat = Flat(world)
    flat.capabilities = frozenset({"cuda_graphs", "rank_reports"})
    components["engine"] = flat
    with pytest.raises(ComponentError, match="lacks destroy_graphs, recapture_graphs"):
        Machine(**components, registry=registry).capture(request)
    assert isinstance(flat, RankedEngine)

"""Compatibility: a captured identity against the runtime's, one line per differing field."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldsnap.artifacts import (
    EngineBuild,
    FileDigest,
    IncompatibleArtifact,
    Platform,
    Topology,
    check_compatible,
    diff_identities,
)

SHA = "sha256:" + "ab" * 32


def test_equal_identities_are_compatible(make_identity):
    check_compatible(make_identity(), make_identity())
    assert diff_identities(make_identity(), make_identity()) == []


def test_each_differing_field_gets_one_line_with_expected_and_found(make_identity):
    captured = make_identity(platform=Platform("13.0", 580, "9.0", 140, "2.27.3"))
    runtime = make_identity(platform=Platform("13.0", 610, "10.0", 180, "2.27.3"))
    with pytest.raises(IncompatibleArtifact) as info:
        check_compatible(captured, runtime)
    message = str(info.value)
    assert "platform.driver_major: expected 580, found 610" in message
    assert "platform.compute_capability: expected 9.0, found 10.0" in message
    assert "platform.capacity_gib: expected 140, found 180" in message
    assert "nccl" not in message
    assert [d.field for d in info.value.differences] == [
        "platform.driver_major",
        "platform.compute_capability",
        "platform.capacity_gib",
    ]
    assert "new capture" not in message  # a platform change is refused, not a recapture hint


def test_topology_change_says_a_new_capture_is_needed(make_identity):
    captured = make_identity(topology=Topology(tp=2, pp=1, rank=0, world_size=2))
    runtime = make_identity(topology=Topology(tp=1, pp=1, rank=0, world_size=1))
    with pytest.raises(IncompatibleArtifact) as info:
        check_compatible(captured, runtime)
    lines = str(info.value).splitlines()
    assert "  topology.tp: expected 2, found 1" in lines
    assert "  topology.world_size: expected 2, found 1" in lines
    assert lines[-1].startswith("a new capture is needed")


def test_engine_build_change_says_a_new_capture_is_needed(make_identity):
    runtime = make_identity(engine=EngineBuild("sglang", "0.5.24", "sha256:" + "11" * 32))
    with pytest.raises(IncompatibleArtifact, match="a new capture is needed") as info:
        check_compatible(make_identity(), runtime)
    assert "engine.version: expected 0.5.23, found 0.5.24" in str(info.value)


def test_checkpoint_files_are_compared_one_by_one(make_identity):
    other = "sha256:" + "cd" * 32
    model = attrs.evolve(
        make_identity().model,
        checkpoint=(FileDigest("model.safetensors", other), FileDigest("extra.json", SHA)),
    )
    differences = diff_identities(make_identity(), make_identity(model=model))
    assert [str(d) for d in differences] == [
        f"model.checkpoint[model.safetensors]: expected {SHA}, found {other}",
        f"model.checkpoint[extra.json]: expected none, found {SHA}",
    ]


@settings(max_examples=50, deadline=None)
@given(
    tp=st.integers(1, 8),
    rank=st.integers(0, 7),
    driver=st.sampled_from([None, 580, 610]),
    cap=st.sampled_from([None, "9.0", "10.0"]),
)
def test_diff_is_empty_exactly_when_identities_are_equal(make_identity, tp, rank, driver, cap):
    runtime = make_identity(
        topology=Topology(tp=tp, pp=1, rank=min(rank, tp - 1), world_size=tp),
        platform=Platform(compute_capability=cap, driver_major=driver),
    )
    differences = diff_identities(make_identity(), runtime)
    assert (differences == []) == (runtime == make_identity())
    for d in differences:
        assert d.expected != d.found

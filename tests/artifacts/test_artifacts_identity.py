"""Identity records: portable (no host facts), round-trip through JSON, strict on input."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coldsnap._errors import RefusedError
from coldsnap.artifacts import (
    ArtifactError,
    EngineBuild,
    FileDigest,
    Identity,
    IncompatibleArtifact,
    IntegrityError,
    ModelBinding,
    Platform,
    RecordError,
    SnapshotDriver,
    StoreError,
    Topology,
    capture_identity,
    checkpoint_digests,
    collect_platform,
    from_json,
    record_digest,
    to_json,
    tree_digest,
)
from coldsnap.artifacts._identity import IDENTITY_READS

pytestmark = pytest.mark.xdist_group("host")


def _write_checkpoint(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(b"weights" * 100)
    (root / "config.json").write_text('{"hidden_size": 64}')
    (root / "sub" / "extra.json").write_text("{}")
    (root / "plugin").mkdir()
    (root / "plugin" / "hooks.py").write_text("X = 1\n")
    (root / "plugin" / "__pycache__").mkdir()
    (root / "plugin" / "__pycache__" / "hooks.cpython-311.pyc").write_bytes(b"\0host-specific")


def test_identity_is_the_same_on_two_hosts_and_paths(tmp_path, monkeypatch):
    """Capture under two hostnames, two checkout paths and two PIDs' worth of state: equal."""
    captured = []
    for host, where in (("node-a.example", "a/deep/path"), ("gpu-host-17", "b")):
        monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
        monkeypatch.setattr(socket, "getfqdn", lambda *_, host=host: host)
        root = tmp_path / where
        _write_checkpoint(root)
        model = ModelBinding(
            model_id="org/tiny-llama",
            revision="main",
            checkpoint=checkpoint_digests(root),
            dtype="bfloat16",
            quantization="none",
            layout_digest="sha256:" + "33" * 32,
        )
        identity = capture_identity(
            engine=EngineBuild("sglang", "0.5.23", "contract-1"),
            plugin_digest=tree_digest(root / "plugin"),
            model=model,
            topology=Topology(tp=1, pp=1, rank=0, world_size=1),
            snapshot=SnapshotDriver("n580", "1"),
        )
        captured.append(identity)
        text = to_json(identity).decode()
        assert host not in text and str(tmp_path) not in text
    assert captured[0] == captured[1]
    assert to_json(captured[0]) == to_json(captured[1])
    assert record_digest(captured[0]) == record_digest(captured[1])
    names = [f.name for f in captured[0].model.checkpoint]
    assert names == ["config.json", "model.safetensors", "sub/extra.json"]


def test_tree_digest_sees_content_and_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        root.mkdir()
        (root / "x.py").write_text("A = 1\n")
    assert tree_digest(a) == tree_digest(b)
    (b / "x.py").write_text("A = 2\n")
    assert tree_digest(a) != tree_digest(b)
    shutil.rmtree(b)
    b.mkdir()
    (b / "y.py").write_text("A = 1\n")
    assert tree_digest(a) != tree_digest(b)


def test_collect_platform_on_cpu():
    import torch

    platform = collect_platform()
    if torch.cuda.is_available():
        pytest.skip("CPU-only expectation")
    assert platform.compute_capability is None
    assert platform.capacity_gib is None
    assert platform.driver_major is None
    assert platform.cuda_runtime == torch.version.cuda


def test_identity_round_trips_through_json(make_identity):
    identity = make_identity(
        platform=Platform("13.0", 580, "9.0", 140, "2.27.3"),
        topology=Topology(tp=2, pp=1, rank=1, world_size=2),
    )
    assert from_json(to_json(identity), Identity) == identity


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_id": "/home/alice/models/llama"}, "model_id"),
        ({"model_id": "~/models/llama"}, "model_id"),
        ({"revision": ""}, "revision"),
    ],
)
def test_model_binding_refuses_host_paths(change, field):
    fields = {
        "model_id": "org/m",
        "revision": "main",
        "checkpoint": (),
        "dtype": "bfloat16",
        "quantization": "none",
        "layout_digest": "x",
    }
    fields.update(change)
    with pytest.raises(ValueError, match=field):
        ModelBinding(**fields)  # type: ignore[arg-type]


def test_checkpoint_names_are_relative():
    SHA = "sha256:" + "ab" * 32
    with pytest.raises(ValueError, match="absolute"):
        FileDigest("/etc/passwd", SHA)
    with pytest.raises(ValueError, match=r"'\.\.'"):
        FileDigest("../model.safetensors", SHA)


def test_topology_rank_must_be_inside_the_world():
    with pytest.raises(ValueError, match="rank"):
        Topology(tp=2, pp=1, rank=2, world_size=2)


@settings(max_examples=60, deadline=None)
@given(
    path=st.lists(
        st.sampled_from(["engine", "model", "topology", "snapshot", "platform", "format", "kind"]),
        min_size=1,
        max_size=1,
    ),
    junk=st.one_of(
        st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)
    ),
)
def test_damaged_identity_json_is_refused_with_its_field(make_identity, path, junk):
    data = json.loads(to_json(make_identity()))
    assume(data[path[0]] != junk)
    assume(path != ["format"] or junk not in IDENTITY_READS)  # an older format it reads
    data[path[0]] = junk
    with pytest.raises(RecordError) as info:
        from_json(data, Identity)
    assert info.value.fields and all(
        f.split(".")[0].split("[")[0] == path[0] for f in info.value.fields
    ), str(info.value)


def test_strings_are_not_coerced_to_ints(make_identity):
    data = json.loads(to_json(make_identity()))
    data["topology"]["tp"] = "1"
    with pytest.raises(RecordError, match=r"topology\.tp"):
        from_json(data, Identity)


@pytest.mark.gpu
def test_collect_platform_on_a_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    platform = collect_platform()
    major, minor = torch.cuda.get_device_capability()
    assert platform.compute_capability == f"{major}.{minor}"
    assert platform.capacity_gib == round(torch.cuda.get_device_properties(0).total_memory / 2**30)
    assert platform.cuda_runtime == torch.version.cuda
    assert platform.nccl_version is not None and platform.nccl_version.count(".") == 2


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SnapshotDriver("N-9", "1"), "name: 'N-9' is not a driver's name"),
        (lambda: FileDigest("a.json", "sha256:" + "ab" * 32, -1), "size: a non-negative integer"),
        (lambda: Topology(tp=1, pp=1, rank=True, world_size=1), "rank: a non-negative integer"),
        (lambda: Platform(driver_major=0), "driver_major: a positive integer is required, got 0"),
        (lambda: EngineBuild("sglang", " ", "c"), "version: a non-empty string is required"),
    ],
)
def test_each_field_rule_names_its_field(build, message):
    with pytest.raises(ValueError) as info:
        build()
    assert str(info.value).startswith(message)


def test_artifact_errors_are_refusals():
    assert issubclass(ArtifactError, RefusedError) and issubclass(RecordError, ValueError)
    for error in (RecordError, StoreError, IntegrityError, IncompatibleArtifact):
        assert issubclass(error, ArtifactError)

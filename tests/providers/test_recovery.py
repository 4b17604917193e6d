"""Recovery: a pinned checkpoint verified before loading, loaded in place, plus the residual
state (what the checkpoint omits) restored from a small native pack."""

from __future__ import annotations

import json

import pytest
import torch

from coldsnap.artifacts import RecordError, checkpoint_digests
from coldsnap.providers import (
    CheckpointError,
    PackDirectory,
    PinnedCheckpoint,
    capture_residual,
    load_recovery,
)
from coldsnap.providers._convert import dumps, loads
from coldsnap.providers.recovery import checkpoint_keys, recovery_tensors

from .provider_helpers import data_ptrs, storage_bytes


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def saved(request, tmp_path_factory, make_model):
    """A model saved the Hugging Face way (tied lm_head left out of the file), its pin, and the
    residual state captured from the live model."""
    root = tmp_path_factory.mktemp(request.param)
    source = make_model(request.param, seed=11)
    source.save_pretrained(root / "ckpt")
    pin = PinnedCheckpoint.pin(root / "ckpt", model_id=f"test/{request.param}", revision="r1")
    capture_residual(source, root / "ckpt", pin, root / "residual")
    return request.param, source, root, pin


def test_pin_records_relative_names_and_round_trips(saved):
    _, _, root, pin = saved
    names = [f.name for f in pin.files]
    assert "model.safetensors" in names and "config.json" in names
    assert all(not n.startswith("/") for n in names)
    assert loads(dumps(pin), PinnedCheckpoint) == pin
    # the pin's files are the records an identity binds, with their sizes
    assert pin.files == checkpoint_digests(root / "ckpt")
    assert all(f.size == (root / "ckpt" / f.name).stat().st_size for f in pin.files)
    pin.verify(root / "ckpt")


def test_residual_holds_exactly_what_the_checkpoint_omits(saved):
    _, source, root, pin = saved
    names = set(PackDirectory(root / "residual").index.names())
    keys = set(checkpoint_keys(root / "ckpt", pin))
    assert "lm_head.weight" not in keys  # tied: the file holds the embedding only
    assert "lm_head.weight" not in names  # ...and the tie covers it: not residual either
    assert any(n.endswith("rotary_emb.inv_freq") for n in names)
    assert not names & keys
    assert names | keys >= set(recovery_tensors(source)) - {"lm_head.weight"}


def test_recovery_is_bit_exact_and_in_place(saved, make_model):
    arch, source, root, pin = saved
    dest = make_model(arch, seed=12)
    for module in dest.modules():  # derived buffers are garbage after a release, say
        if hasattr(module, "inv_freq"):
            module.inv_freq.zero_()
    mapping = recovery_tensors(dest)
    before = data_ptrs(mapping)
    report = load_recovery(dest, root / "ckpt", pin, residual=PackDirectory(root / "residual"))
    assert report.loaded > 0 and report.residual >= 1
    assert data_ptrs(mapping) == before
    assert storage_bytes(mapping) == storage_bytes(recovery_tensors(source))
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(source(ids).logits, dest(ids).logits)


def test_a_tampered_checkpoint_is_refused_before_loading(saved, make_model, tmp_path):
    arch, _, root, pin = saved
    bad = json.loads(dumps(pin))
    bad["files"] = [
        dict(f, sha256="sha256:" + "0" * 64) if f["name"] == "model.safetensors" else f
        for f in bad["files"]
    ]
    tampered = loads(bad, PinnedCheckpoint)
    dest = make_model(arch, seed=13)
    before = storage_bytes(recovery_tensors(dest))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256: expected"):
        load_recovery(dest, root / "ckpt", tampered, residual=PackDirectory(root / "residual"))
    with pytest.raises(CheckpointError, match="missing"):
        load_recovery(dest, tmp_path, pin, residual=PackDirectory(root / "residual"))
    assert storage_bytes(recovery_tensors(dest)) == before


def test_without_residual_the_uncovered_tensors_are_named(saved, make_model):
    arch, _, root, pin = saved
    dest = make_model(arch, seed=14)
    before = storage_bytes(recovery_tensors(dest))
    with pytest.raises(CheckpointError, match="inv_freq: not in the checkpoint") as info:
        load_recovery(dest, root / "ckpt", pin)
    assert "nothing was loaded" in str(info.value)
    assert storage_bytes(recovery_tensors(dest)) == before


def test_a_checkpoint_of_another_shape_is_refused(saved):
    _, _, root, pin = saved
    from .provider_helpers import _transformers

    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(root / "ckpt")
    config.intermediate_size = 96
    other = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    before = storage_bytes(recovery_tensors(other))
    with pytest.raises(CheckpointError, match=r"mlp\.up_proj\.weight: shape: expected \(96, 64\)"):
        load_recovery(other, root / "ckpt", pin, verify=False)
    assert storage_bytes(recovery_tensors(other)) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "../model.safetensors"),
        ("name", "/etc/passwd"),
        ("sha256", "md5:abc"),
        ("size", -1),
        ("size", "12"),
    ],
)
def test_damaged_pins_are_refused(saved, field, value):
    _, _, _, pin = saved
    data = json.loads(dumps(pin))
    data["files"][0][field] = value
    with pytest.raises(RecordError, match="files\\[0\\]"):
        loads(data, PinnedCheckpoint)


def test_a_pin_without_file_sizes_is_refused(saved):
    _, _, _, pin = saved
    data = json.loads(dumps(pin))
    del data["files"][0]["size"]  # an identity's file digest may lack it; a pin may not
    with pytest.raises(RecordError, match="a pin records each file's size"):
        loads(data, PinnedCheckpoint)


def test_duplicate_files_and_host_paths_are_refused(saved):
    _, _, _, pin = saved
    data = json.loads(dumps(pin))
    data["files"].append(data["files"][0])
    with pytest.raises(RecordError, match="duplicate"):
        loads(data, PinnedCheckpoint)
    data = json.loads(dumps(pin))
    data["model_id"] = "/models/llama"
    with pytest.raises(RecordError, match="host path"):
        loads(data, PinnedCheckpoint)

"""The CPU stand-ins reach every SGLang process (spawned children included), stay lazy, and
the sgl_kernel stand-in refuses to compute. Also: the test models are deterministic."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _child_report(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import sgl_kernel
    import torchvision

    try:
        sgl_kernel.assign_req_to_token_pool_cpu(1, 2)
        raised = ""
    except NotImplementedError as exc:
        raised = str(exc)
    queue.put((torchvision.__version__, getattr(sgl_kernel, "STANDIN", False), raised))


def test_spawned_children_get_the_stand_ins(sglang_cpu: None) -> None:
    """SGLang's children are spawned: a fresh interpreter runs sitecustomize (from PYTHONPATH,
    which activate() exported) before anything imports torchvision, and takes its sys.path
    from the parent."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("the stand-ins are for CPU torch only")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_report, args=(queue,))
    child.start()
    version, standin, raised = queue.get(timeout=120)
    child.join(30)
    assert child.exitcode == 0
    assert version
    assert standin is True
    assert "coldsnap's CPU stand-in" in raised and "assign_req_to_token_pool_cpu" in raised


def test_sitecustomize_is_lazy(tmp_path: Path) -> None:
    from coldsnap.engines.sglang.cpu import cpu_env

    code = "import sys; print('torch' in sys.modules, 'sitecustomize' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=cpu_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True"]


def test_cpu_env_keeps_existing_pythonpath() -> None:
    from coldsnap.engines.sglang.cpu import PYTHONPATH_DIR, cpu_env

    env = cpu_env({"PYTHONPATH": "/x/y"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(PYTHONPATH_DIR), "/x/y"])
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_models_are_deterministic_per_seed(tmp_path: Path) -> None:
    from coldsnap.tiny_models import build_model

    a = build_model(tmp_path / "a", arch="llama", size="tiny", seed=3)
    b = build_model(tmp_path / "b", arch="llama", size="tiny", seed=3)
    c = build_model(tmp_path / "c", arch="llama", size="tiny", seed=4)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _sha(a.path / name) == _sha(b.path / name)
    assert _sha(a.path / "model.safetensors") != _sha(c.path / "model.safetensors")
    assert a.weight_bytes == (a.path / "model.safetensors").stat().st_size - _header(a.path)
    assert build_model(tmp_path / "a", arch="llama", size="tiny", seed=3) == a  # reused
    with pytest.raises(FileExistsError):
        build_model(tmp_path / "a", arch="qwen3", size="tiny", seed=3)
    with pytest.raises(ValueError, match="arch 'gpt' is not one of"):
        build_model(tmp_path / "d", arch="gpt")
    assert not (tmp_path / "d").exists()


def _header(path: Path) -> int:
    data = (path / "model.safetensors").read_bytes()
    return 8 + int.from_bytes(data[:8], "little")


def test_tokenizer_round_trips_text(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from coldsnap.tiny_models import build_model

    info = build_model(tmp_path / "q", arch="qwen3", size="tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(str(info.path))
    assert len(tok) == info.vocab_size
    text = "hello world, snapshots restore 42 weights"
    assert tok.decode(tok(text).input_ids) == text


def test_an_overlay_follows_the_stand_ins_on_pythonpath(tmp_path: Path) -> None:
    from coldsnap.engines.sglang.cpu import OVERLAY_VARIABLE, PYTHONPATH_DIR, cpu_env

    overlay = tmp_path / "sglang-x"
    (overlay / "sglang").mkdir(parents=True)
    (overlay / "sglang" / "__init__.py").write_text("")
    base = {"PYTHONPATH": "/elsewhere"}
    env = cpu_env(base, overlay=overlay)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PYTHONPATH_DIR), str(overlay), "/elsewhere"]
    assert env[OVERLAY_VARIABLE] == str(overlay)
    # Named by the base environment instead; applying it twice changes nothing.
    again = cpu_env(env)
    assert again["PYTHONPATH"] == env["PYTHONPATH"]
    assert cpu_env(base)["PYTHONPATH"].split(os.pathsep) == [str(PYTHONPATH_DIR), "/elsewhere"]


def test_an_overlay_without_sglang_is_refused_naming_the_variable(tmp_path: Path) -> None:
    from coldsnap.engines.sglang.cpu import OverlayError, cpu_env
    from coldsnap.testing.sglang_cpu import ReleaseNotInstalled, release_overlay

    with pytest.raises(OverlayError, match=r"COLDSNAP_SGLANG_OVERLAY=.*no SGLang installed"):
        cpu_env({}, overlay=tmp_path)
    with pytest.raises(OverlayError, match="COLDSNAP_SGLANG_OVERLAY"):
        cpu_env({"COLDSNAP_SGLANG_OVERLAY": str(tmp_path)})
    with pytest.raises(ReleaseNotInstalled, match=r"release '0\.4\.0': unknown"):
        release_overlay("0.4.0")
    assert release_overlay("0.5.23") is None

"""Readying SGLang's CPU support is idempotent across processes: a child started with the
environment its parent exported (the stand-ins first on PYTHONPATH, possibly another copy of
coldsnap's) builds a Machine like its parent, while a real sgl_kernel on the import path is
still refused. torch's build is read without importing torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from coldsnap import _torch
from coldsnap.engines.sglang import cpu

CHILD = """
import json, os, sys
from coldsnap import CaptureRequest, Machine, ModelRef
request = CaptureRequest(
    driver="n610", provider="native", engine="sglang",
    model=ModelRef(id="org/m", revision="r1", path=sys.argv[1]),
    workdir=sys.argv[2], store=sys.argv[3], name="m",
)
Machine.for_request(request)
print(json.dumps({"pythonpath": os.environ["PYTHONPATH"], "sglang": "sglang" in sys.modules}))
"""


def _other_copy(tmp_path: Path) -> Path:
    """The stand-ins' folder of another copy of coldsnap (another checkout or install)."""
    other = tmp_path / "other-coldsnap" / "pythonpath"
    shutil.copytree(cpu.PYTHONPATH_DIR, other, ignore=shutil.ignore_patterns("__pycache__"))
    return other


def test_a_child_given_another_copy_s_stand_ins_builds_a_machine(tmp_path: Path) -> None:
    """What an embedder's worker inherits: PYTHONPATH with the stand-ins of the coldsnap its
    parent ran (here another copy's). The child readies itself and builds a Machine; its own
    stand-ins come first on the PYTHONPATH it exports, the other copy's are dropped."""
    if _torch.gpu_build() is not None:
        pytest.skip("the CPU support is for CPU builds of torch")
    other = _other_copy(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {**os.environ, "PYTHONPATH": str(other)}
    env.pop(cpu.OVERLAY_VARIABLE, None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(tmp_path / "op"), str(tmp_path / "store")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["pythonpath"].split(os.pathsep) == [str(cpu.PYTHONPATH_DIR)]
    assert seen["sglang"] is False  # readying imports no SGLang


def test_another_copy_s_stand_ins_are_no_real_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [str(_other_copy(tmp_path)), *sys.path])
    monkeypatch.setattr(cpu, "gpu_build", lambda: None)
    cpu.check_cpu_install()


def test_a_real_kernel_on_the_import_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "site" / "sgl_kernel"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(cpu.PYTHONPATH_DIR), str(tmp_path / "site"), *sys.path])
    monkeypatch.setattr(cpu, "gpu_build", lambda: None)
    with pytest.raises(cpu.GpuInstallError, match=r"a real sgl_kernel is installed .*site"):
        cpu.check_cpu_install()


def test_a_gpu_build_of_torch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "gpu_build", lambda: "cuda 12.8")
    with pytest.raises(cpu.GpuInstallError, match=r"torch is a GPU build \(cuda 12\.8\)"):
        cpu.check_cpu_install()


def test_the_exported_pythonpath_keeps_one_folder_of_stand_ins(tmp_path: Path) -> None:
    other = _other_copy(tmp_path)
    env = cpu.cpu_env({"PYTHONPATH": os.pathsep.join([str(other), "/opt/lib"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(cpu.PYTHONPATH_DIR), "/opt/lib"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", "cuda 12.8"),
        ("cuda = None\nhip = '6.2'\n", "hip 6.2"),
        ("from typing import Optional\ncuda: Optional[str] = None\nhip = None\n", None),
    ],
)
def test_torch_s_build_is_read_from_its_version_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str | None
) -> None:
    (tmp_path / "version.py").write_text(text)
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)], origin=None)
    monkeypatch.setattr(_torch.importlib.util, "find_spec", lambda name: spec)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as a fresh process
    assert _torch.gpu_build() == expected


def test_the_version_file_says_what_torch_says() -> None:
    import torch

    read = _torch._read()
    assert read == {"cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}

"""The set-up makes the venv's torchvision importable on CPU torch (PyPI's is built against
CUDA torch and died on `operator torchvision::nms does not exist`, and with it a plain
`python -m sglang.launch_server` or `sglang.bench_serving` in the venv), and stays idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PTH = "coldsnap-cpu-torchvision.pth"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    return env | extra


def test_the_step_arms_the_declaration_in_every_interpreter_and_is_idempotent(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    written = []
    for _ in range(2):
        subprocess.run([str(ROOT / "scripts" / "setup.sh"), "cpu-torchvision"], check=True,
                       cwd=ROOT, env=_clean_env(COLDSNAP_VENV=str(venv)))  # fmt: skip
        (pth,) = venv.glob(f"lib/python*/site-packages/{PTH}")
        written.append(pth.read_text())
    assert written[0] == written[1]
    code = "import sys; print(type(sys.meta_path[0]).__name__, 'torch' in sys.modules)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=_clean_env(),
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stderr == ""  # site reports a failing .pth line on stderr
    assert out.stdout.split() == ["_DeclareBeforeTorchvision", "False"]  # armed, nothing imported


def test_the_venv_s_torchvision_imports_without_coldsnap_s_environment() -> None:
    if not any(Path(p, PTH).is_file() for p in sys.path):
        pytest.fail(f"{PTH} is not in this venv: run scripts/setup.sh")
    code = "import torch, torchvision, torchvision.ops; print(torchvision.__version__)"
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]

"""The engine runs coldsnap's plugin as installed beside the orchestrator, wherever the
orchestrator runs: engines inherit its working directory, and `python -m` would put that
directory first on the import path (a checkout there would shadow the installed plugin)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import coldsnap
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.machine import WeightSource

FROM_CHECKPOINT = WeightSource(source="checkpoint", checkpoint="/models/m")


def test_an_engine_started_in_a_checkout_imports_the_installed_coldsnap(tmp_path: Path) -> None:
    request = SimpleNamespace(
        operation="capture", model=SimpleNamespace(path="/models/m"), tp=1, engine_args=()
    )
    argv = SGLangLauncher().command(request, tmp_path, weights=FROM_CHECKPOINT).argv
    interpreter = list(argv[: argv.index("-m") + 1])  # the interpreter and its flags
    decoy = tmp_path / "checkout" / "coldsnap"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('the checkout in the cwd was imported')\n")
    probe = "import coldsnap, sys; sys.stdout.write(coldsnap.__file__)"
    done = subprocess.run(
        [*interpreter, "json.tool", "--help"], cwd=decoy.parent, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr  # the engine's module runs from there at all
    imported = subprocess.run(
        [*interpreter[:-1], "-c", probe], cwd=decoy.parent, capture_output=True, text=True
    )
    # `-c` puts the cwd first unless the launcher's flags say otherwise, like `-m`
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == coldsnap.__file__

"""n580 on CUDA: the memory saver's allocator hook must be loaded in the template's forkserver.

On the H200 a capture through n580 once refused at release_memory:
SGLang puts the hook on LD_PRELOAD only while it spawns a scheduler, and a scheduler forked from
the template's forkserver is never exec'd, so nothing was in the memory saver's regions."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from coldsnap.drivers import n580
from coldsnap.drivers.n580._forkserver import _unique_preload
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.engines.sglang._launcher import MEMORY_SAVER_HOOK, memory_saver_preload

LIB = next(
    (p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1")
     if Path(p).exists()),
    None,
)  # fmt: skip


def test_the_hook_comes_first_once_and_keeps_what_was_preloaded(monkeypatch) -> None:
    pytest.importorskip("torch_memory_saver")
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    first = memory_saver_preload()["LD_PRELOAD"].split(":")
    assert MEMORY_SAVER_HOOK in Path(first[0]).name and first[1:] == ["/opt/other.so"]
    monkeypatch.setenv("LD_PRELOAD", ":".join(first))
    assert memory_saver_preload()["LD_PRELOAD"].split(":") == first


def test_a_path_listed_twice_is_listed_once_keeping_the_order() -> None:
    env = {"LD_PRELOAD": "/a.so:/b.so:/a.so::/c.so", "X": "1"}
    assert _unique_preload(env) == {"LD_PRELOAD": "/a.so:/b.so:/c.so", "X": "1"}
    assert _unique_preload({"X": "1"}) == {"X": "1"}


def test_the_template_is_launched_with_the_launchers_template_env() -> None:
    launcher = SGLangLauncher(template_env={"LD_PRELOAD": "/hook.so"})
    driver = n580.build(SimpleNamespace(), SimpleNamespace(launcher=launcher))
    assert driver.template_env == {"LD_PRELOAD": "/hook.so"}
    plain = n580.build(SimpleNamespace(), SimpleNamespace(launcher=SGLangLauncher()))
    assert plain.template_env == {}


@pytest.mark.skipif(LIB is None, reason="no libz.so.1 to preload")
def test_a_child_forked_from_the_forkserver_has_the_templates_preload_mapped(tmp_path) -> None:
    """What the fix relies on, with a harmless library in the hook's place: the forkserver is
    exec'd with the template's environment, so its children carry the library, and a duplicate
    added before the spawn (as SGLang's configure_subprocess does) reaches the child once."""
    script = textwrap.dedent(
        f"""
        import json, multiprocessing, os, sys
        from coldsnap.drivers.n580 import _forkserver

        def report(path):
            maps = open("/proc/self/maps").read()
            with open(path, "w") as f:
                json.dump({{"mapped": {LIB!r} in maps, "env": os.environ["LD_PRELOAD"]}}, f)

        if __name__ == "__main__":
            _forkserver.start([])
            os.environ["LD_PRELOAD"] = {LIB!r} + ":" + os.environ["LD_PRELOAD"]
            multiprocessing.set_start_method("spawn", force=True)
            p = multiprocessing.Process(target=report, args=(sys.argv[1],))
            p.start(); p.join()
            sys.exit(p.exitcode)
        """
    )
    (tmp_path / "t.py").write_text(script)
    out = tmp_path / "out.json"
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": LIB, "PYTHONPATH": str(Path.cwd())}
    subprocess.run([sys.executable, str(tmp_path / "t.py"), str(out)], env=env, check=True,
                   cwd=tmp_path, timeout=120)  # fmt: skip
    got = json.loads(out.read_text())
    assert got == {"mapped": True, "env": LIB}


def test_the_hook_of_a_cuda_build_is_found_without_importing_the_memory_saver() -> None:
    """Its package imports torch (3.4 s of a fresh `coldsnap restore` on the H200, which builds
    the engine's launcher for every request): the hook is looked up as the memory saver does."""
    pytest.importorskip("torch_memory_saver")
    code = textwrap.dedent(
        """
        import json, sys
        from coldsnap.engines.sglang import _launcher
        _launcher.gpu_build = lambda: "cuda 13.0"
        hook = _launcher.memory_saver_preload()["LD_PRELOAD"].split(":")[0]
        print(json.dumps([hook, "torch_memory_saver" in sys.modules, "torch" in sys.modules]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    hook, saver_imported, torch_imported = json.loads(done.stdout)
    from torch_memory_saver.utils import get_binary_path_from_package

    assert Path(hook).name == f"{MEMORY_SAVER_HOOK}_cu13.abi3.so"
    assert Path(hook).parent == get_binary_path_from_package(MEMORY_SAVER_HOOK).parent
    assert (saver_imported, torch_imported) == (False, False)

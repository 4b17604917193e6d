"""Fixtures for the plugin tests: SGLang importable on this CPU host, test models, servers."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._support import missing


@pytest.fixture(scope="session")
def sglang_cpu() -> None:
    """Makes SGLang importable here (CPU stand-ins), or skips where SGLang is not installed."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        missing("sglang", "SGLang is not installed (scripts/setup.sh sglang)")
    import torch

    if torch.version.cuda is None:
        from coldsnap.engines.sglang.cpu import activate

        activate()


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def clean_hook_registry(sglang_cpu: None) -> Iterator[Any]:
    """Restores SGLang's global HookRegistry after a test that registers hooks in this process."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    hooks = copy.copy(HookRegistry._hooks)
    saved = {k: list(v) for k, v in hooks.items()}
    patched = set(HookRegistry._patched)
    yield HookRegistry
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(saved)
    HookRegistry._patched.clear()
    HookRegistry._patched.update(patched)


PROMPTS = (
    "The quick brown fox jumps over the lazy dog",
    "hello world one two three",
    "snapshots restore weights in memory",
)


def plugin_env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a plugin-enabled engine (on top of the CPU stand-ins)."""
    return {
        "SGLANG_PLUGINS": "coldsnap",
        "COLDSNAP_MODE": "capture",
        "COLDSNAP_RUNTIME_DIR": str(runtime_dir),
        **extra,
    }


TEST_PLUGIN = Path(__file__).resolve().parent / "sglang_test_plugin"
PAUSE_FAULT_VAR = "TEST_PLUGIN_PAUSE_FAULT"  # tests/plugin/sglang_test_plugin's


def with_test_plugin(env: dict[str, str], release: str, pause_fault: Path) -> dict[str, str]:
    """`env` (a `plugin_env`) with the test plugin of TEST_PLUGIN loaded beside coldsnap's: the
    server's rotary cache is kept in float32 as on CUDA (SGLANG_ROPE_CACHE_FP32; on CPU SGLang
    casts it to the model's dtype when it makes it) and recast at its first use, after the
    model was registered (as SGLang's CUDA fallback does), and a file at `pause_fault` naming a
    memory region makes the next release fail when it pauses that region."""
    import os

    from coldsnap.testing.sglang_cpu import release_env

    path = release_env(release)["PYTHONPATH"] + os.pathsep + str(TEST_PLUGIN)
    plugins = f"{env['SGLANG_PLUGINS']},coldsnap_test_plugin"
    return {
        **env,
        "SGLANG_PLUGINS": plugins,
        "PYTHONPATH": path,
        "SGLANG_ROPE_CACHE_FP32": "1",
        PAUSE_FAULT_VAR: str(pause_fault),
    }


def read_status(runtime_dir: Path, process: str) -> dict[str, Any]:
    import json

    from coldsnap._wire import status_path

    return json.loads(status_path(runtime_dir, process).read_text())


def scheduler_process(launcher_pid: int) -> Any:
    import psutil

    for child in psutil.Process(launcher_pid).children(recursive=True):
        if "scheduler" in child.name() or "scheduler" in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no scheduler process under {launcher_pid}")


def stop_now(server: Any) -> None:
    """Kills a test's SGLang server (`coldsnap.testing.sglang_cpu.SGLangServer`) tree at once,
    then `stop()` reaps its launcher. Its graceful drain is not what these tests check, and
    SGLang's only starts at its SIGTERM watchdog's next 5 s poll."""
    from coldsnap.backends.procs import kill_tree

    if server.process.poll() is None:  # not reaped: its PID is still its own
        kill_tree(server.process.pid)
    server.stop()


def generate_all(client: Any, max_new_tokens: int = 12) -> dict[str, tuple[int, ...]]:
    return {p: client.generate(p, max_new_tokens=max_new_tokens).token_ids for p in PROMPTS}

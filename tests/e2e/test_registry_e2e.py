"""A capsule between two hosts' stores through a real OCI registry, as a user runs it: capture a
tiny SGLang server (`coldsnap capture -- python -m sglang.launch_server ...`), `coldsnap push`
it to a registry this test starts (Debian's docker-registry), remove the capture's store,
`coldsnap pull` it into an empty store on another root, restore from there and compare the
answers with a cold start's (conftest's `tiny_cold`). The capture is the session's one
command-line capture (conftest's `cli_capsule`), pushed from a copy of its store; one restore."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from coldsnap.engines import EngineClient
from coldsnap.engines.sglang import SGLANG_POLICY
from tests._support import free_port
from tests.registry._server import registry_binary, serve_registry

from .conftest import CliCapsule, answers, marked_pids, run_cli

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]


def test_pushed_pulled_into_an_empty_store_elsewhere_and_restored_exactly(
    cli_capsule: CliCapsule, tiny_cold: list[tuple[int, ...]], tmp_path: Path
) -> None:
    registry_binary()  # skips, saying why, where the registry is not installed
    marker = cli_capsule.marker
    (tmp_path / "first").mkdir()
    first, second = cli_capsule.own_store(tmp_path / "first"), tmp_path / "second" / "store"
    env = {"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")}
    with serve_registry(tmp_path / "registry") as registry:
        ref = f"{registry}/coldsnap/tiny:v1"
        try:
            pushed = run_cli("push", "tiny", ref, "--store", str(first), "--plain-http", "--json",
                          marker=marker, env=env)  # fmt: skip
            assert pushed.returncode == 0, pushed.stdout[-4000:] + pushed.stderr[-2000:]
            done = json.loads(pushed.stdout.strip().splitlines()[-1])
            assert done["event"] == "finished" and done["status"] == "done"
            assert done["result"]["sent"]["count"] > 1
            shutil.rmtree(first)  # the restore has only what the pull brought

            pulled = run_cli("pull", ref, "--store", str(second), "--plain-http",
                          marker=marker, env=env)  # fmt: skip
            assert pulled.returncode == 0, pulled.stdout[-4000:] + pulled.stderr[-2000:]
            result = json.loads(pulled.stdout.strip().splitlines()[-1])
            assert result["tag"] == "tiny" and result["capsule"] == done["result"]["capsule"]
            assert result["fetched"]["count"] == done["result"]["sent"]["count"] - 1  # config

            port = free_port()
            restored = run_cli("restore", "tiny", "--store", str(second), "--port", str(port),
                            marker=marker, env=env)  # fmt: skip
            assert restored.returncode == 0, restored.stdout[-4000:] + restored.stderr[-2000:]
            url = f"http://127.0.0.1:{port}"
            with EngineClient(url, SGLANG_POLICY) as client:
                client.flush_cache_when_idle()
            assert answers(url) == tiny_cold, "the pulled capsule answers unlike the cold start"
            stopped = run_cli("stop", "tiny", marker=marker, env=env)
            assert stopped.returncode == 0, stopped.stderr
            assert not marked_pids(marker), "stop left engine processes running"
        finally:
            for pid in marked_pids(marker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

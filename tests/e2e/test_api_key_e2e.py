"""A keyed SGLang server captured with n610 and restored from the command line: the capture is
given `--api-key`, each restore `-- --api-key KEY` (another key). Neither key is in
any file of the store (the throw-away key coldsnap started the captured engine with may be:
n610's image holds that process's memory); the restored server refuses a request without a
key, with the throw-away key, with the capture's key and with a wrong key, and answers with the
restore's key (its health stays open: coldsnap's readiness probes carry none); no process of
the restored tree has the restore's key in its command line or environment. n610 resumes the
captured process (the plugin swaps the key; its sleep and wake send the restore's key). n580,
which builds the engine at restore and starts it with the key, is checked the same way by
test_n580_manage_e2e.py, on the keyed capsule it manages (one n580 capture for both)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import uuid
from pathlib import Path

import psutil
import pytest

from coldsnap.machine import JOURNAL_NAME, read_journal
from tests._support import free_port

from ._api_keys import files_holding, status_code
from .conftest import marked_pids, run_cli

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]


def test_a_keyed_server_is_captured_and_restored_and_the_key_is_in_no_capsule_file(
    tiny_llama: Path, tmp_path: Path
) -> None:
    driver = "n610"
    marker, store = uuid.uuid4().hex, tmp_path / "store"
    env = {"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")}
    captured_key, restore_key = secrets.token_hex(16), secrets.token_hex(16)
    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(tiny_llama),
              "--api-key", captured_key]  # fmt: skip
    port = free_port()
    try:
        done = run_cli("capture", "--name", "keyed", "--driver", driver, "--store", str(store),
                    "--workdir", str(tmp_path / "capture"), "--", *launch, marker=marker,
                    env=env)  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        request = read_journal(tmp_path / "capture" / JOURNAL_NAME)[0].request or {}
        assert request["engine_args"].count("--api-key") == 1, request
        throwaway = json.loads((tmp_path / "capture" / "api-key").read_text())["key"]

        unkeyed = run_cli("restore", "keyed", "--store", str(store), "--port", str(port),
                       "--model-path", str(tiny_llama), marker=marker, env=env)  # fmt: skip
        assert unkeyed.returncode == 2, unkeyed.stderr
        assert "was captured with --api-key" in unkeyed.stderr

        restored = run_cli("restore", "keyed", "--store", str(store), "--port", str(port),
                        "--model-path", str(tiny_llama), "--workdir", str(tmp_path / "restore"),
                        "--", "--api-key", restore_key, marker=marker, env=env)  # fmt: skip
        assert restored.returncode == 0, restored.stdout[-4000:] + restored.stderr[-2000:]
        url = f"http://127.0.0.1:{port}"
        for path in ("/generate", "/v1/models"):
            assert status_code(url, path, None) == 401, path
            assert status_code(url, path, throwaway) == 401, path
            assert status_code(url, path, captured_key) == 401, path
            assert status_code(url, path, restore_key + "x") == 401, path
            assert status_code(url, path, restore_key) == 200, path
        assert status_code(url, "/health", None) == 200

        for key in (captured_key, restore_key):  # the throw-away may be: n610 dumps its process
            assert not files_holding(store, key.encode()), "a given key is in the store"
        assert not files_holding(tmp_path / "capture", captured_key.encode())
        for pid in marked_pids(marker):
            proc = psutil.Process(pid)
            with contextlib.suppress(psutil.Error):
                assert restore_key not in " ".join(proc.cmdline())
                assert restore_key not in json.dumps(proc.environ())

        for operation in ("sleep", "wake"):  # they send the restore's key too
            done = run_cli(operation, "keyed", marker=marker, env=env)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert status_code(url, "/generate", restore_key) == 200
        assert status_code(url, "/generate", throwaway) == 401

        stopped = run_cli("stop", "keyed", marker=marker, env=env)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        for pid in marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(store, ignore_errors=True)

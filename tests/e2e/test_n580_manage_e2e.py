"""An n580 restore of a keyed real SGLang on CPU, managed from the command line as an n610 one
is: one `coldsnap capture --driver n580` of a server launched with `--api-key`, one `coldsnap
restore` by the short digest `ls` prints, given another key (`-- --api-key KEY`), then `status`
(running, listening, its start stamp), `sleep`, `status` (asleep), `wake`, `logs`, `stop` (exit
0; the port freed, no process of it left, its runtime and control dirs and its serving record
gone) and `status` again. Every command is a fresh `python -m coldsnap.cli` in the environment
this session started with.

The key, as test_api_key_e2e.py checks it for n610 (n580 builds the engine at restore and
starts it with the restore's key): a restore without a key is refused; the restored server
refuses a request without a key, with the capture's throw-away key, with the capture's key and
with a wrong key, and answers with the restore's key, also after the sleep and wake (which send
it); neither given key is in any file of the store, the capture's key in none of its workdir,
and no process of the restored tree has the restore's key in its command line or
environment."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coldsnap.backends.procs import start_stamp
from coldsnap.machine import JOURNAL_NAME, read_journal
from tests._support import free_port

from ._api_keys import files_holding, status_code
from .conftest import PRISTINE_ENV, marked_pids

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]
MARKER = "COLDSNAP_N580_MANAGE_MARKER"
"""In the environment of every process the capture starts, which CRIU restores as it was: what
finds a process of this module left running, whatever its command line says."""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class Cli:
    """`python -m coldsnap.cli` with this module's store, serving dir and marker."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "store"
        self.marker = uuid.uuid4().hex
        self.env = {**PRISTINE_ENV, MARKER: self.marker,
                    "COLDSNAP_SERVING_DIR": str(root / "serving")}  # fmt: skip
        self.captured_key = secrets.token_hex(16)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "coldsnap.cli", *args], capture_output=True,
                              text=True, timeout=540, env=self.env)  # fmt: skip


@pytest.fixture(scope="module")
def captured(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """One n580 capsule of the tiny Llama launched with `--api-key`, in this module's store."""
    cli = Cli(tmp_path_factory.mktemp("n580-manage"))
    try:
        done = cli("capture", "--driver", "n580", "--name", "tiny580", "--store", str(cli.store),
                   "--workdir", str(cli.root / "capture"), "--", "python", "-m",
                   "sglang.launch_server", "--model-path", str(tiny_llama), "--port",
                   str(free_port()), "--api-key", cli.captured_key)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not marked_pids(cli.marker, MARKER), "the capture left its source running"
        yield cli
    finally:
        for pid in marked_pids(cli.marker, MARKER):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_status_sleep_wake_logs_and_stop_of_an_n580_restore(
    captured: Cli, tiny_llama: Path
) -> None:
    cli, port = captured, free_port()
    restore_key = secrets.token_hex(16)
    request = read_journal(cli.root / "capture" / JOURNAL_NAME)[0].request or {}
    assert request["engine_args"].count("--api-key") == 1, request
    throwaway = json.loads((cli.root / "capture" / "api-key").read_text())["key"]
    listed = cli("ls", "--store", str(cli.store), "--json")
    assert listed.returncode == 0, listed.stderr
    short = json.loads(listed.stdout)[0]["digest"].removeprefix("sha256:")[:12]

    unkeyed = cli("restore", short, "--store", str(cli.store), "--model-path", str(tiny_llama),
                  "--port", str(port))  # fmt: skip
    assert unkeyed.returncode == 2, unkeyed.stderr
    assert "was captured with --api-key" in unkeyed.stderr

    restored = cli("restore", short, "--store", str(cli.store), "--model-path", str(tiny_llama),
                   "--port", str(port), "--", "--api-key", restore_key)  # fmt: skip
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    result = json.loads(restored.stdout.strip().splitlines()[-1])
    name, pid, url = result["name"], result["pid"], f"http://127.0.0.1:{port}"
    assert name == short and result["url"] == url
    receipt = json.loads((Path(result["workdir"]) / "receipt.json").read_text())
    facts = receipt["facts"]
    assert receipt["spec"] == "restore-n580"
    assert facts["engine_start"] == start_stamp(pid), "the receipt's stamp is not the engine's"
    carried = psutil.Process(pid).environ().get("COLDSNAP_RUNTIME_DIR")
    assert facts["runtime_dir"] == carried, "the engine runs with a runtime dir it does not carry"

    for path in ("/generate", "/v1/models"):
        assert status_code(url, path, None) == 401, path
        assert status_code(url, path, throwaway) == 401, path
        assert status_code(url, path, cli.captured_key) == 401, path
        assert status_code(url, path, restore_key + "x") == 401, path
        assert status_code(url, path, restore_key) == 200, path
    assert status_code(url, "/health", None) == 200
    for key in (cli.captured_key, restore_key):
        assert not files_holding(cli.store, key.encode()), "a given key is in the store"
    assert not files_holding(cli.root / "capture", cli.captured_key.encode())
    for marked in marked_pids(cli.marker, MARKER):
        proc = psutil.Process(marked)
        with contextlib.suppress(psutil.Error):
            assert restore_key not in " ".join(proc.cmdline())
            assert restore_key not in json.dumps(proc.environ())

    state = json.loads(cli("status", "--json", name).stdout)
    assert state["running"] and state["listening"], state
    assert (state["pid"], state["url"], state["state"]) == (pid, url, "done")

    slept = cli("sleep", name)
    assert slept.returncode == 0, slept.stdout + slept.stderr[-2000:]
    asleep = json.loads(cli("status", "--json", name).stdout)
    assert asleep["running"] and asleep["sleep"] == "asleep", asleep
    woke = cli("wake", name)
    assert woke.returncode == 0, woke.stdout + woke.stderr[-2000:]
    assert json.loads(cli("status", "--json", name).stdout)["sleep"] == "awake"
    assert status_code(url, "/generate", restore_key) == 200
    assert status_code(url, "/generate", throwaway) == 401
    logs = cli("logs", name, "-n", "5")
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr

    stopped = cli("stop", name)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr[-2000:]
    assert f"stopped {name} (pid {pid})" in stopped.stdout
    assert _port_free(port), "the stopped server still holds its port"
    assert not marked_pids(cli.marker, MARKER), "stop left processes of the engine running"
    assert not Path(facts["runtime_dir"]).exists() and not Path(facts["control_dir"]).exists()
    assert not (Path(cli.env["COLDSNAP_SERVING_DIR"]) / f"{name}.json").exists()
    assert "nothing serving" in cli("status").stdout
    after = json.loads(cli("status", "--json", result["workdir"]).stdout)
    assert not after["running"] and after["stopped"], after

"""One capture of a real SGLang server served three times at once on one host, from the command
line: three `coldsnap restore` started together (one plain, two `--replica`), each on its own
port and answering token for token as a cold start does; `status` shows all three; the stop
of one leaves the other two serving; once all are stopped nothing is left: no engine process,
no forwarder, no port held, no replica's runtime dir. The capture is the session's one
command-line capture (conftest's `cli_capsule`), served from a copy of its store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coldsnap.backends.procs import kill_tree
from tests._support import free_port

from .conftest import MARKER, PRISTINE_ENV, CliCapsule, answers, marked_pids

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]


def _env(marker: str, serving: Path) -> dict[str, str]:
    """Every process a restore makes inherits the marker (CRIU restores the environment the
    captured server started with), so leftovers are found whatever their command lines say."""
    return {**PRISTINE_ENV, MARKER: marker, "COLDSNAP_SERVING_DIR": str(serving)}


def _cli(*args: str, marker: str, serving: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coldsnap.cli", *args],
        capture_output=True,
        text=True,
        timeout=540,
        env=_env(marker, serving),
    )


def _forwarders(ports: list[int], *, nsenter: bool = False) -> list[int]:
    """Forwarders of one of `ports` (their command line names the forwarder and the port; they
    run without the marker: the driver starts them with a bare environment), and with
    `nsenter` the `nsenter` that waits for each."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE or len(cmdline) < 2:
            continue
        if proc.info["name"] == "nsenter" and not nsenter:
            continue
        if any(a.endswith("_forward_child.py") for a in cmdline) and cmdline[-1] in map(str, ports):
            found.append(proc.info["pid"])
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_one_capsule_serves_three_times_at_once_and_each_stops_alone(
    cli_capsule: CliCapsule, tiny_cold: list[tuple[int, ...]], tmp_path: Path
) -> None:
    marker, serving = cli_capsule.marker, tmp_path / "serving"
    store = str(cli_capsule.own_store(tmp_path))
    names = ["tiny", "tiny-2", "tiny-3"]
    ports = [free_port() for _ in names]
    try:
        # All three at once: CRIU restores them one after another (the image's files are put
        # back at shared paths), everything before and after runs side by side.
        restores = []
        flags = [[], ["--replica"], ["--replica"]]
        for name, port, replica in zip(names, ports, flags, strict=True):
            args = ["restore", "tiny", "--store", store, "--port", str(port),
                    "--serve-as", name, *replica]  # fmt: skip
            restores.append(subprocess.Popen(
                [sys.executable, "-m", "coldsnap.cli", *args], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=_env(marker, serving),
            ))  # fmt: skip
        results = []
        for popen in restores:
            out, err = popen.communicate(timeout=540)
            assert popen.returncode == 0, out[-4000:] + err[-2000:]
            results.append(_last_json(out))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        assert [r["url"] for r in results] == urls
        assert len({r["pid"] for r in results}) == 3
        for url in urls:
            assert answers(url) == tiny_cold, f"{url} answers unlike the cold start"
        assert len(_forwarders(ports)) == 2, "a replica has no forwarder, or more than one"
        facts = [json.loads((Path(r["workdir"]) / "receipt.json").read_text())["facts"]
                 for r in results]  # fmt: skip
        own_dirs = [f["runtime_dir"] for f in facts]
        assert own_dirs[0] == facts[0]["capsule"]["runtime_dir"]
        assert len(set(own_dirs)) == 3 and all(Path(d).is_dir() for d in own_dirs)

        listed = _cli("status", "--json", marker=marker, serving=serving)
        assert listed.returncode == 0, listed.stderr
        rows = {row["name"]: row for row in json.loads(listed.stdout)}
        assert set(rows) == set(names)
        for name, url, result in zip(names, urls, results, strict=True):
            row = rows[name]
            assert row["running"] and row["url"] == url and row["pid"] == result["pid"], row

        stopped = _cli("stop", "tiny-2", marker=marker, serving=serving)
        assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
        assert _port_free(ports[1]) and _forwarders(ports) != [] and not _forwarders(ports[1:2])
        for url in (urls[0], urls[2]):
            assert answers(url) == tiny_cold, f"{url} stopped serving with tiny-2"
        rows = {row["name"]: row for row in json.loads(
            _cli("status", "--json", marker=marker, serving=serving).stdout)}  # fmt: skip
        assert set(rows) == {"tiny", "tiny-3"} and all(r["running"] for r in rows.values())

        ended = _cli("stop", "tiny", marker=marker, serving=serving)  # the plain restore
        assert ended.returncode == 0, ended.stdout[-2000:] + ended.stderr[-2000:]
        assert answers(urls[2]) == tiny_cold, "tiny-3 stopped serving with tiny"
        # The last one's tree is killed first: its stop then ends a replica that is gone (what
        # is left of it: forwarder, runtime dir, serving record) without SGLang's drain.
        kill_tree(results[2]["pid"])
        ended = _cli("stop", "tiny-3", marker=marker, serving=serving)
        assert ended.returncode == 0, ended.stdout[-2000:] + ended.stderr[-2000:]
        assert not marked_pids(marker), "a stop left engine processes running"
        assert not _forwarders(ports, nsenter=True), "a stop left a forwarder running"
        assert all(_port_free(port) for port in ports)
        assert not [d for d in own_dirs if os.path.exists(d)], "a runtime dir is left"
        assert "nothing serving" in _cli("status", marker=marker, serving=serving).stdout
    finally:
        for pid in marked_pids(marker) + _forwarders(ports, nsenter=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

"""The command line as a user runs it, from a shell that has not been readied for SGLang:
`coldsnap demo` once (a real cold start, capture and restore of a tiny SGLang server; it prints
the times, their ratio and the capsule size, and leaves nothing behind), and README's "Capture
your own server": `coldsnap capture -- python -m sglang.launch_server ... --port P` (its request
file printed and planned), `restore --port` another port, answers equal to a cold start's,
`sleep` (memory freed, health gated) and `wake` (answers equal again), `ls`, `status`, `stop`;
a second restore with neither --port nor --host comes back on the captured command line's
--port, its `--json` events schema'd; then `rm` and `gc`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import uuid
from pathlib import Path

import jsonschema
import pytest

from tests._support import free_port

from .conftest import CliCapsule, marked_pids, run_cli

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]


def _figure(label: str, unit: str, text: str) -> float:
    match = re.search(rf"^{label}\s+([0-9.]+)\s*{unit}\s*$", text, re.MULTILINE)
    assert match, f"no '{label}' line in:\n{text}"
    return float(match[1])


def test_the_demo_prints_cold_start_restore_and_their_ratio(e2e_ready: None) -> None:
    marker = uuid.uuid4().hex
    done = run_cli("demo", marker=marker)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-4000:]
    cold = _figure("cold start to first answer", "s", out)
    restore = _figure("restore to first answer", "s", out)
    ratio = _figure("ratio", "x", out)
    capsule = _figure("capsule size", "MB", out)
    assert cold > 0 and restore > 0 and capsule > 0
    assert ratio == pytest.approx(cold / restore, rel=0.02, abs=0.06)  # printed rounded
    assert "equal to the cold start's token for token" in out
    workdir = re.search(r"^work directory: (\S+)$", out, re.MULTILINE)
    assert workdir, out
    assert not Path(workdir[1]).exists(), "the demo left its work directory behind"
    assert not marked_pids(marker), "the demo left processes running"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_capture_your_own_server_restore_it_on_your_port_then_stop_and_gc(
    cli_capsule: CliCapsule, tiny_cold: list[tuple[int, ...]], tmp_path: Path
) -> None:
    """README's "Capture your own server": a plain launch command line with the user's --port
    (conftest's `cli_capsule`, the session's one capture of it, whose output is checked here),
    restored on another port given at restore; ls, status, stop, rm and gc on a copy of its
    store. The cold answers are conftest's `tiny_cold` (the same model, seed 0)."""
    from .conftest import answers

    expected = tiny_cold
    capsule = cli_capsule
    marker, launch, user_port = capsule.marker, list(capsule.launch), capsule.user_port
    store = str(tmp_path / "store")
    serving = {"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")}
    port = free_port()
    printed = run_cli(
        "capture", "--print-request", "--name", "tiny", "--store", store, "--", *launch,
        marker=marker,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    request = json.loads(printed.stdout)
    assert request["kind"] == "coldsnap.capture-request" and request["engine_args"] == []
    assert f"restores serve on your 127.0.0.1:{user_port}" in printed.stderr
    assert request["serve_port"] == user_port
    (tmp_path / "capture.json").write_text(printed.stdout)
    planned = run_cli("plan", str(tmp_path / "capture.json"), marker=marker)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert not Path(request["workdir"]).exists(), "plan started the operation"

    done = capsule.done
    assert json.loads(done.stdout.strip().splitlines()[-1])["outcome"] == "done"
    assert not capsule.left_running, "the capture left its source running"
    capsule.own_store(tmp_path)
    try:
        restored = run_cli("restore", "tiny", "--store", store, "--port", str(port), marker=marker,
                        env=serving)  # fmt: skip
        assert restored.returncode == 0, restored.stdout[-4000:] + restored.stderr[-2000:]
        result = json.loads(restored.stdout.strip().splitlines()[-1])
        url = f"http://127.0.0.1:{port}"
        assert result["url"] == url and result["name"] == "tiny"
        assert f"serving tiny at {url} (pid {result['pid']})" in restored.stdout
        assert answers(url) == expected, "the restored server answers unlike the cold start"
        assert _port_free(user_port)

        slept = run_cli("sleep", "--json", "tiny", marker=marker, env=serving)
        assert slept.returncode == 0, slept.stdout + slept.stderr[-2000:]
        freed = json.loads(slept.stdout.strip().splitlines()[-1])["result"]["sleep_record"]
        assert freed["host_bytes"] > 0 and freed["healthy_while_asleep"] is False, freed
        assert freed["exported"] is False, "the sleep wrote another copy of the weights"
        asleep = json.loads(run_cli("status", "--json", "tiny", marker=marker, env=serving).stdout)
        assert asleep["sleep"] == "asleep" and asleep["running"], asleep
        woke = run_cli("wake", "tiny", marker=marker, env=serving)
        assert woke.returncode == 0, woke.stdout + woke.stderr[-2000:]
        assert answers(url) == expected, "after wake the server answers unlike the cold start"

        listed = run_cli("ls", "--store", store, marker=marker)
        assert listed.returncode == 0 and "tiny" in listed.stdout, listed.stderr
        status = run_cli("status", "--json", "tiny", marker=marker, env=serving)
        assert status.returncode == 0, status.stderr
        state = json.loads(status.stdout)
        assert state["running"] and state["listening"] and state["url"] == url
        assert state["pid"] == result["pid"] and state["state"] == "done"

        stopped = run_cli("stop", "tiny", marker=marker, env=serving)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped tiny (pid {result['pid']}" in stopped.stdout
        assert not marked_pids(marker), "stop left engine processes running"
        assert _port_free(port)
        after = run_cli("status", "--json", result["workdir"], marker=marker, env=serving)
        assert after.returncode == 0 and not json.loads(after.stdout)["running"], after.stderr
        assert "nothing serving" in run_cli("status", marker=marker, env=serving).stdout

        # What `coldsnap stop` ended are zombies of this process until reaped, holding the
        # image's PIDs (conftest's CliCapsule.own_store says why).
        from coldsnap.backends import reap_children
        from coldsnap.backends.procs import kill_tree

        reap_children()
        again = run_cli("restore", "tiny", "--store", store, "--json", marker=marker, env=serving)
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
        events = [json.loads(line) for line in again.stdout.strip().splitlines()]
        schema = json.loads(run_cli("schema", "event", marker=marker).stdout)
        for event in events:
            jsonschema.validate(event, schema)
        assert {"step_started", "step_ended"} <= {e["event"] for e in events}
        assert events[-1]["event"] == "finished" and events[-1]["status"] == "done"
        assert events[-1]["result"]["url"] == f"http://127.0.0.1:{user_port}"
        assert answers(events[-1]["result"]["url"]) == expected
        # This one's tree is killed first (the graceful stop is checked above): the stop then
        # ends an engine that is gone, without SGLang's drain.
        kill_tree(events[-1]["result"]["pid"])
        assert run_cli("stop", "tiny", marker=marker, env=serving).returncode == 0
        assert not marked_pids(marker), "stop left engine processes running"

        removed = run_cli("rm", "tiny", "--store", store, marker=marker)
        assert removed.returncode == 0, removed.stderr
        assert re.search(r"^freed [1-9][0-9]* objects", removed.stdout, re.M), removed.stdout
        collected = run_cli("gc", "--store", store, "--grace", "0", marker=marker)
        assert collected.returncode == 0, collected.stderr
        assert re.search(r"gc: removed [0-9]+ objects", collected.stdout), collected.stdout
        assert "no capsules" in run_cli("ls", "--store", store, marker=marker).stdout
    finally:
        for pid in marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp_path / "store", ignore_errors=True)

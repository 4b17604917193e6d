"""SGLang 0.5.17 (the overlay of scripts/setup.sh sglang-0517) captured and restored through
`Machine` (n610, native) with exact tokens.

The orchestrator takes the engine's identity and the plugin digest in its own process, so the
whole operation runs in a child started with the 0.5.17 overlay on PYTHONPATH
(`release_env("0.5.17")`) and the test engine `sglang-0.5.17` registered
(`coldsnap.testing.sglang_cpu.register_release_engine`): its launcher serves the overlay. The
child answers with JSON; one server runs at a time and each is stopped before the next starts.
The cold start is the capture's own engine, started from nothing by the capture's launch
command and asked right after it is healthy, before anything is released (as conftest's
`ask_when_healthy` does in this process): a server start of its own would add half a minute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._support import missing

from .conftest import MAX_NEW_TOKENS, PROMPTS

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]

RELEASE = "0.5.17"

_CHILD = """
import json, shutil, sys
from pathlib import Path

from coldsnap import REGISTRY, CaptureRequest, Machine, ModelRef, RestoreRequest
from coldsnap.backends.procs import kill_tree
from coldsnap.engines import EngineClient
from coldsnap.engines.sglang import SGLANG_POLICY, installed_sglang
from coldsnap.machine import JOURNAL_NAME, Replay, read_journal
from coldsnap.plugin import plugin_digest
from coldsnap.testing.sglang_cpu import register_release_engine

model_path, base, release, prompts, max_new = sys.argv[1:6]
base, prompts, max_new = Path(base), json.loads(prompts), int(max_new)


def answers(url):
    # The prefix cache flushed before each prompt and after the last: no answer comes from a
    # cache the other side did not have.
    with EngineClient(url, SGLANG_POLICY) as client:
        out = []
        for p in prompts:
            client.flush_cache_when_idle()
            out.append(list(client.generate(p, max_new_tokens=max_new).token_ids))
        client.flush_cache_when_idle()
        return out


out = {"cold": None, "cold_error": "the capture's engine was never seen healthy"}


def ask_when_healthy(event):
    # The reference: the capture's engine, healthy, before anything is released.
    if (event.step, event.phase) != ("wait_healthy", "done"):
        return
    try:
        facts = Replay.of(read_journal(base / "cap" / JOURNAL_NAME)).facts
        out["cold"], out["cold_error"] = answers(facts["engine_url"]), None
    except Exception as exc:  # reported by the test, not swallowed
        out["cold_error"] = repr(exc)


engine = register_release_engine(REGISTRY, release)
model = ModelRef(id="tiny-llama", revision="r1", path=model_path)
capture = CaptureRequest(driver="n610", provider="native", model=model, engine=engine,
                         workdir=str(base / "cap"), store=str(base / "store"), name="c0517")
receipt = Machine.for_request(capture, subscribers=[ask_when_healthy]).capture(capture)
out["capture"] = {"ok": receipt.ok, "error": str(receipt.error),
                  "acceptance": receipt.facts.get("acceptance_tokens")}
build = installed_sglang()
out["identity"] = [build.engine, build.version, build.contract]
out["plugin_digest"] = plugin_digest()
out["restores"] = []
if receipt.ok:
    for attempt in range(2):
        restore = RestoreRequest(driver="n610", provider="native", model=model, engine=engine,
                                 artifact="c0517", workdir=str(base / f"res-{attempt}"),
                                 store=str(base / "store"))
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        item = {"ok": restored.ok, "error": str(restored.error), "steps": restored.timings()}
        if restored.ok:
            try:
                item["answers"] = answers(restored.facts["engine_url"])
                item["acceptance"] = restored.facts.get("acceptance_tokens")
                item["engine_log"] = restored.facts.get("engine_log")
            finally:  # the second restore is killed at once: only the first's stop drains
                if attempt == 1:
                    kill_tree(int(restored.facts["engine_pid"]))
                machine.stop(restored)
        out["restores"].append(item)
print("COLDSNAP-E2E " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("e2e-0517")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def outcome(tiny_llama: Path, root: Path) -> dict[str, Any]:
    from coldsnap.testing.sglang_cpu import ReleaseNotInstalled, release_env

    try:
        env = release_env(RELEASE)
    except ReleaseNotInstalled as exc:
        missing("sglang", str(exc))
    args = [str(tiny_llama), str(root), RELEASE, json.dumps(PROMPTS), str(MAX_NEW_TOKENS)]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("COLDSNAP-E2E ")]
    assert done.returncode == 0 and lines, (done.stdout[-2000:], done.stderr[-4000:])
    return json.loads(lines[-1].removeprefix("COLDSNAP-E2E "))


def test_the_0517_capsule_restores_twice_with_the_cold_tokens(outcome: dict[str, Any]) -> None:
    from coldsnap.engines.sglang.cpu import activate
    from coldsnap.plugin import digest, plugin_digest

    activate()  # this process: the venv's SGLang 0.5.23
    name, version, contract = outcome["identity"]
    assert (name, version) == ("sglang", RELEASE)
    # The capsule binds 0.5.17's variants: neither digest is the venv's 0.5.23 one.
    assert contract != digest()
    assert outcome["plugin_digest"] != plugin_digest()
    assert outcome["capture"]["ok"], outcome["capture"]["error"]
    assert outcome["cold_error"] is None, outcome["cold_error"]
    assert len(outcome["cold"]) == len(PROMPTS) and all(outcome["cold"])
    assert len(outcome["restores"]) == 2
    for attempt, restored in enumerate(outcome["restores"]):
        assert restored["ok"], (attempt, restored["error"])
        assert restored["answers"] == outcome["cold"], attempt
        assert restored["acceptance"] == outcome["capture"]["acceptance"], attempt
        # No /ready in 0.5.17: /ping once the gate opened, not /health's one-second sleep.
        print(f"restore {attempt} steps: {restored['steps']}")
        assert restored["steps"]["wait_healthy"] < 0.5, restored["steps"]

"""A real SGLang server (tiny Qwen3, tied embeddings; tiny Llama on 0.5.17) with the plugin:
hooks land in the main and scheduler processes, storages are registered, release/resume with
native hydration and with recovery give the cold server's tokens and bit-exact weights, failures
fail closed, and a release that fails part way followed by the orchestrator's compensation
(run twice, as a resumed operation would) leaves the server answering as before. Every test
runs against SGLang 0.5.23 (the venv's) and 0.5.17 (the overlay of scripts/setup.sh
sglang-0517), one server at a time: the plugin hooks each release's contract variants.

The servers recast their rotary cache at its first use, after the model was registered
(tests/plugin/sglang_test_plugin, what SGLang does on AMX CPUs and in its CUDA fallback):
every release here registers the model as it serves and frees, exports and refills that. The
module's server is released once as a capture's release is (the only one that exports: a
process refilled from a payload exports no second copy); every test refills from that payload.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from coldsnap._wire import ResumePlan, write_plan
from coldsnap.engines import EngineClient, EngineError
from coldsnap.engines.sglang import SGLANG_POLICY
from tests._support import missing

from .conftest import (
    generate_all,
    plugin_env,
    read_status,
    scheduler_process,
    stop_now,
    with_test_plugin,
)

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.xdist_group("host")]
RELEASES = ("0.5.23", "0.5.17")


@attrs.define
class Served:
    server: Any
    client: EngineClient
    runtime: Path
    artifacts: Path
    model: Any
    cold: dict[str, tuple[int, ...]]
    checksum: dict[str, Any]
    acceptance: tuple[int, ...]
    release: str
    payload: str  # the export of the capture-like first release
    pause_fault: Path  # the test plugin's fault file


@pytest.fixture(scope="module", params=RELEASES)
def served(
    request: pytest.FixtureRequest,
    sglang_cpu: None,
    models_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    from coldsnap.testing.sglang_cpu import ReleaseNotInstalled, release_overlay, start_server
    from coldsnap.tiny_models import build_model

    release = request.param
    try:
        release_overlay(release)
    except ReleaseNotInstalled as exc:
        missing("sglang", str(exc))

    # 0.5.17's Qwen3 has no get_weights_by_name (its weights are compared through it): Llama.
    arch = "llama" if release == "0.5.17" else "qwen3"
    model = build_model(models_root / f"{arch}-tiny-seed1", arch=arch, size="tiny", seed=1)
    base = tmp_path_factory.mktemp(f"tiny-server-{release}")
    env = plugin_env(
        base / "run",
        COLDSNAP_EXPORT_MODEL_PAYLOAD="1",
        COLDSNAP_ARTIFACT_DIR=str(base / "art"),
        COLDSNAP_SHAPE_CALIBRATION="record",
        COLDSNAP_ASYNC_CUDA_GRAPHS="1",
    )
    env = with_test_plugin(env, release, base / "pause-fault")
    server = start_server(model.path, log_path=base / "server.log", env=env, release=release)
    client = EngineClient(server.url, SGLANG_POLICY)
    try:
        cold = generate_all(client)
        checksum = weights_fingerprint(client, server.url, release)
        acceptance = client.acceptance_tokens()
        client.release()
        payload = str(read_status(base / "run", "scheduler-tp0")["export"]["root"])
        write_plan(base / "run", ResumePlan(source="payload", payload_dir=payload))
        client.resume()
        yield Served(
            server,
            client,
            base / "run",
            base / "art",
            model,
            cold,
            checksum,
            acceptance,
            release,
            payload,
            base / "pause-fault",
        )
    finally:
        client.close()
        stop_now(server)


# 0.5.17's /weights_checker needs CUDA; there the weights are compared through
# /get_weights_by_name (whole tensors, the fused ones through their shards) instead.
COMPARED_WEIGHTS = (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
)


def weights_fingerprint(client: EngineClient, url: str, release: str) -> dict[str, Any]:
    if release != "0.5.17":
        return client.weights_checksum()
    import httpx

    values = {}
    for name in COMPARED_WEIGHTS:
        reply = httpx.post(
            f"{url}/get_weights_by_name",
            json={"name": name, "truncate_size": 1 << 30},
            timeout=60,
        )
        reply.raise_for_status()
        values[name] = reply.json()
    return {"by_name": values}


def release_exported(s: Served) -> str:
    """Releases everything; returns the payload of the module's first release to refill from."""
    s.client.release()
    assert s.client.health() is False
    if s.release != "0.5.17":  # 0.5.17 has no /ready
        assert s.client.ready() is False
    status = read_status(s.runtime, "scheduler-tp0")
    assert status["outcome"] == "ok" and status["released_tags"] == [
        "cuda_graph",
        "kv_cache",
        "weights",
    ]
    assert status["export"] is None  # refilled from a payload: no second copy
    return s.payload


def assert_like_cold(s: Served) -> None:
    assert s.client.health() is True
    assert generate_all(s.client) == s.cold
    s.client.accept(s.acceptance)
    checksum = weights_fingerprint(s.client, s.server.url, s.release)
    if s.release == "0.5.17":
        assert checksum == s.checksum
        return
    assert checksum["per_engine_checksum"] == s.checksum["per_engine_checksum"]
    assert checksum["ranks"][0]["checksums"] == s.checksum["ranks"][0]["checksums"]


def test_hooks_landed_in_main_and_scheduler(served: Served) -> None:
    from coldsnap.plugin import CONTRACTS, Settings, StatusFile, digest
    from coldsnap.plugin._auth import AUTH_TARGET
    from coldsnap.plugin._gate import STATE_FIELD_CONTRACT, STATUS_GUARD_TARGET, HealthGate
    from coldsnap.plugin._scheduler import FINALIZE_CONTRACT, SchedulerHooks

    main = read_status(served.runtime, "main")
    sched = read_status(served.runtime, "scheduler-tp0")
    assert main["pid"] == served.server.pid
    assert sched["pid"] == scheduler_process(served.server.pid).pid
    # The variants in use, as the server's own processes admitted them.
    for c in CONTRACTS:
        seen = {alt.seen_in: f"{alt.seen_in}:{alt.variant}" for alt in c.alternatives()}
        want = seen.get(served.release, seen["0.5.23"])
        assert main["contract_variants"][c.key] == sched["contract_variants"][c.key] == want
    assert main["contract_digest"] == sched["contract_digest"]
    assert main["plugin_digest"] == sched["plugin_digest"]
    gate = HealthGate(StatusFile(None, "x", {}), None)
    hooks = SchedulerHooks(Settings(), StatusFile(None, "x", {}))
    # The gate's and the scheduler's own hooks come first (the CUDA release module's, if any,
    # follow them; the status guard comes last).
    gate_hooks = [t for t, _, _ in gate.targets()]
    sched_hooks = [t for t, _, _ in hooks.targets()]
    assert AUTH_TARGET in main["hooks"] and AUTH_TARGET not in sched["hooks"]  # the key check
    if served.release == "0.5.23":  # this process runs 0.5.23 too
        assert main["hooks"][: len(gate_hooks)] == gate_hooks
        assert sched["hooks"][: len(sched_hooks)] == sched_hooks
        assert main["contract_digest"] == digest()
        assert FINALIZE_CONTRACT in sched["hooks"]
        assert STATE_FIELD_CONTRACT in main["hooks"] and STATUS_GUARD_TARGET not in main["hooks"]
    else:
        assert main["hooks"][:2] == gate_hooks[:2] and main["hooks"][-1] == STATUS_GUARD_TARGET
        assert STATE_FIELD_CONTRACT not in main["hooks"]
        expected = [t for t in sched_hooks if t != FINALIZE_CONTRACT]
        assert sched["hooks"][: len(expected)] == expected
        assert FINALIZE_CONTRACT not in sched["hooks"]
        assert main["contract_digest"] != digest()


def test_final_storages_are_registered(served: Served) -> None:
    reg = read_status(served.runtime, "scheduler-tp0")["registered"]
    assert list(reg) == ["target"]
    # SGLang fuses q/k/v and gate/up and keeps one tied head: about the checkpoint's bytes.
    weight_bytes = served.model.weight_bytes
    assert weight_bytes <= reg["target"]["parameter_nbytes"] <= 1.02 * weight_bytes
    if served.release != "0.5.17":
        checksums = served.checksum["ranks"][0]["checksums"]
        assert reg["target"]["tensors"] >= len(checksums) > 0
    assert reg["target"]["devices"] == ["cpu"]


def test_async_decode_graph_and_shape_plan_on_cpu(served: Served) -> None:
    # Served eagerly first; at the first idle boundary after a request the decode graph capture
    # ran (on CPU without torch.compile SGLang captures none), then the plan was calibrated.
    sched = read_status(served.runtime, "scheduler-tp0")
    events = [e["event"] for e in sched["events"]]
    assert events.index("decode_graph_deferred") < events.index("decode_graph_captured")
    assert sched["async_decode_graph"]["capture_bs"] == []
    calibration = sched["shape_calibration"]
    assert (calibration["outcome"], calibration["error"]) == ("ok", None)
    disabled = {"backend": "disabled", "shapes": []}
    assert calibration["coverage"] == {"device": "cpu", "decode": disabled, "prefill": disabled}
    assert calibration["phases"]["prefill"] == {"backend": "disabled", "planned": [], "warmed": []}
    assert (served.runtime / "shape-plan.json").exists()


def test_native_release_and_hydration_are_bit_exact(served: Served) -> None:
    root = release_exported(served)
    write_plan(served.runtime, ResumePlan(source="payload", payload_dir=root))
    served.client.resume()
    detail = read_status(served.runtime, "scheduler-tp0")["resume"]
    assert detail["source"] == "payload" and detail["storages_unchanged"] is True
    assert detail["hydrated"]["target"]["verify_seconds"] > 0
    assert_like_cold(served)


def test_recovery_through_update_weights_from_disk(served: Served) -> None:
    release_exported(served)
    write_plan(served.runtime, ResumePlan(source="checkpoint", checkpoint=str(served.model.path)))
    served.client.resume()
    detail = read_status(served.runtime, "scheduler-tp0")["resume"]
    assert detail["loaded"] == {"target": str(served.model.path)}
    assert detail["second_phase"] == ["kv_cache", "cuda_graph"]
    assert_like_cold(served)


def test_resume_without_plan_is_refused_closed_and_retryable(served: Served) -> None:
    root = release_exported(served)
    (served.runtime / "resume-plan.json").unlink()
    with pytest.raises(EngineError, match="no resume plan"):
        served.client.resume()
    assert served.client.health() is False
    write_plan(served.runtime, ResumePlan(source="payload", payload_dir=root))
    served.client.resume()
    assert_like_cold(served)


def test_damaged_payload_is_refused_before_memory_changes(served: Served, tmp_path: Path) -> None:
    root = Path(release_exported(served))
    damaged = tmp_path / "damaged"
    shutil.copytree(root, damaged)
    pack = next((damaged / "tp0" / "target").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))
    write_plan(served.runtime, ResumePlan(source="payload", payload_dir=str(damaged)))
    with pytest.raises(EngineError, match="refused"):
        served.client.resume()
    assert served.client.health() is False
    assert read_status(served.runtime, "scheduler-tp0")["released_tags"] == [
        "cuda_graph",
        "kv_cache",
        "weights",
    ]
    write_plan(served.runtime, ResumePlan(source="payload", payload_dir=str(root)))
    served.client.resume()
    assert_like_cold(served)


def test_a_release_frees_and_refills_the_model_as_it_serves(served: Served) -> None:
    """The rotary cache was recast after registration: the module's first release registered
    the model again, naming the cache, instead of refusing; a release and a refill from that
    payload answer as before."""
    events = read_status(served.runtime, "scheduler-tp0")["events"]
    moved = [m for e in events if e["event"] == "reregistered"
             for m in e["registered"]["target"]["moved"]]  # fmt: skip
    assert any(m.startswith("'model.layers.0.self_attn.rotary_emb.cos_sin_cache' dtype float32 "
                            "-> bfloat16") for m in moved), moved  # fmt: skip
    write_plan(served.runtime, ResumePlan(source="payload", payload_dir=release_exported(served)))
    served.client.resume()
    assert_like_cold(served)


def test_a_release_failed_part_way_then_compensated_twice_leaves_the_server_answering(
    served: Served,
) -> None:
    """The release fails after SGLang marked every region released, at the KV cache's pause
    (the test plugin's fault): the scheduler lives on and says so, with only the KV cache left
    marked (the weights' pause never began). The capture's compensation (resume the weights and
    the KV cache from the checkpoint) brings the engine back; run again, as an interrupted
    operation's resume does, it resumes nothing that is not released."""
    from coldsnap._wire import CUDA_GRAPH, KV_CACHE, WEIGHTS

    served.pause_fault.write_text(KV_CACHE)
    with pytest.raises(EngineError, match="release"):
        served.client.release([KV_CACHE, WEIGHTS])
    assert not served.pause_fault.exists()  # the fault fired
    status = read_status(served.runtime, "scheduler-tp0")
    assert status["outcome"] == "failed" and "pause(kv_cache) failed" in status["error"]
    assert "release_failed_part_way" in [e["event"] for e in status["events"]]
    assert status["released_tags"] == [KV_CACHE]
    plan = ResumePlan(source="checkpoint", checkpoint=str(served.model.path))
    for attempt in range(2):
        write_plan(served.runtime, plan)
        served.client.resume([WEIGHTS, KV_CACHE])
        status = read_status(served.runtime, "scheduler-tp0")
        assert (status["outcome"], status["released_tags"]) == ("ok", []), attempt
        assert_like_cold(served)
    resumes = [e["event"] for e in status["events"] if e["event"].startswith("resume")]
    assert resumes[-1] == "resume_nothing_released", resumes
    served.client.resume([CUDA_GRAPH])  # nothing was released: answered, not refused
    assert_like_cold(served)


def test_restore_mode_startup_hydrates_a_dummy_loaded_engine(
    served: Served, tmp_path: Path
) -> None:
    """The n580 native path: a new engine allocates without the checkpoint (dummy load) and the
    plugin hydrates it from the payload before it serves; its tokens equal the cold server's."""
    from coldsnap.testing.sglang_cpu import start_server

    root = release_exported(served)
    served.client.close()
    stop_now(served.server)
    env = plugin_env(
        tmp_path / "run",
        COLDSNAP_MODE="restore",
        COLDSNAP_SGLANG_STARTUP_SOURCE="payload",
        COLDSNAP_ARTIFACT_DIR=root,
    )
    env = with_test_plugin(env, served.release, tmp_path / "pause-fault")  # computes alike
    with (
        start_server(
            served.model.path,
            log_path=tmp_path / "server.log",
            env=env,
            extra_args=("--load-format", "dummy"),
            release=served.release,
        ) as server,
        EngineClient(server.url, SGLANG_POLICY) as client,
    ):
        sched = read_status(tmp_path / "run", "scheduler-tp0")
        assert sched["startup_hydration"]["target"]["nbytes"] > 0
        assert generate_all(client) == served.cold
        client.accept(served.acceptance)
        stop_now(server)

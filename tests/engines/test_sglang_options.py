"""SGLang's engine options: each key accepted and refused by name, at the registry's check
before anything is built; each reaching the engine's environment explicitly, whatever the
orchestrator's environment holds; each bound by the capsule and compared at admission."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap._wire import EngineSettings
from coldsnap.engines.sglang import (
    GRAPH_SAVER_ENV,
    OPTIONS,
    EngineOptionsError,
    SGLangCommandLine,
    SGLangLauncher,
    SGLangOptions,
    check_engine_options,
    parse_options,
)
from coldsnap.machine import REGISTRY, CaptureRequest, ModelRef, RequestError, WeightSource

FROM_CHECKPOINT = WeightSource(source="checkpoint", checkpoint="/models/m")

# key -> (a value it takes, what that parses to, a value it refuses, words of the refusal)
CASES: dict[str, tuple[str, Any, str, str]] = {
    "live_backing": ("cpu", "cpu", "ram", "is not one of: discard, cpu, disk"),
    "process_artifact_root": ("/var/tmp/x", "/var/tmp/x", "rel/x", "is not an absolute path"),
    "keep_residual": ("off", False, "maybe", "is not a boolean"),
    "recovery_load_format": ("pt", "pt", "gguf", "is not one of: auto, safetensors, pt"),
    "rank_timeout_s": ("12.5", 12.5, "-1", "is not a number of seconds"),
    "cuda_graphs_in_saver": ("1", True, "", "is empty"),
}


def test_every_option_has_a_case() -> None:
    assert set(CASES) == set(OPTIONS) == {f.name for f in SGLangOptions.__attrs_attrs__}


@pytest.mark.parametrize("key", sorted(CASES))
def test_each_option_is_taken_and_refused_by_its_key(key: str) -> None:
    good, parsed, bad, why = CASES[key]
    assert check_engine_options({key: good}) == []
    assert getattr(parse_options({key: good}), key) == parsed
    problems = check_engine_options({key: bad})
    assert [field for field, _ in problems] == [f"engine_options.{key}"]
    assert why in problems[0][1]
    with pytest.raises(EngineOptionsError, match=f"engine_options.{key}: "):
        parse_options({key: bad})


def test_an_unknown_option_and_a_disk_backing_without_its_root_are_refused() -> None:
    problems = check_engine_options({"live_backin": "cpu"})
    assert problems[0][0] == "engine_options.live_backin"
    assert "is not an option of SGLang (known: live_backing," in problems[0][1]
    assert check_engine_options({"live_backing": "disk"}) == [
        ("engine_options.process_artifact_root",
         "is needed with live_backing disk (where the pack is written)")
    ]  # fmt: skip
    assert check_engine_options({"live_backing": "disk", "process_artifact_root": "/x"}) == []


def test_the_registry_refuses_a_bad_option_naming_it_before_building(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    request = CaptureRequest(
        driver="n610", provider="native", workdir=str(tmp_path / "cap"),
        store=str(tmp_path / "store"), model=ModelRef(id="m", revision="r", path=str(model)),
        engine_options={"keep_residual": "maybe", "rank_timeout_s": "5"},
    )  # fmt: skip
    with pytest.raises(RequestError) as info:
        REGISTRY.check(request)
    assert info.value.fields == ("engine_options.keep_residual",)


def test_a_request_takes_options_only_as_strings(tmp_path: Path) -> None:
    from coldsnap.machine import parse_request

    data = {"kind": "coldsnap.capture-request", "driver": "n610", "provider": "native",
            "model": {"id": "m", "revision": "r", "path": str(tmp_path)},
            "workdir": str(tmp_path / "cap"), "store": str(tmp_path / "store"),
            "engine_options": {"rank_timeout_s": 5}}  # fmt: skip
    with pytest.raises(RequestError, match="engine_options"):
        parse_request(data)
    data["engine_options"] = {"rank_timeout_s": "5"}
    assert parse_request(data).engine_options == {"rank_timeout_s": "5"}


def _command(options: dict[str, str], base_env: dict[str, str] | None = None) -> dict[str, str]:
    request = SimpleNamespace(
        operation="capture", model=SimpleNamespace(path="/models/m"), tp=1, engine_args=()
    )
    launcher = SGLangLauncher((), base_env, options=parse_options(options))
    command = launcher.command(request, Path("/nonexistent"), weights=FROM_CHECKPOINT)
    runtime = EngineSettings.from_env(command.env).runtime_dir
    assert runtime is not None
    shutil.rmtree(runtime)
    return dict(command.env)


def test_every_option_reaches_the_engine_and_the_orchestrators_own_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ambient = {
        "COLDSNAP_LIVE_BACKING": "disk",
        "COLDSNAP_PROCESS_ARTIFACT_ROOT": "/var/tmp/ambient",
        "COLDSNAP_KEEP_RESIDUAL": "0",
        "COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT": "pt",
        "COLDSNAP_RANK_TIMEOUT_S": "7",
        GRAPH_SAVER_ENV: "1",
    }
    for name, value in ambient.items():
        monkeypatch.setenv(name, value)

    # what the drivers start: this process's environment under the command's
    defaults = EngineSettings.from_env({**os.environ, **_command({})})
    assert (defaults.live_backing, defaults.process_artifact_root) == ("discard", None)
    assert defaults.keep_residual is True and defaults.recovery_load_format == "auto"
    assert defaults.rank_timeout_s == 300.0
    assert {**os.environ, **_command({})}[GRAPH_SAVER_ENV] == "0"
    chosen = {k: good for k, (good, _, _, _) in CASES.items() if k != "cuda_graphs_in_saver"}
    env = {**os.environ, **_command(chosen)}
    settings = EngineSettings.from_env(env)
    for key, (_, parsed, _, _) in CASES.items():
        if key == "process_artifact_root":
            assert settings.process_artifact_root == Path(parsed)
        elif key != "cuda_graphs_in_saver":
            assert getattr(settings, key) == parsed, key
    graphs = _command({"cuda_graphs_in_saver": "1"}, {GRAPH_SAVER_ENV: "1"})
    assert graphs[GRAPH_SAVER_ENV] == "1"


@pytest.mark.parametrize("key", sorted(CASES))
def test_each_option_is_bound_and_compared(key: str) -> None:
    good, parsed, _, _ = CASES[key]
    differ = SGLangCommandLine().engine_options_differences
    default = getattr(SGLangOptions(), key)
    extra = {"process_artifact_root": "/var/tmp/x"} if key == "live_backing" else {}
    assert differ({key: good, **extra}, {key: good, **extra}) == []
    found = differ({**extra}, {key: good, **extra})
    assert [(d.field, d.expected, d.found) for d in found] == [
        (f"engine_options.{key}", default, parsed)
    ]

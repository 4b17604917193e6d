"""The environment an SGLang engine is launched with sets the plugin's four request-borne settings
itself, each from the request, and states every COLDSNAP_* variable, so that nothing the
orchestrator's own environment holds decides one (the drivers launch with `{**os.environ,
**command.env}`):

- COLDSNAP_LIVE_BACKING: the engine option `live_backing` (default discard, what a capsule's
  capture releases to);
- COLDSNAP_PROCESS_ARTIFACT_ROOT: the engine option `process_artifact_root` (empty: none);
- COLDSNAP_ARTIFACT_PREVERIFIED: the weight source the provider staged (an n580 engine built
  from a payload the stage verified block by block does not verify it again at load);
- COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT: the load format the request's engine arguments load the
  checkpoint with (`--load-format`), or the engine option that names one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coldsnap._wire import VARIABLES, EngineSettings
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.engines.sglang._cmdline import EngineArgsError
from coldsnap.engines.sglang._launcher import coldsnap_env
from coldsnap.engines.sglang._options import parse_options
from coldsnap.machine import CaptureRequest, ModelRef, RestoreRequest, WeightSource

FROM_CHECKPOINT = WeightSource(source="checkpoint", checkpoint="/models/tiny")
EXPORT = WeightSource(source="payload")
STAGED = WeightSource(source="payload", payload_dir="/capsule/payload", preverified=True)
UNVERIFIED = WeightSource(source="payload", payload_dir="/capsule/payload", preverified=False)


def _model(tmp_path: Path) -> ModelRef:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    return ModelRef(id="tiny", revision="r1", path=str(model))


def capture(tmp_path: Path, *args: str) -> CaptureRequest:
    return CaptureRequest(driver="n580", provider="recovery", model=_model(tmp_path),
                          workdir=str(tmp_path / "cap"), store=str(tmp_path / "store"),
                          engine_args=args)  # fmt: skip


def restore(tmp_path: Path, *args: str) -> RestoreRequest:
    return RestoreRequest(driver="n580", provider="native", artifact="tiny", model=_model(tmp_path),
                          workdir=str(tmp_path / "rest"), store=str(tmp_path / "store"),
                          engine_args=args)  # fmt: skip


def env(
    request: Any, weights: WeightSource, options: dict[str, str] | None = None
) -> dict[str, str]:
    return coldsnap_env(request, weights, Path("/run/engine"), parse_options(options))


def engine_sees(launch_env: dict[str, str], inherited: dict[str, str]) -> EngineSettings:
    """What the plugin reads in an engine the drivers launch with this orchestrator env."""
    return EngineSettings.from_env({**inherited, **launch_env})


def test_every_variable_is_stated_so_none_is_inherited(tmp_path: Path) -> None:
    for request, weights in ((capture(tmp_path), FROM_CHECKPOINT), (restore(tmp_path), STAGED)):
        assert set(VARIABLES) <= set(env(request, weights))


def test_the_live_backing_comes_from_the_request(tmp_path: Path) -> None:
    inherited = {"COLDSNAP_LIVE_BACKING": "cpu"}  # a shell's leftover
    assert env(capture(tmp_path), FROM_CHECKPOINT)["COLDSNAP_LIVE_BACKING"] == "discard"
    assert engine_sees(env(capture(tmp_path), FROM_CHECKPOINT), inherited).live_backing == (
        "discard"
    )
    cpu = env(capture(tmp_path), FROM_CHECKPOINT, {"live_backing": "cpu"})
    assert cpu["COLDSNAP_LIVE_BACKING"] == "cpu"


def test_the_process_artifact_root_comes_from_the_request(tmp_path: Path) -> None:
    inherited = {"COLDSNAP_PROCESS_ARTIFACT_ROOT": str(tmp_path / "elsewhere")}
    none = env(capture(tmp_path), FROM_CHECKPOINT)
    assert none["COLDSNAP_PROCESS_ARTIFACT_ROOT"] == ""
    assert engine_sees(none, inherited).process_artifact_root is None
    root = str(tmp_path / "spill")
    disk = env(capture(tmp_path), FROM_CHECKPOINT,
               {"live_backing": "disk", "process_artifact_root": root})  # fmt: skip
    assert disk["COLDSNAP_PROCESS_ARTIFACT_ROOT"] == root
    assert engine_sees(disk, inherited).process_artifact_root == Path(root)


def test_preverified_says_what_the_stage_verified(tmp_path: Path) -> None:
    inherited = {"COLDSNAP_ARTIFACT_PREVERIFIED": "1"}  # a shell's leftover must not skip checks
    staged = env(restore(tmp_path), STAGED)
    assert staged["COLDSNAP_ARTIFACT_PREVERIFIED"] == "1"
    assert engine_sees(staged, {}).artifact_preverified is True
    for request, weights in (
        (restore(tmp_path), UNVERIFIED),
        (capture(tmp_path), FROM_CHECKPOINT),
        (capture(tmp_path), EXPORT),
    ):
        launched = env(request, weights)
        assert launched["COLDSNAP_ARTIFACT_PREVERIFIED"] == "0"
        assert engine_sees(launched, inherited).artifact_preverified is False


@pytest.mark.parametrize(
    ("args", "options", "expected"),
    [
        ((), {}, "auto"),
        (("--load-format", "safetensors"), {}, "safetensors"),
        (("--dtype", "bfloat16", "--load-format=pt"), {}, "pt"),
        (("--load-format", "safetensors"), {"recovery_load_format": "auto"}, "safetensors"),
        ((), {"recovery_load_format": "pt"}, "pt"),
        (("--load-format", "pt"), {"recovery_load_format": "pt"}, "pt"),
    ],
)
def test_a_recovery_reloads_the_way_the_request_loads(
    tmp_path: Path, args: tuple[str, ...], options: dict[str, str], expected: str
) -> None:
    inherited = {"COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT": "safetensors" if expected != "safetensors"
                 else "pt"}  # fmt: skip
    launched = env(capture(tmp_path, *args), FROM_CHECKPOINT, options)
    assert launched["COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT"] == expected
    assert engine_sees(launched, inherited).recovery_load_format == expected


def test_a_load_format_the_option_contradicts_is_refused_naming_both(tmp_path: Path) -> None:
    request = capture(tmp_path, "--load-format", "safetensors")
    differs = r"engine_options\.recovery_load_format: 'pt' differs"
    with pytest.raises(EngineArgsError, match=differs):
        env(request, FROM_CHECKPOINT, {"recovery_load_format": "pt"})


def test_a_checkpoint_no_recovery_can_reload_is_refused_only_where_one_would(
    tmp_path: Path,
) -> None:
    with pytest.raises(EngineArgsError, match="engine_args: --load-format gguf cannot be reloaded"):
        env(capture(tmp_path, "--load-format", "gguf"), FROM_CHECKPOINT)
    # An engine that exports a payload is restored from it; no recovery reads its checkpoint.
    exported = env(capture(tmp_path, "--load-format", "gguf"), EXPORT)
    assert exported["COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT"] == "auto"


def test_the_launch_command_carries_the_settings(tmp_path: Path) -> None:
    request = capture(tmp_path, "--load-format", "safetensors")
    launcher = SGLangLauncher(options=parse_options({"live_backing": "cpu"}))
    command = launcher.command(request, tmp_path, weights=FROM_CHECKPOINT)
    assert command.env["COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT"] == "safetensors"
    assert command.env["COLDSNAP_LIVE_BACKING"] == "cpu"
    assert command.env["COLDSNAP_ARTIFACT_PREVERIFIED"] == "0"
    assert command.env["COLDSNAP_PROCESS_ARTIFACT_ROOT"] == ""
    argv = list(command.argv)
    assert argv[argv.index("--load-format") + 1] == "safetensors"  # the engine loads so too

"""The launch of an SGLang engine that serves a speculative draft model of its own: STANDALONE
(SGLang 0.5.17's StandaloneWorkerV2 builds the draft's ModelRunner from
`--speculative-draft-model-path`, which it never defaults). The launcher adds that path from the
request's `draft`; a request that names the algorithm but no draft is refused naming the field
before anything starts. Without this an n580 restore whose request left out the draft (which
admission allows: an n610 image holds the draft) built an engine that SGLang could not start."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from coldsnap.engines.sglang import EngineArgsError, SGLangLauncher
from coldsnap.machine import ModelRef, WeightSource

SPEC = (
    "--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
)  # fmt: skip


def request(
    tmp_path: Path, operation: str, draft: ModelRef | None, args: tuple[str, ...]
) -> object:
    target = ModelRef(id="org/t", revision="t", path=str(tmp_path / "t"))
    return SimpleNamespace(
        operation=operation, model=target, draft=draft, tp=None, engine_args=args
    )


PAYLOAD = WeightSource(source="payload", payload_dir="/capsule/payload")
CHECKPOINT = WeightSource(source="checkpoint", checkpoint="/models/t")


@pytest.mark.parametrize(
    ("operation", "weights"),
    [("capture", CHECKPOINT), ("restore", PAYLOAD), ("restore", CHECKPOINT)],
)
@pytest.mark.parametrize(
    "algorithm",
    [
        SPEC[:2],
        ("--speculative-algorithm", "standalone"),  # SGLang upper-cases it
        ("--speculative-algorithm=Standalone",),
    ],
)
def test_a_standalone_draft_without_the_field_draft_is_refused(
    tmp_path: Path, operation: str, weights: WeightSource, algorithm: tuple[str, ...]
) -> None:
    args = (*algorithm, *SPEC[2:])
    with pytest.raises(EngineArgsError, match="draft") as err:
        SGLangLauncher().command(
            request(tmp_path, operation, None, args), tmp_path, weights=weights
        )
    assert "--speculative-algorithm" in str(err.value) and "'draft'" in str(err.value)


def test_with_its_draft_the_engine_is_given_the_drafts_path(tmp_path: Path) -> None:
    draft = ModelRef(id="org/d", revision="d", path=str(tmp_path / "d"))
    cmd = SGLangLauncher().command(
        request(tmp_path, "restore", draft, SPEC), tmp_path, weights=PAYLOAD
    )
    at = cmd.argv.index("--speculative-draft-model-path")
    assert cmd.argv[at + 1] == draft.path
    assert cmd.argv[cmd.argv.index("--load-format") + 1] == "dummy"  # the draft's too


def test_algorithms_without_a_draft_model_of_their_own_need_no_draft(tmp_path: Path) -> None:
    for args in ((), ("--speculative-algorithm", "NGRAM")):
        cmd = SGLangLauncher().command(
            request(tmp_path, "capture", None, args), tmp_path, weights=CHECKPOINT
        )
        assert "--speculative-draft-model-path" not in cmd.argv

"""A launch command line read into a capture request: what coldsnap takes out (--host, --port),
reads (--model-path, --tp-size) and refuses (naming the flag), and that every other flag goes
to the engine unchanged, in its order."""

from __future__ import annotations

import pytest

from coldsnap.cli._cmdline import CommandLineError, notice, parse_launch

LAUNCH = ["python", "-m", "sglang.launch_server"]


@pytest.mark.parametrize(
    "head",
    [
        ["python", "-m", "sglang.launch_server"],
        ["python3", "-m", "sglang.launch_server"],
        ["/opt/venv/bin/python3.11", "-m", "sglang.launch_server"],
        ["sglang", "serve"],
        ["/usr/local/bin/sglang", "serve"],
    ],
)
def test_each_launch_form_is_read(head: list[str]) -> None:
    line = parse_launch([*head, "--model-path", "/m", "--dtype", "bfloat16"])
    assert line.model_path == "/m" and line.engine_args == ("--dtype", "bfloat16")


def test_host_and_port_are_taken_out_and_other_flags_kept_in_order() -> None:
    args = ["--host", "0.0.0.0", "--model", "/m", "--port=30000", "--enable-metrics"]
    line = parse_launch([*LAUNCH, *args, "--tp-size", "2", "--mem-fraction-static=0.7"])
    assert (line.host, line.port, line.tp) == ("0.0.0.0", 30000, 2)
    assert line.engine_args == ("--enable-metrics", "--mem-fraction-static=0.7")


@pytest.mark.parametrize("flag", ["--tp", "--tp-size", "--tensor-parallel-size"])
def test_the_tp_size_becomes_the_request_s_tp(flag: str) -> None:
    line = parse_launch([*LAUNCH, "--model-path", "/m", f"{flag}=4", "--dtype", "half"])
    assert line.tp == 4 and line.engine_args == ("--dtype", "half")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--admin-api-key", "k"], "--admin-api-key"),
        (["--config", "c.yaml"], "--config"),
        (["--ssl-keyfile=k.pem"], "--ssl-keyfile"),
        (["--skip-tokenizer-init"], "--skip-tokenizer-init"),
        (["--dp-size", "2"], "--dp-size"),
        (["--pp-size=2"], "--pp-size"),
        (["--nnodes", "2"], "--nnodes"),
        (["--node-rank", "1"], "--node-rank"),
    ],
)
def test_flags_coldsnap_cannot_honour_are_refused_by_name(args: list[str], flag: str) -> None:
    with pytest.raises(CommandLineError) as caught:
        parse_launch([*LAUNCH, "--model-path", "/m", *args])
    assert [f for f, _ in caught.value.problems] == [flag]


def test_parallel_sizes_of_one_are_honoured() -> None:
    line = parse_launch([*LAUNCH, "--model-path", "/m", "--dp-size", "1", "--pp-size=1"])
    assert line.engine_args == ("--dp-size", "1", "--pp-size=1")


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(CommandLineError) as caught:
        parse_launch([*LAUNCH, "--admin-api-key", "k", "--dp-size", "2"])
    assert [f for f, _ in caught.value.problems] == ["--admin-api-key", "--dp-size",
                                                     "--model-path"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], "command"),
        (["sglang", "generate", "--model-path", "/m"], "command"),
        ([], "command"),
        ([*LAUNCH, "--model-path", "/m", "--port"], "--port"),
        ([*LAUNCH, "--model-path", "/m", "--tp-size", "two"], "--tp-size"),
    ],
)
def test_what_is_not_a_launch_command_line_is_refused(argv: list[str], field: str) -> None:
    with pytest.raises(CommandLineError) as caught:
        parse_launch(argv)
    assert caught.value.problems[0][0] == field


def test_the_notice_says_what_coldsnap_changed() -> None:
    plain = notice(parse_launch([*LAUNCH, "--model-path", "/m"]))
    assert "127.0.0.1 at a free port" in plain and "--port" in plain
    mine = notice(parse_launch([*LAUNCH, "--model-path", "/m", "--port", "30000",
                                "--host", "0.0.0.0"]))  # fmt: skip
    assert "restores serve on your 0.0.0.0:30000 unless given --host/--port" in mine


def test_the_draft_model_becomes_the_request_s_draft(tmp_path) -> None:
    """The draft is the capsule's field `draft`, never an engine flag; a Hugging Face id needs
    its revision, named by the flag the user would add."""
    from coldsnap.cli._operations import _capture_request
    from coldsnap.machine import RequestError

    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    head = ["python", "-m", "sglang.launch_server", "--model-path", str(tmp_path / "target")]
    spec = ["--speculative-algorithm", "STANDALONE"]
    line = parse_launch([*head, *spec, "--speculative-draft-model-path", str(tmp_path / "draft")])
    assert line.draft_path == str(tmp_path / "draft") and line.engine_args == tuple(spec)
    options = dict(name="t", driver="n610", provider="native", store=tmp_path / "s", workdir=None,
                   model_id=None, revision=None, keep_source=False)  # fmt: skip
    request = _capture_request(
        (*head, *spec, f"--speculative-draft-model-path={tmp_path / 'draft'}"), **options
    )
    assert request.draft is not None and request.draft.path == str((tmp_path / "draft").resolve())
    assert "--speculative-draft-model-path" not in " ".join(request.engine_args)
    with pytest.raises(RequestError, match="with --speculative-draft-model-revision"):
        _capture_request((*head, "--speculative-draft-model-path", "org/draft"), **options)
    with pytest.raises(CommandLineError, match="needs --speculative-draft-model-path"):
        parse_launch([*head, "--speculative-draft-model-revision", "abc"])

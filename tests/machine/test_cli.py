"""The command line: docs stay in sync with the specs; dry-run operations; bad input."""

from __future__ import annotations

import json

from click.testing import CliRunner

from coldsnap.cli import main
from coldsnap.cli._main import DOCS
from coldsnap.machine import SPECS, document


def test_state_machine_docs_are_in_sync() -> None:
    assert DOCS.read_text() == document(SPECS.values()), "run `coldsnap docs`"


def test_docs_check_fails_on_a_stale_file(tmp_path) -> None:
    out = tmp_path / "sm.md"
    out.write_text("stale")
    result = CliRunner().invoke(main, ["docs", "--check", "--out", str(out)])
    assert result.exit_code != 0 and "is stale" in result.output


def test_dry_run_capture_from_a_request_file(tmp_path) -> None:
    (tmp_path / "model").mkdir()
    request = {
        "kind": "coldsnap.capture-request", "driver": "n610", "provider": "native",
        "model": {"id": "tiny", "revision": "r1", "path": str(tmp_path / "model")},
        "workdir": str(tmp_path / "cap"), "store": str(tmp_path / "store"),
    }
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request))
    result = CliRunner().invoke(main, ["capture", "--dry-run", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1])["outcome"] == "done"
    assert "process_dump" in result.output


def test_a_bad_request_file_names_the_field(tmp_path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"kind": "coldsnap.restore-request", "driver": "n610",
                                "provider": "native", "artifact": "x",
                                "workdir": "rel", "store": str(tmp_path)}))
    result = CliRunner().invoke(main, ["restore", "--dry-run", str(path)])
    assert result.exit_code != 0
    assert "request field 'workdir': must be an absolute path" in str(result.exception)
    assert not (tmp_path / "rel").exists()


def test_demo_dry_run_says_so() -> None:
    result = CliRunner().invoke(main, ["demo", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("DRY RUN")
    assert result.output.count("restore done") == 4

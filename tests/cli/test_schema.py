"""The request files' JSON Schemas: generated from the request classes, kept in docs/schema in
sync, and the examples (and what `--print-request` prints) valid against them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from coldsnap.cli import main
from coldsnap.cli._schema import CLASSES, SCHEMA_DIR, path, schema, text
from coldsnap.machine import parse_request

EXAMPLES = sorted((SCHEMA_DIR / "examples").glob("*.json"))


@pytest.mark.parametrize("operation", sorted(CLASSES))
def test_the_schemas_in_docs_are_in_sync(operation: str) -> None:
    assert path(operation).read_text() == text(operation), (
        f"run `coldsnap schema {operation} --write`"
    )


@pytest.mark.parametrize("operation", sorted(CLASSES))
def test_the_schema_is_a_valid_json_schema_naming_every_field(operation: str) -> None:
    body = schema(operation)
    jsonschema.Draft202012Validator.check_schema(body)
    assert body["additionalProperties"] is False
    assert body["properties"]["kind"]["const"] == f"coldsnap.{operation}-request"
    own = "target" if operation in ("stop", "sleep", "wake") else "engine_args"
    assert own in body["properties"] and "kind" in body["required"]


def test_the_schema_command_prints_what_docs_hold() -> None:
    result = CliRunner().invoke(main, ["schema", "restore"])
    assert result.exit_code == 0 and result.output == path("restore").read_text()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_example_is_valid(example: Path) -> None:
    data = json.loads(example.read_text())
    operation = "capture" if data["kind"] == "coldsnap.capture-request" else "restore"
    jsonschema.validate(data, schema(operation))


def test_a_local_example_parses_once_its_paths_exist(tmp_path: Path) -> None:
    data = json.loads((SCHEMA_DIR / "examples" / "capture-request.json").read_text())
    (tmp_path / "model").mkdir()
    data["model"]["path"] = str(tmp_path / "model")
    data["store"], data["workdir"] = str(tmp_path / "store"), str(tmp_path / "op")
    assert parse_request(data).engine_args == tuple(data["engine_args"])


def test_a_schema_refuses_what_the_parser_refuses(tmp_path: Path) -> None:
    data = json.loads((SCHEMA_DIR / "examples" / "restore-request.json").read_text())
    for bad in ({"colour": "blue"}, {"port": "30000"}, {"engine_args": "--abc"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**data, **bad}, schema("restore"))


def test_print_request_output_is_valid_against_the_schema(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    result = CliRunner().invoke(main, ["capture", "--print-request", "--store",
                                       str(tmp_path / "store"), "--", "sglang", "serve",
                                       "--model-path", str(tmp_path / "m")])  # fmt: skip
    assert result.exit_code == 0, result.output
    jsonschema.validate(json.loads(result.stdout), schema("capture"))

"""YAML recipes: the documented example parses into the request its JSON form makes; unknown
keys, wrong types, repeated keys and non-mappings are refused naming the field; `--recipe`
works on capture and restore and goes with no other source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.cli import main
from coldsnap.cli._recipes import read_recipe
from coldsnap.machine import CaptureRequest, RequestError, RestoreRequest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _documented(tmp_path: Path) -> str:
    """The YAML recipe docs/cli.md shows, its paths moved under `tmp_path`."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/cli.md should show one YAML recipe"
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "var" / "ops").mkdir(parents=True)
    text = blocks[0].replace("/models/tiny", str(tmp_path / "models" / "tiny"))
    return text.replace("/var/lib/coldsnap", str(tmp_path / "var"))


def test_the_documented_recipe_parses(tmp_path: Path) -> None:
    request = read_recipe(_documented(tmp_path), "docs/cli.md")
    assert isinstance(request, CaptureRequest)
    assert request.name == "tiny" and request.serve_port == 30000
    assert request.engine_args == ("--dtype", "bfloat16")
    assert request.timeouts == {"wait_healthy": 900.0}


def test_capture_recipe_makes_the_request_its_json_makes(tmp_path: Path) -> None:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(_documented(tmp_path))
    from_yaml = cli("capture", "--recipe", str(recipe), "--print-request")
    assert from_yaml.exit_code == 0, from_yaml.output
    (tmp_path / "tiny.json").write_text(from_yaml.stdout)
    from_json = cli("capture", "--print-request", str(tmp_path / "tiny.json"))
    assert json.loads(from_json.stdout) == json.loads(from_yaml.stdout)
    assert cli("capture", "--print-request", str(recipe)).stdout == from_yaml.stdout


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("colour: blue\n", "colour"),
        ("tp: '2'\n", "tp"),
        ("keep_source: 'yes'\n", "keep_source"),
        ("engine_args: --dtype bfloat16\n", "engine_args"),
        ("name: other\n", "name"),  # given twice
    ],
)
def test_a_bad_recipe_is_refused_naming_the_field(tmp_path: Path, change: str, field: str) -> None:
    with pytest.raises(RequestError) as refused:
        read_recipe(_documented(tmp_path) + change, "r.yaml")
    assert field in [f for f, _ in refused.value.problems], refused.value.problems


@pytest.mark.parametrize("text", ["- a list\n", "just text\n", "key: [unclosed\n"])
def test_a_recipe_that_is_no_mapping_is_refused(text: str) -> None:
    with pytest.raises(RequestError, match=r"r\.yaml"):
        read_recipe(text, "r.yaml")


def test_restore_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "restore.yml"
    recipe.write_text(
        "kind: coldsnap.restore-request\ndriver: n610\nprovider: native\nartifact: tiny\n"
        f"port: 30000\nhost: 0.0.0.0\nstore: {tmp_path}/store\nworkdir: {tmp_path}/op\n"
    )
    result = cli("restore", "--recipe", str(recipe), "--print-request")
    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    assert (request["port"], request["host"], request["artifact"]) == (30000, "0.0.0.0", "tiny")
    assert RestoreRequest  # the kind the recipe names


def test_recipe_goes_alone_and_must_be_yaml(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("kind: coldsnap.restore-request\n")
    both = cli("restore", "tiny", "--recipe", str(recipe))
    assert both.exit_code == 2 and "not both" in both.output
    not_yaml = cli("capture", "--recipe", str(tmp_path / "r.json"))
    assert not_yaml.exit_code == 2 and "must be a .yaml or .yml file" in not_yaml.output
    nothing = cli("capture")
    assert nothing.exit_code == 2 and "--recipe FILE.yaml" in nothing.output


@pytest.mark.parametrize("text", ["{[1, 2]: x}\n", "? {a: 1}\n: x\n", "1: x\n"])
def test_a_key_that_is_not_text_is_refused_naming_its_line(text: str) -> None:
    with pytest.raises(RequestError, match=r"r\.yaml, line 1: a key must be text"):
        read_recipe(text, "r.yaml")


def test_a_merge_key_takes_a_mapping_written_in_place(tmp_path: Path) -> None:
    text = _documented(tmp_path) + "<<: {keep_source: true, name: merged}\n"
    request = read_recipe(text, "r.yaml")
    assert isinstance(request, CaptureRequest)
    assert request.keep_source  # merged in
    assert request.name == "tiny"  # the key written beside the merge wins, as YAML says


def test_a_merged_mapping_is_checked_like_any_other(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="line 1: is given twice"):
        read_recipe("<<: {tp: 1, tp: 2}\n", "r.yaml")


def test_a_merge_by_alias_is_refused_as_an_alias(tmp_path: Path) -> None:
    text = "base: &base {driver: n610}\n<<: *base\n"
    with pytest.raises(RequestError, match=r"r\.yaml, line 2: an alias \(\*base\)"):
        read_recipe(text, "r.yaml")


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_timeout_that_is_not_finite_is_refused_naming_the_step(
    tmp_path: Path, value: str
) -> None:
    documented = _documented(tmp_path)
    text = documented.replace("wait_healthy: 900", f"wait_healthy: {value}")
    assert text != documented
    with pytest.raises(RequestError) as refused:
        read_recipe(text, "r.yaml")
    assert [f for f, _ in refused.value.problems] == ["timeouts.wait_healthy"]

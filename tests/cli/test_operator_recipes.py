"""A recipe runs as often as the command line does and gets its defaults: a fresh workdir per
run under STORE/../ops (a second run must not find the first one's journal), the store, and the
driver and provider (a capture's option defaults; a restore's, the capsule's)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from coldsnap.artifacts import Store
from coldsnap.cli import main

from .test_operator_errors import _publish


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def test_a_capture_recipe_gets_the_command_line_s_defaults(tmp_path: Path) -> None:
    (tmp_path / "tiny").mkdir()
    recipe = tmp_path / "capture.yaml"
    recipe.write_text(
        "kind: coldsnap.capture-request\n"
        f"model: {{id: tiny, revision: local, path: {tmp_path / 'tiny'}}}\n"
        f"store: {tmp_path / 'store'}\n"
    )
    runs = [cli("capture", "--recipe", str(recipe), "--print-request") for _ in range(2)]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    first, second = (json.loads(r.stdout) for r in runs)
    assert (first["driver"], first["provider"]) == ("n610", "native")
    assert Path(first["workdir"]).parent == tmp_path / "ops"
    assert Path(first["workdir"]).name.startswith("capture-tiny-")
    assert first["workdir"] != second["workdir"]


def test_a_restore_recipe_takes_the_capsule_s_driver_and_runs_twice(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny580", driver="n580")
    recipe = tmp_path / "restore.yml"
    recipe.write_text(f"kind: coldsnap.restore-request\nartifact: tiny580\nstore: {store.root}\n")
    printed = json.loads(cli("restore", "--recipe", str(recipe), "--print-request").stdout)
    assert (printed["driver"], printed["provider"]) == ("n580", "native")
    assert printed["engine_args"] == ["--dtype", "float32", "--log-level", "info"]
    env = {"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")}
    runs = [cli("restore", "--recipe", str(recipe), "--json", env=env) for _ in range(2)]
    # The capsule is a stand-in, so admission refuses it (exit 3) each time, for the same
    # reason: the second run is not refused over the first one's journal.
    assert [r.exit_code for r in runs] == [3, 3], [r.output for r in runs]
    assert all("capsule tiny580 has no identity" in r.stdout for r in runs)
    assert "journal" not in runs[1].stdout
    assert len(list((tmp_path / "ops").iterdir())) == 2

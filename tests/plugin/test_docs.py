"""docs/plugin.md lists every contract the plugin relies on, and says how it is exercised."""

from __future__ import annotations

from pathlib import Path

from coldsnap.plugin import CONTRACTS, VARIABLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin.md"


def test_every_contract_is_in_the_doc_with_how_it_is_exercised() -> None:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`"):
            rows[(cells[0], cells[1].strip("`"))] = cells[3]
    for c in CONTRACTS:
        key = (c.group, c.target.removeprefix("sglang.srt."))
        assert key in rows, f"docs/plugin.md lacks contract {key}"
        assert rows[key] == ("run time" if c.runtime_on_cpu else "static"), key
    assert len(rows) == len(CONTRACTS)


def test_every_setting_is_documented() -> None:
    text = DOC.read_text()
    for name in VARIABLES:
        assert f"`{name}`" in text, name

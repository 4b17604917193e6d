"""docs/plugin.md lists every contract and each of its variants, says how it is exercised and
which variant each SGLang release uses."""

from __future__ import annotations

from pathlib import Path

from coldsnap.plugin import CONTRACTS, VARIABLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin.md"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_every_contract_variant_is_in_the_doc_with_how_it_is_exercised() -> None:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = _cells(line)
        if len(cells) == 5 and cells[1].startswith("`") and cells[4].startswith("`"):
            rows[(cells[0], cells[1].strip("`"), cells[4])] = cells[3]
    expected = 0
    for c in CONTRACTS:
        for alt in c.alternatives():
            key = (
                c.group,
                alt.target.removeprefix("sglang.srt."),
                f"`{alt.variant}` ({alt.seen_in})",
            )
            assert key in rows, f"docs/plugin.md lacks contract variant {key}"
            assert rows[key] == ("run time" if c.runtime_on_cpu else "static"), key
            expected += 1
    assert len(rows) == expected


def test_the_doc_says_which_variant_each_release_uses() -> None:
    """The per-release table names, for every contract with variants, a variant of it that was
    seen in that release (the 0.5.23 column: the first variant of a 0.5.23 build)."""
    table = {}
    for line in DOC.read_text().splitlines():
        cells = _cells(line)
        if len(cells) == 4 and cells[1].startswith("`") and cells[2].startswith("`"):
            table[cells[0].strip("`")] = (cells[1].strip("`"), cells[2].strip("`"))
    with_variants = [c for c in CONTRACTS if c.variants]
    assert {c.key.removeprefix("sglang.srt.") for c in with_variants} == set(table)
    for c in with_variants:
        new, old = table[c.key.removeprefix("sglang.srt.")]
        names = {alt.seen_in: alt.variant for alt in c.alternatives()}
        assert names["0.5.23"] == new, c.key
        assert names["0.5.17"] == old, c.key


def test_every_setting_is_documented() -> None:
    text = DOC.read_text()
    for name in VARIABLES:
        assert f"`{name}`" in text, name

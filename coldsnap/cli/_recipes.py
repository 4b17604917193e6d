"""YAML recipes: a capture or restore request written as YAML (`--recipe FILE.yaml`), for
people who keep their serving set-ups in files they comment. A recipe holds exactly what the
JSON request file holds: PyYAML's `safe_load` reads it, then the same strict structuring does
the rest, so an unknown key or a wrong type is refused naming the field. A key given twice is
refused too (YAML itself would keep the last silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from coldsnap.machine import Request, RequestError, parse_request


class _UniqueKeys(yaml.SafeLoader):
    """The safe loader, refusing a mapping that names a key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise RequestError(
                    [(str(key), f"is given twice (line {key_node.start_mark.line + 1})")]
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_recipe(text: str, where: str) -> Request:
    """The request in the YAML `text` (from `where`, for messages), parsed strictly."""
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # safe_load, with keys checked
    except yaml.YAMLError as exc:
        raise RequestError([("$", f"{where} is not YAML: {exc}")]) from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise RequestError([("$", f"{where} must hold a mapping (a request), got {kind}")])
    return parse_request(data)


def load_recipe(path: Path) -> Request:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RequestError([("--recipe", f"cannot read {path}: {exc.strerror}")]) from None
    return read_recipe(text, str(path))


__all__ = ["load_recipe", "read_recipe"]

"""YAML recipes: a capture or restore request written as YAML (`--recipe FILE.yaml`), for
people who keep their serving set-ups in files they comment. A recipe holds exactly what the
JSON request file holds: PyYAML's safe loader reads it, then the same strict structuring does
the rest, so an unknown key or a wrong type is refused naming the field.

What the loader refuses besides, each naming its line, before the document is built:
- an alias (`*name`): each one copies what its anchor holds, so a kilobyte of nested aliases
  expands to gigabytes; a request is a few lines and needs none. Merge keys (`<<:`) work with
  a mapping written in place.
- a key given twice (YAML itself would keep the last silently), and a key that is not text (a
  request's keys are all names).
- nesting deeper than MAX_DEPTH (a request nests three levels; Python's recursion gives out
  near a thousand).

What a recipe leaves out, the command line's defaults give (`defaults`, which the command
passes): the store, a fresh workdir for each run (so a recipe runs again and again; a workdir
written in the recipe is that one directory, whose journal a second run finds), and the driver
and provider (a capture's defaults; a restore's, the capsule's).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from coldsnap.machine import Request, RequestError, parse_request

MAX_DEPTH = 32
"""How deep a recipe's collections may nest."""
_MERGE = "tag:yaml.org,2002:merge"


class _Refused(yaml.YAMLError):
    """A recipe the loader refuses: the message names the line and why, `field` the request
    field where there is one."""

    def __init__(self, mark: yaml.Mark, why: str, field: str = "$") -> None:
        super().__init__(f"line {mark.line + 1}: {why}")
        self.field = field


class _RecipeLoader(yaml.SafeLoader):
    """The safe loader, refusing what the module's docstring lists."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(event.start_mark, f"an alias (*{event.anchor}): write the value out")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self._check_keys(node)
        return super().construct_mapping(node, deep=deep)

    def _check_keys(self, node: yaml.MappingNode) -> None:
        """Every key of `node` is text and given once; the mappings it merges are checked
        alike (the keys written beside a merge key override the merged ones, as YAML says)."""
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [
                    value_node]  # fmt: skip
                for mapping in merged:
                    if isinstance(mapping, yaml.MappingNode):
                        self._check_keys(mapping)  # anything else: flatten_mapping says why
                continue
            key = self.construct_object(key_node)
            if not isinstance(key, str):
                what = type(key).__name__
                raise _Refused(key_node.start_mark, f"a key must be text, got {what}")
            if key in seen:
                raise _Refused(key_node.start_mark, "is given twice", field=key)
            seen.add(key)


Defaults = Callable[[dict[str, Any]], dict[str, Any]]
"""The recipe's mapping with what it leaves out filled in (the command line's defaults)."""


def read_recipe(text: str, where: str, defaults: Defaults | None = None) -> Request:
    """The request in the YAML `text` (from `where`, for messages), parsed strictly after
    `defaults` fill in what it leaves out."""
    try:
        data = yaml.load(text, Loader=_RecipeLoader)  # safe_load, with the refusals above
    except _Refused as exc:
        raise RequestError([(exc.field, f"{where}, {exc}")]) from None
    except yaml.YAMLError as exc:
        raise RequestError([("$", f"{where} is not YAML: {exc}")]) from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise RequestError([("$", f"{where} must hold a mapping (a request), got {kind}")])
    return parse_request(data if defaults is None else defaults(data))


def load_recipe(path: Path, defaults: Defaults | None = None) -> Request:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RequestError([("--recipe", f"cannot read {path}: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise RequestError([("--recipe", f"{path} is not UTF-8 text ({exc.reason})")]) from None
    return read_recipe(text, str(path), defaults)


__all__ = ["MAX_DEPTH", "Defaults", "load_recipe", "read_recipe"]

"""Is a capture valid here? Compares a captured identity with the runtime's, field by field."""

from __future__ import annotations

from typing import Any

import attrs
from attrs import frozen

from ._errors import IncompatibleArtifact
from ._identity import FileDigest, Identity

# A difference under these prefixes means the process image itself cannot run here.
_RECAPTURE = ("topology.", "engine.", "plugin_digest")


@frozen
class Difference:
    field: str
    expected: Any
    found: Any

    def __str__(self) -> str:
        return f"{self.field}: expected {_show(self.expected)}, found {_show(self.found)}"


def _show(value: Any) -> str:
    return "none" if value is None else str(value)


def _flatten(value: Any, name: str, out: dict[str, Any]) -> None:
    if attrs.has(type(value)):
        for a in attrs.fields(type(value)):
            if a.name not in ("format", "kind"):
                _flatten(getattr(value, a.name), f"{name}.{a.name}" if name else a.name, out)
    elif isinstance(value, tuple) and value and all(isinstance(v, FileDigest) for v in value):
        for item in value:
            out[f"{name}[{item.name}]"] = item.sha256
    elif isinstance(value, dict) and value:  # a file -> digest map: each file its own field
        for key in sorted(value):
            out[f"{name}[{key}]"] = value[key]
    else:
        out[name] = value


def _leaves(identity: Identity) -> dict[str, Any]:
    out: dict[str, Any] = {"format": identity.format}
    _flatten(identity, "", out)
    return out


def diff_identities(captured: Identity, runtime: Identity) -> list[Difference]:
    """Every field that differs, in a stable order; a checkpoint file present on one side only
    shows as `none` on the other."""
    want, have = _leaves(captured), _leaves(runtime)
    names = list(want) + [name for name in have if name not in want]
    return [
        Difference(name, want.get(name), have.get(name))
        for name in names
        if want.get(name) != have.get(name)
    ]


def check_compatible(captured: Identity, runtime: Identity) -> None:
    """Raises IncompatibleArtifact, one line per differing field, when the capture does not
    fit this runtime; says when only a new capture can help."""
    differences = diff_identities(captured, runtime)
    if not differences:
        return
    lines = ["the artifact does not match this runtime:"]
    lines += [f"  {d}" for d in differences]
    if any(d.field.startswith(_RECAPTURE) for d in differences):
        lines.append(
            "a new capture is needed: the topology or the engine build differs from the capture"
        )
    raise IncompatibleArtifact(differences, "\n".join(lines))

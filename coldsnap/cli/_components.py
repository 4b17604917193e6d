"""Builds the real components a request names (drivers, providers, engine adapter, store)."""

from __future__ import annotations

from typing import Any

import click


def real_components(request: Any) -> dict[str, Any]:
    raise click.ClickException(
        f"the real {request.driver} driver is not wired to the command line yet; "
        "use --dry-run for the in-memory driver"
    )

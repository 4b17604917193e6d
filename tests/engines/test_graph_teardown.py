"""Graphs in the memory saver's region (engine option cuda_graphs_in_saver): releasing the
`cuda_graph` region must be seen to free the graphs' memory, at destroy_graphs and where the
capture's rehearsal releases it again. SGLang 0.5.17 captures its decode graphs inside
torch_memory_saver's `cuda_graph` context only with `--enable-memory-saver` and
SGLANG_MEMORY_SAVER_CUDA_GRAPH=1; otherwise the release of the tag returns and frees nothing,
and the image would still hold the graphs while the receipt said they left it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coldsnap.engines import EngineError
from coldsnap.machine import steps as s

from .test_sglang_steps import GIB, TOKENS, MockSGLang, adapter, ctx, measured


def graph_release(freed: int) -> dict[str, Any]:
    """The plugin's measurement of a release of the graph region that freed `freed` bytes."""
    report = measured()
    report.update(regions={}, resident={}, device_used_before=3 * GIB)
    report.update(device_used_released=3 * GIB - freed, device_used_after=3 * GIB - freed)
    return report


def test_destroy_graphs_releases_the_region_and_sees_it_freed(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=graph_release(96 << 20), ranks=2)
    assert adapter(mock, graphs=True).destroy_graphs(ctx(tmp_path)) is None
    assert mock.tags("/release_memory_occupation") == [["cuda_graph"]]


def test_destroy_graphs_that_freed_nothing_fails_naming_the_ranks(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=graph_release(0), ranks=2)
    with pytest.raises(EngineError, match="destroy_graphs") as err:
        adapter(mock, graphs=True).destroy_graphs(ctx(tmp_path))
    text = str(err.value)
    assert "scheduler-tp0" in text and "scheduler-tp1" in text
    assert "freed no device memory" in text and "the image would still hold them" in text


def test_destroy_graphs_without_a_measurement_of_this_release_fails(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path)  # the schedulers write no cuda_release
    with pytest.raises(EngineError, match="no measurement of this release of the cuda_graph"):
        adapter(mock, graphs=True).destroy_graphs(ctx(tmp_path))


def test_the_rehearsals_second_graph_release_is_checked_too(tmp_path: Path) -> None:
    class GraphsStay(MockSGLang):
        """Weights and KV released as measured(); the graph region frees nothing."""

        def _write_status(self, tags: list[str]) -> None:
            self.report = graph_release(0) if tags == ["cuda_graph"] else measured()
            super()._write_status(tags)

    mock = GraphsStay(runtime_dir=tmp_path)
    facts = {
        s.ACCEPTANCE_TOKENS.name: TOKENS,
        s.WEIGHT_SOURCE.name: {"source": "checkpoint", "checkpoint": "/models/m"},
    }
    with pytest.raises(EngineError, match=r"rehearse_refill.*freed no device memory"):
        adapter(mock, graphs=True).rehearse_refill(ctx(tmp_path, **facts))
    assert mock.tags("/release_memory_occupation")[-1] == ["cuda_graph"]

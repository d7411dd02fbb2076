"""The aarch64 check's comparisons (test/cross_arch.py) fail what they should: a hidden state off by more than its
type's tolerance, tokens parting at a row, ONNX graphs that differ by more than float32 rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from cross_arch import HIDDEN_FILE, TOLERANCES, _onnx_ulps, _same_tokens, compare_hidden
from onnx import helper, numpy_helper


def _hidden(directory: Path, values: dict[str, np.ndarray]) -> Path:
    directory.mkdir()
    np.savez(directory / HIDDEN_FILE, **values)
    return directory


@pytest.mark.parametrize("name", list(TOLERANCES))
def test_a_hidden_state_is_held_to_its_types_tolerance(tmp_path: Path, name: str) -> None:
    rng = np.random.default_rng(0)
    expected = rng.standard_normal(256)
    x86 = expected + 1e-3 * rng.standard_normal(256)  # x86-64's own error: a relative 1e-3
    tolerance = TOLERANCES[name]
    limit = max(tolerance.share * np.linalg.norm(x86 - expected), tolerance.floor * np.linalg.norm(x86))
    direction = rng.standard_normal(256)
    direction /= np.linalg.norm(direction)
    reference = _hidden(tmp_path / "x86", {name: x86})
    near = _hidden(tmp_path / "near", {name: x86 + 0.5 * limit * direction})
    far = _hidden(tmp_path / "far", {name: x86 + 2.0 * limit * direction})
    assert compare_hidden(reference, near, {name: expected})[0].startswith("ok")
    assert compare_hidden(reference, far, {name: expected})[0].startswith("FAIL")


def test_tokens_that_part_name_the_first_row(tmp_path: Path) -> None:
    codes = np.arange(40).reshape(10, 4)
    other = codes.copy()
    other[6, 2] += 1
    np.savez(tmp_path / "a.npz", codes=codes)
    np.savez(tmp_path / "b.npz", codes=other)
    assert _same_tokens(tmp_path / "a.npz", tmp_path / "a.npz")[0]
    assert _same_tokens(tmp_path / "a.npz", tmp_path / "b.npz") == (False, "codes differs from its row 6 on")


def _graph(path: Path, weight: np.ndarray, op: str = "Add") -> Path:
    node = helper.make_node(op, ["x", "w"], ["y"])
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in ("x", "y")]
    graph = helper.make_graph([node], "g", [io[0]], [io[1]], [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph), path)
    return path


def test_onnx_graphs_are_compared_to_the_float32_ulp(tmp_path: Path) -> None:
    weight = np.array([1.0, 2.0, 3.0], np.float32)
    nudged = weight.copy()
    nudged[1] = np.nextafter(nudged[1], np.float32(3.0))
    base = _graph(tmp_path / "a.onnx", weight)
    assert _onnx_ulps(base, _graph(tmp_path / "b.onnx", nudged)) == 1
    assert _onnx_ulps(base, _graph(tmp_path / "c.onnx", weight * 2)) > 1
    assert _onnx_ulps(base, _graph(tmp_path / "d.onnx", weight, op="Mul")) is None  # another graph

"""Writing a GGUF file tensor by tensor, in file order, atomically: what every GGUF writer here shares.

A converter hands tensors over as an iterable of ``(source_name, array)`` pairs, one at a time: each is written
as soon as every tensor before it in file order has been, so a caller that yields in that order never holds more
than one tensor in memory (tensors out of order wait in memory for their turn). A partial file never takes the
final name.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the file: its GGUF name, its shape (rows first, as NumPy holds it) and the dtype stored."""

    gguf_name: str
    dims: tuple[int, ...]
    dtype: np.dtype


def write_planned_gguf(
    path: Path | str,
    architecture: str,
    add_header: Callable[[Any], None],
    plan: dict[str, PlannedTensor],
    tensors: Iterable[tuple[str, np.ndarray]],
    what: str,
    check_name: Callable[[str], None] | None = None,
) -> None:
    """Write ``plan`` (source name -> tensor, in file order) to ``path`` from ``tensors``.

    ``add_header`` adds the architecture's keys to the ``gguf.GGUFWriter``; ``what`` names the model in errors
    (a tensor that is not in the plan "does not belong to" it); ``check_name`` may raise its own error for a
    name that is not of the architecture at all. Every planned tensor must come exactly once.
    """
    import gguf  # deferred: only converters and generators need the gguf package

    path = Path(path)
    order = list(plan)
    position = {name: index for index, name in enumerate(order)}
    writer = gguf.GGUFWriter(None, architecture)
    add_header(writer)
    for tensor in plan.values():
        writer.add_tensor_info(
            tensor.gguf_name, tensor.dims, tensor.dtype, int(np.prod(tensor.dims)) * tensor.dtype.itemsize
        )

    partial = path.with_name(f".{path.name}.partial")
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        pending: dict[str, np.ndarray] = {}
        next_index = 0
        for name, array in tensors:
            if check_name is not None:
                check_name(name)
            if name not in position:
                raise ValueError(f"tensor {name!r} does not belong to {what}")
            if name in pending or position[name] < next_index:
                raise ValueError(f"tensor {name!r} was given twice")
            if tuple(array.shape) != plan[name].dims:
                raise ValueError(f"tensor {name!r} has shape {tuple(array.shape)}, expected {plan[name].dims}")
            pending[name] = np.ascontiguousarray(array, dtype=plan[name].dtype)
            while next_index < len(order) and order[next_index] in pending:
                writer.write_tensor_data(pending.pop(order[next_index]))
                next_index += 1
        if next_index < len(order):
            missing = [n for n in order[next_index:] if n not in pending]
            raise ValueError(f"missing tensors: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        writer.close()
        os.replace(partial, path)
    except BaseException:
        writer.close()
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise


def layered_tensor_name(
    name: str, layer_prefix: str, layer_names: dict[str, str], final_names: dict[str, str], model: str
) -> str:
    """GGUF's name of a checkpoint tensor: ``<layer_prefix>.<i>.<suffix>`` becomes ``blk.<i>.<layer_names[suffix]>``,
    the others are ``final_names``' (embeddings, final norm, head); ValueError naming ``model`` for any other."""
    if name in final_names:
        return final_names[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == layer_prefix and parts[1].isdigit() and parts[2] in layer_names:
        return f"blk.{int(parts[1])}.{layer_names[parts[2]]}"
    raise ValueError(f"unknown {model} tensor name {name!r}")

"""The 8-bit block scheme ONNX Runtime's ``MatMulNBits`` reads, written once for every weight that uses it.

A weight is stored by output row: each row of K input channels is cut into blocks of ``block`` channels,
and each block keeps one float32 scale (its largest magnitude / 127) and ``block`` unsigned codes around
128, the zero point: ``w = (code - 128) * scale``. The audio heads (``model/heads.py``) quantize at load,
the stream decoder builder when it writes its 8-bit graphs (docs/stream-decoder.md, "Precision").
"""

from __future__ import annotations

import numpy as np

from moss_tts_node.errors import WeightsError


def quantize_q8_blocks(rows: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) weight rows as MatMulNBits' 8 bits: (N, K / block, block) uint8 codes and (N, K / block)
    float32 scales. An all-zero block gets scale 1 (its codes are all 128, so any scale decodes it to 0)."""
    n, k = rows.shape
    if k % block:
        raise WeightsError(f"a weight of {k} input channels does not split into 8-bit blocks of {block}")
    blocks = np.asarray(rows, dtype=np.float32).reshape(n, k // block, block)
    scales = np.abs(blocks).max(axis=2) / np.float32(127)
    scales[scales == 0] = 1
    codes = np.clip(np.rint(blocks / scales[:, :, None]), -127, 127) + 128
    return codes.astype(np.uint8), scales

"""The codec's residual quantizer: how many levels it has and the codes each level holds (docs/model.md,
"Codec I/O"). Every reader takes them from here.

The codec's graphs always take and give ``CODEC_QUANTIZERS`` rows of codes, whatever the model: a model of fewer
codebooks (its ``n_vq``) is coded with the first levels, a count ``checked_quantizers`` bounds. This module uses
nothing of the package but its errors, so that a tool run on an earlier revision's package can bring it along
(``tools/dev/stream_decoder_bench.py``).
"""

from __future__ import annotations

from moss_tts_node.errors import CodecError

CODEC_QUANTIZERS = 32  # levels of the residual quantizer: the rows of codes the codec's graphs take and give
CODEBOOK_SIZE = 1024  # codes each level holds, 0 to CODEBOOK_SIZE - 1


def checked_quantizers(n_quantizers: int) -> int:
    """``n_quantizers`` if the codec can code with that many of its levels (1 to ``CODEC_QUANTIZERS``), else
    CodecError."""
    if type(n_quantizers) is not int or not 1 <= n_quantizers <= CODEC_QUANTIZERS:
        raise CodecError(
            f"the codec codes with 1 to {CODEC_QUANTIZERS} quantizers (its residual levels), not {n_quantizers!r}"
        )
    return n_quantizers

"""Load a GGUF through the bridge in a process of its own and decode rows with it: a crash in one of llama.cpp's
kernels ends this process, so the test that started it fails with the signal instead of the whole suite dying.

    python backbone_worker.py MODEL.gguf ROWS.npy OUT.npy [--skip BUFFER_TYPE]...

Prefills all rows but the last, decodes the last, and saves the last row's hidden state to OUT.npy; prints one JSON
line: the CPU extra buffer types llama.cpp offered before any skip, and the loaded model's ``weight_layout``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from qwen3_reference import exact_backbone

from moss_tts_node.llama.bindings import cpu_extra_buffer_types, skip_cpu_extra_buffer_type


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("rows", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--skip", action="append", default=[], help="an extra buffer type to hide first")
    args = parser.parse_args()
    offered = cpu_extra_buffer_types()
    for name in args.skip:
        skip_cpu_extra_buffer_type(name)
    rows = np.load(args.rows)
    with exact_backbone(args.model) as backbone:
        backbone.prefill(rows[:-1])
        backbone.decode(rows[-1])
        np.save(args.out, backbone.hidden())
        print(json.dumps({"offered": offered, "weight_layout": backbone.weight_layout}))


if __name__ == "__main__":
    main()

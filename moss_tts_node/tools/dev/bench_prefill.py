"""The prompt prefilled by llama.cpp itself, for ``bench``: outputs for the last row only, and for every row.

``python -m moss_tts_node.tools.dev.bench_prefill GGUF PROMPT.npy THREADS N_CTX N_BATCH`` (``bench`` runs it
in its own process, through llama-cpp-python's bindings rather than our bridge) prints one JSON line: the
best of 3 prefills of the prompt's embedding rows with the output for the last row only (what the bridge
does) and with the text head at every position (what llama.cpp does by default with embeddings on).
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from collections.abc import Sequence

import numpy as np


def main(argv: Sequence[str]) -> None:
    import llama_cpp  # deferred: bench imports this module only to name it

    from moss_tts_node.llama.placement import cpu_weight_placement

    path, prompt, threads, n_ctx, n_batch = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    # The bridge's choice of weight layout, made in this process: it hides AMX from the libllama that
    # llama-cpp-python's bindings share with the bridge, as it does for the bridge's own models.
    cpu_weight_placement(repack=True)
    quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model_params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(path.encode(), model_params)
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx = n_ctx
    context_params.n_batch = n_batch
    context_params.n_ubatch = n_batch
    context_params.n_threads = threads
    context_params.n_threads_batch = threads
    context_params.embeddings = True
    context_params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
    context_params.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, context_params)
    rows = np.load(prompt).astype(np.float32)
    count, width = rows.shape
    batch = llama_cpp.llama_batch_init(n_batch, width, 1)

    def decode(first: int, n: int, outputs: int) -> None:
        batch.n_tokens = n
        ctypes.memmove(batch.embd, rows[first : first + n].ctypes.data, n * width * 4)
        for i in range(n):
            batch.pos[i] = first + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = outputs
        status = llama_cpp.llama_decode(ctx, batch)
        if status != 0:
            raise SystemExit(f"llama_decode returned {status}")

    def prefill(every: bool) -> float:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        started = time.perf_counter()
        if every:
            llama_cpp.llama_set_embeddings(ctx, True)
            for first in range(0, count, n_batch):
                decode(first, min(n_batch, count - first), 1)
        else:
            llama_cpp.llama_set_embeddings(ctx, False)
            for first in range(0, count - 1, n_batch):
                decode(first, min(n_batch, count - 1 - first), 0)
            llama_cpp.llama_set_embeddings(ctx, True)
            decode(count - 1, 1, 1)
        return (time.perf_counter() - started) * 1000

    prefill(False)
    last, every = [], []
    for _ in range(3):  # alternated; the minimum is the cost without interference from other processes
        last.append(prefill(False))
        every.append(prefill(True))
    print(json.dumps({"prefill_last_row_ms": min(last), "prefill_every_row_ms": min(every)}))


if __name__ == "__main__":
    main(sys.argv[1:])

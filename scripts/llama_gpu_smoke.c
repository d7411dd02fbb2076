/*
 * The bridge with no Python in the process: load a GGUF with n_gpu_layers, prefill a few rows, decode one,
 * print the hidden state's checksum. scripts/llama_gpu_check.sh runs it before the Python check, so that a
 * crash in llama.cpp's CUDA build can be told apart from one that needs Python's process (its libstdc++,
 * its other extensions) to happen.
 *
 * Usage: llama_gpu_smoke MODEL.gguf N_GPU_LAYERS     (exit 0 and one line "ok ..." on success)
 */
#include <stdio.h>
#include <stdlib.h>

#include "moss_bridge.h"

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf N_GPU_LAYERS\n", argv[0]);
        return 2;
    }
    moss_bridge_set_verbose(getenv("LLAMA_VERBOSE") != NULL);
    struct moss_bridge_params params = moss_bridge_default_params();
    params.model_path = argv[1];
    params.n_ctx = 256;
    params.n_batch = 64;
    params.n_gpu_layers = atoi(argv[2]);
    struct moss_bridge * h = NULL;
    int32_t status = moss_bridge_create(&params, &h);
    if (status != MOSS_BRIDGE_OK) {
        fprintf(stderr, "create: %s: %s\n", moss_bridge_status_string(status), moss_bridge_last_error(NULL));
        return 1;
    }
    int32_t n_embd = 0;
    moss_bridge_n_embd(h, &n_embd);
    float * rows = malloc(sizeof(float) * (size_t) n_embd * 9);
    float * hidden = malloc(sizeof(float) * (size_t) n_embd);
    for (int i = 0; i < n_embd * 9; i++) {
        rows[i] = (float) ((i * 7919) % 2003) / 1001.5f - 1.0f; /* fixed, roughly uniform in [-1, 1) */
    }
    status = moss_bridge_prefill(h, rows, 8);
    if (status == MOSS_BRIDGE_OK) {
        status = moss_bridge_decode(h, rows + (size_t) n_embd * 8);
    }
    if (status == MOSS_BRIDGE_OK) {
        status = moss_bridge_get_hidden(h, hidden);
    }
    if (status != MOSS_BRIDGE_OK) {
        fprintf(stderr, "decode: %s: %s\n", moss_bridge_status_string(status), moss_bridge_last_error(h));
        moss_bridge_free(h);
        return 1;
    }
    double sum = 0.0, sum_abs = 0.0;
    for (int i = 0; i < n_embd; i++) {
        sum += hidden[i];
        sum_abs += hidden[i] < 0 ? -hidden[i] : hidden[i];
    }
    printf("ok n_gpu_layers=%s n_embd=%d hidden_sum=%.6f hidden_sum_abs=%.6f\n", argv[2], n_embd, sum, sum_abs);
    free(rows);
    free(hidden);
    moss_bridge_free(h);
    return 0;
}

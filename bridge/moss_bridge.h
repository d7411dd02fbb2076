/*
 * moss_bridge: a Qwen3 backbone in llama.cpp, driven by input *embeddings* instead of token ids.
 *
 * MOSS-TTS-Delay sums 33 embeddings per position (text + 32 audio codebooks), so llama.cpp's own
 * token lookup cannot be used. This bridge feeds those summed rows to llama.cpp and reads back the
 * final-normed hidden state (for the audio heads, computed outside) and the text logits.
 *
 * Style follows llama.cpp's C API: an opaque handle, a params struct with defaults, explicit free.
 * Every function that can fail returns an int32_t status (MOSS_BRIDGE_OK = 0); a failing call stores a
 * detailed message readable with moss_bridge_last_error(). A handle is not thread-safe.
 */
#ifndef MOSS_BRIDGE_H
#define MOSS_BRIDGE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface: the params struct, the enums and every signature below. Python mirrors them
 * by hand (moss_tts_node/llama/bindings.py) and refuses a library whose moss_bridge_abi_version() differs
 * from its own copy of this number: bump both on any change. */
#define MOSS_BRIDGE_ABI_VERSION 3

enum moss_bridge_status {
    MOSS_BRIDGE_OK                   = 0,
    MOSS_BRIDGE_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad size or out-of-range parameter */
    MOSS_BRIDGE_ERR_MODEL_LOAD       = 2, /* the GGUF file is missing, unreadable or not a usable model */
    MOSS_BRIDGE_ERR_CONTEXT_CREATE   = 3, /* llama.cpp refused the context (memory, KV type, flash-attn) */
    MOSS_BRIDGE_ERR_CONTEXT_FULL     = 4, /* the rows would not fit in n_ctx; nothing was decoded */
    MOSS_BRIDGE_ERR_DECODE           = 5, /* llama_decode failed; the KV cache may hold part of the rows */
    MOSS_BRIDGE_ERR_NO_OUTPUT        = 6, /* no hidden state / logits: nothing decoded since the last clear */
    MOSS_BRIDGE_ERR_ALLOC            = 7, /* out of host memory */
    MOSS_BRIDGE_ERR_QUANTIZE         = 8, /* llama_model_quantize failed (unusable input, bad ftype, write error) */
};

struct moss_bridge;

/* MOSS_BRIDGE_ABI_VERSION as this library was built with it. */
int32_t moss_bridge_abi_version(void);

struct moss_bridge_params {
    const char * model_path; /* GGUF file of the backbone (arch qwen3) */
    int32_t n_ctx;           /* KV cache rows; llama.cpp rounds it up to a multiple of 256 */
    int32_t n_batch;         /* rows per llama_decode call during a prefill (capped at n_ctx) */
    int32_t n_threads;       /* CPU threads for single rows (generation steps); <= 0 means all online cores */
    int32_t n_threads_batch; /* CPU threads for batches of rows (a prefill); <= 0 means as many as n_threads */
    int32_t n_gpu_layers;    /* layers offloaded to the GPU; -1 = all, 0 = CPU only */
    int32_t type_k;          /* enum ggml_type of the K cache (GGML_TYPE_F16 = 1, F32 = 0, Q8_0 = 8...) */
    int32_t type_v;          /* enum ggml_type of the V cache; quantized V needs flash_attn = 1 */
    int32_t flash_attn;      /* -1 auto, 0 off, 1 on */
    int32_t extra_bufts;     /* 1: weights on the CPU may go to its extra buffer types (repacked layouts, see
                              * moss_bridge_cpu_extra_buft_name); 0: the GGUF's own layout (llama-cli --no-repack) */
};

/* n_ctx 4096, n_batch 512, all cores (steps and batches), all layers on the GPU, F16 KV cache, flash-attn auto, extra buffer types. */
struct moss_bridge_params moss_bridge_default_params(void);

/* Loads the model and creates its context. On success *out owns both; free it with moss_bridge_free.
 * On failure *out is NULL and the reason is readable with moss_bridge_last_error(NULL) on this thread. */
int32_t moss_bridge_create(const struct moss_bridge_params * params, struct moss_bridge ** out);

/* The weights' buffers as llama.cpp allocated them while loading, by buffer type: "CPU_REPACK 646.0 MiB, CPU
 * 120.5 MiB" (a CPU model whose quantized matrices were repacked), "CUDA0 ... MiB, CPU_Mapped ... MiB"... Never NULL;
 * valid as long as the handle. */
const char * moss_bridge_weight_buffers(const struct moss_bridge * h);

/* Frees the handle, its context and model. NULL is accepted. */
void moss_bridge_free(struct moss_bridge * h);

int32_t moss_bridge_n_embd(const struct moss_bridge * h, int32_t * out);  /* width of an input row */
int32_t moss_bridge_n_vocab(const struct moss_bridge * h, int32_t * out); /* text logits per row */
int32_t moss_bridge_n_ctx(const struct moss_bridge * h, int32_t * out);   /* actual (rounded) n_ctx */
int32_t moss_bridge_n_pos(const struct moss_bridge * h, int32_t * out);   /* rows now in the KV cache */

/* Appends n_rows rows (row-major, n_rows x n_embd floats) to the KV cache. Only the last row produces an
 * output (hidden state and text logits): the others run with outputs off, so a long prompt does not pay
 * the final norm and the text head at every position. Refuses with ERR_CONTEXT_FULL, decoding nothing,
 * when n_pos + n_rows > n_ctx. */
int32_t moss_bridge_prefill(struct moss_bridge * h, const float * embd, int32_t n_rows);

/* Appends one row (n_embd floats); same as moss_bridge_prefill(h, embd, 1). */
int32_t moss_bridge_decode(struct moss_bridge * h, const float * embd);

/* Copies the hidden state of the last decoded row, after the final RMSNorm (n_embd floats). */
int32_t moss_bridge_get_hidden(struct moss_bridge * h, float * out);

/* Copies the text logits of the last decoded row (n_vocab floats). */
int32_t moss_bridge_get_text_logits(struct moss_bridge * h, float * out);

/* Whether the following decodes compute the text head (default 1). With 0 the graph stops after the final
 * norm: the hidden state is produced as usual but the text logits are not (get_text_logits then fails with
 * ERR_NO_OUTPUT), which saves the (n_vocab x n_embd) text head on every step that needs no text logits,
 * e.g. the audio phase, whose two allowed text logits the caller computes from the hidden state. */
int32_t moss_bridge_set_text_logits(struct moss_bridge * h, int32_t enabled);

/* Empties the KV cache: the next prefill starts at position 0. */
int32_t moss_bridge_clear(struct moss_bridge * h);

/* Keeps the KV cache's first n_keep rows (positions 0..n_keep-1) and removes the rest, so that the next
 * prefill continues at position n_keep: a prompt that begins with rows already in the cache prefills only
 * the rows after them. Removing rows drops the last row's outputs (get_hidden fails until the next decode);
 * n_keep >= n_pos removes nothing and keeps them. n_keep < 0 is ERR_INVALID_ARGUMENT. */
int32_t moss_bridge_truncate(struct moss_bridge * h, int32_t n_keep);

/* A short constant name for a status code ("MOSS_BRIDGE_ERR_CONTEXT_FULL"...). Never NULL. */
const char * moss_bridge_status_string(int32_t status);

/* The detailed message of the handle's last failed call ("" if none). With h == NULL: the message of the
 * last failed moss_bridge_create or moss_bridge_quantize on the calling thread. Valid until the next call on
 * the same handle. */
const char * moss_bridge_last_error(const struct moss_bridge * h);

/* Quantizes the GGUF at input_path (F32/F16/BF16 weights) into output_path, as llama.cpp's llama-quantize
 * tool does. ftype is an enum llama_ftype value (LLAMA_FTYPE_MOSTLY_Q8_0 = 7, Q4_K_M = 15, Q5_K_M = 17,
 * Q6_K = 18...); n_threads <= 0 means all online cores. Runs for minutes on a large model and logs one line
 * per tensor (visible with moss_bridge_set_verbose(1)). output_path is written in place: after a failure it
 * may hold a partial file, which the caller removes. Needs no handle; on failure the reason is readable with
 * moss_bridge_last_error(NULL) on this thread. */
int32_t moss_bridge_quantize(const char * input_path, const char * output_path, int32_t ftype, int32_t n_threads);

/* ---- the CPU's extra buffer types (process-wide) ---------------------------------------------------------------
 * llama.cpp's CPU backend may keep weight matrices in "extra" buffer types, each with its own layout and matrix
 * kernels, chosen per tensor in this order when a model loads (with extra_bufts = 1): "AMX" (Intel AMX tiles, only
 * in a library built with AMX and run on a CPU that has it), "CPU_KLEIDIAI" (Arm), "CPU_REPACK" (quantized rows
 * interleaved for the CPU's SIMD width), then plain "CPU" memory for whatever none of them takes. */

/* How many extra buffer types llama.cpp's loader will consider, skipped ones not counted. */
int32_t moss_bridge_cpu_extra_buft_count(void);

/* The name of the i-th of them, in llama.cpp's order of preference; NULL when i is out of range. */
const char * moss_bridge_cpu_extra_buft_name(int32_t i);

/* Removes the extra buffer type named `name` from the list llama.cpp's loader reads, for every model loaded after
 * the call in this process, by this bridge or by any other user of the same libllama (llama-cpp-python's own
 * bindings): their weights go to the next type that takes them, as if this library had been built without it.
 * For a buffer type whose kernels are unsafe on this machine; there is no undo. ERR_INVALID_ARGUMENT when no such
 * type is in the list (already skipped, or never there). */
int32_t moss_bridge_skip_cpu_extra_buft(const char * name);

/* Process-wide: 0 (default) keeps llama.cpp's log quiet (its errors still reach last_error); 1 forwards
 * all of llama.cpp's log to stderr. */
int32_t moss_bridge_set_verbose(int32_t verbose);

#ifdef __cplusplus
}
#endif

#endif /* MOSS_BRIDGE_H */

/*
 * moss_bridge: see moss_bridge.h.
 *
 * How a prefill avoids the output layer: with cparams.embeddings = true llama.cpp marks every row of a
 * batch as an output (llama_context::decode, output_all), so the last layer's FFN, the final norm and
 * the text head would run on every row. All rows but the last are therefore decoded with embeddings
 * switched off and no row flagged as output (a batch with zero outputs is valid: the graph gathers zero
 * rows after the last attention block). The last row is then decoded on its own with embeddings on,
 * which yields both its hidden state and its text logits.
 */
#include "moss_bridge.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#define MOSS_ERROR_LEN 1024
#define MOSS_LOG_LEN 512
#define MOSS_BUFFERS_LEN 256
/* Bytes of tensor rows llama_model_quantize converts at once. Its default (8 GiB) would widen a whole
 * 155,648 x 4096 embedding table to float32 in one go (~4 GB next to it); slabs of whole rows give the
 * same result with a bounded buffer. */
#define MOSS_QUANTIZE_BUF_SIZE ((size_t) 256 * 1024 * 1024)

struct moss_bridge {
    struct llama_model * model;
    struct llama_context * ctx;
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_ctx;
    int32_t n_batch;
    llama_pos * pos;  /* n_batch positions, reused by every llama_decode call */
    int8_t * output;  /* n_batch output flags, likewise */
    int has_output;   /* the last llama_decode succeeded and produced the last row's outputs */
    int text_logits;  /* decodes compute the text head (moss_bridge_set_text_logits); default 1 */
    int has_logits;   /* has_output, and the text head ran for it */
    char weight_buffers[MOSS_BUFFERS_LEN]; /* moss_bridge_weight_buffers */
    char last_error[MOSS_ERROR_LEN];
};

/* The graph-evaluation callback that skips the text head. With the text logits switched off it asks to see
 * the final-normed hidden state (llama.cpp names it result_norm, renamed result_embd_pooled when pooling is
 * NONE) and, once that node is computed, returns false: ggml's scheduler then stops computing the rest of
 * that split, i.e. the text head, the graph's only node after it. The hidden state is complete and
 * llama.cpp reads it as usual; the logits buffer keeps stale values, which get_text_logits refuses to
 * hand out. With the text logits on, no node is asked for and the graph runs as one piece. */
static bool moss_eval_callback(struct ggml_tensor * t, bool ask, void * user_data) {
    const struct moss_bridge * h = user_data;
    if (h->text_logits) {
        return !ask;
    }
    if (ask) {
        return strcmp(t->name, "result_norm") == 0 || strcmp(t->name, "result_embd_pooled") == 0;
    }
    return false;
}

/* ---- llama.cpp log capture ------------------------------------------------------------------------- */

static atomic_int g_verbose = 0;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

/* The first error (or, failing any, the last warning) llama.cpp logged on this thread since log_reset():
 * model loading and decoding log on the calling thread, and the first error names the root cause (later
 * ones say "failed to load model"), so it is appended to our messages. */
static _Thread_local char g_log_msg[MOSS_LOG_LEN];
static _Thread_local int g_log_level = GGML_LOG_LEVEL_NONE; /* level of g_log_msg */
static _Thread_local int g_log_capturing = 0; /* the previous log line was captured: keep its CONT parts */

static _Thread_local char g_create_error[MOSS_ERROR_LEN];

/* The weights' buffers of the model loading on this thread, from the loader's "<name> model buffer size = <x> MiB"
 * lines (llama_model::load_tensors): llama.cpp has no call that lists them. NULL when no load is being watched. */
static _Thread_local char * g_weight_buffers;

static void note_weight_buffer(const char * text) {
    static const char mark[] = " model buffer size = ";
    const char * at = strstr(text, mark);
    if (at == NULL) {
        return;
    }
    const char * name = at;
    while (name > text && name[-1] != ' ' && name[-1] != ':') {
        --name;
    }
    size_t used = strlen(g_weight_buffers);
    snprintf(g_weight_buffers + used, MOSS_BUFFERS_LEN - used, "%s%.*s %.1f MiB", used ? ", " : "", (int) (at - name),
             name, strtod(at + sizeof(mark) - 1, NULL));
}

static void moss_log_callback(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (atomic_load(&g_verbose)) {
        fputs(text, stderr);
    }
    if (g_weight_buffers != NULL && level == GGML_LOG_LEVEL_INFO) {
        note_weight_buffer(text);
    }
    if ((level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) && g_log_level != GGML_LOG_LEVEL_ERROR) {
        snprintf(g_log_msg, sizeof(g_log_msg), "%s", text);
        g_log_level = level;
        g_log_capturing = 1;
    } else if (level == GGML_LOG_LEVEL_CONT && g_log_capturing) {
        size_t used = strlen(g_log_msg);
        snprintf(g_log_msg + used, sizeof(g_log_msg) - used, "%s", text);
    } else {
        g_log_capturing = 0;
        return;
    }
    /* keep one line: drop the trailing newline */
    size_t len = strlen(g_log_msg);
    while (len > 0 && (g_log_msg[len - 1] == '\n' || g_log_msg[len - 1] == '\r')) {
        g_log_msg[--len] = '\0';
    }
}

static void moss_init_once(void) {
    llama_log_set(moss_log_callback, NULL);
    llama_backend_init();
}

static void log_reset(void) {
    g_log_msg[0] = '\0';
    g_log_level = GGML_LOG_LEVEL_NONE;
    g_log_capturing = 0;
}

/* ---- error messages -------------------------------------------------------------------------------- */

/* Formats a message into buf, followed by llama.cpp's last logged warning/error when there is one. */
static void format_error(char * buf, size_t size, const char * fmt, va_list args) {
    int n = vsnprintf(buf, size, fmt, args);
    if (n >= 0 && (size_t) n < size && g_log_msg[0] != '\0') {
        snprintf(buf + n, size - (size_t) n, " (llama.cpp: %s)", g_log_msg);
    }
}

static int32_t fail(struct moss_bridge * h, int32_t status, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    format_error(h->last_error, sizeof(h->last_error), fmt, args);
    va_end(args);
    return status;
}

static int32_t fail_create(int32_t status, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    format_error(g_create_error, sizeof(g_create_error), fmt, args);
    va_end(args);
    return status;
}

const char * moss_bridge_status_string(int32_t status) {
    switch (status) {
        case MOSS_BRIDGE_OK: return "MOSS_BRIDGE_OK";
        case MOSS_BRIDGE_ERR_INVALID_ARGUMENT: return "MOSS_BRIDGE_ERR_INVALID_ARGUMENT";
        case MOSS_BRIDGE_ERR_MODEL_LOAD: return "MOSS_BRIDGE_ERR_MODEL_LOAD";
        case MOSS_BRIDGE_ERR_CONTEXT_CREATE: return "MOSS_BRIDGE_ERR_CONTEXT_CREATE";
        case MOSS_BRIDGE_ERR_CONTEXT_FULL: return "MOSS_BRIDGE_ERR_CONTEXT_FULL";
        case MOSS_BRIDGE_ERR_DECODE: return "MOSS_BRIDGE_ERR_DECODE";
        case MOSS_BRIDGE_ERR_NO_OUTPUT: return "MOSS_BRIDGE_ERR_NO_OUTPUT";
        case MOSS_BRIDGE_ERR_ALLOC: return "MOSS_BRIDGE_ERR_ALLOC";
        case MOSS_BRIDGE_ERR_QUANTIZE: return "MOSS_BRIDGE_ERR_QUANTIZE";
        default: return "MOSS_BRIDGE_ERR_UNKNOWN";
    }
}

const char * moss_bridge_last_error(const struct moss_bridge * h) {
    return h ? h->last_error : g_create_error;
}

const char * moss_bridge_weight_buffers(const struct moss_bridge * h) {
    return h ? h->weight_buffers : "";
}

/* ---- the CPU's extra buffer types ------------------------------------------------------------------------- */

static pthread_mutex_t g_bufts_lock = PTHREAD_MUTEX_INITIALIZER;

/* The NULL-terminated list llama.cpp's loader reads (make_cpu_buft_list): the CPU backend hands out its own
 * static copy, the one that ggml_backend_dev_get_extra_bufts returns every time, so an entry removed from it
 * stays removed; the backend's own list, which its supports_op checks read, is another copy and keeps it. */
static ggml_backend_buffer_type_t * cpu_extra_bufts(void) {
    pthread_once(&g_init_once, moss_init_once);
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == NULL) {
        return NULL;
    }
    ggml_backend_dev_get_extra_bufts_t get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu), "ggml_backend_dev_get_extra_bufts");
    return get ? get(cpu) : NULL;
}

int32_t moss_bridge_cpu_extra_buft_count(void) {
    pthread_mutex_lock(&g_bufts_lock);
    int32_t n = 0;
    for (ggml_backend_buffer_type_t * buft = cpu_extra_bufts(); buft && *buft; ++buft) {
        ++n;
    }
    pthread_mutex_unlock(&g_bufts_lock);
    return n;
}

const char * moss_bridge_cpu_extra_buft_name(int32_t i) {
    pthread_mutex_lock(&g_bufts_lock);
    const char * name = NULL;
    ggml_backend_buffer_type_t * buft = cpu_extra_bufts();
    for (int32_t k = 0; i >= 0 && buft && buft[k]; ++k) {
        if (k == i) {
            name = ggml_backend_buft_name(buft[k]);
            break;
        }
    }
    pthread_mutex_unlock(&g_bufts_lock);
    return name;
}

int32_t moss_bridge_skip_cpu_extra_buft(const char * name) {
    if (name == NULL) {
        return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_bufts_lock);
    int32_t status = MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    ggml_backend_buffer_type_t * buft = cpu_extra_bufts();
    for (; buft && *buft; ++buft) {
        if (strcmp(ggml_backend_buft_name(*buft), name) == 0) {
            do { /* close the gap, the terminating NULL included */
                buft[0] = buft[1];
            } while (*buft++ != NULL);
            status = MOSS_BRIDGE_OK;
            break;
        }
    }
    pthread_mutex_unlock(&g_bufts_lock);
    return status;
}

int32_t moss_bridge_set_verbose(int32_t verbose) {
    pthread_once(&g_init_once, moss_init_once);
    atomic_store(&g_verbose, verbose != 0);
    return MOSS_BRIDGE_OK;
}

int32_t moss_bridge_abi_version(void) {
    return MOSS_BRIDGE_ABI_VERSION;
}

/* ---- lifetime -------------------------------------------------------------------------------------- */

struct moss_bridge_params moss_bridge_default_params(void) {
    struct moss_bridge_params p;
    p.model_path = NULL;
    p.n_ctx = 4096;
    p.n_batch = 512;
    p.n_threads = 0;
    p.n_threads_batch = 0;
    p.n_gpu_layers = -1;
    p.type_k = GGML_TYPE_F16;
    p.type_v = GGML_TYPE_F16;
    p.flash_attn = -1;
    p.extra_bufts = 1;
    return p;
}

static int32_t check_params(const struct moss_bridge_params * p) {
    if (p->model_path == NULL || p->model_path[0] == '\0') {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "model_path is empty");
    }
    if (p->n_ctx <= 0 || p->n_batch <= 0) {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "n_ctx (%d) and n_batch (%d) must be positive",
                           p->n_ctx, p->n_batch);
    }
    if (p->n_gpu_layers < -1) {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "n_gpu_layers must be >= -1, got %d",
                           p->n_gpu_layers);
    }
    if (p->flash_attn < -1 || p->flash_attn > 1) {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "flash_attn must be -1, 0 or 1, got %d",
                           p->flash_attn);
    }
    if (p->type_k < 0 || p->type_k >= GGML_TYPE_COUNT || p->type_v < 0 || p->type_v >= GGML_TYPE_COUNT) {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "type_k (%d) / type_v (%d) is not a ggml_type",
                           p->type_k, p->type_v);
    }
    return MOSS_BRIDGE_OK;
}

static int32_t all_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int32_t) n : 1;
}

void moss_bridge_free(struct moss_bridge * h) {
    if (h == NULL) {
        return;
    }
    if (h->ctx) {
        llama_free(h->ctx);
    }
    if (h->model) {
        llama_model_free(h->model);
    }
    free(h->pos);
    free(h->output);
    free(h);
}

int32_t moss_bridge_create(const struct moss_bridge_params * params, struct moss_bridge ** out) {
    pthread_once(&g_init_once, moss_init_once);
    log_reset();
    g_create_error[0] = '\0';
    if (out == NULL || params == NULL) {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "params and out must not be NULL");
    }
    *out = NULL;
    int32_t status = check_params(params);
    if (status != MOSS_BRIDGE_OK) {
        return status;
    }

    /* llama.cpp reports a missing file only in its log; say it plainly. */
    FILE * f = fopen(params->model_path, "rb");
    if (f == NULL) {
        return fail_create(MOSS_BRIDGE_ERR_MODEL_LOAD, "cannot open model file '%s': %s", params->model_path,
                           strerror(errno));
    }
    fclose(f);

    struct moss_bridge * h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return fail_create(MOSS_BRIDGE_ERR_ALLOC, "out of memory allocating the bridge handle");
    }

    struct llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = params->n_gpu_layers;
    mparams.use_extra_bufts = params->extra_bufts != 0;
    /* All on the CPU: read the weights instead of mapping them. llama.cpp repacks most quantized CPU weights
     * into a faster layout in memory of its own and keeps the file pages it read them from mapped, so a
     * mapping holds the GGUF in RAM twice (8B Q4_K_M: 4.8 GB mapped + 3.2 GB repacked; read: 5.0 GB). */
    if (params->n_gpu_layers == 0 || !llama_supports_gpu_offload()) {
        mparams.load_mode = LLAMA_LOAD_MODE_NONE;
    }
    g_weight_buffers = h->weight_buffers;
    h->model = llama_model_load_from_file(params->model_path, mparams);
    g_weight_buffers = NULL;
    if (h->model == NULL) {
        status = fail_create(MOSS_BRIDGE_ERR_MODEL_LOAD, "llama.cpp could not load model file '%s'",
                             params->model_path);
        moss_bridge_free(h);
        return status;
    }

    int32_t n_threads = params->n_threads > 0 ? params->n_threads : all_cores();
    int32_t n_threads_batch = params->n_threads_batch > 0 ? params->n_threads_batch : n_threads;
    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) params->n_ctx;
    cparams.n_batch = (uint32_t) params->n_batch;
    cparams.n_ubatch = (uint32_t) params->n_batch;
    cparams.n_seq_max = 1;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads_batch;
    cparams.embeddings = true;
    cparams.pooling_type = LLAMA_POOLING_TYPE_NONE;
    cparams.flash_attn_type = (enum llama_flash_attn_type) params->flash_attn;
    cparams.type_k = (enum ggml_type) params->type_k;
    cparams.type_v = (enum ggml_type) params->type_v;
    cparams.no_perf = true;
    cparams.cb_eval = moss_eval_callback;
    cparams.cb_eval_user_data = h;
    h->text_logits = 1;
    log_reset(); /* drop the loader's warnings: only the context's own complaints explain a failure here */
    h->ctx = llama_init_from_model(h->model, cparams);
    if (h->ctx == NULL) {
        status = fail_create(MOSS_BRIDGE_ERR_CONTEXT_CREATE,
                             "llama.cpp could not create a context for '%s' (n_ctx %d, n_batch %d, type_k %s, "
                             "type_v %s, flash_attn %d)",
                             params->model_path, params->n_ctx, params->n_batch,
                             ggml_type_name((enum ggml_type) params->type_k),
                             ggml_type_name((enum ggml_type) params->type_v), params->flash_attn);
        moss_bridge_free(h);
        return status;
    }

    h->n_embd = llama_model_n_embd(h->model);
    h->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(h->model));
    h->n_ctx = (int32_t) llama_n_ctx(h->ctx);
    h->n_batch = (int32_t) llama_n_batch(h->ctx);
    h->pos = malloc(sizeof(*h->pos) * (size_t) h->n_batch);
    h->output = malloc(sizeof(*h->output) * (size_t) h->n_batch);
    if (h->pos == NULL || h->output == NULL) {
        moss_bridge_free(h); /* nothing logged: malloc failed, not llama.cpp */
        return fail_create(MOSS_BRIDGE_ERR_ALLOC, "out of memory allocating %d batch slots", params->n_batch);
    }
    *out = h;
    return MOSS_BRIDGE_OK;
}

/* ---- queries --------------------------------------------------------------------------------------- */

/* Rows in the KV cache, read from llama.cpp itself so that it stays right after a failed decode. */
static int32_t current_pos(const struct moss_bridge * h) {
    return (int32_t) llama_memory_seq_pos_max(llama_get_memory(h->ctx), 0) + 1;
}

#define MOSS_GETTER(name, expr)                                       \
    int32_t name(const struct moss_bridge * h, int32_t * out) {      \
        if (h == NULL || out == NULL) {                               \
            return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;                  \
        }                                                             \
        *out = (expr);                                                \
        return MOSS_BRIDGE_OK;                                        \
    }

MOSS_GETTER(moss_bridge_n_embd, h->n_embd)
MOSS_GETTER(moss_bridge_n_vocab, h->n_vocab)
MOSS_GETTER(moss_bridge_n_ctx, h->n_ctx)
MOSS_GETTER(moss_bridge_n_pos, current_pos(h))

/* ---- decoding -------------------------------------------------------------------------------------- */

/* One llama_decode of n rows at position pos0; only the last row is an output when with_output. */
static int32_t decode_rows(struct moss_bridge * h, const float * embd, int32_t n, int32_t pos0, int with_output) {
    for (int32_t i = 0; i < n; ++i) {
        h->pos[i] = pos0 + i;
        h->output[i] = 0;
    }
    h->output[n - 1] = (int8_t) (with_output != 0);

    struct llama_batch batch = {0};
    batch.n_tokens = n;
    batch.embd = (float *) embd; /* llama.cpp copies the rows; it never writes through this pointer */
    batch.pos = h->pos;
    batch.logits = h->output; /* n_seq_id / seq_id NULL: every row in sequence 0 */

    llama_set_embeddings(h->ctx, with_output != 0);
    log_reset();
    int32_t ret = llama_decode(h->ctx, batch);
    if (ret == 0) {
        return MOSS_BRIDGE_OK;
    }
    if (ret == 1) {
        return fail(h, MOSS_BRIDGE_ERR_CONTEXT_FULL, "no KV cache slot for rows %d..%d (n_ctx %d)", pos0,
                    pos0 + n - 1, h->n_ctx);
    }
    return fail(h, MOSS_BRIDGE_ERR_DECODE, "llama_decode returned %d for rows %d..%d", ret, pos0, pos0 + n - 1);
}

int32_t moss_bridge_prefill(struct moss_bridge * h, const float * embd, int32_t n_rows) {
    if (h == NULL) {
        return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    }
    h->last_error[0] = '\0';
    log_reset();
    if (embd == NULL || n_rows <= 0) {
        return fail(h, MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "prefill needs at least one row, got %d%s", n_rows,
                    embd == NULL ? " and a NULL pointer" : "");
    }
    int32_t pos = current_pos(h);
    if ((int64_t) pos + n_rows > h->n_ctx) {
        return fail(h, MOSS_BRIDGE_ERR_CONTEXT_FULL,
                    "%d row(s) at position %d would fill the KV cache to %lld rows, but n_ctx is %d; "
                    "clear the context or raise n_ctx",
                    n_rows, pos, (long long) pos + n_rows, h->n_ctx);
    }

    h->has_output = 0;
    const size_t row = (size_t) h->n_embd;
    int32_t done = 0;
    while (done < n_rows - 1) {
        int32_t n = n_rows - 1 - done;
        if (n > h->n_batch) {
            n = h->n_batch;
        }
        int32_t status = decode_rows(h, embd + (size_t) done * row, n, pos + done, 0);
        if (status != MOSS_BRIDGE_OK) {
            return status;
        }
        done += n;
    }
    int32_t status = decode_rows(h, embd + (size_t) done * row, 1, pos + done, 1);
    if (status != MOSS_BRIDGE_OK) {
        return status;
    }
    h->has_output = 1;
    h->has_logits = h->text_logits;
    return MOSS_BRIDGE_OK;
}

int32_t moss_bridge_decode(struct moss_bridge * h, const float * embd) {
    return moss_bridge_prefill(h, embd, 1);
}

/* Copies n floats of the last row's output, read by getter, into out. */
static int32_t copy_output(struct moss_bridge * h, float * out, float * (*getter)(struct llama_context *, int32_t),
                           int32_t n, const char * what) {
    if (h == NULL) {
        return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    }
    h->last_error[0] = '\0';
    log_reset();
    if (out == NULL) {
        return fail(h, MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "NULL output buffer for the %s", what);
    }
    if (!h->has_output) {
        return fail(h, MOSS_BRIDGE_ERR_NO_OUTPUT, "no %s: nothing decoded since the last clear, or the last decode failed",
                    what);
    }
    const float * src = getter(h->ctx, -1);
    if (src == NULL) {
        return fail(h, MOSS_BRIDGE_ERR_NO_OUTPUT, "llama.cpp returned no %s for the last row", what);
    }
    memcpy(out, src, sizeof(float) * (size_t) n);
    return MOSS_BRIDGE_OK;
}

int32_t moss_bridge_get_hidden(struct moss_bridge * h, float * out) {
    return copy_output(h, out, llama_get_embeddings_ith, h ? h->n_embd : 0, "hidden state");
}

int32_t moss_bridge_get_text_logits(struct moss_bridge * h, float * out) {
    if (h != NULL && h->has_output && !h->has_logits) {
        return fail(h, MOSS_BRIDGE_ERR_NO_OUTPUT,
                    "no text logits: the text head was switched off for the last decode (moss_bridge_set_text_logits)");
    }
    return copy_output(h, out, llama_get_logits_ith, h ? h->n_vocab : 0, "text logits");
}

int32_t moss_bridge_set_text_logits(struct moss_bridge * h, int32_t enabled) {
    if (h == NULL) {
        return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    }
    h->text_logits = enabled != 0;
    return MOSS_BRIDGE_OK;
}

int32_t moss_bridge_clear(struct moss_bridge * h) {
    if (h == NULL) {
        return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    }
    h->last_error[0] = '\0';
    llama_memory_clear(llama_get_memory(h->ctx), true);
    h->has_output = 0;
    return MOSS_BRIDGE_OK;
}

int32_t moss_bridge_truncate(struct moss_bridge * h, int32_t n_keep) {
    if (h == NULL) {
        return MOSS_BRIDGE_ERR_INVALID_ARGUMENT;
    }
    h->last_error[0] = '\0';
    log_reset();
    if (n_keep < 0) {
        return fail(h, MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "truncate keeps n_keep >= 0 rows, got %d", n_keep);
    }
    if (n_keep >= current_pos(h)) {
        return MOSS_BRIDGE_OK;
    }
    /* A plain KV cache removes any position range; only a recurrent memory (not Qwen3) could refuse. */
    if (!llama_memory_seq_rm(llama_get_memory(h->ctx), 0, n_keep, -1)) {
        return fail(h, MOSS_BRIDGE_ERR_DECODE, "llama.cpp could not remove KV cache rows %d.. (n_pos %d)", n_keep,
                    current_pos(h));
    }
    h->has_output = 0;
    return MOSS_BRIDGE_OK;
}

/* ---- quantization ---------------------------------------------------------------------------------- */

int32_t moss_bridge_quantize(const char * input_path, const char * output_path, int32_t ftype, int32_t n_threads) {
    pthread_once(&g_init_once, moss_init_once);
    log_reset();
    g_create_error[0] = '\0';
    if (input_path == NULL || output_path == NULL || input_path[0] == '\0' || output_path[0] == '\0') {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "input_path and output_path must not be empty");
    }
    if (ftype < 0) {
        return fail_create(MOSS_BRIDGE_ERR_INVALID_ARGUMENT, "ftype must be an enum llama_ftype value, got %d", ftype);
    }
    /* llama.cpp reports a missing file only in its log; say it plainly. */
    FILE * f = fopen(input_path, "rb");
    if (f == NULL) {
        return fail_create(MOSS_BRIDGE_ERR_MODEL_LOAD, "cannot open model file '%s': %s", input_path, strerror(errno));
    }
    fclose(f);

    struct llama_model_quantize_params qparams = llama_model_quantize_default_params();
    qparams.nthread = n_threads > 0 ? n_threads : all_cores();
    qparams.ftype = (enum llama_ftype) ftype;
    qparams.max_buf_size = MOSS_QUANTIZE_BUF_SIZE;
    if (llama_model_quantize(input_path, output_path, &qparams) != 0) {
        return fail_create(MOSS_BRIDGE_ERR_QUANTIZE, "llama.cpp could not quantize '%s' to ftype %d", input_path,
                           ftype);
    }
    return MOSS_BRIDGE_OK;
}

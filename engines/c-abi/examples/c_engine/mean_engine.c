/*
 * mean_engine.c — a DEMONSTRATION of the kneepoint IF ABI (kneepoint_if.h).
 *
 * This is not a model and stands in for none. It is the smallest engine that
 * exercises every callback, every ownership rule and every error path of the
 * ABI, with arithmetic simple enough to re-implement exactly in a test.
 *
 * "Model": a text file (or the same bytes in memory) of key=value lines:
 *
 *     # comment
 *     num_classes=10
 *     input=3,8,8
 *     input_name=image        (optional, default "input")
 *     output_name=scores      (optional, default "scores")
 *
 * "Inference": each input's input_elems = product(input) values, in their
 * flattened order, are split into num_classes contiguous windows; window k
 * is [k * n / K, (k + 1) * n / K) with n = input_elems, K = num_classes
 * (so K <= n), and scores[k] is the mean of window k, summed in order in
 * double precision and rounded once to float. Every input value lands in
 * exactly one window, so every output depends on the whole input.
 *
 * Build as a shared library: cc -shared -fPIC -I../../../../ffi/if-abi/include mean_engine.c
 */

#include "kneepoint_if.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest batch configure_batch accepts: a sanity bound, not a tuning. */
#define MEAN_MAX_BATCH 65536
/* Longest tensor name, NUL included. */
#define MEAN_NAME_CAP 64
/* Largest model text accepted. */
#define MEAN_MODEL_CAP 4096

/* ---- Errors: a heap-allocated, self-contained message ------------------ */

struct kp_error {
    size_t len;     /* strlen(message) */
    char message[]; /* NUL-terminated; allocated to its length */
};

/* Stores a formatted message in *err (if memory allows) and returns status. */
static kp_status fail(kp_error **err, kp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kp_status fail(kp_error **err, kp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0 || err == NULL) {
        return status;
    }
    kp_error *e = malloc(sizeof(kp_error) + (size_t)len + 1);
    if (e == NULL) {
        return status; /* no memory: the host reports a status without text */
    }
    va_start(ap, fmt);
    vsnprintf(e->message, (size_t)len + 1, fmt, ap);
    va_end(ap);
    e->len = (size_t)len;
    *err = e;
    return status;
}

static const char *mean_error_message(const kp_error *err) {
    return err->message;
}

static void mean_error_free(kp_error *err) {
    free(err);
}

/* ---- The engine -------------------------------------------------------- */

struct kp_engine {
    size_t threads;     /* recorded only: this engine is single-threaded */
    int loaded;         /* a model has been loaded or linked */
    size_t max_batch;   /* 0 until configure_batch */
    size_t num_classes; /* K */
    size_t input_elems; /* n */
    kp_shape input_shape;
    char input_name[MEAN_NAME_CAP];
    char output_name[MEAN_NAME_CAP];
};

/* The parsed "model", before it is committed to the engine. */
typedef struct mean_model {
    size_t num_classes;
    kp_shape input_shape;
    char input_name[MEAN_NAME_CAP];
    char output_name[MEAN_NAME_CAP];
} mean_model;

static kp_status mean_init(const kp_engine_config *config, kp_engine **out,
                           kp_error **err) {
    if (config->abi_version_major != KP_IF_ABI_VERSION_MAJOR) {
        return fail(err, KP_STATUS_RUN,
                    "host speaks ABI %u.%u, this engine was built for %d.%d",
                    (unsigned)config->abi_version_major,
                    (unsigned)config->abi_version_minor,
                    KP_IF_ABI_VERSION_MAJOR, KP_IF_ABI_VERSION_MINOR);
    }
    if (config->intra_op_threads == 0) {
        return fail(err, KP_STATUS_RUN, "intra_op_threads must be at least 1");
    }
    kp_engine *engine = calloc(1, sizeof(kp_engine));
    if (engine == NULL) {
        return fail(err, KP_STATUS_RUN, "out of memory");
    }
    engine->threads = config->intra_op_threads;
    *out = engine;
    return KP_STATUS_OK;
}

static void mean_deinit(kp_engine *engine) {
    free(engine); /* the names live inside it */
}

/* Copies [start, end) into dst (capacity cap) as a NUL-terminated string. */
static int copy_token(char *dst, size_t cap, const char *start,
                      const char *end) {
    size_t len = (size_t)(end - start);
    if (len == 0 || len >= cap) {
        return -1;
    }
    memcpy(dst, start, len);
    dst[len] = '\0';
    return 0;
}

/* Parses a decimal size in [start, end); -1 unless it is all digits, >= 1
 * and at most 1e9 (far beyond any input, and overflow-free below). */
static int parse_size(const char *start, const char *end, size_t *out) {
    size_t value = 0;
    if (start == end) {
        return -1;
    }
    for (const char *p = start; p < end; p++) {
        if (*p < '0' || *p > '9') {
            return -1;
        }
        value = value * 10 + (size_t)(*p - '0');
        if (value > 1000000000u) {
            return -1;
        }
    }
    if (value == 0) {
        return -1;
    }
    *out = value;
    return 0;
}

/* Parses a "model" of len bytes (not NUL-terminated). `what` names it in
 * messages. On success fills *model. */
static kp_status parse_model(const char *text, size_t len, const char *what,
                             mean_model *model, kp_error **err) {
    memset(model, 0, sizeof(*model));
    strcpy(model->input_name, "input");
    strcpy(model->output_name, "scores");
    if (len > MEAN_MODEL_CAP) {
        return fail(err, KP_STATUS_MODEL, "%s: %zu bytes, more than %d",
                    what, len, MEAN_MODEL_CAP);
    }
    const char *end = text + len;
    const char *line = text;
    int line_no = 0;
    while (line < end) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL) {
            eol = end;
        }
        line_no++;
        const char *stop = eol;
        if (stop > line && stop[-1] == '\r') {
            stop--;
        }
        if (stop > line && line[0] != '#') {
            const char *eq = memchr(line, '=', (size_t)(stop - line));
            if (eq == NULL) {
                return fail(err, KP_STATUS_MODEL,
                            "%s: line %d: expected key=value", what, line_no);
            }
            size_t key_len = (size_t)(eq - line);
            const char *val = eq + 1;
            if (key_len == 11 && memcmp(line, "num_classes", 11) == 0) {
                if (parse_size(val, stop, &model->num_classes) != 0) {
                    return fail(err, KP_STATUS_MODEL,
                                "%s: line %d: num_classes must be a positive "
                                "integer", what, line_no);
                }
            } else if (key_len == 5 && memcmp(line, "input", 5) == 0) {
                const char *dim = val;
                model->input_shape.rank = 0;
                while (1) {
                    const char *comma = memchr(dim, ',', (size_t)(stop - dim));
                    const char *dim_end = comma != NULL ? comma : stop;
                    if (model->input_shape.rank == KP_MAX_RANK) {
                        return fail(err, KP_STATUS_MODEL,
                                    "%s: line %d: more than %d dimensions",
                                    what, line_no, KP_MAX_RANK);
                    }
                    size_t *slot =
                        &model->input_shape.dims[model->input_shape.rank];
                    if (parse_size(dim, dim_end, slot) != 0) {
                        return fail(err, KP_STATUS_MODEL,
                                    "%s: line %d: dimensions must be positive "
                                    "integers", what, line_no);
                    }
                    model->input_shape.rank++;
                    if (comma == NULL) {
                        break;
                    }
                    dim = comma + 1;
                }
            } else if (key_len == 10 && memcmp(line, "input_name", 10) == 0) {
                if (copy_token(model->input_name, MEAN_NAME_CAP, val, stop)) {
                    return fail(err, KP_STATUS_MODEL,
                                "%s: line %d: input_name must have 1 to %d "
                                "bytes", what, line_no, MEAN_NAME_CAP - 1);
                }
            } else if (key_len == 11 && memcmp(line, "output_name", 11) == 0) {
                if (copy_token(model->output_name, MEAN_NAME_CAP, val, stop)) {
                    return fail(err, KP_STATUS_MODEL,
                                "%s: line %d: output_name must have 1 to %d "
                                "bytes", what, line_no, MEAN_NAME_CAP - 1);
                }
            } else {
                return fail(err, KP_STATUS_MODEL, "%s: line %d: unknown key",
                            what, line_no);
            }
        }
        line = eol + 1;
    }
    if (model->num_classes == 0 || model->input_shape.rank == 0) {
        return fail(err, KP_STATUS_MODEL,
                    "%s: needs num_classes= and input=", what);
    }
    size_t elems = 1;
    for (size_t i = 0; i < model->input_shape.rank; i++) {
        if (elems > 1000000000u / model->input_shape.dims[i]) {
            return fail(err, KP_STATUS_MODEL, "%s: input is too large", what);
        }
        elems *= model->input_shape.dims[i];
    }
    if (model->num_classes > elems) {
        return fail(err, KP_STATUS_MODEL,
                    "%s: num_classes %zu exceeds the %zu input values", what,
                    model->num_classes, elems);
    }
    return KP_STATUS_OK;
}

/* Commits a parsed model and describes it in *out (names point into the
 * engine, which owns them until deinit). */
static void commit_model(kp_engine *engine, const mean_model *model,
                         kp_model_info *out) {
    engine->loaded = 1;
    engine->num_classes = model->num_classes;
    engine->input_shape = model->input_shape;
    engine->input_elems = 1;
    for (size_t i = 0; i < model->input_shape.rank; i++) {
        engine->input_elems *= model->input_shape.dims[i];
    }
    memcpy(engine->input_name, model->input_name, MEAN_NAME_CAP);
    memcpy(engine->output_name, model->output_name, MEAN_NAME_CAP);

    out->input_name = engine->input_name;
    out->input_shape = engine->input_shape;
    out->output_name = engine->output_name;
    memset(&out->output_shape, 0, sizeof(out->output_shape));
    out->output_shape.rank = 1;
    out->output_shape.dims[0] = engine->num_classes;
}

static kp_status mean_link_model(kp_engine *engine, const uint8_t *bytes,
                                 size_t len, kp_model_info *out,
                                 kp_error **err) {
    if (engine->loaded) {
        return fail(err, KP_STATUS_ORDER, "a model is already loaded");
    }
    mean_model model;
    kp_status status =
        parse_model((const char *)bytes, len, "model in memory", &model, err);
    if (status != KP_STATUS_OK) {
        return status;
    }
    commit_model(engine, &model, out);
    return KP_STATUS_OK;
}

static kp_status mean_load_model(kp_engine *engine, const char *path,
                                 kp_model_info *out, kp_error **err) {
    if (engine->loaded) {
        return fail(err, KP_STATUS_ORDER, "a model is already loaded");
    }
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        return fail(err, KP_STATUS_MODEL, "cannot open %s: %s", path,
                    strerror(errno));
    }
    char text[MEAN_MODEL_CAP + 1];
    size_t len = fread(text, 1, sizeof(text), file);
    int read_failed = ferror(file);
    fclose(file);
    if (read_failed) {
        return fail(err, KP_STATUS_MODEL, "cannot read %s", path);
    }
    mean_model model;
    kp_status status = parse_model(text, len, path, &model, err);
    if (status != KP_STATUS_OK) {
        return status;
    }
    commit_model(engine, &model, out);
    return KP_STATUS_OK;
}

static kp_status mean_configure_batch(kp_engine *engine, size_t max_batch,
                                      kp_error **err) {
    if (!engine->loaded) {
        return fail(err, KP_STATUS_ORDER,
                    "configure_batch before load_model or link_model");
    }
    if (max_batch == 0 || max_batch > MEAN_MAX_BATCH) {
        return fail(err, KP_STATUS_SHAPE, "max_batch %zu is not in 1..=%d",
                    max_batch, MEAN_MAX_BATCH);
    }
    engine->max_batch = max_batch;
    return KP_STATUS_OK;
}

static kp_status mean_infer_batch(kp_engine *engine, const float *input,
                                  size_t input_len, size_t batch,
                                  float *output, size_t output_len,
                                  kp_error **err) {
    if (!engine->loaded) {
        return fail(err, KP_STATUS_ORDER,
                    "infer_batch before load_model or link_model");
    }
    if (engine->max_batch == 0) {
        return fail(err, KP_STATUS_ORDER, "infer_batch before configure_batch");
    }
    if (batch > engine->max_batch) {
        return fail(err, KP_STATUS_SHAPE,
                    "batch %zu exceeds the configured max_batch %zu", batch,
                    engine->max_batch);
    }
    size_t n = engine->input_elems;
    size_t k_count = engine->num_classes;
    if (input_len != batch * n) {
        return fail(err, KP_STATUS_SHAPE,
                    "input has %zu values, batch %zu needs %zu", input_len,
                    batch, batch * n);
    }
    if (output_len < batch * k_count) {
        return fail(err, KP_STATUS_SHAPE,
                    "output has room for %zu values, batch %zu needs %zu",
                    output_len, batch, batch * k_count);
    }
    for (size_t b = 0; b < batch; b++) {
        const float *x = input + b * n;
        float *scores = output + b * k_count;
        for (size_t k = 0; k < k_count; k++) {
            size_t lo = k * n / k_count;
            size_t hi = (k + 1) * n / k_count;
            double sum = 0.0;
            for (size_t i = lo; i < hi; i++) {
                sum += (double)x[i];
            }
            scores[k] = (float)(sum / (double)(hi - lo));
        }
    }
    return KP_STATUS_OK;
}

/* ---- The table and the entry point ------------------------------------- */

static const kp_framework MEAN_FRAMEWORK = {
    .abi_version_major = KP_IF_ABI_VERSION_MAJOR,
    .abi_version_minor = KP_IF_ABI_VERSION_MINOR,
    .name = "mean-demo",
    .init = mean_init,
    .deinit = mean_deinit,
    .load_model = mean_load_model,
    .link_model = mean_link_model,
    .configure_batch = mean_configure_batch,
    .infer_batch = mean_infer_batch,
    .error_message = mean_error_message,
    .error_free = mean_error_free,
};

KP_IF_EXPORT const kp_framework *kp_if_framework(void) {
    return &MEAN_FRAMEWORK;
}

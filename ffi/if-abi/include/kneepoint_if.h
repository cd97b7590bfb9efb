/*
 * kneepoint_if.h — the C ABI through which an inference function (IF) hosts
 * an inference engine written in C or C++.
 *
 * An engine is GSLICE's six callbacks (init, deinit, load_model, link_model,
 * configure_batch, infer_batch) plus a name and two error accessors, in one
 * table of function pointers, `kp_framework`. A shared library (.so) that
 * implements an engine exports one symbol, `kp_if_framework`, returning its
 * table; the host dlopen()s the library by path, calls that symbol, checks
 * the version and then calls the table. The Rust host side (crate
 * `kp-if-abi`) adapts the table to libml's `Framework` trait.
 *
 * Everything below is normative: a word such as "must" is a requirement on
 * the side named, and the host (crate kp-if-abi) relies on it for memory
 * safety.
 *
 * ------------------------------------------------------------------------
 * Versioning
 * ------------------------------------------------------------------------
 * KP_IF_ABI_VERSION_MAJOR changes when a change breaks existing engines or
 * hosts (a field moved, retyped or removed, a rule below changed). The host
 * refuses an engine whose table states a different major.
 *
 * KP_IF_ABI_VERSION_MINOR changes for backward-compatible additions only:
 * new fields appended at the end of `kp_framework` or `kp_engine_config`,
 * new status codes. A reader uses an appended field only when the other
 * side's stated minor is at least the minor that added it. A host accepts
 * any minor of its major.
 *
 * The engine states the version it was built against in the first two
 * fields of its `kp_framework`; the host states its own in the first two
 * fields of `kp_engine_config`. Those first two fields keep their place and
 * type in every major version, so either side can always read them.
 *
 * ------------------------------------------------------------------------
 * Call order (guaranteed by the host; an engine may rely on it)
 * ------------------------------------------------------------------------
 *   init                 once, first. If it fails there is no engine: no
 *                        further call is made with it and deinit is not
 *                        called (init must have released what it took).
 *   load_model |         exactly one of the two succeeds at most once,
 *   link_model           after init. A failed load or link must leave the
 *                        engine as it was; the host may try again.
 *   configure_batch      after a model is loaded, before the first
 *                        infer_batch, and again whenever the largest batch
 *                        the IF may run changes.
 *   infer_batch          only after a successful configure_batch, with
 *                        batch <= the last configured max_batch.
 *   deinit               once, last, whenever init succeeded (also after
 *                        any error). It cannot fail.
 * Engines may check the order anyway and answer KP_STATUS_ORDER.
 *
 * ------------------------------------------------------------------------
 * Threading
 * ------------------------------------------------------------------------
 * Calls on one engine instance are never concurrent: the host makes them
 * one at a time, each returning before the next starts. They may come from
 * different threads over the engine's life (the host may move an engine to
 * another thread between calls); an engine with thread-affine state (e.g.
 * a CUDA context) must make it current on each call. The host may create
 * several engine instances from one table and call different instances
 * concurrently, so an engine must not keep unsynchronised global mutable
 * state. `kp_if_framework`, `error_message` and `error_free` may be called
 * from any thread; for one error object, never concurrently.
 *
 * ------------------------------------------------------------------------
 * Ownership (for every pointer crossing the ABI)
 * ------------------------------------------------------------------------
 * - The `kp_framework` table and its `name` string belong to the library;
 *   they must stay valid and unchanged while the library is loaded. The
 *   host copies the table and the name when it opens the library.
 * - Inputs (`config`, `path`, `bytes`, `input`) are borrowed by the engine
 *   for the duration of the call only; it must copy what it keeps.
 * - `output` is borrowed, writable, for the duration of infer_batch only.
 * - `kp_engine*` is created by a successful init and owned by the engine's
 *   code; the host only passes it back and never dereferences it. It is
 *   freed by deinit. On a failed init the host ignores `*out`.
 * - `kp_model_info` is host memory (zeroed before the call) that the engine
 *   fills on success. The two name strings it points to are owned by the
 *   engine and must stay valid until the engine's next call returns or
 *   deinit, whichever is first; the host copies them before it makes
 *   another call. On error the host ignores `*out`.
 * - `kp_error*`: `*err` is NULL on entry. On success the engine must leave
 *   it NULL. On error the engine may set it to an error object it
 *   allocated (or leave it NULL if it has no message or no memory);
 *   ownership passes to the host, which copies the message with
 *   `error_message` and releases the object with `error_free` exactly once,
 *   before making any other call into the table. An error object must not
 *   depend on the engine instance (init errors have none). Should an engine
 *   set `*err` on success anyway, the host frees it the same way.
 * - Nothing the engine allocates is freed by the host with its own
 *   allocator, and nothing the host allocates is freed by the engine:
 *   no allocator crosses the ABI.
 */

#ifndef KNEEPOINT_IF_H
#define KNEEPOINT_IF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version ---------------------------------------------------------- */

#define KP_IF_ABI_VERSION_MAJOR 1
#define KP_IF_ABI_VERSION_MINOR 0

/* ---- Limits ----------------------------------------------------------- */

/* Most dimensions a tensor shape may have (without the batch dimension). */
#define KP_MAX_RANK 8

/* ---- Status codes ----------------------------------------------------- */

/* A fixed-width integer rather than an enum, whose size C leaves to the
 * compiler. The host maps each code to one Rust `EngineError` variant; a
 * code it does not know is treated as KP_STATUS_RUN. */
typedef int32_t kp_status;

/* The call succeeded. */
#define KP_STATUS_OK 0
/* The model could not be read, parsed or prepared. */
#define KP_STATUS_MODEL 1
/* Inputs, outputs or a batch size do not fit the model. */
#define KP_STATUS_SHAPE 2
/* The call came out of order (see "Call order" above). */
#define KP_STATUS_ORDER 3
/* Anything else went wrong (including a bad configuration or no memory). */
#define KP_STATUS_RUN 4

/* ---- Opaque handles --------------------------------------------------- */

/* One engine instance: the engine's own state. Defined by the engine. */
typedef struct kp_engine kp_engine;

/* One error: a message the engine allocated. Defined by the engine. */
typedef struct kp_error kp_error;

/* ---- Plain data ------------------------------------------------------- */

/* What the engine needs before it loads anything. Host memory, borrowed by
 * init for the call only. */
typedef struct kp_engine_config {
    /* The ABI the host was built against (KP_IF_ABI_VERSION_*). */
    uint32_t abi_version_major;
    uint32_t abi_version_minor;
    /* Intra-op threads: the CPU form of the IF's device share (>= 1). */
    size_t intra_op_threads;
} kp_engine_config;

/* A tensor shape without the batch dimension: dims[0..rank) are used,
 * the rest are ignored. rank <= KP_MAX_RANK; rank 0 is a scalar. */
typedef struct kp_shape {
    size_t rank;
    size_t dims[KP_MAX_RANK];
} kp_shape;

/* The tensors of a loaded model. Host memory; see "Ownership" for the
 * strings. Names are NUL-terminated (UTF-8 expected) and must not be NULL. */
typedef struct kp_model_info {
    const char *input_name;
    kp_shape input_shape;
    const char *output_name;
    kp_shape output_shape;
} kp_model_info;

/* ---- The callback table ----------------------------------------------- */

typedef struct kp_framework {
    /* The ABI the engine was built against: set these to
     * KP_IF_ABI_VERSION_MAJOR / KP_IF_ABI_VERSION_MINOR. */
    uint32_t abi_version_major;
    uint32_t abi_version_minor;

    /* A short name for logs and telemetry, e.g. "mean-demo". Static. */
    const char *name;

    /* Creates an engine with its share of the device and stores it in
     * *out. Every callback below that returns kp_status has the same
     * error convention (see "Ownership": `kp_error*`). */
    kp_status (*init)(const kp_engine_config *config, kp_engine **out,
                      kp_error **err);

    /* Releases the engine and everything it owns (model info strings
     * included). Cannot fail. */
    void (*deinit)(kp_engine *engine);

    /* Loads a model from a file. `path` is NUL-terminated. Fills *out. */
    kp_status (*load_model)(kp_engine *engine, const char *path,
                            kp_model_info *out, kp_error **err);

    /* Attaches a model whose `len` bytes are already in memory (e.g. a
     * model store shared between processes). The bytes are borrowed for
     * the call only. Fills *out. */
    kp_status (*link_model)(kp_engine *engine, const uint8_t *bytes,
                            size_t len, kp_model_info *out, kp_error **err);

    /* Prepares for batches of up to max_batch (>= 1) inputs; the engine
     * may pre-allocate or pre-optimise for it. */
    kp_status (*configure_batch)(kp_engine *engine, size_t max_batch,
                                 kp_error **err);

    /* Runs `batch` inputs laid out back to back in the model's input
     * layout (NCHW f32): `input` holds input_len floats, which should be
     * batch * input elements. Writes batch * output elements floats to
     * the start of `output`, which has room for output_len floats. The
     * engine must not read beyond input_len nor write beyond output_len,
     * and answers KP_STATUS_SHAPE if they are too small. On error the
     * contents of `output` are unspecified. */
    kp_status (*infer_batch)(kp_engine *engine, const float *input,
                             size_t input_len, size_t batch, float *output,
                             size_t output_len, kp_error **err);

    /* The NUL-terminated message of an error, valid until error_free(err).
     * Never NULL. */
    const char *(*error_message)(const kp_error *err);

    /* Releases an error object. The host never passes NULL. */
    void (*error_free)(kp_error *err);
} kp_framework;

/* ---- Entry point ------------------------------------------------------ */

#if defined(__GNUC__) || defined(__clang__)
#define KP_IF_EXPORT __attribute__((visibility("default")))
#else
#define KP_IF_EXPORT
#endif

/* The symbol a shared library implementing an engine exports. */
#define KP_IF_ENTRY_POINT "kp_if_framework"

/* Returns the engine's table; never NULL. Must be callable any number of
 * times, from any thread, and return the same table each time. */
typedef const kp_framework *(*kp_if_framework_fn)(void);

KP_IF_EXPORT const kp_framework *kp_if_framework(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KNEEPOINT_IF_H */

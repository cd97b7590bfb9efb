/*
 * layout_probe.c — what the C compiler makes of kneepoint_if.h, for the test
 * that checks the hand-written Rust bindings (src/lib.rs) against it.
 *
 * Exports a table of (name, value) pairs: every struct's size and alignment,
 * every field's offset, and every macro constant. The Rust test compares
 * each entry with its own value, by name, and fails on a missing name.
 */

#include "kneepoint_if.h"

#include <stdalign.h>
#include <stddef.h>

typedef struct kp_layout_entry {
    const char *name;
    size_t value;
} kp_layout_entry;

#define SIZE(T) {"sizeof " #T, sizeof(T)}, {"alignof " #T, alignof(T)}
#define FIELD(T, f) {"offsetof " #T "." #f, offsetof(T, f)}
#define CONST(c) {#c, (size_t)(c)}

const kp_layout_entry kp_if_abi_layout_probe[] = {
    CONST(KP_IF_ABI_VERSION_MAJOR),
    CONST(KP_IF_ABI_VERSION_MINOR),
    CONST(KP_MAX_RANK),
    CONST(KP_STATUS_OK),
    CONST(KP_STATUS_MODEL),
    CONST(KP_STATUS_SHAPE),
    CONST(KP_STATUS_ORDER),
    CONST(KP_STATUS_RUN),
    SIZE(kp_status),

    SIZE(kp_engine_config),
    FIELD(kp_engine_config, abi_version_major),
    FIELD(kp_engine_config, abi_version_minor),
    FIELD(kp_engine_config, intra_op_threads),

    SIZE(kp_shape),
    FIELD(kp_shape, rank),
    FIELD(kp_shape, dims),

    SIZE(kp_model_info),
    FIELD(kp_model_info, input_name),
    FIELD(kp_model_info, input_shape),
    FIELD(kp_model_info, output_name),
    FIELD(kp_model_info, output_shape),

    SIZE(kp_framework),
    FIELD(kp_framework, abi_version_major),
    FIELD(kp_framework, abi_version_minor),
    FIELD(kp_framework, name),
    FIELD(kp_framework, init),
    FIELD(kp_framework, deinit),
    FIELD(kp_framework, load_model),
    FIELD(kp_framework, link_model),
    FIELD(kp_framework, configure_batch),
    FIELD(kp_framework, infer_batch),
    FIELD(kp_framework, error_message),
    FIELD(kp_framework, error_free),
};

const size_t kp_if_abi_layout_probe_len =
    sizeof(kp_if_abi_layout_probe) / sizeof(kp_if_abi_layout_probe[0]);

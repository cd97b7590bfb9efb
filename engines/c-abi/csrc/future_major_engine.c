/*
 * future_major_engine.c — a test fixture: a library that exports the
 * kneepoint entry point but was built against a future major version (2)
 * of kneepoint_if.h, whose table keeps only the first two fields (the
 * version) where version 1 has them and is shorter than a version-1 table.
 * The host must read the version, refuse, and read nothing else.
 */

#include <stdint.h>

typedef struct future_framework {
    uint32_t abi_version_major;
    uint32_t abi_version_minor;
} future_framework;

static const future_framework FUTURE = {2, 0};

__attribute__((visibility("default"))) const future_framework *
kp_if_framework(void) {
    return &FUTURE;
}

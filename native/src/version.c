/* version.c — library identity and status names. */
#include "strata.h"

#ifndef STRATA_VERSION_STRING
#error "STRATA_VERSION_STRING comes from strata/_version.py (native/CMakeLists.txt defines it)"
#endif

const char *strata_version(void) { return STRATA_VERSION_STRING; }

const char *strata_status_str(strata_status s) {
    switch (s) {
    case STRATA_OK: return "ok";
    case STRATA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case STRATA_ERR_IO: return "i/o error";
    case STRATA_ERR_FORMAT: return "malformed model file";
    case STRATA_ERR_UNSUPPORTED: return "unsupported model";
    case STRATA_ERR_OUT_OF_MEMORY: return "out of host memory";
    case STRATA_ERR_BUDGET: return "device budget too small";
    case STRATA_ERR_CONTEXT: return "context full";
    case STRATA_ERR_LEND: return "lending the prompt path its slots failed";
    case STRATA_ERR_CANCELLED: return "cancelled";
    case STRATA_ERR_DEVICE: return "device error";
    case STRATA_ERR_INTERNAL: return "internal error";
    case STRATA_ERR_STATE: return "invalid engine state";
    }
    return "unknown status";
}

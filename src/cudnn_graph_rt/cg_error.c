/* The thread-local last-error message and the status names (cg_status_names.h). */
#include <stdarg.h>
#include <stdio.h>

#include "cg_internal.h"
#include "cg_status_names.h"

#define CG_ERROR_CAPACITY 1024

static __thread char last_error[CG_ERROR_CAPACITY];

cg_status_t cg_fail(cg_status_t status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    return status;
}

const char *cg_last_error(void) { return last_error; }

int cg_api_version(void) { return CG_API_VERSION; }

const char *cg_status_name(cg_status_t status) { return cg_status_text(status); }

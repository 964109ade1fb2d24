/* error.c — formatting of error messages into an errbuf (see error.h). */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

strata_status err_set(errbuf *e, strata_status s, const char *fmt, ...) {
    if (!e) return s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = s;
    return s;
}

strata_status err_prefix(errbuf *e, const char *fmt, ...) {
    if (!e) return STRATA_ERR_INTERNAL;
    char head[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    /* shift the old message right by the head's length, then copy the head in front */
    size_t h = strlen(head), m = strlen(e->msg);
    if (h >= sizeof e->msg) h = sizeof e->msg - 1;
    if (h + m >= sizeof e->msg) m = sizeof e->msg - 1 - h;
    memmove(e->msg + h, e->msg, m);
    memcpy(e->msg, head, h);
    e->msg[h + m] = '\0';
    return e->status;
}

void err_clear(errbuf *e) {
    if (!e) return;
    e->status = STRATA_OK;
    e->msg[0] = '\0';
}

/* Failure groups (ServicePulse's failed-message groups): unresolved events whose errors
 * differ only in their variable parts (ids, numbers, quoted values, URL query strings)
 * share one group, keyed by endpoint + error type + the masked text. */
#ifndef NH_FAILGROUP_H
#define NH_FAILGROUP_H

#include <stddef.h>

#define NH_FAILGROUP_ID_LEN 12

/* Writes `text` with its variable parts replaced by placeholders into out (always
 * NUL-terminated; cut at outlen - 1): UUIDs -> <uuid>, hex ids of 6+ characters with a
 * digit -> <id>, digit runs -> <n>, quoted strings -> "<s>" or '<s>', a query string
 * after '?' -> ?<q>; a leading Lua position "dir/file.lua:17:" keeps only "file.lua:<n>:".
 * Only the first line counts (a traceback below it varies by design). */
void nh_failgroup_mask(const char *text, char *out, size_t outlen);

/* The group's stable id: 12 lower-case hex digits of a 64-bit FNV-1a hash of
 * endpoint, error type and masked text. */
void nh_failgroup_id(const char *endpoint, const char *error_type, const char *error_text,
                     char out[NH_FAILGROUP_ID_LEN + 1]);

#endif

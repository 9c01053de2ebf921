/* A small open-addressing set of strings, for one scan (sessions seen while looking
 * for session heads). Sized up front: it never grows, so give it twice the keys. */
#ifndef NH_STRSET_H
#define NH_STRSET_H

#include <stddef.h>

typedef struct nh_strset {
  char **keys;
  size_t cap;   /* a power of two */
} nh_strset_t;

void nh_strset_init(nh_strset_t *set, size_t max_keys);
int nh_strset_add(nh_strset_t *set, const char *key);   /* 1 if newly added, 0 if present */
void nh_strset_free(nh_strset_t *set);

#endif

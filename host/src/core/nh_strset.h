/* A small open-addressing set of strings, for one scan (sessions seen while looking
 * for session heads). Sized up front for the expected keys; it doubles when half full,
 * so a caller that cannot know the count (an operator listing) is still correct. */
#ifndef NH_STRSET_H
#define NH_STRSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct nh_strset {
  char **keys;
  size_t cap;   /* a power of two */
  size_t count;
} nh_strset_t;

void nh_strset_init(nh_strset_t *set, size_t max_keys);
int nh_strset_add(nh_strset_t *set, const char *key);   /* 1 if newly added, 0 if present */
int nh_strset_has(const nh_strset_t *set, const char *key);
void nh_strset_free(nh_strset_t *set);
void nh_strset_clear(nh_strset_t *set);                 /* empty again; the table is kept for reuse */
uint64_t nh_strset_hash(const char *s);                  /* the set's hash (FNV-1a) */

#endif

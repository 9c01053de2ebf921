#include "nh_strset.h"
#include "nh_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s)
{
  uint64_t h = 1469598103934665603ull;   /* FNV-1a */
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
  return h;
}

void nh_strset_init(nh_strset_t *set, size_t max_keys)
{
  size_t cap = 16;
  while (cap < max_keys * 2) cap <<= 1;
  set->keys = nh_xcalloc(cap, sizeof(char *));
  set->cap = cap;
}

int nh_strset_add(nh_strset_t *set, const char *key)
{
  size_t i = hash_str(key) & (set->cap - 1);
  while (set->keys[i]) {
    if (strcmp(set->keys[i], key) == 0) return 0;
    i = (i + 1) & (set->cap - 1);
  }
  set->keys[i] = nh_xstrdup(key);
  return 1;
}

void nh_strset_free(nh_strset_t *set)
{
  for (size_t i = 0; i < set->cap; i++) free(set->keys[i]);
  free(set->keys);
  set->keys = NULL;
  set->cap = 0;
}

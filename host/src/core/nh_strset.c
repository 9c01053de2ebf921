/* The string set of nh_strset.h: FNV-1a hashes, linear probing, keys copied in. */
#include "nh_strset.h"
#include "nh_util.h"

#include <stdlib.h>
#include <string.h>

uint64_t nh_strset_hash(const char *s)
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
  set->count = 0;
}

static void place(char **keys, size_t cap, char *key)
{
  size_t i = nh_strset_hash(key) & (cap - 1);
  while (keys[i]) i = (i + 1) & (cap - 1);
  keys[i] = key;
}

/* Doubles the table, moving the keys (not copying them). */
static void grow(nh_strset_t *set)
{
  size_t cap = set->cap * 2;
  char **keys = nh_xcalloc(cap, sizeof(char *));
  for (size_t i = 0; i < set->cap; i++)
    if (set->keys[i]) place(keys, cap, set->keys[i]);
  free(set->keys);
  set->keys = keys;
  set->cap = cap;
}

/* The slot holding key, or the empty slot where it would go. */
static size_t slot(const nh_strset_t *set, const char *key)
{
  size_t i = nh_strset_hash(key) & (set->cap - 1);
  while (set->keys[i] && strcmp(set->keys[i], key) != 0) i = (i + 1) & (set->cap - 1);
  return i;
}

int nh_strset_add(nh_strset_t *set, const char *key)
{
  size_t i = slot(set, key);
  if (set->keys[i]) return 0;
  set->keys[i] = nh_xstrdup(key);
  if (++set->count * 2 > set->cap) grow(set);
  return 1;
}

int nh_strset_has(const nh_strset_t *set, const char *key)
{
  return set->keys[slot(set, key)] != NULL;
}

void nh_strset_free(nh_strset_t *set)
{
  for (size_t i = 0; i < set->cap; i++) free(set->keys[i]);
  free(set->keys);
  set->keys = NULL;
  set->cap = 0;
  set->count = 0;
}

void nh_strset_clear(nh_strset_t *set)
{
  if (!set->count) return;
  for (size_t i = 0; i < set->cap; i++) {
    free(set->keys[i]);
    set->keys[i] = NULL;
  }
  set->count = 0;
}

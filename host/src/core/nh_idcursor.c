/* nh_idcursor.h: ids that commit out of order, read without skipping the late ones. */
#include "nh_idcursor.h"
#include "nh_util.h"

#include <stdlib.h>
#include <string.h>

void nh_idcursor_init(nh_idcursor_t *c, int64_t low, int64_t gap_ms)
{
  memset(c, 0, sizeof *c);
  c->low = low;
  c->gap_ms = gap_ms;
}

void nh_idcursor_free(nh_idcursor_t *c)
{
  free(c->seen);
  c->seen = NULL;
  c->n = c->cap = 0;
}

/* the index of the first taken id >= id */
static int lower_bound(const nh_idcursor_t *c, int64_t id)
{
  int lo = 0, hi = c->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (c->seen[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

int nh_idcursor_take(nh_idcursor_t *c, int64_t id, int64_t now)
{
  if (id <= c->low) return 0;
  int at = lower_bound(c, id);
  if (at < c->n && c->seen[at].id == id) return 0;
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 64;
    c->seen = nh_xrealloc(c->seen, sizeof *c->seen * (size_t)c->cap);
  }
  memmove(c->seen + at + 1, c->seen + at, sizeof *c->seen * (size_t)(c->n - at));
  c->seen[at].id = id;
  c->seen[at].at = now;
  c->n++;
  return 1;
}

void nh_idcursor_advance(nh_idcursor_t *c, int64_t now)
{
  int k = 0;
  while (k < c->n) {
    if (c->seen[k].id != c->low + 1 && now - c->seen[k].at < c->gap_ms) break;   /* a gap still waited for */
    c->low = c->seen[k].id;   /* the next id, or the one above a gap given up on */
    k++;
  }
  if (!k) return;
  memmove(c->seen, c->seen + k, sizeof *c->seen * (size_t)(c->n - k));
  c->n -= k;
}

int64_t nh_idcursor_top(const nh_idcursor_t *c)
{
  return c->n ? c->seen[c->n - 1].id : c->low;
}

int nh_idcursor_gaps(const nh_idcursor_t *c, int64_t *pairs, int max)
{
  /* the highest ones: a late commit belongs to a transaction that was running a moment
   * ago, so its id is near the top; a gap far below (history deleted by retention, an id
   * a rolled-back transaction took) only waits to be given up */
  int total = 0;
  int64_t below = c->low;
  for (int k = 0; k < c->n; k++) {
    total += c->seen[k].id != below + 1;
    below = c->seen[k].id;
  }
  int skip = total > max ? total - max : 0, g = 0;
  below = c->low;
  for (int k = 0; k < c->n; k++) {
    if (c->seen[k].id != below + 1 && skip-- <= 0) {
      pairs[2 * g] = below;
      pairs[2 * g + 1] = c->seen[k].id;
      g++;
    }
    below = c->seen[k].id;
  }
  return g;
}

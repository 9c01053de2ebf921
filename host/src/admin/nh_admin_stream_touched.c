/* The events a batch of history rows touched (nh_admin_stream_int.h): a burst changes one
 * event several times, and a status event is its latest state, so each goes out once a
 * batch, in the order they last changed in. No state of the loop: the PostgreSQL poller
 * uses it on the pool. */
#include "nh_admin_stream_int.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

void nh_admin_stream_touched_add(nh_stream_touched_set_t *t, const char *endpoint, const char *event_id, json_t *view)
{
  if (t->n == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 64;
    t->v = nh_xrealloc(t->v, t->cap * sizeof *t->v);
  }
  t->v[t->n] = (nh_stream_touched_t){ nh_xstrdup(endpoint), nh_xstrdup(event_id), t->n, view };
  t->n++;
}

static void entry_free(nh_stream_touched_t *e)
{
  free(e->endpoint);
  free(e->event_id);
  json_decref(e->view);
}

void nh_admin_stream_touched_clear(nh_stream_touched_set_t *t)
{
  for (size_t i = 0; i < t->n; i++) entry_free(&t->v[i]);
  free(t->v);
  memset(t, 0, sizeof *t);
}

static int by_key_then_seq(const void *x, const void *y)
{
  const nh_stream_touched_t *a = x, *b = y;
  int c = strcmp(a->endpoint, b->endpoint);
  if (!c) c = strcmp(a->event_id, b->event_id);
  if (!c) c = a->seq < b->seq ? -1 : a->seq > b->seq;
  return c;
}

static int by_seq(const void *x, const void *y)
{
  const nh_stream_touched_t *a = x, *b = y;
  return a->seq < b->seq ? -1 : a->seq > b->seq;
}

void nh_admin_stream_touched_dedupe(nh_stream_touched_set_t *t)
{
  if (t->n < 2) return;
  qsort(t->v, t->n, sizeof *t->v, by_key_then_seq);
  size_t out = 0;
  for (size_t i = 0; i < t->n; i++) {
    int last_of_key = i + 1 == t->n || strcmp(t->v[i].endpoint, t->v[i + 1].endpoint) ||
                      strcmp(t->v[i].event_id, t->v[i + 1].event_id);
    if (last_of_key) t->v[out++] = t->v[i];
    else entry_free(&t->v[i]);
  }
  t->n = out;
  qsort(t->v, t->n, sizeof *t->v, by_seq);
}

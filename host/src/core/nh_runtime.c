/* The runtime (nh_runtime.h): the loop, its parts, and a close that leaves no handle. */
#include "nh_runtime.h"
#include "nh_metrics.h"
#include "nh_log.h"

#include "nh_util.h"

#include <assert.h>
#include <stddef.h>
#include <stdlib.h>

#define NH_RUNTIME_MAGIC 0x6e687274u   /* "nhrt": a loop that is not a runtime's is a bug */

int nh_runtime_init(nh_runtime_t *rt)
{
  rt->running = 0;
  rt->task = NULL;
  rt->otlp = NULL;
  nh_queue_init(&rt->parts);
  rt->magic = NH_RUNTIME_MAGIC;
  int rc = uv_loop_init(&rt->loop);
  rt->loop.data = rt;   /* uv_loop_init keeps data as it was */
  return rc;
}

nh_runtime_t *nh_runtime_of(uv_loop_t *loop)
{
  nh_runtime_t *rt = loop->data;   /* set by nh_runtime_init */
  assert(rt && rt->magic == NH_RUNTIME_MAGIC);
  return rt;
}

int nh_runtime_run(nh_runtime_t *rt, uv_run_mode mode)
{
  int was = rt->running;
  rt->running = 1;
  int rc = uv_run(&rt->loop, mode);
  rt->running = was;
  return rc;
}

nh_rt_part_t *nh_runtime_part(nh_runtime_t *rt, const void *key)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &rt->parts) {
    nh_rt_part_t *p = nh_queue_data(q, nh_rt_part_t, node);
    if (p->key == key) return p;
  }
  return NULL;
}

void nh_runtime_add_part(nh_runtime_t *rt, nh_rt_part_t *p, const void *key, void (*close)(nh_rt_part_t *p))
{
  p->key = key;
  p->close = close;
  nh_queue_insert_head(&rt->parts, &p->node);
}

void nh_runtime_remove_part(nh_rt_part_t *p) { nh_queue_remove(&p->node); }

typedef struct rt_list {
  nh_rt_part_t part;
  nh_queue_t q;
} rt_list_t;

/* Its elements belong to others, who unlink them when they close: what is left is only
 * unlinked, so no element points at freed memory. */
static void list_close(nh_rt_part_t *p)
{
  rt_list_t *l = nh_queue_data(p, rt_list_t, part);
  while (!nh_queue_empty(&l->q)) nh_queue_remove(nh_queue_head(&l->q));
  free(l);
}

nh_queue_t *nh_runtime_list(nh_runtime_t *rt, const void *key)
{
  nh_rt_part_t *p = nh_runtime_part(rt, key);
  if (!p) {
    rt_list_t *l = nh_xcalloc(1, sizeof *l);
    nh_queue_init(&l->q);
    nh_runtime_add_part(rt, &l->part, key, list_close);
    p = &l->part;
  }
  return &nh_queue_data(p, rt_list_t, part)->q;
}

static void close_stray(uv_handle_t *h, void *arg)
{
  int *n = arg;
  if (uv_is_closing(h)) return;
  nh_log_warn("runtime", "a %s handle was still open when the loop closed; closing it", uv_handle_type_name(h->type));
  (*n)++;
  uv_close(h, NULL);
}

void nh_runtime_close_parts(nh_runtime_t *rt)
{
  /* a part's close may close another's handles: take one at a time off the head */
  while (!nh_queue_empty(&rt->parts)) {
    nh_rt_part_t *p = nh_queue_data(nh_queue_head(&rt->parts), nh_rt_part_t, node);
    nh_queue_remove(&p->node);
    p->close(p);
  }
}

int nh_runtime_close(nh_runtime_t *rt)
{
  nh_runtime_close_parts(rt);
  /* Close callbacks may close more handles (curl's sockets, when its timer is gone): a
   * few turns let them, without blocking on a handle someone forgot. What is still open
   * and not closing then is a leak: said and closed, so the loop can close. The last run
   * waits for work on the thread pool (a checkpoint) and the remaining callbacks. */
  for (int i = 0; i < 8 && uv_run(&rt->loop, UV_RUN_NOWAIT); i++)
    ;
  int stray = 0;
  uv_walk(&rt->loop, close_stray, &stray);
  uv_run(&rt->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&rt->loop) != 0) {
    nh_log_warn("runtime", "the event loop did not close");
    stray++;
  }
  nh_metrics_reset();   /* the series the loop's modules counted */
  rt->magic = 0;
  return stray;
}

/* The runtime: the one object that owns the process's event loop and the state other
 * modules keep per loop (the HTTP client's curl handle, the listening HTTP servers, the
 * Lua task being resumed). Created and closed in one place (main's commands); modules
 * reach it from any uv_loop_t it owns (nh_runtime_of), as luv reaches its context from a
 * Lua state, instead of through process-wide globals bound to whichever loop came first.
 *
 * A module's per-loop state is a part: an nh_rt_part_t embedded in the module's struct,
 * found again by a key (the address of a static of the module) and closed by the runtime,
 * newest first, before the loop is closed. nh_runtime_close then runs the loop until every
 * close callback has run, and says which handles were left open (a bug: it closes them). */
#ifndef NH_RUNTIME_H
#define NH_RUNTIME_H

#include <uv.h>

#include "nh_queue.h"

typedef struct nh_rt_part nh_rt_part_t;
struct nh_rt_part {
  nh_queue_t node;                       /* runtime's parts */
  const void *key;
  void (*close)(nh_rt_part_t *p);        /* closes the part's handles; the part is off the list */
};

typedef struct nh_runtime {
  uv_loop_t loop;
  int running;          /* inside nh_runtime_run: a script's nimbus.run may not drive the loop */
  void *task;           /* lua/: the task being resumed now (nh_task_t *), NULL between callbacks */
  nh_queue_t parts;     /* newest first */
  /* net/nh_otlp.h: the span exporter of `run --otlp`, NULL when spans are not exported
   * (the trace headers still travel). Owned by the command that started it, which stops
   * it before the parts close (it needs the HTTP client for its last batch). */
  struct nh_otlp *otlp;
  unsigned magic;
} nh_runtime_t;

int nh_runtime_init(nh_runtime_t *rt);
/* The runtime that owns `loop` (every loop of the process is a runtime's). */
nh_runtime_t *nh_runtime_of(uv_loop_t *loop);
/* uv_run with `running` set; returns what uv_run returned. */
int nh_runtime_run(nh_runtime_t *rt, uv_run_mode mode);
/* The part added under `key`, or NULL. */
nh_rt_part_t *nh_runtime_part(nh_runtime_t *rt, const void *key);
void nh_runtime_add_part(nh_runtime_t *rt, nh_rt_part_t *p, const void *key, void (*close)(nh_rt_part_t *p));
/* Takes a part off the list (it closed itself); harmless when it is not on it. */
void nh_runtime_remove_part(nh_rt_part_t *p);
/* A queue kept per runtime under `key` (made at first use), for a module's registry of
 * its objects on this loop (the listening HTTP servers). At close, what is still on it
 * is unlinked (nh_queue_remove leaves a node safe to remove again). */
nh_queue_t *nh_runtime_list(nh_runtime_t *rt, const void *key);
/* Closes every part now (their close callbacks run when the loop next turns): for a
 * command that must let parts go before it closes what they serve. */
void nh_runtime_close_parts(nh_runtime_t *rt);
/* Closes every part, runs the loop until their close callbacks ran, closes the loop.
 * Returns 0, or the number of handles that were still open (logged, then closed). */
int nh_runtime_close(nh_runtime_t *rt);

#endif

/* VM internals shared by the files of src/lua. */
#ifndef NH_VM_INT_H
#define NH_VM_INT_H

#include "nh_task.h"
#include "nh_vm.h"
#include "core/nh_queue.h"

struct nh_task {
  nh_vm_t *vm;
  lua_State *co;
  int co_ref;
  nh_task_kind_t kind;
  void *data;
  nh_task_done_cb on_done;
  nh_op_t *pending;          /* the async operation that owns the next resume */
  nh_queue_t ready_node;     /* in vm->ready (resume on the next loop iteration), else unlinked */
  uint64_t resume_gen;
  nh_task_t **done_flag;     /* the owner's pointer to this task, NULLed when it ends */
  int start_nargs;
  int done;
  int reusable;              /* ended cleanly: its thread may serve the next handler (task_free) */
  nh_task_kill_t kill;       /* set once the budget or the deadline stopped it */
  nh_task_err_t error;       /* what ended it with NH_TASK_ERROR */
  uint64_t resume_ns, cpu_budget_ns;
  double deadline_s;
  uv_timer_t *deadline;
  nh_queue_t node;           /* vm->tasks */
  nh_trace_ctx_t trace;      /* the span it runs in, when has_trace */
  int has_trace;
};

#define NH_VM_SPARE_THREADS 64

/* Small blocks of one VM, recycled by size class (nh_vm.c, vm_alloc): most of what a
 * handler run allocates (strings, tables, closures) is freed by the next collection and
 * asked for again at once, at the same few sizes. */
#define NH_VM_POOL_MAX 1024                         /* larger blocks go to malloc */
#define NH_VM_POOL_CLASSES (NH_VM_POOL_MAX / 16)    /* 16, 32, ... 1024 bytes */

typedef struct nh_vm_pool {
  void *free[NH_VM_POOL_CLASSES];   /* freed blocks of each class, linked through their first word */
  char *bump;                       /* the unused end of the newest slab */
  size_t bump_left;
  void *slabs;                      /* every slab, linked through its first word */
} nh_vm_pool_t;

struct nh_vm {
  uv_loop_t *loop;
  lua_State *L;
  char *path;
  uint64_t load_deadline_ns;    /* while the adapter's main chunk runs (uv_hrtime) */
  double load_budget_s;
  nh_vm_host_t host;
  int has_host;
  int check;                 /* `nimbus-host check`: no sockets, no files, nothing sent */
  int script;                /* a -l script, not an adapter */
  int run_ref, alive_ref, hook_ref;
  int hooks[NH_HOOK_COUNT];  /* functions registered per hook (nimbus.on) */
  int live_tasks;
  nh_queue_t tasks;          /* every live task (nh_task_t.node), newest first */
  nh_queue_t ready;          /* FIFO of tasks to resume on the next iteration (nh_task_t.ready_node) */
  uv_idle_t idle;
  uint64_t yield_gen;
  int64_t deadline_ms;       /* drain deadline of a retiring generation */
  int in_task;               /* > 0 while a task runs: the memory limit applies */
  size_t mem, mem_limit;
  nh_vm_pool_t pool;
  struct nh_every *everies;  /* periodic tasks (status checkers) */
  /* Threads of tasks that ended cleanly, reset and kept for the next task: a handler run
   * then allocates no coroutine (and the collector frees none). Registry refs. */
  int spare_co[NH_VM_SPARE_THREADS];
  int nspare;
  char warn_buf[512];
  size_t warn_len;
};

int nh_vm_pcall(lua_State *L, int nargs, int nres, nh_error_t *err);
void nh_lapi_open(nh_vm_t *vm);
nh_task_t *nh_task_running(lua_State *L);

#endif

/* VM internals shared by nh_vm.c and nh_lapi.c. */
#ifndef NH_VM_INT_H
#define NH_VM_INT_H

#include "nh_vm.h"

struct nh_task {
  nh_vm_t *vm;
  lua_State *co;
  int co_ref;
  void *data;
  int pending;        /* an async host operation owns the next resume (later issues) */
  int resume_next;    /* bare yield: resume on the next loop iteration */
  nh_task_t *next, *prev;
};

struct nh_vm {
  uv_loop_t *loop;
  lua_State *L;
  char *path;
  nh_vm_host_t host;
  int has_host;
  int run_ref;
  int live_tasks;
  nh_task_t *tasks;
  uv_idle_t idle;
};

int nh_vm_pcall(lua_State *L, int nargs, int nres, nh_error_t *err);
void nh_lapi_open(nh_vm_t *vm);
nh_task_t *nh_vm_current_task(lua_State *L);

#endif

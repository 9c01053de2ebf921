#ifndef NH_LASYNC_H
#define NH_LASYNC_H

#include <lua.h>
#include <uv.h>

typedef struct nh_vm nh_vm_t;

/* Adds sleep, spawn, run and every to the table at the top of the stack. */
void nh_lasync_register(lua_State *L);
/* Stops and releases the VM's periodic timers (before its tasks are cancelled). */
void nh_lasync_close(nh_vm_t *vm);
/* Whether the VM runs periodic tasks (status checkers, nimbus.every). */
int nh_lasync_has_timers(nh_vm_t *vm);
/* The VM and loop a Lua state belongs to (stored in the registry at creation). */
nh_vm_t *nh_lua_vm(lua_State *L);
uv_loop_t *nh_lua_loop(lua_State *L);

#endif

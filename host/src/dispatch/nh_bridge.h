/* Store and operator services offered to Lua (status checkers, scripts): shared by the
 * running host's dispatcher and by interpreter mode, which opens the store on demand. */
#ifndef NH_BRIDGE_H
#define NH_BRIDGE_H

#include <lua.h>

#include "lua/nh_vm.h"
#include "store/nh_store.h"
#include "transport/nh_transport.h"

/* Pushes an array of the endpoint's Pending+Handoff events, oldest first. */
void nh_bridge_push_handoff(lua_State *L, const nh_audit_t *a, int index);   /* one, at index of the array on top */
int nh_bridge_push_handoffs(lua_State *L, nh_store_t *s, const char *endpoint, nh_error_t *err);
/* The operator request a hand-off settlement is (borrowing h's strings). */
struct nh_op_req;
void nh_bridge_handoff_req(const nh_handoff_req_t *h, struct nh_op_req *out);
int nh_bridge_handoff(nh_store_t *s, nh_transport_t *t, const nh_handoff_req_t *req, nh_error_t *err);
/* The vm host for `nimbus-host -l`: no dispatcher, the store is opened per call. */
const nh_vm_host_t *nh_bridge_script_host(void);

#endif

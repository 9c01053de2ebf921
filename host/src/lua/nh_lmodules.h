/* C modules preloaded into every VM (package.preload), each a luaopen-style function. */
#ifndef NH_LMODULES_H
#define NH_LMODULES_H

#include <lua.h>

int nh_lsqlite_open(lua_State *L);   /* require("nimbus.sqlite.core") */
int nh_lhttpd_open(lua_State *L);    /* require("nimbus.httpd.core") */
int nh_lhttp_open(lua_State *L);     /* require("nimbus.http.core"): the client */
int nh_lcrypto_open(lua_State *L);   /* require("nimbus.crypto.core") */

typedef struct nh_vm nh_vm_t;
/* Stops the VM's HTTP servers accepting (a retiring generation); in-flight requests finish. */
void nh_lhttpd_quiesce_vm(nh_vm_t *vm);
/* How many servers of the VM are listening. */
int nh_lhttpd_vm_serves(nh_vm_t *vm);

#endif

/* Lua's store calls on a PostgreSQL store, answered later through the host's link
 * (nh_pgcalls.c). Each returns NH_LATER and answers `later` once, or an error now. */
#ifndef NH_PGCALLS_H
#define NH_PGCALLS_H

#include "core/nh_msg.h"
#include "lua/nh_vm.h"

struct nh_pg_link;
/* The endpoint's Pending+Handoff events as a Lua array, oldest first. */
int nh_pgcall_pending_handoffs(struct nh_pg_link *link, const char *endpoint, nh_later_t *later, nh_error_t *err);
/* A hand-off completed or failed (nh_operator_submit_link): true, or (nil, why, code). */
int nh_pgcall_handoff(struct nh_pg_link *link, const nh_handoff_req_t *req, nh_later_t *later, nh_error_t *err);
/* m queued for `to`, or for each subscriber of its type, in one transaction: its
 * MessageId and whether it was a duplicate (given_id, the caller's MessageId, published
 * within the dedup window: nothing queued then). */
int nh_pgcall_publish(struct nh_pg_link *link, const nh_msg_t *m, const char *to, const char *given_id,
                      nh_later_t *later, nh_error_t *err);

#endif

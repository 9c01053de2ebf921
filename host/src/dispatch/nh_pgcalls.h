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
/* m queued for `to`, or for each subscriber of its type, in one transaction; done (from
 * the loop, once) says how many copies went (0 with duplicate set: given_id, the caller's
 * MessageId, was published within the dedup window, nothing queued) or err. NH_OK, or an
 * error now (done not called). */
typedef void (*nh_pgcall_sent_cb)(void *data, const nh_msg_t *m, int copies, int duplicate, const nh_error_t *err);
int nh_pgcall_send(struct nh_pg_link *link, const nh_msg_t *m, const char *to, const char *given_id,
                   nh_pgcall_sent_cb done, void *data, nh_error_t *err);
/* nh_pgcall_send for nimbus.publish outside a handler: its
 * MessageId and whether it was a duplicate (given_id, the caller's MessageId, published
 * within the dedup window: nothing queued then). */
int nh_pgcall_publish(struct nh_pg_link *link, const nh_msg_t *m, const char *to, const char *given_id,
                      nh_later_t *later, nh_error_t *err);
/* When message_id was last published (0: never), read on the link: done(data, at, NULL)
 * or done(data, 0, err), once, from the loop. */
typedef void (*nh_pgcall_seen_cb)(void *data, int64_t at, const nh_error_t *err);
int nh_pgcall_published_at(struct nh_pg_link *link, const char *message_id, nh_pgcall_seen_cb done, void *data,
                           nh_error_t *err);

#endif

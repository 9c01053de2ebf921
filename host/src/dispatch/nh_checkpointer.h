/* Copies the store's WAL back into the database on a libuv worker thread, so the loop
 * never waits for a checkpoint (docs/architecture.md, "Checkpoints"). */
#ifndef NH_CHECKPOINTER_H
#define NH_CHECKPOINTER_H

#include <uv.h>

#include "store/nh_store.h"

typedef struct nh_checkpointer nh_checkpointer_t;

nh_checkpointer_t *nh_checkpointer_start(uv_loop_t *loop, nh_store_t *store);
/* A checkpoint now if the WAL holds anything (the host just went idle). */
void nh_checkpointer_kick(nh_checkpointer_t *c);
/* Gives the store back sqlite's own checkpoints; a copy under way finishes on the loop
 * (uv_run after this returns lets it), then the checkpointer is freed. */
void nh_checkpointer_close(nh_checkpointer_t *c);

#endif

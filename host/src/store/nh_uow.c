/* The unit of work of nh_uow.h over the sqlite store: direct reads, or (NH_UOW_COLD) a
 * miss on the first read of each key in a pump, to run the pump's restart path. Over
 * PostgreSQL every call goes to nh_uow_pg.c. */
#include "nh_uow_int.h"
#include "core/nh_util.h"
#include "nh_pg_ops.h"

#include <stdlib.h>
#include <string.h>

nh_uow_t *nh_uow_new(nh_store_t *s, unsigned mode)
{
  nh_uow_t *u = nh_xcalloc(1, sizeof *u);
  u->store = s;
  u->mode = mode;
  if (mode & NH_UOW_CACHED) {
    u->mode &= ~(unsigned)NH_UOW_COLD;   /* the cache misses on its own */
    u->pg = nh_uowpg_new_local(u, s);
  } else if (mode & NH_UOW_COLD) {
    nh_strset_init(&u->known, 64);
    nh_strset_init(&u->fresh, 64);
  }
  return u;
}

nh_uow_t *nh_uow_new_pg(struct nh_pg_link *link)
{
  nh_uow_t *u = nh_xcalloc(1, sizeof *u);
  u->pg = nh_uowpg_new(u, link);
  return u;
}

void nh_uow_free(nh_uow_t *u)
{
  if (!u) return;
  if (u->pg) {
    nh_uowpg_free(u->pg);   /* frees u too, now or when its batch is over */
    return;
  }
  if (u->mode & NH_UOW_COLD) {
    nh_strset_free(&u->known);
    nh_strset_free(&u->fresh);
  }
  free(u->key);
  free(u);
}

unsigned nh_uow_mode(const nh_uow_t *u) { return u->mode; }

void nh_uow_pass_begin(nh_uow_t *u)
{
  if (u->missed) u->stats.restarts++;   /* the pass before was void */
  u->missed = 0;
  u->pass++;
  u->stats.passes++;
  if (u->pg) nh_uowpg_pass_begin(u->pg);
  if (u->hooks.pass_begin) u->hooks.pass_begin(u->hooks.data);
  if ((u->mode & NH_UOW_COLD) && u->fresh.count) {
    for (size_t i = 0; i < u->fresh.cap; i++)
      if (u->fresh.keys[i]) nh_strset_add(&u->known, u->fresh.keys[i]);
    nh_strset_clear(&u->fresh);
  }
}

int nh_uow_missed(const nh_uow_t *u) { return u->missed; }

/* The transaction's phases for a broker transport, on PostgreSQL only (sqlite's store says them). */
static void txn_tell(nh_uow_t *u, nh_txn_phase_t phase)
{
  if (u->txn_cb && !u->store) u->txn_cb(u->txn_data, phase);
}

void nh_uow_set_txn_hook(nh_uow_t *u, nh_store_txn_cb cb, void *data)
{
  u->txn_cb = cb;
  u->txn_data = data;
}

void nh_uow_end(nh_uow_t *u)
{
  if (u->pass && u->hooks.pump_end) u->hooks.pump_end(u->hooks.data, u->committed);   /* the cache still whole */
  if (u->commit_sent) txn_tell(u, u->committed ? NH_TXN_COMMIT : NH_TXN_ROLLBACK);
  else if (u->open) txn_tell(u, NH_TXN_ROLLBACK);
  u->commit_sent = 0;
  u->committed = 0;
  u->missed = 0;
  u->open = 0;
  u->pass = 0;
  if (u->pg) nh_uowpg_end(u->pg);
  if (u->mode & NH_UOW_COLD) {
    nh_strset_clear(&u->known);
    nh_strset_clear(&u->fresh);
  }
}

void nh_uow_stats(const nh_uow_t *u, nh_uow_stats_t *out) { *out = u->stats; }

const char *nh_uow_key(nh_uow_t *u, char kind, const char *a, const char *b, const char *c)
{
  const char *parts[3] = { a, b, c };
  size_t need = 2;
  for (int i = 0; i < 3; i++) need += (parts[i] ? strlen(parts[i]) : 0) + 1;
  if (need > u->key_cap) {
    u->key_cap = need * 2;
    u->key = nh_xrealloc(u->key, u->key_cap);
  }
  char *p = u->key;
  *p++ = kind;
  for (int i = 0; i < 3; i++) {
    size_t n = parts[i] ? strlen(parts[i]) : 0;
    memcpy(p, parts[i] ? parts[i] : "", n);
    p += n;
    *p++ = '\x1f';
  }
  *p = '\0';
  return u->key;
}

/* 1: answer from the store; 0: a miss (recorded, the pass is void). */
static int have(nh_uow_t *u, char kind, const char *a, const char *b, const char *c)
{
  if (!(u->mode & NH_UOW_COLD) || u->pass > NH_UOW_MAX_PASSES) return 1;
  const char *key = nh_uow_key(u, kind, a, b, c);
  if (nh_strset_has(&u->known, key)) return 1;
  if (nh_strset_add(&u->fresh, key)) u->stats.misses++;
  u->missed = 1;
  return 0;
}

/* ---------------------------------------------------------------- reads */

int nh_uow_session_get(nh_uow_t *u, const char *endpoint, const char *session, nh_session_state_t *st)
{
  if (u->pg) return nh_uowpg_session_get(u->pg, endpoint, session, st);
  if (have(u, 's', endpoint, session, NULL)) return nh_store_session_get(u->store, endpoint, session, st);
  memset(st, 0, sizeof *st);
  st->next_park_seq = 1;
  return NH_OK;
}

int nh_uow_audit_get(nh_uow_t *u, const char *endpoint, const char *event_id, nh_audit_t *out)
{
  if (u->pg) return nh_uowpg_audit_get(u->pg, endpoint, event_id, out);
  if (have(u, 'a', endpoint, event_id, NULL)) return nh_store_audit_get(u->store, endpoint, event_id, out);
  memset(out, 0, sizeof *out);
  return 0;
}

int nh_uow_inbox_has(nh_uow_t *u, const char *endpoint, const char *message_id)
{
  if (u->pg) return nh_uowpg_inbox_has(u->pg, endpoint, message_id);
  return have(u, 'i', endpoint, message_id, NULL) ? nh_store_inbox_has(u->store, endpoint, message_id) : 0;
}

int nh_uow_parked_any(nh_uow_t *u, const char *endpoint, const char *session)
{
  if (u->pg) return nh_uowpg_parked_any(u->pg, endpoint, session);
  return have(u, 'p', endpoint, session, NULL) ? nh_store_parked_any(u->store, endpoint, session) : 0;
}

int nh_uow_parked_head(nh_uow_t *u, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq)
{
  if (u->pg) return nh_uowpg_parked_head(u->pg, endpoint, session, out, park_seq);
  if (have(u, 'h', endpoint, session, NULL)) return nh_store_parked_head(u->store, endpoint, session, out, park_seq);
  return 0;
}

int nh_uow_processed_has(nh_uow_t *u, const char *endpoint, const char *message_id, const char *event_id)
{
  if (u->pg) return nh_uowpg_processed_has(u->pg, endpoint, message_id, event_id);
  if (have(u, 'd', endpoint, message_id, event_id))
    return nh_store_processed_has(u->store, endpoint, message_id, event_id);
  return 0;
}

int nh_uow_oppending_take(nh_uow_t *u, const char *message_id, char **expected_status)
{
  if (u->pg) return nh_uowpg_oppending_take(u->pg, message_id, expected_status);
  if (have(u, 'o', message_id, NULL, NULL)) return nh_store_oppending_take(u->store, message_id, expected_status);
  *expected_status = NULL;
  return 0;
}

int nh_uow_sessions_due(nh_uow_t *u, const char *endpoint, int64_t now, int limit, char **cursor, nh_session_cb cb,
                        void *data)
{
  if (u->pg) return nh_uowpg_sessions_due(u->pg, endpoint, limit, cursor, cb, data);
  return nh_store_sessions_due(u->store, endpoint, now, limit, cursor, cb, data);
}

/* ---------------------------------------------------------------- writes */

int nh_uow_session_put(nh_uow_t *u, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  if (u->pg) return nh_uowpg_session_put(u->pg, endpoint, session, st);
  return nh_store_session_put(u->store, endpoint, session, st);
}

int nh_uow_audit_put(nh_uow_t *u, const nh_audit_t *a)
{
  if (u->pg) return nh_uowpg_audit_put(u->pg, a);
  return nh_store_audit_put(u->store, a);
}

int nh_uow_audit_retext_deferred(nh_uow_t *u, const char *endpoint, const char *session, const char *text)
{
  if (u->pg) return nh_uowpg_audit_retext_deferred(u->pg, endpoint, session, text);
  return nh_store_audit_retext_deferred(u->store, endpoint, session, text);
}

int nh_uow_history_add(nh_uow_t *u, const char *endpoint, const char *event_id, const char *message_id,
                       const char *message_type, const char *status, const char *detail,
                       const nh_history_extra_t *x)
{
  if (u->pg) return nh_uowpg_history_add(u->pg, endpoint, event_id, message_id, message_type, status, detail, x);
  return nh_store_history_add_ex(u->store, endpoint, event_id, message_id, message_type, status, detail, x);
}

int nh_uow_park(nh_uow_t *u, const nh_msg_t *m, int64_t park_seq)
{
  if (u->pg) return nh_uowpg_park(u->pg, m, park_seq);
  return nh_store_park(u->store, m, park_seq);
}

int nh_uow_parked_delete(nh_uow_t *u, const char *endpoint, const char *session, int64_t park_seq)
{
  if (u->pg) return nh_uowpg_parked_delete(u->pg, endpoint, session, park_seq);
  return nh_store_parked_delete(u->store, endpoint, session, park_seq);
}

int nh_uow_parked_delete_event(nh_uow_t *u, const char *endpoint, const char *event_id)
{
  if (u->pg) return nh_uowpg_parked_delete_event(u->pg, endpoint, event_id);
  return nh_store_parked_delete_event(u->store, endpoint, event_id);
}

int nh_uow_inbox_add(nh_uow_t *u, const char *endpoint, const char *message_id)
{
  if (u->pg) return nh_uowpg_inbox_add(u->pg, endpoint, message_id);
  return nh_store_inbox_add(u->store, endpoint, message_id);
}

/* ---------------------------------------------------------------- the pass's transaction */

/* With NH_UOW_CACHED both run: the write list, and the sqlite transaction the transport
 * writes in meanwhile (nh_uow_commit sends the list into it before it commits). */
int nh_uow_begin(nh_uow_t *u)
{
  if (u->pg) nh_uowpg_rollback(u->pg);
  int rc = u->store ? nh_store_begin(u->store) : NH_OK;
  u->open = rc == NH_OK;
  if (u->open) txn_tell(u, NH_TXN_BEGIN);
  return rc;
}

int nh_uow_open(const nh_uow_t *u) { return u->open; }

void nh_uow_rollback(nh_uow_t *u)
{
  if (u->open) txn_tell(u, NH_TXN_ROLLBACK);
  u->open = 0;
  if (u->pg) nh_uowpg_rollback(u->pg);
  if (u->store) nh_store_rollback(u->store);
}

int nh_uow_savepoint(nh_uow_t *u)
{
  if (u->pg) nh_uowpg_savepoint(u->pg);
  txn_tell(u, NH_TXN_SAVEPOINT);
  return u->store ? nh_store_savepoint(u->store) : NH_OK;
}

int nh_uow_savepoint_end(nh_uow_t *u)
{
  /* sqlite rolls back to the savepoint when a statement failed since: the list follows */
  int rc = u->store ? nh_store_savepoint_end(u->store) : NH_OK;
  if (u->pg && rc) nh_uowpg_savepoint_rollback(u->pg);
  else if (u->pg) nh_uowpg_savepoint_end(u->pg);
  txn_tell(u, rc ? NH_TXN_SAVEPOINT_ROLLBACK : NH_TXN_SAVEPOINT_END);
  return rc;
}

void nh_uow_savepoint_rollback(nh_uow_t *u)
{
  if (u->pg) nh_uowpg_savepoint_rollback(u->pg);
  txn_tell(u, NH_TXN_SAVEPOINT_ROLLBACK);
  if (u->store) nh_store_savepoint_rollback(u->store);
}

int nh_uow_batched(const nh_uow_t *u) { return u->pg != NULL; }

int nh_uow_can_miss(const nh_uow_t *u) { return u->pg || (u->mode & NH_UOW_COLD); }

int nh_uow_fill(nh_uow_t *u, nh_uow_fill_cb cb, void *data, nh_error_t *err)
{
  if (!u->pg) return nh_error_set(err, NH_ESTATE, "unit of work: a sqlite store reads at once, it has nothing to fill");
  return nh_uowpg_fill(u->pg, cb, data, err);
}

static void commit_seen(void *data, nh_uow_outcome_t outcome, const nh_error_t *err)
{
  nh_uow_t *u = data;
  u->committed = outcome == NH_UOW_COMMITTED;
  u->commit_cb(u->commit_data, outcome, err);
}

int nh_uow_commit(nh_uow_t *u, nh_uow_commit_cb cb, void *data, nh_error_t *err)
{
  if (!u->pg) return nh_error_set(err, NH_ESTATE, "unit of work: a sqlite store commits with nh_store_commit");
  if (u->hooks.pass_end && !u->missed) u->hooks.pass_end(u->hooks.data);   /* its writes join this commit */
  u->open = 0;
  u->commit_cb = cb;
  u->commit_data = data;
  u->commit_sent = 1;   /* a commit that fails to go out is over too: not COMMITTED */
  return nh_uowpg_commit(u->pg, commit_seen, u, err);
}

void nh_uow_set_hooks(nh_uow_t *u, const nh_uow_hooks_t *hooks) { u->hooks = *hooks; }

int nh_uow_op_peek(nh_uow_t *u, const char *key, const struct pg_result **out)
{
  *out = NULL;
  return u->pg && !u->store ? nh_uowpg_op_peek(u->pg, key, out) : 0;
}

int nh_uow_op(nh_uow_t *u, const struct nh_pg_optab *tab, int op, struct nh_pg_args *args, nh_error_t *err)
{
  if (!u->pg) {
    nh_pg_args_release(args);
    return nh_error_set(err, NH_ESTATE, "unit of work: another table's operation needs a PostgreSQL store");
  }
  return nh_uowpg_op(u->pg, tab, op, args, err);
}

int nh_uow_op_read(nh_uow_t *u, const char *key, const struct nh_pg_optab *tab, int op, struct nh_pg_args *args,
                   const struct pg_result **out)
{
  *out = NULL;
  if (!u->pg || u->store) {   /* no link to read it with */
    nh_pg_args_release(args);
    return NH_ESTATE;
  }
  return nh_uowpg_op_read(u->pg, key, tab, op, args, out);
}

int nh_uow_busy(const nh_uow_t *u) { return u->pg && nh_uowpg_busy(u->pg); }

/* The unit of work over PostgreSQL (nh_uow.h; docs/store-backends.md, "The PostgreSQL
 * unit of work"). The loop never waits for the server, so a pump cannot read a row when
 * it wants it. Instead:
 *
 *   - Reads answer from a cache of entries, one per key (a session's state, an event's
 *     audit row, an inbox entry, ...). A key not in it is a miss: the entry is marked
 *     wanted, the read gives the empty answer and the pass is void. nh_uowpg_fill reads
 *     every wanted entry as one batch on the link; the pump then runs its pass again.
 *     The cache lives for one pump (nh_uowpg_end): sessions the pump holds cannot change
 *     under it meanwhile, so what it read stays true until it lets them go.
 *   - Writes are a list, of copies, sent with the pass's COMMIT as one batch
 *     (nh_uowpg_commit). A pass must read what it wrote, so each write is also applied
 *     to the entries it changes: their overlay, which reads consult before the base read
 *     from the server. A write's effect on an entry not in the cache needs no applying:
 *     reading that entry misses, the pass is void, and the next pass writes again onto
 *     the filled entry. A savepoint's rollback truncates the list and applies it again
 *     from the start, on emptied overlays.
 *   - Two reads depend on writes in a way an overlay cannot compute from one row, and are
 *     keyed so that a fill can answer them. A session's parked rows are read in windows
 *     ("up to WINDOW_ROWS rows after park_seq N"): once a pass has deleted every row of a window,
 *     the head is the first row of the window after it, its own key. How many rows of an
 *     event are parked (what PARKED_DEL_EVENT removes) is read as a count, to which the
 *     pass's parks of that event add and its deletes of them subtract.
 *
 * The due scan is a read like the others (its three statements merged as sqlite's function
 * merges them), and another table's operations (a transport's) can join either batch
 * (nh_uow_op, nh_uow_op_read). This file has the unit's reads and writes; nh_uow_cache.c
 * the entries and overlays; nh_uow_batch.c the fill and the commit, on the link or, with
 * NH_UOW_CACHED, on the sqlite store.
 *
 * What is still left (stage 3): a write whose result the state machine reads beyond these
 * (published_claim, unlock_session), and tagging the transport's held settlements with
 * the transaction that recorded them. */
#include "nh_uow_cache.h"

#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- lifecycle */

nh_uowpg_t *nh_uowpg_new(nh_uow_t *u, nh_pg_link_t *link)
{
  nh_uowpg_t *p = nh_xcalloc(1, sizeof *p);
  p->u = u;
  p->link = link;
  p->mark = -1;
  return p;
}

void nh_uowc_destroy(nh_uowpg_t *p)
{
  nh_uow_t *u = p->u;
  if (p->fill_sets_live) nh_pg_sets_free(&p->fill_sets);
  nh_uowc_writes_truncate(p, 0);
  free(p->writes);
  nh_uowc_entries_free(p);
  free(p);
  free(u->key);
  free(u);
}

void nh_uowpg_free(nh_uowpg_t *p)
{
  if (p->busy) p->orphan = 1;   /* the batch's callbacks still point here */
  else nh_uowc_destroy(p);
}

int nh_uowpg_busy(const nh_uowpg_t *p) { return p->busy; }

nh_uowpg_t *nh_uowpg_new_local(nh_uow_t *u, nh_store_t *store)
{
  nh_uowpg_t *p = nh_uowpg_new(u, NULL);
  p->local = store;
  return p;
}

void nh_uowpg_pass_begin(nh_uowpg_t *p) { nh_uowpg_rollback(p); }

void nh_uowpg_rollback(nh_uowpg_t *p)
{
  nh_uowc_writes_truncate(p, 0);
  nh_uowc_overlays_reset(p);
  p->mark = -1;
}

void nh_uowpg_end(nh_uowpg_t *p)
{
  nh_uowpg_rollback(p);
  nh_uowc_entries_free(p);
}

void nh_uowpg_savepoint(nh_uowpg_t *p) { p->mark = (long)p->nwrites; }

void nh_uowpg_savepoint_end(nh_uowpg_t *p) { p->mark = -1; }

void nh_uowpg_savepoint_rollback(nh_uowpg_t *p)
{
  if (p->mark < 0) return;
  nh_uowc_writes_truncate(p, (size_t)p->mark);
  p->mark = -1;
  nh_uowc_overlays_reset(p);
  for (size_t i = 0; i < p->nwrites; i++) nh_uowc_apply(p, &p->writes[i]);
}

/* ---------------------------------------------------------------- reads */

int nh_uowpg_session_get(nh_uowpg_t *p, const char *endpoint, const char *session, nh_session_state_t *st)
{
  entry_t *e = nh_uowc_entry_at(p, K_SESSION, endpoint, session, NULL, 0);
  memset(st, 0, sizeof *st);
  st->next_park_seq = 1;
  if (e->ov) nh_uowc_session_copy(st, &e->ov_st);
  else if (e->have) nh_uowc_session_copy(st, &e->st);
  else nh_uowc_want(p, e);
  return NH_OK;
}

int nh_uowpg_audit_get(nh_uowpg_t *p, const char *endpoint, const char *event_id, nh_audit_t *out)
{
  entry_t *e = nh_uowc_entry_at(p, K_AUDIT, endpoint, event_id, NULL, 0);
  memset(out, 0, sizeof *out);
  if (!e->ov && !e->have) {
    nh_uowc_want(p, e);
    return 0;
  }
  const nh_audit_t *a = nh_uowc_audit_seen(e);
  if (!a) return 0;
  nh_uowc_audit_copy(out, a);
  return 1;
}

/* A yes-or-no read: the overlay says yes, or the base does. */
static int flag(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c)
{
  entry_t *e = nh_uowc_entry_at(p, kind, a, b, c, 0);
  if (e->ov) return 1;
  if (e->have) return e->found;
  nh_uowc_want(p, e);
  return 0;
}

int nh_uowpg_inbox_has(nh_uowpg_t *p, const char *endpoint, const char *message_id)
{
  return endpoint && message_id ? flag(p, K_INBOX, endpoint, message_id, NULL) : 0;
}

int nh_uowpg_processed_has(nh_uowpg_t *p, const char *endpoint, const char *message_id, const char *event_id)
{
  return endpoint && message_id && event_id ? flag(p, K_DONE, endpoint, message_id, event_id) : 0;
}

int nh_uowpg_oppending_take(nh_uowpg_t *p, const char *message_id, char **expected_status)
{
  *expected_status = NULL;
  entry_t *e = nh_uowc_entry_at(p, K_OPREQ, message_id, NULL, NULL, 0);
  if (e->ov) return 0;   /* taken earlier in this pass */
  if (!e->have) {
    nh_uowc_want(p, e);
    return 0;
  }
  if (!e->found) return 0;
  *expected_status = nh_xstrdup(e->text);
  write_t *w = nh_uowc_write_new(p, W_OPTAKE);
  w->s[0] = nh_xstrdup(message_id);
  nh_uowc_record(p, w);
  return 1;
}

/* A base row the pass has removed: deleted by its seq, or its event's rows deleted. */
static int row_gone(nh_uowpg_t *p, const entry_t *parks, const nh_msg_t *m, int64_t seq)
{
  for (int i = 0; parks && i < parks->ngone; i++)
    if (parks->gone[i] == seq) return 1;
  if (!m->event_id) return 0;
  const entry_t *gone = nh_uowc_entry_find(p, K_GONE, m->endpoint, m->event_id, NULL, 0);
  return gone && gone->ov;
}

/* The session's first parked row now: 1 (row and seq set, not copied), 0 none, -1 a miss. */
static int head_of(nh_uowpg_t *p, const char *endpoint, const char *session, const nh_msg_t **row, int64_t *seq)
{
  entry_t *parks = nh_uowc_entry_at(p, K_PARKS, endpoint, session, NULL, 0);
  const nh_msg_t *base = NULL;
  int64_t base_seq = 0, after = 0;
  for (;;) {
    entry_t *w = nh_uowc_entry_at(p, K_WINDOW, endpoint, session, NULL, after);
    if (!w->have) {
      nh_uowc_want(p, w);
      return -1;
    }
    for (int i = 0; i < w->nrows && !base; i++)
      if (!row_gone(p, parks, &w->rows[i], w->seqs[i])) {
        base = &w->rows[i];
        base_seq = w->seqs[i];
      }
    if (base || !w->more || w->nrows == 0) break;
    after = w->seqs[w->nrows - 1];
  }
  /* the pass's own parks come after every base row (a session's park_seq only grows), but
   * compare rather than rely on it */
  if (parks->nparks && (!base || parks->park_seqs[0] < base_seq)) {
    *row = &parks->parks[0];
    *seq = parks->park_seqs[0];
    return 1;
  }
  if (!base) return 0;
  *row = base;
  *seq = base_seq;
  return 1;
}

int nh_uowpg_parked_head(nh_uowpg_t *p, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq)
{
  const nh_msg_t *row = NULL;
  int64_t seq = 0;
  if (head_of(p, endpoint, session, &row, &seq) != 1) return 0;
  nh_msg_copy(out, row);
  *park_seq = seq;
  return 1;
}

int nh_uowpg_parked_any(nh_uowpg_t *p, const char *endpoint, const char *session)
{
  const nh_msg_t *row = NULL;
  int64_t seq = 0;
  return head_of(p, endpoint, session, &row, &seq) == 1;
}

int nh_uowpg_sessions_due(nh_uowpg_t *p, const char *endpoint, int limit, char **cursor, nh_session_cb cb,
                          void *data)
{
  entry_t *e = nh_uowc_entry_at(p, K_DUE, endpoint, *cursor ? *cursor : "", NULL, limit);
  if (!e->have) {
    nh_uowc_want(p, e);
    return 0;
  }
  free(*cursor);
  *cursor = e->due_cursor ? nh_xstrdup(e->due_cursor) : NULL;
  for (int i = 0; i < e->due.n; i++) cb(data, endpoint, e->due.ids[i], &e->due.sts[i]);
  return e->due.n;
}

/* ---------------------------------------------------------------- writes */

int nh_uowpg_session_put(nh_uowpg_t *p, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  write_t *w = nh_uowc_write_new(p, W_SESSION);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(session);
  nh_uowc_session_copy(&w->st, st);
  return nh_uowc_record(p, w);
}

int nh_uowpg_audit_put(nh_uowpg_t *p, const nh_audit_t *a)
{
  write_t *w = nh_uowc_write_new(p, W_AUDIT);
  nh_uowc_audit_copy(&w->audit, a);
  w->n = nh_time_now_ms();
  if (!w->audit.updated_at) w->audit.updated_at = w->n;   /* the row the overlay shows is the one sent */
  return nh_uowc_record(p, w);
}

int nh_uowpg_audit_retext_deferred(nh_uowpg_t *p, const char *endpoint, const char *session, const char *text)
{
  write_t *w = nh_uowc_write_new(p, W_RETEXT);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(session);
  w->s[2] = nh_xstrdup(text);
  return nh_uowc_record(p, w);
}

int nh_uowpg_history_add(nh_uowpg_t *p, const char *endpoint, const char *event_id, const char *message_id,
                         const char *message_type, const char *status, const char *detail,
                         const nh_history_extra_t *x)
{
  write_t *w = nh_uowc_write_new(p, W_HISTORY);
  const char *v[6] = { endpoint, event_id, message_id, message_type, status, detail };
  for (int i = 0; i < 6; i++) w->s[i] = nh_xstrdup(v[i]);
  if (x) {
    w->has_x = 1;
    w->s[6] = nh_xstrdup(x->error_text);
    w->s[7] = nh_xstrdup(x->error_type);
    w->s[8] = nh_xstrdup(x->error_stack);
    w->s[9] = nh_xstrdup(x->previous_payload);
  }
  return nh_uowc_record(p, w);
}

int nh_uowpg_park(nh_uowpg_t *p, const nh_msg_t *m, int64_t park_seq)
{
  write_t *w = nh_uowc_write_new(p, W_PARK);
  nh_msg_copy(&w->m, m);
  w->n = park_seq;
  return nh_uowc_record(p, w);
}

int nh_uowpg_parked_delete(nh_uowpg_t *p, const char *endpoint, const char *session, int64_t park_seq)
{
  write_t *w = nh_uowc_write_new(p, W_PARKED_DEL);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(session);
  w->n = park_seq;
  return nh_uowc_record(p, w);
}

int nh_uowpg_parked_delete_event(nh_uowpg_t *p, const char *endpoint, const char *event_id)
{
  /* the count it returns is a read: the server's rows of the event, and this pass's */
  entry_t *c = nh_uowc_entry_at(p, K_COUNT, endpoint, event_id, NULL, 0);
  int64_t n = c->delta;
  if (!c->dead) {
    if (c->have) n += c->count;
    else nh_uowc_want(p, c);
  }
  write_t *w = nh_uowc_write_new(p, W_PARKED_DEL_EVENT);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(event_id);
  nh_uowc_record(p, w);
  return n > 0 ? (int)n : 0;
}

int nh_uowpg_inbox_add(nh_uowpg_t *p, const char *endpoint, const char *message_id)
{
  write_t *w = nh_uowc_write_new(p, W_INBOX);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(message_id);
  return nh_uowc_record(p, w);
}

int nh_uowpg_op(nh_uowpg_t *p, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args, nh_error_t *err)
{
  if (p->local) {
    nh_pg_args_release(args);
    return nh_error_set(err, NH_ESTATE, "unit of work: another table's operation needs a PostgreSQL store");
  }
  write_t *w = nh_uowc_write_new(p, W_OP);
  w->op = nh_pg_opcopy_new(tab, op, args);
  return nh_uowc_record(p, w);
}

int nh_uowpg_op_peek(nh_uowpg_t *p, const char *key, const struct pg_result **out)
{
  entry_t *e = nh_uowc_entry_find(p, K_OP, key, NULL, NULL, 0);
  *out = e && e->have ? e->res : NULL;
  return *out != NULL;
}

int nh_uowpg_op_read(nh_uowpg_t *p, const char *key, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args,
                     const PGresult **out)
{
  *out = NULL;
  entry_t *e = nh_uowc_entry_at(p, K_OP, key, NULL, NULL, 0);
  if (e->have) {
    nh_pg_args_release(args);
    *out = e->res;
    return 1;
  }
  if (!e->op) e->op = nh_pg_opcopy_new(tab, op, args);
  else nh_pg_args_release(args);
  nh_uowc_want(p, e);
  return 0;
}


/* The PostgreSQL unit of work's two batches (nh_uow_cache.h): a fill reads every entry a
 * void pass wanted, a commit sends the write list and COMMIT; each one batch on the link.
 * With NH_UOW_CACHED both run at once on the sqlite store instead. */
#include "nh_uow_cache.h"

#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

static int fill_local(nh_uowpg_t *p);
static nh_uow_outcome_t commit_local(nh_uowpg_t *p, nh_error_t *err);

/* ---------------------------------------------------------------- fill: one batch of reads */

/* The three reads of a due scan into what nh_store_sessions_due gives: due retries first,
 * then draining sessions after the cursor, and from the start again once they run out
 * (when the scan did not begin at the start), the cursor left at the last one given. */
static void due_merge(entry_t *e)
{
  int limit = (int)e->after;
  int from_start = !e->k2 || !*e->k2;
  char *cursor = from_start ? NULL : nh_xstrdup(e->k2);
  int n = 0;
  for (int i = 0; i < e->part[0].n && n < limit; i++, n++)
    nh_uowc_due_list_add(&e->due, e->part[0].ids[i], &e->part[0].sts[i]);
  if (n < limit) {
    int m = 0;
    for (int i = 0; i < e->part[1].n && n + m < limit; i++, m++)
      nh_uowc_due_list_add(&e->due, e->part[1].ids[i], &e->part[1].sts[i]);
    if (m > 0) {
      free(cursor);
      cursor = nh_xstrdup(e->due.ids[e->due.n - 1]);
    }
    if (n + m < limit && cursor) {   /* reached the end: start over */
      free(cursor);
      cursor = NULL;
      if (!from_start) {
        int k = 0;
        for (int i = 0; i < e->part[2].n && n + m + k < limit; i++, k++)
          nh_uowc_due_list_add(&e->due, e->part[2].ids[i], &e->part[2].sts[i]);
        if (k > 0) cursor = nh_xstrdup(e->due.ids[e->due.n - 1]);
      }
    }
  }
  e->due_cursor = cursor;
  for (int i = 0; i < 3; i++) nh_uowc_due_list_free(&e->part[i]);
}

static void on_read(void *data, const nh_pg_optab_t *tab, int op, const PGresult *r)
{
  (void)tab;
  (void)op;
  entry_t *e = data;
  int n = PQntuples(r);
  switch (e->kind) {
  case K_SESSION:
    nh_session_state_clear(&e->st);
    memset(&e->st, 0, sizeof e->st);
    e->st.next_park_seq = 1;
    if (n > 0) nh_pgrow_session(r, 0, 0, &e->st);
    break;
  case K_AUDIT:
    nh_audit_clear(&e->audit);
    e->found = n > 0;
    if (e->found) nh_pgrow_audit(r, 0, &e->audit);
    break;
  case K_INBOX:
  case K_DONE:
    e->found = n > 0;
    break;
  case K_OPREQ:
    free(e->text);
    e->text = NULL;
    e->found = n > 0;
    if (e->found) e->text = nh_pg_col_strdup(r, 0, 0);
    break;
  case K_COUNT:
    e->count = n > 0 ? nh_pg_col_i64(r, 0, 0) : 0;
    break;
  case K_DUE: {
    due_list_t *l = &e->part[e->nparts++];
    for (int i = 0; i < n; i++) {
      nh_session_state_t st = { 0 };
      nh_pgrow_session(r, i, 1, &st);
      nh_uowc_due_list_add(l, nh_pg_col_text(r, i, 0), &st);
      nh_session_state_clear(&st);
    }
    if (e->nparts < (e->k2 && *e->k2 ? 3 : 2)) return;   /* not the last of its reads */
    due_merge(e);
    break;
  }
  case K_OP:
    if (e->res) PQclear(e->res);
    e->res = PQcopyResult(r, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES);
    break;
  case K_WINDOW:
    e->rows = nh_xcalloc((size_t)(n ? n : 1), sizeof *e->rows);
    e->seqs = nh_xcalloc((size_t)(n ? n : 1), sizeof *e->seqs);
    for (int i = 0; i < n; i++) nh_pgrow_parked(r, i, e->k1, e->k2, &e->rows[i], &e->seqs[i]);
    e->nrows = n;
    e->more = n == WINDOW_ROWS;
    break;
  }
  e->have = 1;
}

static nh_pgop_t read_args(nh_pg_args_t *a, const entry_t *e)
{
  switch (e->kind) {
  case K_SESSION: return nh_pgargs_session_get(a, e->k1, e->k2);
  case K_AUDIT: return nh_pgargs_audit_get(a, e->k1, e->k2);
  case K_INBOX: return nh_pgargs_inbox_has(a, e->k1, e->k2);
  case K_DONE: return nh_pgargs_processed_has(a, e->k1, e->k2, e->k3);
  case K_OPREQ: return nh_pgargs_oppending_get(a, e->k1);
  case K_COUNT: return nh_pgargs_parked_count_event(a, e->k1, e->k2);
  default: return nh_pgargs_parked_window(a, e->k1, e->k2, e->after, WINDOW_ROWS);
  }
}

/* Every wanted entry's read, those with set twins as one statement of each (nh_pg_set.h):
 * a fill's hundreds of session states and lease checks. */
static int build_fill(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  nh_uowpg_t *p = data;
  nh_pg_sets_t *g = &p->fill_sets;
  if (p->fill_sets_live) nh_pg_sets_free(g);   /* a batch built again after its link came back */
  nh_pg_sets_init(g);
  p->fill_sets_live = 1;
  const nh_pg_optab_t *store = &nh_pg_store_optab;
  for (entry_t *e = p->wanted; e; e = e->want_next) {
    nh_pg_args_t a;
    if (e->kind == K_DUE) {   /* the scan's reads, merged once the last is in (due_merge) */
      int limit = (int)e->after;
      nh_uowc_due_list_free(&e->due);
      free(e->due_cursor);
      e->due_cursor = NULL;
      e->nparts = 0;
      nh_pgop_t op = nh_pgargs_sessions_retry_due(&a, e->k1, nh_time_now_ms(), limit);
      if (nh_pg_sets_add(g, db, store, (int)op, &a, on_read, e, err)) return err->code;
      op = nh_pgargs_sessions_draining(&a, e->k1, e->k2, limit);
      if (nh_pg_sets_add(g, db, store, (int)op, &a, on_read, e, err)) return err->code;
      if (*e->k2) {
        op = nh_pgargs_sessions_draining(&a, e->k1, "", limit);
        if (nh_pg_sets_add(g, db, store, (int)op, &a, on_read, e, err)) return err->code;
      }
      continue;
    }
    if (e->kind == K_OP) {
      nh_pg_opcopy_args(e->op, &a);
      if (nh_pg_sets_add(g, db, e->op->tab, e->op->op, &a, on_read, e, err)) return err->code;
      continue;
    }
    nh_pgop_t op = read_args(&a, e);
    if (nh_pg_sets_add(g, db, store, (int)op, &a, on_read, e, err)) return err->code;
  }
  return nh_pg_sets_flush(g, db, err);
}

static void fill_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  nh_uowpg_t *p = data;
  p->busy = 0;
  if (p->fill_sets_live) {   /* every callback has run, or none will */
    nh_pg_sets_free(&p->fill_sets);
    p->fill_sets_live = 0;
  }
  int ok = outcome == NH_PG_COMMITTED;
  if (ok) {   /* every on_read has run */
    for (entry_t *e = p->wanted, *next; e; e = next) {
      next = e->want_next;
      e->wanted = 0;
      e->want_next = NULL;
    }
    p->wanted = NULL;
    p->nwanted = 0;
  }
  if (p->orphan) {
    nh_uowc_destroy(p);
    return;
  }
  p->fill_cb(p->cb_data, ok, ok ? NULL : err);
}

int nh_uowpg_fill(nh_uowpg_t *p, nh_uow_fill_cb cb, void *data, nh_error_t *err)
{
  if (p->busy) return nh_error_set(err, NH_ESTATE, "unit of work: a batch is already out");
  if (!p->wanted) return nh_error_set(err, NH_ESTATE, "unit of work: no key was missed, nothing to fill");
  if (p->local) {
    int ok = fill_local(p) == NH_OK;
    if (!ok) nh_error_set(err, NH_EFAIL, "unit of work: reading from the store failed: %s", nh_store_errmsg(p->local));
    cb(data, ok, ok ? NULL : err);
    return NH_OK;
  }
  p->fill_cb = cb;
  p->cb_data = data;
  if (nh_pg_link_submit(p->link, build_fill, fill_done, p, err)) return err->code;
  p->busy = 1;
  p->u->stats.fills++;
  p->u->stats.filled += p->nwanted;
  return NH_OK;
}

/* ---------------------------------------------------------------- commit: the writes and COMMIT */

static nh_pgop_t write_args(nh_pg_args_t *a, const write_t *w)
{
  switch (w->kind) {
  case W_SESSION: return nh_pgargs_session_put(a, w->s[0], w->s[1], &w->st);
  case W_AUDIT: return nh_pgargs_audit_put(a, &w->audit);
  case W_RETEXT: return nh_pgargs_audit_retext(a, w->s[0], w->s[1], w->s[2]);
  case W_HISTORY: {
    nh_history_extra_t x = { w->s[6], w->s[7], w->s[8], w->s[9] };
    return nh_pgargs_history_add(a, w->s[0], w->s[1], w->s[2], w->s[3], w->s[4], w->s[5], w->has_x ? &x : NULL);
  }
  case W_PARK: return nh_pgargs_park(a, &w->m, w->n);
  case W_PARKED_DEL: return nh_pgargs_parked_delete(a, w->s[0], w->s[1], w->n);
  case W_PARKED_DEL_EVENT: return nh_pgargs_parked_delete_event(a, w->s[0], w->s[1]);
  case W_INBOX: return nh_pgargs_inbox_add(a, w->s[0], w->s[1]);
  default: return nh_pgargs_oppending_take(a, w->s[0]);
  }
}

/* The locks the list's writes need first (nh_pg_opdef_t's guard: the leases' keys of the
 * ends of leases), as the commit's first statement: two hosts' commits that end leases of
 * the same sessions take their keys in one order, and neither waits for a key while
 * holding a row (nh_pg_queue.c, "Lease keys"). */
static int send_guards(nh_uowpg_t *p, nh_pg_sets_t *g, nh_pg_db_t *db, nh_error_t *err)
{
  int rc = NH_OK;
  for (size_t i = 0; i < p->sent && rc == NH_OK; i++)
    if (p->writes[i].kind == W_OP) rc = nh_pg_sets_add_guard(g, db, p->writes[i].op, err);
  return rc ? rc : nh_pg_sets_flush(g, db, err);
}

/* The write list in as few statements as its tables allow (nh_pg_set.h): a pump's
 * hundreds of audit puts, history rows, queue inserts and deletes and lease ends go as
 * one statement of each. */
static int build_commit(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  nh_uowpg_t *p = data;
  nh_pg_sets_t g;
  nh_pg_sets_init(&g);
  int rc = send_guards(p, &g, db, err);
  for (size_t i = 0; i < p->sent && rc == NH_OK; i++) {
    const write_t *w = &p->writes[i];
    nh_pg_args_t a;
    if (w->kind == W_OP) {
      nh_pg_opcopy_args(w->op, &a);
      rc = nh_pg_sets_add(&g, db, w->op->tab, w->op->op, &a, NULL, NULL, err);
    } else {
      nh_pgop_t op = write_args(&a, w);
      rc = nh_pg_sets_add(&g, db, &nh_pg_store_optab, (int)op, &a, NULL, NULL, err);
    }
  }
  if (rc == NH_OK) rc = nh_pg_sets_flush(&g, db, err);
  p->u->stats.statements += g.statements;
  nh_pg_sets_free(&g);
  return rc ? err->code : NH_OK;
}

static void commit_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  nh_uowpg_t *p = data;
  p->busy = 0;
  p->sent = 0;
  if (p->orphan) {
    nh_uowc_destroy(p);
    return;
  }
  nh_uowpg_rollback(p);   /* the list is spent, whatever happened to it */
  nh_uow_outcome_t o = outcome == NH_PG_COMMITTED ? NH_UOW_COMMITTED
                       : outcome == NH_PG_UNKNOWN ? NH_UOW_UNKNOWN
                                                  : NH_UOW_NOT_COMMITTED;
  p->commit_cb(p->cb_data, o, o == NH_UOW_COMMITTED ? NULL : err);
}

int nh_uowpg_commit(nh_uowpg_t *p, nh_uow_commit_cb cb, void *data, nh_error_t *err)
{
  if (p->busy) return nh_error_set(err, NH_ESTATE, "unit of work: a batch is already out");
  if (p->u->missed)
    return nh_error_set(err, NH_ESTATE, "unit of work: the pass missed a key and is void; it cannot commit");
  if (p->local) {
    nh_error_t e = { 0 };
    nh_uow_outcome_t o = commit_local(p, &e);
    cb(data, o, o == NH_UOW_COMMITTED ? NULL : &e);
    return NH_OK;
  }
  if (p->nwrites == 0) {
    /* Nothing to write (an idle pump's, or one that only fetched: its leases were taken by
     * the fill, which committed): BEGIN and COMMIT alone would be a round trip for nothing,
     * twenty a second per idle host. Told at once, as a local commit is. */
    nh_uowpg_rollback(p);
    cb(data, NH_UOW_COMMITTED, NULL);
    return NH_OK;
  }
  p->commit_cb = cb;
  p->cb_data = data;
  p->sent = p->nwrites;
  if (nh_pg_link_submit(p->link, build_commit, commit_done, p, err)) {
    p->sent = 0;
    return err->code;
  }
  p->busy = 1;
  p->u->stats.commits++;
  p->u->stats.writes += p->nwrites;
  return NH_OK;
}

/* ---------------------------------------------------------------- NH_UOW_CACHED: the same over sqlite */

static int due_collect(void *data, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  (void)endpoint;
  nh_uowc_due_list_add(data, session, st);
  return 0;
}

/* One wanted entry read from the sqlite store, as on_read does from a result. */
static int read_local(nh_uowpg_t *p, entry_t *e)
{
  nh_store_t *s = p->local;
  int rc = NH_OK;
  switch (e->kind) {
  case K_SESSION:
    nh_session_state_clear(&e->st);
    rc = nh_store_session_get(s, e->k1, e->k2, &e->st);
    break;
  case K_AUDIT:
    nh_audit_clear(&e->audit);
    rc = nh_store_audit_get(s, e->k1, e->k2, &e->audit);
    e->found = rc == 1;
    break;
  case K_INBOX:
    rc = e->found = nh_store_inbox_has(s, e->k1, e->k2);
    break;
  case K_DONE:
    rc = e->found = nh_store_processed_has(s, e->k1, e->k2, e->k3);
    break;
  case K_OPREQ:
    free(e->text);
    rc = nh_store_oppending_get(s, e->k1, &e->text);
    e->found = rc == 1;
    break;
  case K_COUNT:
    rc = nh_store_parked_count_event(s, e->k1, e->k2);
    e->count = rc > 0 ? rc : 0;
    break;
  case K_DUE: {
    nh_uowc_due_list_free(&e->due);
    free(e->due_cursor);
    e->due_cursor = *e->k2 ? nh_xstrdup(e->k2) : NULL;
    rc = nh_store_sessions_due(s, e->k1, nh_time_now_ms(), (int)e->after, &e->due_cursor, due_collect, &e->due);
    break;
  }
  case K_WINDOW:
    e->rows = nh_xcalloc(WINDOW_ROWS, sizeof *e->rows);
    e->seqs = nh_xcalloc(WINDOW_ROWS, sizeof *e->seqs);
    rc = nh_store_parked_window(s, e->k1, e->k2, e->after, WINDOW_ROWS, e->rows, e->seqs);
    e->nrows = rc > 0 ? rc : 0;
    e->more = e->nrows == WINDOW_ROWS;
    break;
  }
  if (rc < 0 || nh_store_failed(s)) return NH_EFAIL;
  e->have = 1;
  return NH_OK;
}

static int fill_local(nh_uowpg_t *p)
{
  p->u->stats.fills++;
  p->u->stats.filled += p->nwanted;
  entry_t *e = p->wanted;
  while (e) {
    if (read_local(p, e)) return NH_EFAIL;   /* this one and the rest stay wanted */
    entry_t *next = e->want_next;
    e->wanted = 0;
    e->want_next = NULL;
    p->wanted = e = next;
    p->nwanted--;
  }
  return NH_OK;
}

/* One write on the sqlite store, as write_args builds it for PostgreSQL. */
static int write_local(nh_store_t *s, const write_t *w)
{
  switch (w->kind) {
  case W_SESSION: return nh_store_session_put(s, w->s[0], w->s[1], &w->st);
  case W_AUDIT: return nh_store_audit_put(s, &w->audit);
  case W_RETEXT: return nh_store_audit_retext_deferred(s, w->s[0], w->s[1], w->s[2]);
  case W_HISTORY: {
    nh_history_extra_t x = { w->s[6], w->s[7], w->s[8], w->s[9] };
    return nh_store_history_add_ex(s, w->s[0], w->s[1], w->s[2], w->s[3], w->s[4], w->s[5], w->has_x ? &x : NULL);
  }
  case W_PARK: return nh_store_park(s, &w->m, w->n);
  case W_PARKED_DEL: return nh_store_parked_delete(s, w->s[0], w->s[1], w->n);
  case W_PARKED_DEL_EVENT: return nh_store_parked_delete_event(s, w->s[0], w->s[1]) < 0 ? NH_EFAIL : NH_OK;
  case W_INBOX: return nh_store_inbox_add(s, w->s[0], w->s[1]);
  default: {
    char *expected = NULL;
    int rc = nh_store_oppending_take(s, w->s[0], &expected);
    free(expected);
    return rc < 0 ? NH_EFAIL : NH_OK;
  }
  }
}

/* The write list into the store's open transaction (after the transport's statements of
 * the pass), then its commit; on a failure, the rollback. The list is spent either way.
 * NH_UOW_IN_DOUBT: every other commit is told UNKNOWN after it committed, as a server's is
 * when the connection goes before its answer. (One told UNKNOWN that did not commit is a
 * failed commit whose jobs are given back: the same path, and one a rerun may repeat.) */
static nh_uow_outcome_t commit_local(nh_uowpg_t *p, nh_error_t *err)
{
  uint64_t n = ++p->u->stats.commits;
  p->u->stats.writes += p->nwrites;
  int rc = NH_OK;
  for (size_t i = 0; i < p->nwrites && rc == NH_OK; i++) rc = write_local(p->local, &p->writes[i]);
  if (rc == NH_OK && nh_store_failed(p->local)) rc = NH_EFAIL;
  if (rc == NH_OK && nh_store_commit(p->local)) rc = NH_EFAIL;
  nh_uowpg_rollback(p);
  if (rc) {
    nh_error_set(err, NH_EFAIL, "unit of work: writing the pass failed: %s", nh_store_errmsg(p->local));
    nh_store_rollback(p->local);
    return NH_UOW_NOT_COMMITTED;
  }
  if ((p->u->mode & NH_UOW_IN_DOUBT) && n % 2 == 1) {
    nh_error_set(err, NH_EFAIL, "unit of work: committed, told in doubt (NIMBUS_STORE_IN_DOUBT)");
    return NH_UOW_UNKNOWN;
  }
  return NH_UOW_COMMITTED;
}

/* The PostgreSQL unit of work's cache (nh_uow_cache.h): its entries, the copies they keep,
 * what each write changes in them (their overlay), and the write list. */
#include "nh_uow_cache.h"

#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- entries */

void nh_uowc_entry_clear_overlay(entry_t *e)
{
  /* ov_st and ov_audit are only ever set with ov (apply_*), and every pass resets every
   * entry: clearing the untouched ones was 6% of a host's CPU on PostgreSQL */
  if (e->ov) {
    nh_session_state_clear(&e->ov_st);
    nh_audit_clear(&e->ov_audit);
  }
  e->ov = 0;
  e->ov_found = 0;
  e->delta = 0;
  e->dead = 0;
  for (int i = 0; i < e->nparks; i++) nh_msg_clear(&e->parks[i]);
  e->nparks = 0;
  e->ngone = 0;
}

void nh_uowc_due_list_add(due_list_t *l, const char *id, const nh_session_state_t *st)
{
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 8;
    l->ids = nh_xrealloc(l->ids, sizeof *l->ids * (size_t)l->cap);
    l->sts = nh_xrealloc(l->sts, sizeof *l->sts * (size_t)l->cap);
  }
  l->ids[l->n] = nh_xstrdup(id);
  l->sts[l->n] = *st;
  l->sts[l->n].blocked_by = nh_xstrdup(st->blocked_by);
  l->n++;
}

void nh_uowc_due_list_free(due_list_t *l)
{
  for (int i = 0; i < l->n; i++) {
    free(l->ids[i]);
    nh_session_state_clear(&l->sts[i]);
  }
  free(l->ids);
  free(l->sts);
  memset(l, 0, sizeof *l);
}

void nh_uowc_entry_free(entry_t *e)
{
  nh_uowc_entry_clear_overlay(e);
  nh_session_state_clear(&e->st);
  nh_audit_clear(&e->audit);
  free(e->text);
  for (int i = 0; i < e->nrows; i++) nh_msg_clear(&e->rows[i]);
  free(e->rows);
  free(e->seqs);
  nh_uowc_due_list_free(&e->due);
  for (int i = 0; i < 3; i++) nh_uowc_due_list_free(&e->part[i]);
  free(e->due_cursor);
  nh_pg_opcopy_free(e->op);
  if (e->res) PQclear(e->res);
  free(e->parks);
  free(e->park_seqs);
  free(e->gone);
  free(e->key);
  free(e->k1);
  free(e->k2);
  free(e->k3);
  free(e);
}

static void grow_buckets(nh_uowpg_t *p)
{
  size_t n = p->nbuckets ? p->nbuckets * 2 : 256;
  entry_t **b = nh_xcalloc(n, sizeof *b);
  for (entry_t *e = p->all; e; e = e->next) {
    size_t i = nh_strset_hash(e->key) & (n - 1);
    e->chain = b[i];
    b[i] = e;
  }
  free(p->buckets);
  p->buckets = b;
  p->nbuckets = n;
}

/* The entry of a key, made (with nothing read, nothing written) if there is none. */
/* The key of (kind, a, b, c, after) in the unit's scratch buffer. */
static const char *key_of(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c, int64_t after)
{
  if (kind != K_WINDOW && kind != K_DUE) return nh_uow_key(p->u, kind, a, b, c);
  char num[24];   /* `after` is part of the key */
  snprintf(num, sizeof num, "%lld", (long long)after);
  return nh_uow_key(p->u, kind, a, b, num);
}

static entry_t *find(const nh_uowpg_t *p, const char *key)
{
  if (!p->nbuckets) return NULL;
  for (entry_t *e = p->buckets[nh_strset_hash(key) & (p->nbuckets - 1)]; e; e = e->chain)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

entry_t *nh_uowc_entry_find(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c, int64_t after)
{
  return find(p, key_of(p, kind, a, b, c, after));
}

entry_t *nh_uowc_entry_at(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c, int64_t after)
{
  const char *key = key_of(p, kind, a, b, c, after);
  entry_t *e = find(p, key);
  if (e) return e;
  if (!p->nbuckets) grow_buckets(p);
  size_t i = nh_strset_hash(key) & (p->nbuckets - 1);
  int numbered = kind == K_WINDOW || kind == K_DUE;
  e = nh_xcalloc(1, sizeof *e);
  e->key = nh_xstrdup(key);
  e->kind = kind;
  e->k1 = nh_xstrdup(a);
  e->k2 = nh_xstrdup(b);
  e->k3 = numbered ? NULL : nh_xstrdup(c);
  e->after = after;
  e->next = p->all;
  p->all = e;
  e->chain = p->buckets[i];
  p->buckets[i] = e;
  if (++p->nentries > p->nbuckets) grow_buckets(p);
  return e;
}

/* A read of an entry the cache does not have: the pass is void. */
void nh_uowc_want(nh_uowpg_t *p, entry_t *e)
{
  if (!e->wanted) {
    e->wanted = 1;
    e->want_next = p->wanted;
    p->wanted = e;
    p->nwanted++;
    p->u->stats.misses++;
  }
  p->u->missed = 1;
}

void nh_uowc_entries_free(nh_uowpg_t *p)
{
  entry_t *e = p->all;
  while (e) {
    entry_t *next = e->next;
    nh_uowc_entry_free(e);
    e = next;
  }
  free(p->buckets);
  p->buckets = NULL;
  p->nbuckets = 0;
  p->nentries = 0;
  p->all = NULL;
  p->wanted = NULL;
  p->nwanted = 0;
}

int nh_uowc_streq(const char *a, const char *b) { return a && b ? strcmp(a, b) == 0 : a == b; }

/* ---------------------------------------------------------------- copies */

void nh_uowc_audit_copy(nh_audit_t *d, const nh_audit_t *s)
{
  memset(d, 0, sizeof *d);
  d->endpoint = nh_xstrdup(s->endpoint);
  d->event_id = nh_xstrdup(s->event_id);
  d->session_id = nh_xstrdup(s->session_id);
  d->event_type = nh_xstrdup(s->event_type);
  d->status = nh_xstrdup(s->status);
  d->sub_status = nh_xstrdup(s->sub_status);
  d->error_text = nh_xstrdup(s->error_text);
  d->error_type = nh_xstrdup(s->error_type);
  d->handoff_reason = nh_xstrdup(s->handoff_reason);
  d->external_job_id = nh_xstrdup(s->external_job_id);
  d->expected_by = s->expected_by;
  d->message_id = nh_xstrdup(s->message_id);
  d->correlation_id = nh_xstrdup(s->correlation_id);
  d->originating_message_id = nh_xstrdup(s->originating_message_id);
  d->retry_count = s->retry_count;
  d->attempts = s->attempts;
  if (s->payload) {
    d->payload_len = nh_audit_payload_len(s);
    d->payload = nh_xstrndup(s->payload, d->payload_len);
  }
  d->result = nh_xstrdup(s->result);
  d->error_stack = nh_xstrdup(s->error_stack);
  d->created_at = s->created_at;
  d->updated_at = s->updated_at;
  d->queue_time_ms = s->queue_time_ms;
  d->processing_time_ms = s->processing_time_ms;
  d->overdue_at = s->overdue_at;
  d->traceparent = nh_xstrdup(s->traceparent);
  d->replaced_payload = nh_xstrdup(s->replaced_payload);
}

void nh_uowc_session_copy(nh_session_state_t *d, const nh_session_state_t *s)
{
  *d = *s;
  d->blocked_by = nh_xstrdup(s->blocked_by);
}

/* ---------------------------------------------------------------- overlays: what a write changes */

/* The audit row a read would see now: the overlay's, the base's, or NULL (none, or not read). */
const nh_audit_t *nh_uowc_audit_seen(const entry_t *e)
{
  if (e->ov) return e->ov_found ? &e->ov_audit : NULL;
  return e->have && e->found ? &e->audit : NULL;
}

static void apply_session(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = nh_uowc_entry_at(p, K_SESSION, w->s[0], w->s[1], NULL, 0);
  nh_session_state_clear(&e->ov_st);
  /* as the store keeps it: a free session is no row (read back as a fresh one) */
  if (!w->st.blocked_by && !w->st.draining && !w->st.retry_due) {
    e->ov_st.next_park_seq = 1;
  } else {
    nh_uowc_session_copy(&e->ov_st, &w->st);
    e->ov_st.exists = 1;
    if (e->ov_st.next_park_seq <= 0) e->ov_st.next_park_seq = 1;
  }
  e->ov = 1;
}

static void apply_audit(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = nh_uowc_entry_at(p, K_AUDIT, w->audit.endpoint, w->audit.event_id, NULL, 0);
  const nh_audit_t *was = nh_uowc_audit_seen(e);
  nh_audit_t a;
  nh_uowc_audit_copy(&a, &w->audit);
  free(a.replaced_payload);   /* history keeps it, the row does not */
  a.replaced_payload = NULL;
  if (!a.payload) a.payload_len = 0;
  if (!a.updated_at) a.updated_at = w->n;   /* the time the write was recorded */
  a.created_at = was ? was->created_at : a.updated_at;   /* an upsert keeps a row's creation */
  nh_audit_clear(&e->ov_audit);
  e->ov_audit = a;
  e->ov_found = 1;
  e->ov = 1;
}

/* error_text of the session's Deferred rows. Rows not in the cache need nothing: a read of
 * one misses, and the next pass applies this to it. */
static void apply_retext(nh_uowpg_t *p, const write_t *w)
{
  for (entry_t *e = p->all; e; e = e->next) {
    if (e->kind != K_AUDIT) continue;
    const nh_audit_t *a = nh_uowc_audit_seen(e);
    if (!a || !nh_uowc_streq(a->endpoint, w->s[0]) || !nh_uowc_streq(a->session_id, w->s[1]) ||
        !nh_uowc_streq(a->status, NH_ST_DEFERRED))
      continue;
    if (!e->ov) {
      nh_uowc_audit_copy(&e->ov_audit, a);
      e->ov_found = 1;
      e->ov = 1;
    }
    free(e->ov_audit.error_text);
    e->ov_audit.error_text = nh_xstrdup(w->s[2]);
  }
}

/* A history row records a delivery's outcome unless it is a request or a cancellation
 * (NH_PGOP_PROCESSED_HAS). */
static void apply_history(nh_uowpg_t *p, const write_t *w)
{
  const char *status = w->s[4];
  if (!w->s[1] || !w->s[2] || nh_uowc_streq(status, "Requested") || nh_uowc_streq(status, "Cancelled")) return;
  entry_t *e = nh_uowc_entry_at(p, K_DONE, w->s[0], w->s[2], w->s[1], 0);
  e->ov = 1;
}

static void count_add(nh_uowpg_t *p, const char *endpoint, const char *event_id, int by)
{
  if (event_id) nh_uowc_entry_at(p, K_COUNT, endpoint, event_id, NULL, 0)->delta += by;
}

static void apply_park(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = nh_uowc_entry_at(p, K_PARKS, w->m.endpoint, w->m.session_id, NULL, 0);
  if (e->nparks == e->cap_parks) {
    e->cap_parks = e->cap_parks ? e->cap_parks * 2 : 4;
    e->parks = nh_xrealloc(e->parks, sizeof *e->parks * (size_t)e->cap_parks);
    e->park_seqs = nh_xrealloc(e->park_seqs, sizeof *e->park_seqs * (size_t)e->cap_parks);
  }
  int i = e->nparks++;   /* kept in park_seq order: a session's seqs only grow, but be sure */
  while (i > 0 && e->park_seqs[i - 1] > w->n) {
    e->parks[i] = e->parks[i - 1];
    e->park_seqs[i] = e->park_seqs[i - 1];
    i--;
  }
  nh_msg_copy(&e->parks[i], &w->m);
  e->park_seqs[i] = w->n;
  count_add(p, w->m.endpoint, w->m.event_id, 1);
}

static void parks_remove(entry_t *e, int i)
{
  nh_msg_clear(&e->parks[i]);
  memmove(&e->parks[i], &e->parks[i + 1], sizeof *e->parks * (size_t)(e->nparks - i - 1));
  memmove(&e->park_seqs[i], &e->park_seqs[i + 1], sizeof *e->park_seqs * (size_t)(e->nparks - i - 1));
  e->nparks--;
}

/* The base row with that park_seq in a window of the session the cache has, or NULL. */
static const nh_msg_t *window_row(nh_uowpg_t *p, const char *endpoint, const char *session, int64_t seq)
{
  for (entry_t *e = p->all; e; e = e->next) {
    if (e->kind != K_WINDOW || !e->have || !nh_uowc_streq(e->k1, endpoint) || !nh_uowc_streq(e->k2, session)) continue;
    for (int i = 0; i < e->nrows; i++)
      if (e->seqs[i] == seq) return &e->rows[i];
  }
  return NULL;
}

static void apply_parked_delete(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = nh_uowc_entry_at(p, K_PARKS, w->s[0], w->s[1], NULL, 0);
  for (int i = 0; i < e->nparks; i++) {
    if (e->park_seqs[i] != w->n) continue;
    count_add(p, w->s[0], e->parks[i].event_id, -1);
    parks_remove(e, i);
    return;
  }
  if (e->ngone == e->cap_gone) {
    e->cap_gone = e->cap_gone ? e->cap_gone * 2 : 4;
    e->gone = nh_xrealloc(e->gone, sizeof *e->gone * (size_t)e->cap_gone);
  }
  e->gone[e->ngone++] = w->n;
  /* a row deleted by seq is the replayed head, read from a window; one that is not (never
   * in this pump's reads) leaves its event's count as the server has it until commit */
  const nh_msg_t *row = window_row(p, w->s[0], w->s[1], w->n);
  if (row) count_add(p, w->s[0], row->event_id, -1);
}

static void apply_parked_delete_event(nh_uowpg_t *p, const write_t *w)
{
  entry_t *c = nh_uowc_entry_at(p, K_COUNT, w->s[0], w->s[1], NULL, 0);
  c->dead = 1;
  c->delta = 0;
  nh_uowc_entry_at(p, K_GONE, w->s[0], w->s[1], NULL, 0)->ov = 1;
  for (entry_t *e = p->all; e; e = e->next) {
    if (e->kind != K_PARKS || !nh_uowc_streq(e->k1, w->s[0])) continue;
    for (int i = e->nparks - 1; i >= 0; i--)
      if (nh_uowc_streq(e->parks[i].event_id, w->s[1])) parks_remove(e, i);
  }
}

void nh_uowc_apply(nh_uowpg_t *p, const write_t *w)
{
  switch (w->kind) {
  case W_SESSION: apply_session(p, w); break;
  case W_AUDIT: apply_audit(p, w); break;
  case W_RETEXT: apply_retext(p, w); break;
  case W_HISTORY: apply_history(p, w); break;
  case W_PARK: apply_park(p, w); break;
  case W_PARKED_DEL: apply_parked_delete(p, w); break;
  case W_PARKED_DEL_EVENT: apply_parked_delete_event(p, w); break;
  case W_INBOX:
    if (w->s[0] && w->s[1]) nh_uowc_entry_at(p, K_INBOX, w->s[0], w->s[1], NULL, 0)->ov = 1;
    break;
  case W_OPTAKE: {
    entry_t *e = nh_uowc_entry_at(p, K_OPREQ, w->s[0], NULL, NULL, 0);
    e->ov = 1;
    e->ov_found = 0;
    break;
  }
  case W_OP:   /* another table's: the cache knows nothing of it */
    break;
  }
}

/* ---------------------------------------------------------------- the write list */

void nh_uowc_write_clear(write_t *w)
{
  for (int i = 0; i < 10; i++) free(w->s[i]);
  nh_session_state_clear(&w->st);
  nh_audit_clear(&w->audit);
  nh_msg_clear(&w->m);
  nh_pg_opcopy_free(w->op);
  memset(w, 0, sizeof *w);
}

write_t *nh_uowc_write_new(nh_uowpg_t *p, wkind_t kind)
{
  if (p->nwrites == p->cap_writes) {
    p->cap_writes = p->cap_writes ? p->cap_writes * 2 : 64;
    p->writes = nh_xrealloc(p->writes, sizeof *p->writes * p->cap_writes);
  }
  write_t *w = &p->writes[p->nwrites++];
  memset(w, 0, sizeof *w);
  w->kind = kind;
  return w;
}

/* Records the write and applies it to what the pass reads next. */
int nh_uowc_record(nh_uowpg_t *p, write_t *w)
{
  nh_uowc_apply(p, w);
  return NH_OK;
}

void nh_uowc_overlays_reset(nh_uowpg_t *p)
{
  for (entry_t *e = p->all; e; e = e->next) nh_uowc_entry_clear_overlay(e);
}

void nh_uowc_writes_truncate(nh_uowpg_t *p, size_t n)
{
  while (p->nwrites > n) nh_uowc_write_clear(&p->writes[--p->nwrites]);
}


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
 * What is still left (stage 3): a write whose result the state machine reads beyond these
 * (published_claim, unlock_session), the due scan's reads, and tagging the transport's
 * held settlements with the transaction that recorded them. */
#include "nh_pg_link.h"
#include "nh_pg_ops.h"
#include "nh_uow_int.h"

#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

/* Parked rows per window read. A session replays one parked row per pump, and the pass that
 * records a replay deletes its row and asks whether any is left: two rows answer both
 * without another read, and a backlog costs no more per replay than one row does
 * (test_dispatch's parking_and_replay_cost_do_not_grow_with_the_backlog, run cached). */
#define WINDOW_ROWS 2

/* What an entry caches. */
enum {
  K_SESSION = 's',   /* (endpoint, session): the session's state */
  K_AUDIT = 'a',     /* (endpoint, event): the audit row */
  K_INBOX = 'i',     /* (endpoint, message): in the inbox */
  K_DONE = 'd',      /* (endpoint, message, event): the delivery's outcome recorded (processed_has) */
  K_OPREQ = 'o',     /* (message): an operator request's expected status */
  K_COUNT = 'c',     /* (endpoint, event): how many rows of the event are parked */
  K_WINDOW = 'w',    /* (endpoint, session, after): parked rows after park_seq `after` */
  K_PARKS = 'p',     /* (endpoint, session): no read, only the pass's parks and deletes */
  K_GONE = 'g',      /* (endpoint, event): no read; the pass removed the event's parked rows */
  K_DUE = 'u',       /* (endpoint, cursor, limit in `after`): the due scan (nh_store_sessions_due) */
  K_OP = 'x',        /* (the caller's key): a read of another table's operation (nh_uow_op_read) */
};

/* An operation of any table with copies of its parameters (nh_uow_op, nh_uow_op_read). */
typedef struct op_copy {
  const nh_pg_optab_t *tab;
  int op;
  int n;
  char *values[NH_PG_MAX_ARGS];
  int lengths[NH_PG_MAX_ARGS];
  int formats[NH_PG_MAX_ARGS];
} op_copy_t;

/* A list of sessions and their states, as a scan read them. */
typedef struct due_list {
  char **ids;
  nh_session_state_t *sts;
  int n, cap;
} due_list_t;

typedef struct entry entry_t;
struct entry {
  entry_t *chain;        /* the bucket's next */
  entry_t *next;         /* every entry, newest first */
  entry_t *want_next;    /* the wanted list */
  char *key;
  char kind;
  char *k1, *k2, *k3;    /* the key's parts, for the read's arguments */
  int64_t after;         /* K_WINDOW */
  unsigned have : 1;     /* the base has been read */
  unsigned wanted : 1;   /* on the wanted list */
  unsigned ov : 1;       /* the overlay is set */

  /* base, read from the server */
  int found;             /* K_AUDIT, K_INBOX, K_DONE, K_OPREQ: the row exists */
  int64_t count;         /* K_COUNT */
  nh_session_state_t st; /* K_SESSION */
  nh_audit_t audit;      /* K_AUDIT */
  char *text;            /* K_OPREQ: expected_status */
  nh_msg_t *rows;        /* K_WINDOW: its rows, in park_seq order */
  int64_t *seqs;
  int nrows;
  int more;              /* K_WINDOW: it was full, rows may follow */
  due_list_t due;        /* K_DUE: the sessions the scan gives, in order */
  char *due_cursor;      /* K_DUE: the cursor after it (NULL: start over) */
  due_list_t part[3];    /* K_DUE on PostgreSQL: its three reads' rows, merged by due_merge */
  int nparts;
  op_copy_t *op;         /* K_OP: the read to make */
  PGresult *res;         /* K_OP: its result, kept for the pump */

  /* overlay, the pass's writes */
  int ov_found;          /* K_AUDIT: a row (0: K_OPREQ taken) */
  nh_session_state_t ov_st;
  nh_audit_t ov_audit;
  int64_t delta;         /* K_COUNT: rows the pass parked less those it deleted */
  int dead;              /* K_COUNT: the pass removed the event's rows (the base no longer counts) */
  nh_msg_t *parks;       /* K_PARKS: the pass's parks, in park_seq order */
  int64_t *park_seqs;
  int nparks, cap_parks;
  int64_t *gone;         /* K_PARKS: base rows the pass deleted */
  int ngone, cap_gone;
};

typedef enum {
  W_SESSION, W_AUDIT, W_RETEXT, W_HISTORY, W_PARK, W_PARKED_DEL, W_PARKED_DEL_EVENT, W_INBOX, W_OPTAKE, W_OP
} wkind_t;

/* A write, with copies of everything it sends. */
typedef struct write {
  wkind_t kind;
  char *s[10];           /* strings, per kind (see record_*) */
  int has_x;             /* W_HISTORY: s[6..9] are an nh_history_extra_t */
  int64_t n;             /* park_seq */
  nh_session_state_t st;
  nh_audit_t audit;
  nh_msg_t m;
  op_copy_t *op;         /* W_OP */
} write_t;

struct nh_uowpg {
  nh_uow_t *u;
  nh_pg_link_t *link;
  nh_store_t *local;     /* NH_UOW_CACHED: the sqlite store that fills and flushes instead of a link */
  entry_t **buckets;
  size_t nbuckets;       /* a power of two */
  size_t nentries;
  entry_t *all;
  entry_t *wanted;
  size_t nwanted;
  write_t *writes;
  size_t nwrites, cap_writes;
  size_t sent;           /* writes the batch out carries */
  long mark;             /* the savepoint: writes before it; -1: none */
  int busy;              /* a batch is out on the link */
  int orphan;            /* freed while busy: free when it is over */
  nh_uow_fill_cb fill_cb;
  nh_uow_commit_cb commit_cb;
  void *cb_data;
};

/* ---------------------------------------------------------------- entries */

static void entry_clear_overlay(entry_t *e)
{
  e->ov = 0;
  e->ov_found = 0;
  nh_session_state_clear(&e->ov_st);
  nh_audit_clear(&e->ov_audit);
  e->delta = 0;
  e->dead = 0;
  for (int i = 0; i < e->nparks; i++) nh_msg_clear(&e->parks[i]);
  e->nparks = 0;
  e->ngone = 0;
}

/* Copies of a's parameters (it is released: its cleaned copies freed, as a send does). */
static op_copy_t *op_copy(const nh_pg_optab_t *tab, int op, nh_pg_args_t *a)
{
  op_copy_t *c = nh_xcalloc(1, sizeof *c);
  c->tab = tab;
  c->op = op;
  c->n = a->n;
  for (int i = 0; i < a->n; i++) {
    c->formats[i] = a->formats[i];
    if (!a->values[i]) continue;
    size_t len = a->formats[i] ? (size_t)a->lengths[i] : strlen(a->values[i]);
    c->values[i] = nh_xmalloc(len + 1);
    memcpy(c->values[i], a->values[i], len);
    c->values[i][len] = '\0';
    c->lengths[i] = (int)len;
  }
  nh_pg_args_release(a);
  return c;
}

static void op_free(op_copy_t *c)
{
  if (!c) return;
  for (int i = 0; i < c->n; i++) free(c->values[i]);
  free(c);
}

/* Adds the copied operation to a batch. */
static int op_send(nh_pg_db_t *db, const op_copy_t *c, nh_pg_result_cb cb, void *data, nh_error_t *err)
{
  nh_pg_args_t a;
  nh_pg_args_reset(&a);
  a.n = c->n;
  for (int i = 0; i < c->n; i++) {
    a.values[i] = c->values[i];
    a.lengths[i] = c->lengths[i];
    a.formats[i] = c->formats[i];
  }
  return nh_pg_batch_add_op(db, c->tab, c->op, &a, cb, data, err);
}

static void due_list_add(due_list_t *l, const char *id, const nh_session_state_t *st)
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

static void due_list_free(due_list_t *l)
{
  for (int i = 0; i < l->n; i++) {
    free(l->ids[i]);
    nh_session_state_clear(&l->sts[i]);
  }
  free(l->ids);
  free(l->sts);
  memset(l, 0, sizeof *l);
}

static void entry_free(entry_t *e)
{
  entry_clear_overlay(e);
  nh_session_state_clear(&e->st);
  nh_audit_clear(&e->audit);
  free(e->text);
  for (int i = 0; i < e->nrows; i++) nh_msg_clear(&e->rows[i]);
  free(e->rows);
  free(e->seqs);
  due_list_free(&e->due);
  for (int i = 0; i < 3; i++) due_list_free(&e->part[i]);
  free(e->due_cursor);
  op_free(e->op);
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
static entry_t *entry_at(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c, int64_t after)
{
  char num[24] = "";
  int numbered = kind == K_WINDOW || kind == K_DUE;   /* `after` is part of the key */
  if (numbered) snprintf(num, sizeof num, "%lld", (long long)after);
  const char *key = numbered ? nh_uow_key(p->u, kind, a, b, num) : nh_uow_key(p->u, kind, a, b, c);
  if (!p->nbuckets) grow_buckets(p);
  size_t i = nh_strset_hash(key) & (p->nbuckets - 1);
  for (entry_t *e = p->buckets[i]; e; e = e->chain)
    if (strcmp(e->key, key) == 0) return e;
  entry_t *e = nh_xcalloc(1, sizeof *e);
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
static void want(nh_uowpg_t *p, entry_t *e)
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

static void entries_free(nh_uowpg_t *p)
{
  entry_t *e = p->all;
  while (e) {
    entry_t *next = e->next;
    entry_free(e);
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

static int streq(const char *a, const char *b) { return a && b ? strcmp(a, b) == 0 : a == b; }

/* ---------------------------------------------------------------- copies */

static void audit_copy(nh_audit_t *d, const nh_audit_t *s)
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

static void session_copy(nh_session_state_t *d, const nh_session_state_t *s)
{
  *d = *s;
  d->blocked_by = nh_xstrdup(s->blocked_by);
}

/* ---------------------------------------------------------------- overlays: what a write changes */

/* The audit row a read would see now: the overlay's, the base's, or NULL (none, or not read). */
static const nh_audit_t *audit_seen(const entry_t *e)
{
  if (e->ov) return e->ov_found ? &e->ov_audit : NULL;
  return e->have && e->found ? &e->audit : NULL;
}

static void apply_session(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = entry_at(p, K_SESSION, w->s[0], w->s[1], NULL, 0);
  nh_session_state_clear(&e->ov_st);
  /* as the store keeps it: a free session is no row (read back as a fresh one) */
  if (!w->st.blocked_by && !w->st.draining && !w->st.retry_due) {
    e->ov_st.next_park_seq = 1;
  } else {
    session_copy(&e->ov_st, &w->st);
    e->ov_st.exists = 1;
    if (e->ov_st.next_park_seq <= 0) e->ov_st.next_park_seq = 1;
  }
  e->ov = 1;
}

static void apply_audit(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = entry_at(p, K_AUDIT, w->audit.endpoint, w->audit.event_id, NULL, 0);
  const nh_audit_t *was = audit_seen(e);
  nh_audit_t a;
  audit_copy(&a, &w->audit);
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
    const nh_audit_t *a = audit_seen(e);
    if (!a || !streq(a->endpoint, w->s[0]) || !streq(a->session_id, w->s[1]) || !streq(a->status, NH_ST_DEFERRED))
      continue;
    if (!e->ov) {
      audit_copy(&e->ov_audit, a);
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
  if (!w->s[1] || !w->s[2] || streq(status, "Requested") || streq(status, "Cancelled")) return;
  entry_t *e = entry_at(p, K_DONE, w->s[0], w->s[2], w->s[1], 0);
  e->ov = 1;
}

static void count_add(nh_uowpg_t *p, const char *endpoint, const char *event_id, int by)
{
  if (event_id) entry_at(p, K_COUNT, endpoint, event_id, NULL, 0)->delta += by;
}

static void apply_park(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = entry_at(p, K_PARKS, w->m.endpoint, w->m.session_id, NULL, 0);
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
    if (e->kind != K_WINDOW || !e->have || !streq(e->k1, endpoint) || !streq(e->k2, session)) continue;
    for (int i = 0; i < e->nrows; i++)
      if (e->seqs[i] == seq) return &e->rows[i];
  }
  return NULL;
}

static void apply_parked_delete(nh_uowpg_t *p, const write_t *w)
{
  entry_t *e = entry_at(p, K_PARKS, w->s[0], w->s[1], NULL, 0);
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
  entry_t *c = entry_at(p, K_COUNT, w->s[0], w->s[1], NULL, 0);
  c->dead = 1;
  c->delta = 0;
  entry_at(p, K_GONE, w->s[0], w->s[1], NULL, 0)->ov = 1;
  for (entry_t *e = p->all; e; e = e->next) {
    if (e->kind != K_PARKS || !streq(e->k1, w->s[0])) continue;
    for (int i = e->nparks - 1; i >= 0; i--)
      if (streq(e->parks[i].event_id, w->s[1])) parks_remove(e, i);
  }
}

static void apply(nh_uowpg_t *p, const write_t *w)
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
    if (w->s[0] && w->s[1]) entry_at(p, K_INBOX, w->s[0], w->s[1], NULL, 0)->ov = 1;
    break;
  case W_OPTAKE: {
    entry_t *e = entry_at(p, K_OPREQ, w->s[0], NULL, NULL, 0);
    e->ov = 1;
    e->ov_found = 0;
    break;
  }
  case W_OP:   /* another table's: the cache knows nothing of it */
    break;
  }
}

/* ---------------------------------------------------------------- the write list */

static void write_clear(write_t *w)
{
  for (int i = 0; i < 10; i++) free(w->s[i]);
  nh_session_state_clear(&w->st);
  nh_audit_clear(&w->audit);
  nh_msg_clear(&w->m);
  op_free(w->op);
  memset(w, 0, sizeof *w);
}

static write_t *write_new(nh_uowpg_t *p, wkind_t kind)
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
static int record(nh_uowpg_t *p, write_t *w)
{
  apply(p, w);
  return NH_OK;
}

static void overlays_reset(nh_uowpg_t *p)
{
  for (entry_t *e = p->all; e; e = e->next) entry_clear_overlay(e);
}

static void writes_truncate(nh_uowpg_t *p, size_t n)
{
  while (p->nwrites > n) write_clear(&p->writes[--p->nwrites]);
}

/* ---------------------------------------------------------------- lifecycle */

nh_uowpg_t *nh_uowpg_new(nh_uow_t *u, nh_pg_link_t *link)
{
  nh_uowpg_t *p = nh_xcalloc(1, sizeof *p);
  p->u = u;
  p->link = link;
  p->mark = -1;
  return p;
}

static void destroy(nh_uowpg_t *p)
{
  nh_uow_t *u = p->u;
  writes_truncate(p, 0);
  free(p->writes);
  entries_free(p);
  free(p);
  free(u->key);
  free(u);
}

void nh_uowpg_free(nh_uowpg_t *p)
{
  if (p->busy) p->orphan = 1;   /* the batch's callbacks still point here */
  else destroy(p);
}

int nh_uowpg_busy(const nh_uowpg_t *p) { return p->busy; }

nh_uowpg_t *nh_uowpg_new_local(nh_uow_t *u, nh_store_t *store)
{
  nh_uowpg_t *p = nh_uowpg_new(u, NULL);
  p->local = store;
  return p;
}

static int fill_local(nh_uowpg_t *p);
static int commit_local(nh_uowpg_t *p, nh_error_t *err);

void nh_uowpg_pass_begin(nh_uowpg_t *p) { nh_uowpg_rollback(p); }

void nh_uowpg_rollback(nh_uowpg_t *p)
{
  writes_truncate(p, 0);
  overlays_reset(p);
  p->mark = -1;
}

void nh_uowpg_end(nh_uowpg_t *p)
{
  nh_uowpg_rollback(p);
  entries_free(p);
}

void nh_uowpg_savepoint(nh_uowpg_t *p) { p->mark = (long)p->nwrites; }

void nh_uowpg_savepoint_end(nh_uowpg_t *p) { p->mark = -1; }

void nh_uowpg_savepoint_rollback(nh_uowpg_t *p)
{
  if (p->mark < 0) return;
  writes_truncate(p, (size_t)p->mark);
  p->mark = -1;
  overlays_reset(p);
  for (size_t i = 0; i < p->nwrites; i++) apply(p, &p->writes[i]);
}

/* ---------------------------------------------------------------- reads */

int nh_uowpg_session_get(nh_uowpg_t *p, const char *endpoint, const char *session, nh_session_state_t *st)
{
  entry_t *e = entry_at(p, K_SESSION, endpoint, session, NULL, 0);
  memset(st, 0, sizeof *st);
  st->next_park_seq = 1;
  if (e->ov) session_copy(st, &e->ov_st);
  else if (e->have) session_copy(st, &e->st);
  else want(p, e);
  return NH_OK;
}

int nh_uowpg_audit_get(nh_uowpg_t *p, const char *endpoint, const char *event_id, nh_audit_t *out)
{
  entry_t *e = entry_at(p, K_AUDIT, endpoint, event_id, NULL, 0);
  memset(out, 0, sizeof *out);
  if (!e->ov && !e->have) {
    want(p, e);
    return 0;
  }
  const nh_audit_t *a = audit_seen(e);
  if (!a) return 0;
  audit_copy(out, a);
  return 1;
}

/* A yes-or-no read: the overlay says yes, or the base does. */
static int flag(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c)
{
  entry_t *e = entry_at(p, kind, a, b, c, 0);
  if (e->ov) return 1;
  if (e->have) return e->found;
  want(p, e);
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
  entry_t *e = entry_at(p, K_OPREQ, message_id, NULL, NULL, 0);
  if (e->ov) return 0;   /* taken earlier in this pass */
  if (!e->have) {
    want(p, e);
    return 0;
  }
  if (!e->found) return 0;
  *expected_status = nh_xstrdup(e->text);
  write_t *w = write_new(p, W_OPTAKE);
  w->s[0] = nh_xstrdup(message_id);
  record(p, w);
  return 1;
}

/* A base row the pass has removed: deleted by its seq, or its event's rows deleted. */
static int row_gone(nh_uowpg_t *p, const entry_t *parks, const nh_msg_t *m, int64_t seq)
{
  for (int i = 0; parks && i < parks->ngone; i++)
    if (parks->gone[i] == seq) return 1;
  if (!m->event_id) return 0;
  char *key = nh_xstrdup(nh_uow_key(p->u, K_GONE, m->endpoint, m->event_id, NULL));
  int gone = 0;
  size_t i = nh_strset_hash(key) & (p->nbuckets - 1);
  for (entry_t *e = p->buckets[i]; e; e = e->chain)
    if (strcmp(e->key, key) == 0) gone = e->ov;
  free(key);
  return gone;
}

/* The session's first parked row now: 1 (row and seq set, not copied), 0 none, -1 a miss. */
static int head_of(nh_uowpg_t *p, const char *endpoint, const char *session, const nh_msg_t **row, int64_t *seq)
{
  entry_t *parks = entry_at(p, K_PARKS, endpoint, session, NULL, 0);
  const nh_msg_t *base = NULL;
  int64_t base_seq = 0, after = 0;
  for (;;) {
    entry_t *w = entry_at(p, K_WINDOW, endpoint, session, NULL, after);
    if (!w->have) {
      want(p, w);
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
  entry_t *e = entry_at(p, K_DUE, endpoint, *cursor ? *cursor : "", NULL, limit);
  if (!e->have) {
    want(p, e);
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
  write_t *w = write_new(p, W_SESSION);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(session);
  session_copy(&w->st, st);
  return record(p, w);
}

int nh_uowpg_audit_put(nh_uowpg_t *p, const nh_audit_t *a)
{
  write_t *w = write_new(p, W_AUDIT);
  audit_copy(&w->audit, a);
  w->n = nh_time_now_ms();
  if (!w->audit.updated_at) w->audit.updated_at = w->n;   /* the row the overlay shows is the one sent */
  return record(p, w);
}

int nh_uowpg_audit_retext_deferred(nh_uowpg_t *p, const char *endpoint, const char *session, const char *text)
{
  write_t *w = write_new(p, W_RETEXT);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(session);
  w->s[2] = nh_xstrdup(text);
  return record(p, w);
}

int nh_uowpg_history_add(nh_uowpg_t *p, const char *endpoint, const char *event_id, const char *message_id,
                         const char *message_type, const char *status, const char *detail,
                         const nh_history_extra_t *x)
{
  write_t *w = write_new(p, W_HISTORY);
  const char *v[6] = { endpoint, event_id, message_id, message_type, status, detail };
  for (int i = 0; i < 6; i++) w->s[i] = nh_xstrdup(v[i]);
  if (x) {
    w->has_x = 1;
    w->s[6] = nh_xstrdup(x->error_text);
    w->s[7] = nh_xstrdup(x->error_type);
    w->s[8] = nh_xstrdup(x->error_stack);
    w->s[9] = nh_xstrdup(x->previous_payload);
  }
  return record(p, w);
}

int nh_uowpg_park(nh_uowpg_t *p, const nh_msg_t *m, int64_t park_seq)
{
  write_t *w = write_new(p, W_PARK);
  nh_msg_copy(&w->m, m);
  w->n = park_seq;
  return record(p, w);
}

int nh_uowpg_parked_delete(nh_uowpg_t *p, const char *endpoint, const char *session, int64_t park_seq)
{
  write_t *w = write_new(p, W_PARKED_DEL);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(session);
  w->n = park_seq;
  return record(p, w);
}

int nh_uowpg_parked_delete_event(nh_uowpg_t *p, const char *endpoint, const char *event_id)
{
  /* the count it returns is a read: the server's rows of the event, and this pass's */
  entry_t *c = entry_at(p, K_COUNT, endpoint, event_id, NULL, 0);
  int64_t n = c->delta;
  if (!c->dead) {
    if (c->have) n += c->count;
    else want(p, c);
  }
  write_t *w = write_new(p, W_PARKED_DEL_EVENT);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(event_id);
  record(p, w);
  return n > 0 ? (int)n : 0;
}

int nh_uowpg_inbox_add(nh_uowpg_t *p, const char *endpoint, const char *message_id)
{
  write_t *w = write_new(p, W_INBOX);
  w->s[0] = nh_xstrdup(endpoint);
  w->s[1] = nh_xstrdup(message_id);
  return record(p, w);
}

int nh_uowpg_op(nh_uowpg_t *p, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args, nh_error_t *err)
{
  if (p->local) {
    nh_pg_args_release(args);
    return nh_error_set(err, NH_ESTATE, "unit of work: another table's operation needs a PostgreSQL store");
  }
  write_t *w = write_new(p, W_OP);
  w->op = op_copy(tab, op, args);
  return record(p, w);
}

int nh_uowpg_op_read(nh_uowpg_t *p, const char *key, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args,
                     const PGresult **out)
{
  *out = NULL;
  entry_t *e = entry_at(p, K_OP, key, NULL, NULL, 0);
  if (e->have) {
    nh_pg_args_release(args);
    *out = e->res;
    return 1;
  }
  if (!e->op) e->op = op_copy(tab, op, args);
  else nh_pg_args_release(args);
  want(p, e);
  return 0;
}

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
  for (int i = 0; i < e->part[0].n && n < limit; i++, n++) due_list_add(&e->due, e->part[0].ids[i], &e->part[0].sts[i]);
  if (n < limit) {
    int m = 0;
    for (int i = 0; i < e->part[1].n && n + m < limit; i++, m++)
      due_list_add(&e->due, e->part[1].ids[i], &e->part[1].sts[i]);
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
          due_list_add(&e->due, e->part[2].ids[i], &e->part[2].sts[i]);
        if (k > 0) cursor = nh_xstrdup(e->due.ids[e->due.n - 1]);
      }
    }
  }
  e->due_cursor = cursor;
  for (int i = 0; i < 3; i++) due_list_free(&e->part[i]);
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
      due_list_add(l, nh_pg_col_text(r, i, 0), &st);
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

static int build_fill(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  nh_uowpg_t *p = data;
  for (entry_t *e = p->wanted; e; e = e->want_next) {
    nh_pg_args_t a;
    if (e->kind == K_DUE) {   /* the scan's reads, merged once the last is in (due_merge) */
      int limit = (int)e->after;
      due_list_free(&e->due);
      free(e->due_cursor);
      e->due_cursor = NULL;
      e->nparts = 0;
      if (nh_pg_batch_add(db, nh_pgargs_sessions_retry_due(&a, e->k1, nh_time_now_ms(), limit), &a, on_read, e, err) ||
          nh_pg_batch_add(db, nh_pgargs_sessions_draining(&a, e->k1, e->k2, limit), &a, on_read, e, err) ||
          (*e->k2 && nh_pg_batch_add(db, nh_pgargs_sessions_draining(&a, e->k1, "", limit), &a, on_read, e, err)))
        return err->code;
      continue;
    }
    if (e->kind == K_OP) {
      if (op_send(db, e->op, on_read, e, err)) return err->code;
      continue;
    }
    nh_pgop_t op = read_args(&a, e);
    if (nh_pg_batch_add(db, op, &a, on_read, e, err)) return err->code;
  }
  return NH_OK;
}

static void fill_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  nh_uowpg_t *p = data;
  p->busy = 0;
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
    destroy(p);
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

static int build_commit(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  nh_uowpg_t *p = data;
  for (size_t i = 0; i < p->sent; i++) {
    if (p->writes[i].kind == W_OP) {
      if (op_send(db, p->writes[i].op, NULL, NULL, err)) return err->code;
      continue;
    }
    nh_pg_args_t a;
    nh_pgop_t op = write_args(&a, &p->writes[i]);
    if (nh_pg_batch_add(db, op, &a, NULL, NULL, err)) return err->code;
  }
  return NH_OK;
}

static void commit_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  nh_uowpg_t *p = data;
  p->busy = 0;
  p->sent = 0;
  if (p->orphan) {
    destroy(p);
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
    int rc = commit_local(p, &e);
    cb(data, rc ? NH_UOW_NOT_COMMITTED : NH_UOW_COMMITTED, rc ? &e : NULL);
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
  due_list_add(data, session, st);
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
    due_list_free(&e->due);
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
 * the pass), then its commit; on a failure, the rollback. The list is spent either way. */
static int commit_local(nh_uowpg_t *p, nh_error_t *err)
{
  p->u->stats.commits++;
  p->u->stats.writes += p->nwrites;
  int rc = NH_OK;
  for (size_t i = 0; i < p->nwrites && rc == NH_OK; i++) rc = write_local(p->local, &p->writes[i]);
  if (rc == NH_OK && nh_store_failed(p->local)) rc = NH_EFAIL;
  if (rc == NH_OK && nh_store_commit(p->local)) rc = NH_EFAIL;
  if (rc) {
    nh_error_set(err, NH_EFAIL, "unit of work: writing the pass failed: %s", nh_store_errmsg(p->local));
    nh_store_rollback(p->local);
  }
  nh_uowpg_rollback(p);
  return rc;
}

/* Set statements (nh_pg_set.h). */
#include "nh_pg_set.h"

#include "core/nh_util.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_OID 25
#define BYTEA_OID 17
#define HEADER 20   /* ndim, has-nulls, element type, then the one dimension's length and lower bound */

static void col_put(nh_pg_set_col_t *c, const void *p, size_t n)
{
  if (c->len + n > c->cap) {
    size_t cap = c->cap ? c->cap : 256;
    while (cap < c->len + n) cap *= 2;
    c->p = nh_xrealloc(c->p, cap);
    c->cap = cap;
  }
  memcpy(c->p + c->len, p, n);
  c->len += n;
}

static void col_u32(nh_pg_set_col_t *c, uint32_t v)
{
  uint32_t be = htonl(v);
  col_put(c, &be, 4);
}

static void set_begin(nh_pg_set_t *s, const nh_pg_optab_t *tab, int op)
{
  s->tab = tab;
  s->op = op;
  s->rows = 0;
  s->reads = 0;
  int n = tab->ops[op].nparams;
  for (int i = 0; i < n; i++) {
    nh_pg_set_col_t *c = &s->col[i];
    c->len = 0;
    c->nulls = 0;
    char zero[HEADER] = { 0 };
    col_put(c, zero, HEADER);   /* written at the send, when the count is known */
  }
}

static void set_add(nh_pg_set_t *s, const nh_pg_args_t *row, nh_pg_result_cb cb, void *data)
{
  if (s->rows == s->to_cap) {
    s->to_cap = s->to_cap ? s->to_cap * 2 : 64;
    s->to = nh_xrealloc(s->to, sizeof *s->to * (size_t)s->to_cap);
  }
  s->to[s->rows] = (nh_pg_set_to_t){ cb, data };
  if (cb) s->reads = 1;
  for (int i = 0; i < row->n; i++) {
    nh_pg_set_col_t *c = &s->col[i];
    const char *v = row->values[i];
    if (!v) {
      col_u32(c, 0xFFFFFFFFu);   /* -1: NULL */
      c->nulls = 1;
      continue;
    }
    /* a text parameter's binary form is its bytes; a bytea's too */
    size_t len = row->formats[i] ? (size_t)row->lengths[i] : strlen(v);
    col_u32(c, (uint32_t)len);
    col_put(c, v, len);
  }
  s->rows++;
}

struct nh_pg_split {
  const nh_pg_optab_t *tab;
  int op;   /* the row operation its callers asked for */
  int n;
  nh_pg_set_to_t *to;
};

/* The twin's result cut into each row's, as its row operation would have answered. */
static void on_set_result(void *data, const nh_pg_optab_t *tab, int twin, const PGresult *r)
{
  (void)tab;
  (void)twin;
  nh_pg_split_t *sp = data;
  int nt = PQntuples(r), nf = PQnfields(r) - 1;
  PGresAttDesc attrs[NH_PG_MAX_ARGS + 8];
  if (nf < 0) nf = 0;
  if (nf > (int)(sizeof attrs / sizeof attrs[0])) nf = (int)(sizeof attrs / sizeof attrs[0]);
  for (int j = 0; j < nf; j++)
    attrs[j] = (PGresAttDesc){ PQfname(r, j + 1), 0, 0, PQfformat(r, j + 1), PQftype(r, j + 1), PQfsize(r, j + 1),
                               PQfmod(r, j + 1) };
  int i = 0;
  for (int k = 0; k < sp->n; k++) {
    PGresult *part = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    if (!part || !PQsetResultAttrs(part, nf, attrs)) nh_oom();
    for (int row = 0; i < nt && nh_pg_col_i64(r, i, 0) == k + 1; i++, row++)
      for (int j = 0; j < nf; j++) {
        int null = PQgetisnull(r, i, j + 1);
        if (!PQsetvalue(part, row, j, null ? NULL : PQgetvalue(r, i, j + 1), null ? -1 : PQgetlength(r, i, j + 1)))
          nh_oom();
      }
    if (sp->to[k].cb) sp->to[k].cb(sp->to[k].data, sp->tab, sp->op, part);
    PQclear(part);
  }
}

static int set_send(nh_pg_sets_t *g, nh_pg_set_t *s, nh_pg_db_t *db, nh_error_t *err)
{
  nh_pg_split_t *sp = NULL;
  if (s->reads) {
    sp = nh_xcalloc(1, sizeof *sp);
    sp->tab = s->tab;
    sp->op = s->op;
    sp->n = s->rows;
    sp->to = nh_xmalloc(sizeof *sp->to * (size_t)s->rows);
    memcpy(sp->to, s->to, sizeof *sp->to * (size_t)s->rows);
    g->splits = nh_xrealloc(g->splits, sizeof *g->splits * (size_t)(g->nsplits + 1));
    g->splits[g->nsplits++] = sp;
  }
  const nh_pg_opdef_t *twin = &s->tab->ops[s->tab->ops[s->op].set];
  nh_pg_args_t a;
  nh_pg_args_reset(&a);
  a.n = twin->nparams;
  for (int i = 0; i < a.n; i++) {
    nh_pg_set_col_t *c = &s->col[i];
    uint32_t h[5] = { htonl(1), htonl((uint32_t)c->nulls),
                      htonl(twin->types && twin->types[i] == 'b' ? BYTEA_OID : TEXT_OID), htonl((uint32_t)s->rows),
                      htonl(1) };
    memcpy(c->p, h, HEADER);
    a.values[i] = c->p;
    a.lengths[i] = (int)c->len;
    a.formats[i] = 1;
  }
  s->rows = 0;
  return nh_pg_batch_add_op(db, s->tab, s->tab->ops[s->op].set, &a, sp ? on_set_result : NULL, sp, err);
}

void nh_pg_sets_init(nh_pg_sets_t *g)
{
  memset(g, 0, sizeof *g);
  nh_strset_init(&g->keys, 64);
}

void nh_pg_sets_free(nh_pg_sets_t *g)
{
  for (int i = 0; i < NH_PG_SETS; i++) {
    for (int j = 0; j < NH_PG_MAX_ARGS; j++) free(g->set[i].col[j].p);
    free(g->set[i].to);
  }
  for (int i = 0; i < g->nsplits; i++) {
    free(g->splits[i]->to);
    free(g->splits[i]);
  }
  free(g->splits);
  nh_strset_free(&g->keys);
}

int nh_pg_sets_flush(nh_pg_sets_t *g, nh_pg_db_t *db, nh_error_t *err)
{
  int rc = NH_OK;
  for (int i = 0; i < g->n && rc == NH_OK; i++) {
    rc = set_send(g, &g->set[i], db, err);
    g->statements++;
  }
  g->n = 0;
  nh_strset_clear(&g->keys);
  return rc;
}

/* "rel\x1fvalue\x1fvalue": the row's key among the rows held, or NULL (no key). */
static char *key_of(const nh_pg_opdef_t *def, const nh_pg_args_t *a)
{
  if (def->key <= 0) return NULL;
  size_t len = strlen(def->rel) + 1;
  for (int i = 0; i < def->key; i++) len += (a->values[i] ? strlen(a->values[i]) : 0) + 1;
  char *k = nh_xmalloc(len), *p = k;
  p = stpcpy(p, def->rel);
  for (int i = 0; i < def->key; i++) {
    *p++ = '\x1f';
    p = stpcpy(p, a->values[i] ? a->values[i] : "");
  }
  return k;
}

int nh_pg_sets_add(nh_pg_sets_t *g, nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args,
                   nh_pg_result_cb cb, void *data, nh_error_t *err)
{
  const nh_pg_opdef_t *def = op >= 0 && op < tab->count ? &tab->ops[op] : NULL;
  if (!def || !def->set || args->n != def->nparams) {   /* a barrier (or a misuse the send reports) */
    int rc = nh_pg_sets_flush(g, db, err);
    if (rc) {
      nh_pg_args_release(args);
      return rc;
    }
    g->statements++;
    return nh_pg_batch_add_op(db, tab, op, args, cb, data, err);
  }
  nh_pg_set_t *s = NULL;
  for (int i = 0; i < g->n && !s; i++)
    if (g->set[i].tab == tab && g->set[i].op == op) s = &g->set[i];
  char *key = key_of(def, args);
  if ((key && nh_strset_has(&g->keys, key)) || (!s && g->n == NH_PG_SETS)) {   /* what is held goes first */
    int rc = nh_pg_sets_flush(g, db, err);
    if (rc) {
      free(key);
      nh_pg_args_release(args);
      return rc;
    }
    s = NULL;
  }
  if (key) nh_strset_add(&g->keys, key);
  free(key);
  if (!s) {
    s = &g->set[g->n++];
    set_begin(s, tab, op);
  }
  set_add(s, args, cb, data);
  nh_pg_args_release(args);
  return NH_OK;
}

int nh_pg_sets_add_guard(nh_pg_sets_t *g, nh_pg_db_t *db, const nh_pg_opcopy_t *c, nh_error_t *err)
{
  int guard = c->tab->ops[c->op].guard;
  if (!guard) return NH_OK;
  nh_pg_args_t a;
  nh_pg_opcopy_args(c, &a);
  a.n = c->tab->ops[guard].nparams;   /* the operation's first parameters name the lock */
  return nh_pg_sets_add(g, db, c->tab, guard, &a, NULL, NULL, err);
}

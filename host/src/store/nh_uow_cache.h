/* The PostgreSQL unit of work's cache and write list, shared by its three files
 * (docs/store-backends.md, "The PostgreSQL unit of work"):
 *   nh_uow_cache.c  entries, the copies they keep, overlays (what a write changes), the write list;
 *   nh_uow_pg.c     the unit's reads and writes (nh_uowpg_*, behind nh_uow.h);
 *   nh_uow_batch.c  fill and commit: batches on the link, or (NH_UOW_CACHED) the sqlite store. */
#ifndef NH_UOW_CACHE_H
#define NH_UOW_CACHE_H

#include "nh_pg_link.h"
#include "nh_pg_ops.h"
#include "nh_pg_set.h"
#include "nh_uow_int.h"

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
typedef nh_pg_opcopy_t op_copy_t;

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
  nh_pg_sets_t fill_sets;   /* the fill out: its read sets' callbacks (nh_pg_set.h) */
  int fill_sets_live;
};


/* ---- entries (nh_uow_cache.c) */
/* The entry of a key, made (nothing read, nothing written) if there is none; `after` is
 * part of the key of K_WINDOW and K_DUE. */
entry_t *nh_uowc_entry_at(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c, int64_t after);
/* A read of an entry the cache does not have: the pass is void, the next fill reads it. */
void nh_uowc_want(nh_uowpg_t *p, entry_t *e);
/* The entry of a key, or NULL: nothing made. */
entry_t *nh_uowc_entry_find(nh_uowpg_t *p, char kind, const char *a, const char *b, const char *c, int64_t after);
void nh_uowc_entries_free(nh_uowpg_t *p);
void nh_uowc_entry_free(entry_t *e);
void nh_uowc_entry_clear_overlay(entry_t *e);
int nh_uowc_streq(const char *a, const char *b);   /* NULL equals only NULL */

void nh_uowc_due_list_add(due_list_t *l, const char *id, const nh_session_state_t *st);
void nh_uowc_due_list_free(due_list_t *l);
/* Copies of a's parameters (a is released, as a send releases it). */

void nh_uowc_audit_copy(nh_audit_t *d, const nh_audit_t *s);
void nh_uowc_session_copy(nh_session_state_t *d, const nh_session_state_t *s);
/* The audit row a read would see now: the overlay's, the base's, or NULL (none, or not read). */
const nh_audit_t *nh_uowc_audit_seen(const entry_t *e);

/* ---- the write list (nh_uow_cache.c) */
write_t *nh_uowc_write_new(nh_uowpg_t *p, wkind_t kind);
void nh_uowc_write_clear(write_t *w);
/* Applies the write just made to what the pass reads next. */
int nh_uowc_record(nh_uowpg_t *p, write_t *w);
void nh_uowc_apply(nh_uowpg_t *p, const write_t *w);
void nh_uowc_overlays_reset(nh_uowpg_t *p);
void nh_uowc_writes_truncate(nh_uowpg_t *p, size_t n);

/* ---- lifecycle (nh_uow_pg.c) */
/* Frees the unit and its nh_uow_t (a batch of it is over, or none was out). */
void nh_uowc_destroy(nh_uowpg_t *p);

#endif

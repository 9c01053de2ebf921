/* AMQP sending: messages wait in the store's amqp_outbox (written in the transaction
 * that decided them), go out on one sender per address once it has committed, and are
 * deleted in a later transaction once the broker accepted them. Each process sends its
 * own rows; rows of dead local processes are taken over at start. */
#include "nh_amqp_priv.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"
#include "core/nh_util.h"

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/disposition.h>
#include <proton/terminus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nh_amqp_outbox_encode(amqp_t *a, const nh_msg_t *m, const char *to, size_t *size, nh_error_t *err)
{
  int flags = a->url.servicebus ? NH_AMQP_ENC_SERVICEBUS : a->url.no_management ? 0 : NH_AMQP_ENC_BUCKETS;
  nh_amqp_msg_encode(a->pm, m, to, flags);
  int rc;
  for (;;) {
    *size = a->bufcap;
    rc = pn_message_encode(a->pm, a->buf, size);
    if (rc != PN_OVERFLOW) break;
    a->bufcap = a->bufcap ? a->bufcap * 2 : 4096;
    a->buf = nh_xrealloc(a->buf, a->bufcap);
  }
  if (rc != 0) return nh_error_set(err, NH_EFAIL, "cannot encode the AMQP message (proton error %d)", rc);
  return NH_OK;
}

int nh_amqp_outbox_add(amqp_t *a, const char *address, const nh_msg_t *m, const char *to, nh_error_t *err)
{
  size_t size;
  if (nh_amqp_outbox_encode(a, m, to, &size, err)) return err->code;
  if (a->pg) {
    if (nh_amqp_pg_out_add(a, address, a->buf, size, err)) return err->code ? err->code : NH_EFAIL;
  } else {
    sqlite3_stmt *st = a->q[A_OUT_ADD];
    nh_sqlite_bind_text(st, 1, address);
    sqlite3_bind_blob(st, 2, a->buf, (int)size, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, nh_time_now_ms());
    nh_sqlite_bind_text(st, 4, a->owner);
    if (nh_sqlite_step_done(a->db, st, "amqp outbox"))
      return nh_error_set(err, NH_EFAIL, "amqp outbox: %s", sqlite3_errmsg(a->db));
    if (!a->first_own_seq) a->first_own_seq = sqlite3_last_insert_rowid(a->db);
  }
  a->outbox_dirty = 1;
  if (!a->in_tx) nh_amqp_outbox_pump(a);
  return NH_OK;
}

static sender_t *sender_for(amqp_t *a, const char *address)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &a->senders) {
    sender_t *s = nh_queue_data(q, sender_t, node);
    if (strcmp(s->address, address) == 0) return s;
  }
  sender_t *s = nh_xcalloc(1, sizeof *s);
  s->address = nh_xstrdup(address);
  char name[700];
  snprintf(name, sizeof name, "nh-send:%s", address);
  s->link = pn_sender(a->ssn, name);
  pn_terminus_set_address(pn_link_target(s->link), address);
  pn_link_set_snd_settle_mode(s->link, PN_SND_UNSETTLED);
  pn_link_open(s->link);
  nh_queue_insert_head(&a->senders, &s->node);
  return s;
}

int nh_amqp_outbox_acked(const amqp_t *a, int64_t seq)
{
  for (int i = 0; i < a->nacked; i++)
    if (a->acked[i] == seq) return 1;
  return 0;
}

int nh_amqp_outbox_send(amqp_t *a, int64_t seq, const char *address, const void *message, size_t len)
{
  char resolved[600];
  int r = nh_amqp_target_resolve(a, seq, address, message, len, resolved, sizeof resolved);
  if (r < 0) return 1;   /* held: its endpoint is not known yet (nh_amqp_targets.c) */
  if (r > 0) address = resolved;
  sender_t *s = sender_for(a, address);
  if (pn_link_credit(s->link) <= 0) return 0;   /* resumed by PN_LINK_FLOW */
  pn_delivery(s->link, pn_dtag((const char *)&seq, sizeof seq));
  pn_link_send(s->link, message, len);
  pn_link_advance(s->link);
  a->unconfirmed++;
  return 1;
}

/* Sends the row at the cursor of `st` (seq, address, message); 0 when its sender has no credit. */
static int send_row(amqp_t *a, sqlite3_stmt *st)
{
  return nh_amqp_outbox_send(a, sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
                             sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2));
}

void nh_amqp_outbox_pump(amqp_t *a)
{
  if (a->in_tx) {   /* once the transaction is over (on PostgreSQL it lasts round trips) */
    a->outbox_dirty = 1;
    return;
  }
  a->outbox_dirty = 0;
  if (!a->ssn || (a->sb && !a->topic_ok)) return;
  if (a->pg) {   /* the rows arrive later, and are sent then */
    nh_amqp_pg_pump(a);
    return;
  }
  while (a->nresend > 0) {   /* released by the broker: that row again, nothing after it */
    sqlite3_stmt *one = a->q[A_OUT_ONE];
    sqlite3_bind_int64(one, 1, a->resend[0]);
    int sent = 1;
    if (sqlite3_step(one) == SQLITE_ROW) sent = send_row(a, one);
    sqlite3_reset(one);
    if (!sent) break;
    memmove(a->resend, a->resend + 1, sizeof *a->resend * (size_t)--a->nresend);
  }
  sqlite3_stmt *st = a->q[A_OUT_NEXT];
  int more = 1;
  while (more) {
    more = 0;
    sqlite3_bind_int64(st, 1, a->last_sent);
    sqlite3_bind_int(st, 2, NH_OUTBOX_BATCH);
    nh_sqlite_bind_text(st, 3, a->owner);
    int rows = 0, blocked = 0;
    while (!blocked && sqlite3_step(st) == SQLITE_ROW) {
      rows++;
      int64_t seq = sqlite3_column_int64(st, 0);
      if (!nh_amqp_outbox_acked(a, seq) && !send_row(a, st)) {
        blocked = 1;
        break;
      }
      a->last_sent = seq;
    }
    sqlite3_reset(st);
    if (!blocked && rows == NH_OUTBOX_BATCH) more = 1;
  }
  if (a->conn) nh_amqp_conn_flush(a->conn);
}

void nh_amqp_outbox_outcome(amqp_t *a, pn_delivery_t *d)
{
  uint64_t state = pn_delivery_remote_state(d);
  if (!state && !pn_delivery_settled(d)) return;
  pn_delivery_tag_t tag = pn_delivery_tag(d);
  int64_t seq = 0;
  if (tag.size == sizeof seq) memcpy(&seq, tag.start, sizeof seq);
  pn_link_t *l = pn_delivery_link(d);
  const char *addr = pn_terminus_get_address(pn_link_target(l));
  if (state == PN_ACCEPTED || state == 0) {
    a->acked = nh_amqp_grow(a->acked, &a->cacked, a->nacked + 1, sizeof *a->acked);
    a->acked[a->nacked++] = seq;
  } else if (state == PN_REJECTED) {
    pn_condition_t *c = pn_disposition_condition(pn_delivery_remote(d));
    nh_log_error("amqp", "the broker rejected outbox message %lld to %s: %s %s; it is dropped from the outbox",
                 (long long)seq, addr ? addr : "?", pn_condition_get_name(c) ? pn_condition_get_name(c) : "",
                 pn_condition_get_description(c) ? pn_condition_get_description(c) : "");
    a->acked = nh_amqp_grow(a->acked, &a->cacked, a->nacked + 1, sizeof *a->acked);
    a->acked[a->nacked++] = seq;
  } else {   /* released / modified: send it again */
    nh_log_warn("amqp", "the broker released outbox message %lld to %s; sending it again", (long long)seq,
                addr ? addr : "?");
    a->resend = nh_amqp_grow(a->resend, &a->cresend, a->nresend + 1, sizeof *a->resend);
    a->resend[a->nresend++] = seq;
    a->outbox_dirty = 1;
  }
  pn_delivery_settle(d);
  if (a->unconfirmed > 0) a->unconfirmed--;
  if (a->pg && a->nacked) nh_amqp_pg_acked(a);   /* on sqlite the next transaction deletes them */
}

/* Rows left by processes of this machine that stopped before the broker took them. */
void nh_amqp_outbox_claim(amqp_t *a)
{
  char *dead[64];
  int n = 0;
  sqlite3_stmt *st = a->q[A_OUT_OWNERS];
  nh_sqlite_bind_text(st, 1, a->owner);
  while (n < 64 && sqlite3_step(st) == SQLITE_ROW) {
    const char *o = (const char *)sqlite3_column_text(st, 0);
    if (nh_owner_dead(o)) dead[n++] = nh_xstrdup(o);
  }
  sqlite3_reset(st);
  for (int i = 0; i < n; i++) {
    nh_sqlite_bind_text(a->q[A_OUT_CLAIM], 1, a->owner);
    nh_sqlite_bind_text(a->q[A_OUT_CLAIM], 2, dead[i]);
    if (nh_sqlite_step_done(a->db, a->q[A_OUT_CLAIM], "amqp outbox claim") == NH_OK && sqlite3_changes(a->db) > 0)
      nh_log_info("amqp", "sending %d outbox message(s) left by %s (no longer running)", sqlite3_changes(a->db),
                  dead[i]);
    free(dead[i]);
  }
}

int nh_amqp_outbox_discard(nh_transport_t *t)
{
  amqp_t *a = (amqp_t *)t;
  if (a->pg) return NH_OK;   /* a command's: commands publish on sqlite only */
  if (!a->first_own_seq) return NH_OK;   /* rows it took over from dead processes stay */
  nh_sqlite_bind_text(a->q[A_OUT_DROP], 1, a->owner);
  sqlite3_bind_int64(a->q[A_OUT_DROP], 2, a->first_own_seq);
  return nh_sqlite_step_done(a->db, a->q[A_OUT_DROP], "amqp outbox discard");
}

int nh_amqp_unconfirmed(nh_transport_t *t)
{
  amqp_t *a = (amqp_t *)t;
  if (a->pg) return nh_amqp_pg_pending(a);
  sqlite3_stmt *st = a->q[A_OUT_LEFT];
  sqlite3_bind_int64(st, 1, a->last_sent);
  nh_sqlite_bind_text(st, 2, a->owner);
  int left = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
  sqlite3_reset(st);
  return left + a->unconfirmed + a->nheld;
}


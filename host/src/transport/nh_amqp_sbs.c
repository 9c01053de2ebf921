/* Service Bus session receivers (docs/servicebus-amqp.md, "Sessions"). An endpoint with
 * `sessions = N` on the Service Bus profile consumes its session-enabled subscription
 * through N receivers, each asking for "the next available session" (source filter
 * com.microsoft:session-filter = null). Service Bus grants each a session no other
 * receiver holds, on any host, and sends that receiver the session's messages only, in
 * order: per-session order across hosts is the broker's. Each receiver:
 *
 *   idle --attach--> asking --granted--> holding --idle, lost, renewal refused--> ending
 *     ^                 |                                                            |
 *     +-- "none free" --+--> ending          idle <-- the broker ended it -----------+
 *
 * Each receiver has an AMQP session of its own, and letting a Service Bus session go is
 * ending that AMQP session: freeing a link whose session is still mapped would settle its
 * unsettled deliveries (proton sends a bare settled disposition for each), which must not
 * happen to a session this host lost; an ended session sends nothing more.
 * A held session's lock is renewed here (renew-session-lock) at half its span (loop time
 * from the grant) for as long as the receiver holds it, whatever runs; the per-message
 * renew-lock does not apply. Only a 410 answer (the lock is gone) ends it; another failure
 * is tried again while the lock lasts.
 * A session with nothing buffered, nothing in handlers and no delivery for
 * NH_SBS_IDLE_MS is let go (the link closes), so that N receivers serve any number of
 * sessions. A lost session lock forgets what the receiver held: the buffered messages go
 * back to Service Bus, and a handler still running has its outcome recorded in the store
 * but settles nothing (the next holder finds the outcome and settles it without running
 * the handler again: the store's session lock stays the last word). */
#include "nh_amqp_priv.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <proton/codec.h>
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/terminus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SBS_IDLE, SBS_ASKING, SBS_HOLDING, SBS_ENDING };

#ifndef NH_SBS_TICK_MS
#define NH_SBS_TICK_MS 250
#endif
#ifndef NH_SBS_IDLE_MS
#define NH_SBS_IDLE_MS 1000     /* a held session with nothing to do this long is let go */
#endif
#define NH_SBS_WAIT_MS 10000    /* com.microsoft:timeout of an attach: how long Service Bus may wait for a session */
#define NH_SBS_ANSWER_MS 15000  /* beyond the wait: an attach, renewal or end unanswered this long is lost */
#define NH_SBS_LOCK_MS 30000    /* the lock span assumed when the grant does not say */
#define NH_SBS_BACKOFF_MS 1000  /* after a refusal that came at once */
#define SESSION_FILTER "com.microsoft:session-filter"
#define LOCKED_UNTIL "com.microsoft:locked-until-utc"
#define DOTNET_EPOCH_TICKS 621355968000000000LL   /* .NET ticks (100 ns) at 1970-01-01 */

static void put_symbol(pn_data_t *d, const char *s) { pn_data_put_symbol(d, pn_bytes(strlen(s), s)); }

static void enter(apart_t *p, int state)
{
  p->sbs = state;
  p->sbs_since = uv_now(p->ep->a->loop);
}

void nh_amqp_sbs_filter(apart_t *p)
{
  pn_data_t *f = pn_terminus_filter(pn_link_source(p->link));
  pn_data_clear(f);
  pn_data_put_map(f);
  pn_data_enter(f);
  put_symbol(f, SESSION_FILTER);
  pn_data_put_null(f);   /* the next available session */
  pn_data_exit(f);
  pn_data_t *props = pn_link_properties(p->link);
  pn_data_clear(props);
  pn_data_put_map(props);
  pn_data_enter(props);
  put_symbol(props, "com.microsoft:timeout");
  pn_data_put_uint(props, NH_SBS_WAIT_MS);
  pn_data_exit(props);
  enter(p, SBS_ASKING);
}

static void seen(amqp_t *a, apart_t *p)
{
  if (p->ep->sessions_seen) return;
  p->ep->sessions_seen = 1;
  nh_amqp_check_ready(a);
}

/* The session is over for this receiver (let go, lost, none granted): what it held is
 * forgotten, and its AMQP session ends; nh_amqp_sbs_ended frees it once the broker answers,
 * and the receiver asks again `retry_in` ms later. */
static void end_part(amqp_t *a, apart_t *p, uint64_t retry_in)
{
  nh_amqp_part_forget(a, p);
  pn_session_close(p->ssn);
  p->attached = 0;
  p->renewing = 0;
  p->grant++;   /* a renewal's answer still to come is for a session gone */
  p->retry_at = retry_in;   /* a delay while ending; a loop time once ended (nh_amqp_sbs_ended) */
  enter(p, SBS_ENDING);
}

void nh_amqp_sbs_ended(amqp_t *a, apart_t *p)
{
  if (p->sid) nh_log_debug("amqp", "%s: session %s let go", p->ep->name, p->sid);
  pn_session_free(p->ssn);   /* and its link and deliveries: nothing more goes out on an ended session */
  p->ssn = NULL;
  p->link = NULL;
  free(p->sid);
  p->sid = NULL;
  p->retry_at += uv_now(a->loop);   /* end_part's delay, from now */
  enter(p, SBS_IDLE);
}

void nh_amqp_sbs_opened(amqp_t *a, apart_t *p)
{
  pn_link_t *l = p->link;
  if (p->sbs != SBS_ASKING || !pn_terminus_get_address(pn_link_remote_source(l))) return;   /* the detach says why */
  pn_data_t *f = pn_terminus_filter(pn_link_remote_source(l));
  char *sid = NULL;
  int keyed = nh_amqp_map_find(f, SESSION_FILTER);
  if (keyed && pn_data_type(f) == PN_STRING)
    sid = nh_xstrndup(pn_data_get_string(f).start, pn_data_get_string(f).size);
  if (!sid && keyed && pn_data_type(f) == PN_NULL) return;   /* none granted: the detach says why */
  if (!sid) {
    nh_log_error("amqp", "%s: Service Bus answered a session receiver without the session it granted (no %s in the "
                 "attach); letting it go", p->ep->name, SESSION_FILTER);
    end_part(a, p, NH_SBS_BACKOFF_MS);
    return;
  }
  int64_t now = nh_time_now_ms(), until = 0;
  pn_data_t *props = pn_link_remote_properties(l);
  if (nh_amqp_map_find(props, LOCKED_UNTIL)) {
    int64_t ticks = pn_data_type(props) == PN_LONG ? pn_data_get_long(props)
                  : pn_data_type(props) == PN_ULONG ? (int64_t)pn_data_get_ulong(props) : 0;
    if (ticks > DOTNET_EPOCH_TICKS) until = (ticks - DOTNET_EPOCH_TICKS) / 10000;
  }
  /* the span from the broker's clock and ours; then loop time only */
  int64_t span = until > now ? until - now : NH_SBS_LOCK_MS;
  free(p->sid);
  p->sid = sid;
  p->grant++;
  p->renewing = 0;
  p->attached = 1;
  p->lock_span = span;
  p->lock_end = uv_now(a->loop) + (uint64_t)span;
  p->last_ms = uv_now(a->loop);
  enter(p, SBS_HOLDING);
  nh_log_debug("amqp", "%s: holding session %s (locked for %lld ms)", p->ep->name, sid, (long long)span);
  seen(a, p);
  nh_amqp_topup(p->ep);
}

int nh_amqp_sbs_closed(amqp_t *a, apart_t *p, pn_condition_t *cond)
{
  const char *name = pn_condition_is_set(cond) ? pn_condition_get_name(cond) : NULL;
  const char *desc = pn_condition_is_set(cond) ? pn_condition_get_description(cond) : NULL;
  aep_t *ep = p->ep;
  if (p->sbs == SBS_ENDING) return 1;   /* the end of its session is on its way */
  if (name && (strcmp(name, "com.microsoft:timeout") == 0 || strcmp(name, "com.microsoft:session-cannot-be-locked") == 0)) {
    /* no session free now: Service Bus waited for one (com.microsoft:timeout), so ask again
     * at once; a refusal that came at once (a broker that does not wait) is not hammered */
    int waited = p->sbs == SBS_ASKING && uv_now(a->loop) - p->sbs_since >= NH_SBS_BACKOFF_MS / 2;
    seen(a, p);
    end_part(a, p, waited ? 0 : NH_SBS_BACKOFF_MS);
    return 1;
  }
  if (name && strcmp(name, "com.microsoft:session-lock-lost") == 0) {
    nh_log_warn("amqp", "%s: Service Bus took back session %s (its lock expired: %s); what this host had buffered of "
                "it goes to the next receiver, and a handler still running settles nothing", ep->name,
                p->sid ? p->sid : "?", desc ? desc : name);
    end_part(a, p, 0);
    return 1;
  }
  if (name && strcmp(name, "amqp:not-allowed") == 0) {
    char why[1400];
    snprintf(why, sizeof why, "Service Bus: endpoint %s has sessions = %d, but %s refused a session receiver (%s): "
             "the subscription is not session-enabled. Create it with sessions enabled (requiresSession), or leave "
             "sessions out of nimbus.endpoint", ep->name, ep->sessions, ep->entity, desc ? desc : name);
    nh_amqp_status(a, NH_AMQP_FATAL, why);
    return 1;
  }
  return 0;   /* anything else: the connection starts over */
}

void nh_amqp_sbs_reset(apart_t *p)
{
  free(p->sid);
  p->sid = NULL;
  p->renewing = 0;
  p->grant++;
  p->retry_at = 0;
  p->sbs = SBS_IDLE;
}

void nh_amqp_sbs_touch(apart_t *p)
{
  if (p->ep->sessions) p->last_ms = uv_now(p->ep->a->loop);
}

int nh_amqp_sbs_closing(const apart_t *p) { return p->sbs == SBS_ENDING; }

/* ---------------------------------------------------------------- renewals and releases */

typedef struct sbs_renew {
  amqp_t *a;
  apart_t *p;
  uint64_t grant;
} sbs_renew_t;

static void renewed(void *data, int code, const char *desc)
{
  sbs_renew_t *c = data;
  apart_t *p = c->p;
  amqp_t *a = c->a;
  /* code < 0: the connection went (the receivers start over); another grant: old news */
  if (code >= 0 && p->grant == c->grant && p->sbs == SBS_HOLDING) {
    p->renewing = 0;
    uint64_t now = uv_now(a->loop);
    if (code == 200) {
      int64_t until = nh_sb_answer_expiration(a->sb), wall = nh_time_now_ms();
      int64_t span = until > wall ? until - wall : p->lock_span;
      p->lock_end = now + (uint64_t)span;
    } else if (code == 410) {   /* gone: session-lock-lost */
      nh_log_warn("amqp", "%s: Service Bus says the lock of session %s is gone (%s); letting it go: a handler still "
                  "running settles nothing", p->ep->name, p->sid, desc ? desc : "status 410");
      end_part(a, p, 0);
      if (a->conn) nh_amqp_conn_flush(a->conn);
    } else {   /* server busy, a token being put again, ...: tried again on the next tick */
      nh_log_warn("amqp", "%s: renewing the lock of session %s failed (status %d%s%s); trying again", p->ep->name,
                  p->sid, code, desc ? ": " : "", desc ? desc : "");
      p->renew_after = now + NH_SBS_BACKOFF_MS;
    }
  }
  free(c);
}

static void renew(amqp_t *a, apart_t *p)
{
  sbs_renew_t *c = nh_xmalloc(sizeof *c);
  c->a = a;
  c->p = p;
  c->grant = p->grant;
  p->renewing = 1;
  p->renew_sent = uv_now(a->loop);
  nh_sb_renew_session(a->sb, p->ep->entity, p->sid, pn_link_name(p->link), renewed, c);
}

/* An answer that never comes: a session end closes the connection (which gives back all it
 * held); an attach is given up; a renewal is asked again. */
static int part_watch(amqp_t *a, apart_t *p, uint64_t now)
{
  uint64_t waited = now - p->sbs_since;
  if (p->sbs == SBS_ENDING && waited >= NH_SBS_ANSWER_MS) {
    nh_log_warn("amqp", "%s: Service Bus did not answer the end of a session receiver's AMQP session within %d ms; "
                "reconnecting, which gives back everything this host held", p->ep->name, NH_SBS_ANSWER_MS);
    pn_connection_close(pn_session_connection(a->ssn));
    return 1;
  }
  if (p->sbs == SBS_ASKING && waited >= NH_SBS_WAIT_MS + NH_SBS_ANSWER_MS) {
    nh_log_warn("amqp", "%s: no answer to a session receiver's attach within %d ms; asking again", p->ep->name,
                NH_SBS_WAIT_MS + NH_SBS_ANSWER_MS);
    end_part(a, p, 0);
  }
  if (p->renewing && now - p->renew_sent >= NH_SBS_ANSWER_MS) p->renewing = 0;
  return 0;
}

static void part_tick(amqp_t *a, apart_t *p, uint64_t now)
{
  if (part_watch(a, p, now) || p->sbs != SBS_HOLDING) return;
  int idle = p->nbuf == 0 && p->inflight == 0 && !p->renewing;
  if (a->quiescing && (p->inflight == 0 || now >= p->lock_end)) end_part(a, p, 0);   /* the host is stopping */
  else if (!p->renewing && now >= p->lock_end - (uint64_t)p->lock_span / 2 && now >= p->renew_after) renew(a, p);
  else if (idle && now - p->last_ms >= NH_SBS_IDLE_MS) end_part(a, p, 0);
}

static void tick(uv_timer_t *t)
{
  amqp_t *a = t->data;
  if (!a->ssn || a->shutting_down) return;
  uint64_t now = uv_now(a->loop);
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (!ep->sessions || !ep->declared) continue;
    int want = 0;
    for (int i = 0; a->ssn && i < ep->nparts; i++) {
      apart_t *p = &ep->parts[i];
      if (p->sbs == SBS_ASKING && a->quiescing) end_part(a, p, 0);
      else if (!p->link && now >= p->retry_at) want = !a->quiescing;
      else if (p->link) part_tick(a, p, now);
    }
    if (want) nh_amqp_attach(a, ep);
  }
  if (a->conn) nh_amqp_conn_flush(a->conn);
}

void nh_amqp_sbs_quiesce(amqp_t *a) { a->quiescing = 1; }

void nh_amqp_sbs_start(amqp_t *a)
{
  if (!a->sb || a->sbs_on) return;
  uv_timer_init(a->loop, &a->sbs_timer);
  a->sbs_timer.data = a;
  uv_timer_start(&a->sbs_timer, tick, NH_SBS_TICK_MS, NH_SBS_TICK_MS);
  uv_unref((uv_handle_t *)&a->sbs_timer);   /* never what keeps the loop alive */
  a->sbs_on = 1;
}

void nh_amqp_sbs_stop(amqp_t *a)
{
  if (!a->sbs_on) return;
  a->sbs_on = 0;
  uv_close((uv_handle_t *)&a->sbs_timer, NULL);
}

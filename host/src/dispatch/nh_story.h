/* The story of a pump: what its transaction changed, told once it committed.
 *
 * The outcome code (nh_outcome.c) runs inside the pump's store transaction, one savepoint
 * a job, and any of it may roll back. So it does not log, count or fire hooks itself: it
 * adds notes here, and the pump tells them (log lines, metrics, lifecycle hooks) after the
 * commit, or forgets them with the savepoint or transaction that made them. Nothing an
 * operator sees can then describe an outcome that was never recorded. */
#ifndef NH_STORY_H
#define NH_STORY_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  NH_NOTE_AUDIT,       /* an event's audit row was written with a new status */
  NH_NOTE_SESSION,     /* a session was blocked (delta +1) or unblocked (-1) */
  NH_NOTE_PARKED,      /* parked rows added (+n) or removed (-n) */
  NH_NOTE_REJECTED,    /* an operator request was rejected (stale, not Pending+Handoff, ...) */
  NH_NOTE_DEADLETTER,  /* a message dead-lettered without an audit row (no EventId) */
  NH_NOTE_OVERDUE,     /* a pending hand-off passed its expected_by */
} nh_note_kind_t;

typedef struct nh_note {
  nh_note_kind_t kind;
  char *endpoint, *event_id, *session, *type, *message_id;
  char *status, *sub_status;   /* NH_NOTE_AUDIT: the new status */
  char *error, *error_type;
  char *detail;                /* the history's text: the log line's message */
  char *blocked_by;            /* NH_NOTE_SESSION: the blocker (blocked), the one it was (unblocked) */
  char *action;                /* the operator request that caused it: resubmit, skip, handoff_complete, ... */
  char *external_job_id;       /* NH_NOTE_OVERDUE */
  int64_t expected_by;         /* NH_NOTE_OVERDUE: ms */
  int delta;                   /* NH_NOTE_SESSION, NH_NOTE_PARKED; NH_NOTE_AUDIT: pending hand-offs +1/-1 */
  int attempt, max_attempts;   /* a transient failure's attempt */
  int64_t retry_in_ms;         /* a retry scheduled: -1 none */
  double handler_s;            /* how long the handler ran; < 0: it did not run */
  int64_t enqueued_at;         /* ms; 0: unknown */
  int64_t started_at;          /* ms the handler started; 0: it did not run */
} nh_note_t;

typedef struct nh_story {
  nh_note_t *notes;
  size_t n, cap;
} nh_story_t;

/* A new zeroed note (its strings are set with nh_note_set); valid until the next add. */
nh_note_t *nh_story_add(nh_story_t *s, nh_note_kind_t kind);
void nh_note_set(char **field, const char *value);
/* Where a savepoint starts; rollback drops what was added after it. */
size_t nh_story_mark(const nh_story_t *s);
void nh_story_rollback(nh_story_t *s, size_t mark);
void nh_story_free(nh_story_t *s);

#endif

/* A cursor over ids that commit out of order. PostgreSQL hands out identity values when a
 * transaction inserts, not when it commits: id 11 may be visible before id 10, and a
 * rolled-back transaction leaves a gap that never fills. A reader that remembers only "the
 * last id seen" would skip 10 for ever. This cursor keeps `low` (every id at or below it
 * was taken or given up on) and the ids taken above it, each with when it was taken. A
 * missing id below a taken one belongs to a transaction that was running when the taken
 * one was read; once that is `gap_ms` ago, it is given up (a transaction of the host's
 * lasts far less, and a rolled-back one never comes). */
#ifndef NH_IDCURSOR_H
#define NH_IDCURSOR_H

#include <stdint.h>

typedef struct nh_idcursor {
  int64_t low;          /* every id <= low was taken or given up on */
  struct nh_idcursor_seen {
    int64_t id, at;
  } *seen;              /* ids > low taken, ascending, and when */
  int n, cap;
  int64_t gap_ms;
} nh_idcursor_t;

void nh_idcursor_init(nh_idcursor_t *c, int64_t low, int64_t gap_ms);
void nh_idcursor_free(nh_idcursor_t *c);
/* 1 if id is new (above low and not taken yet): it is taken now (`now`). 0 if it was. */
int nh_idcursor_take(nh_idcursor_t *c, int64_t id, int64_t now);
/* The highest id taken (low when none is above it): new ids are read after it. */
int64_t nh_idcursor_top(const nh_idcursor_t *c);
/* The gaps waited for, at most max (the highest ones), lowest first: ids strictly between
 * pairs[2k] and pairs[2k+1] are missing. Returns how many. */
int nh_idcursor_gaps(const nh_idcursor_t *c, int64_t *pairs, int max);
/* After a read: moves low over the ids taken, and over the gaps below an id taken gap_ms
 * or more before `now`. */
void nh_idcursor_advance(nh_idcursor_t *c, int64_t now);

#endif

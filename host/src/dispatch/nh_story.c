/* The notes of a pump (nh_story.h); telling them is nh_tell.c's. */
#include "nh_story.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

nh_note_t *nh_story_add(nh_story_t *s, nh_note_kind_t kind)
{
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 64;
    s->notes = nh_xrealloc(s->notes, s->cap * sizeof *s->notes);
  }
  nh_note_t *n = &s->notes[s->n++];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->handler_s = -1;
  n->retry_in_ms = -1;
  return n;
}

void nh_note_set(char **field, const char *value)
{
  free(*field);
  *field = value ? nh_xstrdup(value) : NULL;
}

static void note_clear(nh_note_t *n)
{
  free(n->endpoint); free(n->event_id); free(n->session); free(n->type); free(n->message_id);
  free(n->status); free(n->sub_status); free(n->error); free(n->error_type); free(n->detail);
  free(n->blocked_by); free(n->action); free(n->external_job_id);
}

size_t nh_story_mark(const nh_story_t *s) { return s->n; }

void nh_story_rollback(nh_story_t *s, size_t mark)
{
  while (s->n > mark) note_clear(&s->notes[--s->n]);
}

void nh_story_free(nh_story_t *s)
{
  nh_story_rollback(s, 0);
  free(s->notes);
  s->notes = NULL;
  s->cap = 0;
}

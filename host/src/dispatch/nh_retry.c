/* Retry policies (nh_retry.h): which policy applies to a failure, and the delay before
 * the next attempt (fixed, linear or exponential from base_ms; optional jitter and cap). */
#include "nh_retry.h"
#include "core/nh_util.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void nh_retry_policy_init(nh_retry_policy_t *p)
{
  memset(p, 0, sizeof *p);
  p->strategy = NH_RETRY_FIXED;
  p->base_ms = 1000;
  p->jitter_factor = 0.25;
}

static int contains_nocase(const char *hay, const char *needle)
{
  if (!hay || !needle) return 0;
  size_t n = strlen(needle);
  if (n == 0) return 1;
  for (; *hay; hay++)
    if (strncasecmp(hay, needle, n) == 0) return 1;
  return 0;
}

const nh_retry_policy_t *nh_retry_select(const nh_retry_config_t *c, const char *event_type, const char *error_text)
{
  for (int i = 0; i < c->nrules; i++) {
    const nh_retry_rule_t *r = &c->rules[i];
    if (!contains_nocase(error_text, r->match)) continue;
    if (r->ntypes) {
      int hit = 0;
      for (int j = 0; j < r->ntypes && !hit; j++) hit = event_type && strcasecmp(r->types[j], event_type) == 0;
      if (!hit) continue;
    }
    return &r->policy;
  }
  for (int i = 0; i < c->ntypes; i++)
    if (event_type && strcasecmp(c->per_type[i].event_type, event_type) == 0) return &c->per_type[i].policy;
  return c->has_default ? &c->def : NULL;
}

int64_t nh_retry_delay_ms(const nh_retry_policy_t *p, int n, double u)
{
  double d = (double)p->base_ms;
  switch (p->strategy) {
  case NH_RETRY_FIXED: break;
  case NH_RETRY_LINEAR: d *= (double)(n + 1); break;
  case NH_RETRY_EXPONENTIAL: d *= ldexp(1.0, n > 60 ? 60 : n); break;
  }
  switch (p->jitter) {
  case NH_JITTER_NONE: break;
  case NH_JITTER_FULL: d += d * u; break;                       /* uniform in [d, 2d) */
  case NH_JITTER_BOUNDED: d *= 1.0 + p->jitter_factor * u; break; /* d * (1 + U[0, f)) */
  }
  if (p->max_delay_ms > 0 && d > (double)p->max_delay_ms) d = (double)p->max_delay_ms;
  if (d > 9.0e15) d = 9.0e15;
  return (int64_t)d;
}

int64_t nh_retry_next(const nh_retry_config_t *c, const char *event_type, const char *error_text, int retries_done)
{
  const nh_retry_policy_t *p = nh_retry_select(c, event_type, error_text);
  if (!p || retries_done >= p->max_retries) return -1;
  return nh_retry_delay_ms(p, retries_done, nh_random_unit());
}

void nh_retry_config_free(nh_retry_config_t *c)
{
  for (int i = 0; i < c->nrules; i++) {
    free(c->rules[i].match);
    for (int j = 0; j < c->rules[i].ntypes; j++) free(c->rules[i].types[j]);
    free(c->rules[i].types);
  }
  free(c->rules);
  for (int i = 0; i < c->ntypes; i++) free(c->per_type[i].event_type);
  free(c->per_type);
  memset(c, 0, sizeof *c);
}

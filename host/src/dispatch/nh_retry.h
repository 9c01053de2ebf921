/* Retry policies: which failures are retried automatically, and after how long.
 * Selection order follows NimBus: the first matching rule (case-insensitive substring
 * of the error text, optionally limited to event types), then the event type's policy,
 * then the endpoint default. A policy allows at most 1 + max_retries attempts. */
#ifndef NH_RETRY_H
#define NH_RETRY_H

#include <stdint.h>

typedef enum { NH_RETRY_FIXED, NH_RETRY_LINEAR, NH_RETRY_EXPONENTIAL } nh_retry_strategy_t;
typedef enum { NH_JITTER_NONE, NH_JITTER_FULL, NH_JITTER_BOUNDED } nh_retry_jitter_t;

typedef struct nh_retry_policy {
  int max_retries;               /* 0 = no automatic retry */
  nh_retry_strategy_t strategy;
  int64_t base_ms;
  int64_t max_delay_ms;          /* 0 = uncapped */
  nh_retry_jitter_t jitter;
  double jitter_factor;          /* bounded jitter: delay * (1 + U[0, f)) */
} nh_retry_policy_t;

typedef struct nh_retry_rule {
  char *match;                   /* substring of the error text, case-insensitive */
  char **types;                  /* NULL = any event type */
  int ntypes;
  nh_retry_policy_t policy;
} nh_retry_rule_t;

typedef struct nh_retry_type_policy {
  char *event_type;
  nh_retry_policy_t policy;
} nh_retry_type_policy_t;

typedef struct nh_retry_config {
  int has_default;
  nh_retry_policy_t def;
  nh_retry_rule_t *rules;
  int nrules;
  nh_retry_type_policy_t *per_type;
  int ntypes;
} nh_retry_config_t;

void nh_retry_policy_init(nh_retry_policy_t *p);
/* The policy that applies to a failure, or NULL when none does. */
const nh_retry_policy_t *nh_retry_select(const nh_retry_config_t *c, const char *event_type,
                                         const char *error_text);
/* Delay before retry attempt n (n = retries already made, 0-based); jitter never shortens it. */
int64_t nh_retry_delay_ms(const nh_retry_policy_t *p, int n, double unit_random);
/* Returns the delay for the next retry, or -1 when no retry should be scheduled. */
int64_t nh_retry_next(const nh_retry_config_t *c, const char *event_type, const char *error_text, int retries_done);
void nh_retry_config_free(nh_retry_config_t *c);

#endif

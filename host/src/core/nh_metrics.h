/* Metrics: counters, gauges and histograms with labels, rendered in the Prometheus text
 * exposition format (docs/observability.md lists every family).
 *
 * A family is a static struct in the module that owns it (NH_METRIC_DEF); it joins the
 * process registry on first use, so families need no set-up and never dangle. Series (one
 * per set of label values) are created on first use and freed by nh_metrics_reset. All of
 * it runs on the loop thread; nothing here locks. A family holds at most
 * NH_METRIC_MAX_SERIES series: past that, new label sets are counted under the value
 * "_overflow" so a flood of distinct event types cannot exhaust memory. */
#ifndef NH_METRICS_H
#define NH_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define NH_METRIC_MAX_LABELS 4
#define NH_METRIC_MAX_SERIES 5000

typedef enum { NH_METRIC_COUNTER, NH_METRIC_GAUGE, NH_METRIC_HISTOGRAM } nh_metric_type_t;

typedef struct nh_metric_series nh_metric_series_t;

typedef struct nh_metric {
  nh_metric_type_t type;
  const char *name, *help;
  const char *labels[NH_METRIC_MAX_LABELS];   /* NULL-terminated when fewer */
  const double *buckets;                      /* histograms: upper bounds, ascending; +Inf is implied */
  int nbuckets;
  /* set on first use */
  int nlabels, registered;
  nh_metric_series_t **slots;                 /* open addressing by label values */
  size_t nslots, nseries;
  nh_metric_series_t *first, *last;           /* in creation order (the exposition's) */
  struct nh_metric *next;
} nh_metric_t;

#define NH_METRIC_DEF(type_, name_, help_, ...) \
  { .type = (type_), .name = (name_), .help = (help_), .labels = { __VA_ARGS__ } }
#define NH_HISTOGRAM_DEF(name_, help_, buckets_, ...)                                                   \
  { .type = NH_METRIC_HISTOGRAM, .name = (name_), .help = (help_), .buckets = (buckets_),               \
    .nbuckets = (int)(sizeof(buckets_) / sizeof((buckets_)[0])), .labels = { __VA_ARGS__ } }

/* Bucket sets in seconds: handler and store times (1 ms .. 60 s), queue and end-to-end
 * times (1 ms .. 1 h: a parked event may wait for hours). */
extern const double nh_metric_buckets_fast[14];
extern const double nh_metric_buckets_slow[18];

/* The series of these label values (as many as the family has labels; NULL reads ""). */
nh_metric_series_t *nh_metric_series(nh_metric_t *m, const char *const *values);
void nh_metric_series_add(nh_metric_series_t *s, double v);     /* counters and gauges */
void nh_metric_series_set(nh_metric_series_t *s, double v);     /* gauges */
void nh_metric_series_observe(nh_metric_series_t *s, double v); /* histograms */
double nh_metric_series_value(const nh_metric_series_t *s);     /* counters and gauges; histograms: the count */

/* Shorthands: label values as arguments (at most NH_METRIC_MAX_LABELS, in order). */
void nh_metric_add(nh_metric_t *m, double v, ...);
void nh_metric_set(nh_metric_t *m, double v, ...);
void nh_metric_observe(nh_metric_t *m, double v, ...);
/* Drops every series of the family (a gauge whose label sets are rebuilt at each collect). */
void nh_metric_clear(nh_metric_t *m);

/* Collectors run before each render: they set the gauges that are read, not kept. */
typedef void (*nh_metrics_collect_cb)(void *data);
void nh_metrics_on_collect(nh_metrics_collect_cb cb, void *data);
void nh_metrics_off_collect(nh_metrics_collect_cb cb, void *data);

/* `--metrics off`: every add, set and observe becomes a no-op (the A/B of make bench,
 * and a user who has no use for them); nh_metrics_render then gives only the comment line
 * "# metrics are off (nimbus-host run --metrics off)" (a valid, empty exposition: /metrics
 * still answers 200). Set before the loop starts. */
void nh_metrics_set_enabled(int on);
int nh_metrics_enabled(void);

/* The exposition of every registered family (text format 0.0.4); the caller frees it. */
char *nh_metrics_render(size_t *len);
/* Frees every series and collector; the families stay usable (they re-register). */
void nh_metrics_reset(void);

#endif

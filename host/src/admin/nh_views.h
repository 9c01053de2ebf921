/* JSON views of the store's rows, the one shape of an event, a history row and a failure
 * group for `events --json`, `show --json`, `failures --json` and the admin API
 * (admin/nh_admin.c): a field renamed here is renamed everywhere. */
#ifndef NH_VIEWS_H
#define NH_VIEWS_H

#include <jansson.h>
#include <stdint.h>

#include "store/nh_store.h"

json_t *nh_view_str(const char *s);     /* NULL: JSON null */
json_t *nh_view_time(int64_t ms);       /* ISO 8601 UTC; 0: JSON null */
json_t *nh_view_audit(const nh_audit_t *a);
json_t *nh_view_history(const nh_history_row_t *r);
/* `message` is the masked error text (nh_failgroup_mask). */
json_t *nh_view_failgroup(const nh_failgroup_row_t *g, const char *message);

#endif

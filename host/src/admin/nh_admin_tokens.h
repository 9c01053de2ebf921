/* Logins of the admin listener: --admin-token-file, lines of `TOKEN ROLE NAME` (roles
 * reader and operator; blank lines and # comments ignored). */
#ifndef NH_ADMIN_TOKENS_H
#define NH_ADMIN_TOKENS_H

#include "nh_admin_int.h"

typedef struct nh_admin_token {
  char *token, *name;
  nh_admin_role_t role;
} nh_admin_token_t;

typedef struct nh_admin_tokens nh_admin_tokens_t;

/* NULL with err saying which line is wrong (or that the file cannot be read). */
nh_admin_tokens_t *nh_admin_tokens_load(const char *path, nh_error_t *err);
/* Compares in constant time per token, so the answer's timing does not spell a token out. */
const nh_admin_token_t *nh_admin_tokens_find(const nh_admin_tokens_t *t, const char *token);
void nh_admin_tokens_free(nh_admin_tokens_t *t);

#endif

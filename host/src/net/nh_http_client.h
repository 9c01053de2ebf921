/* HTTP client: libcurl's multi interface driven by the uv loop (uv_poll per socket,
 * one uv_timer for curl's timeouts). No call blocks; completion is a callback. */
#ifndef NH_HTTP_CLIENT_H
#define NH_HTTP_CLIENT_H

#include <stddef.h>
#include <uv.h>

#include "core/nh_error.h"

typedef struct nh_http_call nh_http_call_t;

typedef struct nh_http_req {
  const char *method;          /* GET, POST, PUT, PATCH, DELETE, HEAD, ... */
  const char *url;
  const char *const *headers;  /* "Name: value" lines */
  int nheaders;
  const char *body;            /* may be NULL */
  size_t body_len;
  double timeout_s;            /* whole request; <= 0: 30 s */
} nh_http_req_t;

typedef struct nh_http_res {
  long status;                 /* 0 when the request failed (see error) */
  char **header_names;         /* lower-cased */
  char **header_values;
  int nheaders;
  char *body;
  size_t body_len;
  const char *error_code;      /* NULL on success: "ETIMEDOUT", "ECONNREFUSED", "ENOTFOUND", ... */
  char error[256];
} nh_http_res_t;

/* The callee owns nothing in res after the callback returns (the client frees it). */
typedef void (*nh_http_done_cb)(void *data, nh_http_res_t *res);

nh_http_call_t *nh_http_request(uv_loop_t *loop, const nh_http_req_t *req, nh_http_done_cb cb, void *data,
                                nh_error_t *err);
/* Abandons a call: the callback will not run. */
void nh_http_cancel(nh_http_call_t *call);

#endif

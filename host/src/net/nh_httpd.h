/* A small HTTP/1.1 server: libmicrohttpd in external-loop epoll mode, driven by the uv
 * loop (a uv_poll_t on MHD's epoll fd and a uv_timer_t from MHD_get_timeout). No MHD
 * threads. Pure C: the Lua face lives in src/lua/nh_lhttpd.c.
 *
 * Flow of one request: MHD parses the request line and headers; the server checks the
 * header count and Content-Length, collects the body (up to max_body), then calls
 * on_request with the connection suspended. The application answers, now or later,
 * with nh_httpd_respond; the connection is resumed and the response queued on the next
 * MHD pass. Every accepted request must get exactly one nh_httpd_respond (or
 * nh_httpd_stream_start) call, even after the server was closed (the request is then
 * just freed). */
#ifndef NH_HTTPD_H
#define NH_HTTPD_H

#include <stddef.h>
#include <uv.h>

#include "core/nh_error.h"

typedef struct nh_httpd nh_httpd_t;
typedef struct nh_httpd_req nh_httpd_req_t;

/* A complete request (headers and body) arrived. Runs inside MHD's processing: it must
 * not close the server. It may call nh_httpd_respond at once or keep `req` for later. */
typedef void (*nh_httpd_request_cb)(void *data, nh_httpd_req_t *req);

typedef struct nh_httpd_opts {
  const char *host;            /* numeric IPv4/IPv6 address or "localhost"; NULL: 127.0.0.1 */
  int port;                    /* 0: a free port (see nh_httpd_port) */
  size_t max_body;             /* bytes; 0: 1 MiB. Larger bodies get 413 */
  unsigned max_headers;        /* 0: 64. More request headers get 431 */
  unsigned idle_timeout_s;     /* idle keep-alive connections are closed after this; 0: 60 */
  unsigned max_connections;    /* 0: libmicrohttpd's default */
  size_t stream_max_buffer;    /* bytes a stream may hold for a client that does not read; 0: 1 MiB */
  nh_httpd_request_cb on_request;
  void *data;
  /* The generation this server belongs to (a VM). A server may bind beside one of another
   * generation of this process on the same address (hot reload); never beside its own. */
  const void *owner;
  /* The adapter the generation runs (its file path): only a previous generation of the
   * same adapter may share the address; two different adapters may not. */
  const char *owner_key;
} nh_httpd_opts_t;

/* Starts listening. On failure returns NULL with the reason in err and, when the
 * system said why, the errno name ("EADDRINUSE", "EINVAL"...) in errname. */
nh_httpd_t *nh_httpd_start(uv_loop_t *loop, const nh_httpd_opts_t *opts, nh_error_t *err, char errname[32]);
int nh_httpd_port(const nh_httpd_t *s);
/* Stops listening and closes every connection now. Requests still waiting for their
 * answer stay valid until nh_httpd_respond, which then only frees them. The memory is
 * released once the uv handles have closed (run the loop). Safe to call from any loop
 * callback, including on_request (the stop then happens when MHD's pass ends). */
void nh_httpd_close(nh_httpd_t *s);
/* Stops accepting new connections (a retiring generation); requests in flight finish. */
void nh_httpd_quiesce(nh_httpd_t *s);
/* Server handles do not keep the loop alive by themselves (like uv_unref). */

/* Request accessors. Method, path and body stay valid until nh_httpd_respond. */
const char *nh_httpd_req_method(const nh_httpd_req_t *r);
/* The path as sent, still percent-encoded, without the query string. */
const char *nh_httpd_req_path(const nh_httpd_req_t *r);
const char *nh_httpd_req_body(const nh_httpd_req_t *r, size_t *len);
/* Frees the body early (once the application has copied it). */
void nh_httpd_req_drop_body(nh_httpd_req_t *r);

/* Header and query iteration, valid only inside on_request. Query keys and values are
 * split on & and =, '+' already turned into a space, %XX escapes left as sent. A key
 * without '=' has value NULL. */
typedef void (*nh_httpd_kv_cb)(void *ud, const char *key, size_t klen, const char *val, size_t vlen);
int nh_httpd_req_headers(nh_httpd_req_t *r, nh_httpd_kv_cb cb, void *ud);
int nh_httpd_req_query(nh_httpd_req_t *r, nh_httpd_kv_cb cb, void *ud);

typedef struct nh_httpd_header {
  const char *name, *value;
} nh_httpd_header_t;

/* Answers a request: copies body and headers, resumes the connection. Returns 0, or
 * -1 with a reason in err when the response could not be built (a bad status code or
 * header); the request is then answered with a bare 500 and still consumed.
 * Content-Length is computed; a Content-Length header is ignored. */
int nh_httpd_respond(nh_httpd_req_t *r, unsigned status, const nh_httpd_header_t *headers, size_t nheaders,
                     const char *body, size_t len, nh_error_t *err);

/* ---- streaming responses (Server-Sent Events)
 *
 * nh_httpd_stream_start answers a request with a body of unknown length (chunked) that
 * the application writes piece by piece, on the loop, for as long as it likes. Writes are
 * copied into the stream's buffer and sent as the client reads; the loop never waits. A
 * client that does not read is dropped once the buffer would pass stream_max_buffer,
 * so it cannot make the process grow (a drained buffer is kept for the next burst: a
 * stream holds at most that much). While nothing is buffered the connection rests
 * suspended, and the socket is watched for the peer's close, so a client that goes away
 * is noticed at once rather than at the next write (a client that only half-closes is
 * taken as gone too).
 *
 * on_close(ud) runs exactly once for a started stream that the application did not end
 * itself: the client went away, it was dropped for not reading, or the server closed.
 * It runs from the server's processing (or from nh_httpd_close), never from inside
 * nh_httpd_stream_write. After on_close, or after nh_httpd_stream_end, the handle is
 * gone: do not use it again. A stream does not keep the loop alive (it never ends by
 * itself). */
typedef struct nh_httpd_stream nh_httpd_stream_t;
typedef void (*nh_httpd_stream_close_cb)(void *ud);

/* Answers `r` with `status` and the headers (Content-Length is ignored), the body to
 * follow by nh_httpd_stream_write. Returns NULL with a reason in err when the request's
 * connection is gone already or the response cannot be built (a bad status or header:
 * the client then gets a bare 500); either way the request is consumed, and on_close will
 * not run. */
nh_httpd_stream_t *nh_httpd_stream_start(nh_httpd_req_t *r, unsigned status, const nh_httpd_header_t *headers,
                                         size_t nheaders, nh_httpd_stream_close_cb on_close, void *ud,
                                         nh_error_t *err);
/* Queues len bytes. 0, or -1 when the stream is no longer sending: the client is gone or
 * was dropped now for not reading (on_close follows from the loop), or the server closed. */
int nh_httpd_stream_write(nh_httpd_stream_t *s, const char *data, size_t len);
/* Bytes written and not yet handed to the connection. */
size_t nh_httpd_stream_buffered(const nh_httpd_stream_t *s);
/* Ends the body once what is buffered has been sent; on_close will not run. */
void nh_httpd_stream_end(nh_httpd_stream_t *s);

#endif

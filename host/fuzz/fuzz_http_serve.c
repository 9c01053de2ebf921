/* nimbus.http.serve's request handling: method, path, query pairs, header pairs and
 * body (one per line of the input; the query and headers as k=v&k=v) through the route
 * table of a typical adapter, the way nh_lhttpd.c hands a request over. The routes use
 * path parameters, the query and req:json(). */
#include "nh_fuzz.h"


static const char *const target =
  "local httpd = require('nimbus.httpd')\n"
  "local dispatch = httpd._dispatcher({\n"
  "  ['GET /api/customers/{id}'] = function(req) return 200, { id = req.params.id, q = req.query } end,\n"
  "  ['POST /api/customers'] = function(req) local b = req:json(); return 201, b end,\n"
  "  ['PUT /api/customers/{id}/notes/{n}'] = function(req) return 204 end,\n"
  "  ['GET /health'] = function(req) return 200, 'ok', { ['X-Check'] = { 'a', 'b' } } end,\n"
  "  ['DELETE /api/{kind}/{id}'] = function(req) return 200, req.headers end,\n"
  "})\n"
  "local function pairs_of(s)\n"
  "  local t = {}\n"
  "  for kv in (s or ''):gmatch('[^&]+') do\n"
  "    local k, v = kv:match('^([^=]*)=(.*)$')\n"
  "    t[#t + 1] = k or kv\n"
  "    t[#t + 1] = v or ''\n"
  "  end\n"
  "  return t\n"
  "end\n"
  "function fuzz_http(s)\n"
  "  local method, path, query, headers, body = s:match('^([^\\n]*)\\n([^\\n]*)\\n([^\\n]*)\\n([^\\n]*)\\n?(.*)$')\n"
  "  if not method or path:sub(1, 1) ~= '/' then return end\n"
  "  local status, rbody, rheaders = dispatch(method, path, pairs_of(query), pairs_of(headers), body)\n"
  "  assert(math.type(status) == 'integer' and status >= 100 and status <= 599, 'bad status ' .. tostring(status))\n"
  "  assert(type(rbody) == 'string' or rbody == nil, 'body is not a string')\n"
  "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  nh_fuzz_lua_run(target, "fuzz_http", data, size);
  return 0;
}

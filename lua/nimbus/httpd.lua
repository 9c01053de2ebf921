-- nimbus.http.serve: an HTTP server whose routes are Lua functions, each request in its
-- own task (docs/design.md section 4). The C side (nimbus.httpd.core, host/src/lua/nh_lhttpd.c
-- over host/src/net/nh_httpd.c) owns sockets and parsing; this file parses the route
-- table, matches paths, builds `req` and shapes what a route returns.
--
--   local srv, err, code = nimbus.http.serve{ host = "127.0.0.1", port = 5090, routes = {
--     ["GET /api/customers/{id}"] = function(req) return 200, { id = req.params.id } end,
--   }, max_body = 1048576, max_headers = 64, timeout = 30 }
--   srv.port ; srv:close()
--
-- req: method, path (as sent, percent-encoded), params (decoded path segments), query
-- (decoded; a repeated key gives a list; a key without '=' gives ""), headers (lower-case
-- names; repeated headers joined with ", "), body (string, "" when none), req:json().
-- A route returns status[, body[, headers]]: a table body is sent as JSON, a string as
-- is (text/plain; charset=utf-8 unless the headers say otherwise), nil as an empty body.
-- Response headers: { Name = "value" }, a list value repeats the header (Set-Cookie).
local cjson = require("cjson.safe")

local M = {}

local core   -- loaded on first use: plain lua5.4 (spec/lua) can still load this file
local function get_core()
  core = core or require("nimbus.httpd.core")
  return core
end

local JSON_CT = "application/json"
local TEXT_CT = "text/plain; charset=utf-8"
local INTERNAL = '{"error":"internal error"}'

---------------------------------------------------------------------------- decoding
local function hexbyte(h) return string.char(tonumber(h, 16)) end

local function unescape(s)
  if not s:find("%", 1, true) then return s end
  return (s:gsub("%%(%x%x)", hexbyte))
end
M._unescape = unescape

local function split_path(path)
  local segs, n = {}, 0
  for seg in path:gmatch("/([^/]*)") do
    n = n + 1
    segs[n] = seg
  end
  return segs, n
end

---------------------------------------------------------------------------- routes
local METHOD_PAT = "^[A-Z][A-Z0-9_-]*$"

-- "GET /api/customers/{id}" -> { method, key, nsegs, segs = { "api", "customers", { param = "id" } } }
local function parse_route(key, level)
  if type(key) ~= "string" then
    error(("nimbus.http.serve: route keys must be strings like \"GET /path\", got %s"):format(type(key)), level)
  end
  local method, path = key:match("^(%S+) +(%S+)$")
  if not method then
    error(("nimbus.http.serve: bad route %q: expected \"METHOD /path\""):format(key), level)
  end
  if not method:match(METHOD_PAT) then
    error(("nimbus.http.serve: bad route %q: the method must be upper case, like GET or POST"):format(key), level)
  end
  if path:sub(1, 1) ~= "/" then
    error(("nimbus.http.serve: bad route %q: the path must start with /"):format(key), level)
  end
  if path:find("?", 1, true) or path:find("#", 1, true) then
    error(("nimbus.http.serve: bad route %q: a route path has no query string or fragment"):format(key), level)
  end
  local raw, n = split_path(path)
  local segs, shape, names = {}, {}, {}
  for i = 1, n do
    local s = raw[i]
    local name = s:match("^{([%a_][%w_]*)}$")
    if name then
      if names[name] then
        error(("nimbus.http.serve: bad route %q: parameter {%s} appears twice"):format(key, name), level)
      end
      names[name] = true
      segs[i] = { param = name }
      shape[i] = "{}"
    elseif s:find("[{}]") then
      error(("nimbus.http.serve: bad route %q: a parameter is a whole segment, like /{id}"):format(key), level)
    else
      segs[i] = unescape(s)
      shape[i] = segs[i]
    end
  end
  return { method = method, key = key, nsegs = n, segs = segs, shape = "/" .. table.concat(shape, "/") }
end

-- Literal segments beat parameters, left to right: "/a/new" wins over "/a/{id}".
local function more_specific(a, b)
  for i = 1, a.nsegs do
    local la, lb = type(a.segs[i]) == "string", type(b.segs[i]) == "string"
    if la ~= lb then return la end
  end
  return a.key < b.key
end

local function compile(routes, level)
  if type(routes) ~= "table" then error("nimbus.http.serve: `routes` must be a table of \"METHOD /path\" = function", level) end
  local by_len, seen, count = {}, {}, 0
  for key, fn in pairs(routes) do
    local r = parse_route(key, level + 1)
    if type(fn) ~= "function" then
      error(("nimbus.http.serve: route %q must map to a function, got %s"):format(key, type(fn)), level)
    end
    local sig = r.method .. " " .. r.shape
    if seen[sig] then
      error(("nimbus.http.serve: duplicate route %q (same as %q)"):format(key, seen[sig]), level)
    end
    seen[sig] = key
    r.handler = fn
    local list = by_len[r.nsegs]
    if not list then list = {}; by_len[r.nsegs] = list end
    list[#list + 1] = r
    count = count + 1
  end
  if count == 0 then error("nimbus.http.serve: `routes` is empty", level) end
  for _, list in pairs(by_len) do table.sort(list, more_specific) end
  return by_len
end

local function match_segs(r, segs)
  local params
  for i = 1, r.nsegs do
    local want = r.segs[i]
    if type(want) == "string" then
      if unescape(segs[i]) ~= want then return nil end
    else
      params = params or {}
      params[want.param] = unescape(segs[i])
    end
  end
  return params or {}
end

-- Returns route, params; or nil, allowed-methods list when the path matches other methods.
local function find(by_len, method, path)
  local segs, n = split_path(path)
  local list = by_len[n]
  if not list then return nil end
  local allowed, get
  for i = 1, #list do
    local r = list[i]
    local params = match_segs(r, segs)
    if params then
      if r.method == method then return r, params end
      if method == "HEAD" and r.method == "GET" and not get then get = { r, params } end
      allowed = allowed or {}
      allowed[r.method] = true
    end
  end
  if get then return get[1], get[2] end
  if not allowed then return nil end
  if allowed.GET then allowed.HEAD = true end
  local names = {}
  for m in pairs(allowed) do names[#names + 1] = m end
  table.sort(names)
  return nil, names
end

---------------------------------------------------------------------------- requests
local Req = {}
Req.__index = Req

-- req:json() -> value | nil, message. Integral numbers come back as integers, as in
-- handler payloads.
function Req:json()
  local body = self.body
  if body == nil or body == "" then return nil, "empty request body" end
  local ok, internal = pcall(require, "nimbus.internal")
  local decode = ok and type(internal) == "table" and internal.decode or cjson.decode
  local v, err = decode(body)
  if v == nil then return nil, "malformed JSON body: " .. tostring(err) end
  return v
end

local function build_query(pairs_)
  local q = {}
  for i = 1, #pairs_, 2 do
    local k = unescape(pairs_[i])
    local v = pairs_[i + 1]
    v = v and unescape(v) or ""
    local old = q[k]
    if old == nil then q[k] = v
    elseif type(old) == "table" then old[#old + 1] = v
    else q[k] = { old, v } end
  end
  return q
end

local function build_headers(pairs_)
  local h = {}
  for i = 1, #pairs_, 2 do
    local k = pairs_[i]:lower()
    local v = pairs_[i + 1] or ""
    local old = h[k]
    h[k] = old and (old .. ", " .. v) or v
  end
  return h
end

---------------------------------------------------------------------------- responses
local function json_error(status, msg, extra)
  local h = { "Content-Type", JSON_CT }
  if extra then for i = 1, #extra do h[#h + 1] = extra[i] end end
  return status, cjson.encode({ error = msg }), h
end

local function fail(logmsg) return 500, INTERNAL, { "Content-Type", JSON_CT }, logmsg end

local function describe(v)
  if type(v) == "string" then return ("%q"):format(#v > 40 and v:sub(1, 40) .. "..." or v) end
  return tostring(v) .. " (" .. (math.type(v) or type(v)) .. ")"
end

-- status, body, headers from a route -> status, body string, header pairs, log message
local function shape(where, status, body, headers)
  local st = type(status) == "number" and math.tointeger(status) or nil
  if st == nil then
    return fail(("%s: the route returned %s as the HTTP status; expected an integer like 200 (answered 500)")
      :format(where, status == nil and "nothing" or describe(status)))
  end
  if st < 200 or st > 599 then
    return fail(("%s: the route returned status %d; expected 200..599 (answered 500)"):format(where, st))
  end
  local out, has_ct = {}, false
  if headers ~= nil then
    if type(headers) ~= "table" then
      return fail(("%s: the route returned headers of type %s; expected a table (answered 500)")
        :format(where, type(headers)))
    end
    for k, v in pairs(headers) do
      if type(k) ~= "string" or not k:match("^[!#$%%&'*+.^_`|~%w-]+$") then
        return fail(("%s: bad response header name %s (answered 500)"):format(where, describe(k)))
      end
      local values = type(v) == "table" and v or { v }   -- a list: the header repeated
      for i = 1, #values do
        local val = values[i]
        local tv = type(val)
        if tv == "number" or tv == "boolean" then val = tostring(val)
        elseif tv ~= "string" then
          return fail(("%s: response header %s has a %s value (answered 500)"):format(where, k, tv))
        end
        if val:find("[\r\n]") or val == "" then
          return fail(("%s: response header %s is empty or has a line break (answered 500)"):format(where, k))
        end
        local lk = k:lower()
        if lk ~= "content-length" then   -- computed by the server
          if lk == "content-type" then has_ct = true end
          out[#out + 1] = k
          out[#out + 1] = val
        end
      end
    end
  end
  local tb = type(body)
  if tb == "table" then
    local s, err = cjson.encode(body)
    if not s then
      return fail(("%s: the response body cannot be encoded as JSON: %s (answered 500)"):format(where, tostring(err)))
    end
    body = s
    if not has_ct then out[#out + 1] = "Content-Type"; out[#out + 1] = JSON_CT end
  elseif tb == "string" then
    if not has_ct then out[#out + 1] = "Content-Type"; out[#out + 1] = TEXT_CT end
  elseif body ~= nil then
    return fail(("%s: the route returned a %s body; expected a table (JSON), a string or nil (answered 500)")
      :format(where, tb))
  end
  return st, body, out
end

local function errtext(e)
  if type(e) == "string" then return e end
  local mt = getmetatable(e)
  if mt and mt.__tostring then return tostring(e) end
  if type(e) == "table" and (e.message or e.msg) then return tostring(e.message or e.msg) end
  return "(error object is a " .. type(e) .. " value)"
end

-- The route's traceback, without the dispatcher frames below the xpcall.
local function traceback(e)
  local tb = debug.traceback(errtext(e), 2)
  local cut = tb:find("\n%s*%[C%]: in function 'xpcall'")
  return cut and tb:sub(1, cut - 1) or tb
end

local function make_dispatch(by_len)
  return function(method, path, qpairs, hpairs, body)
    local route, params = find(by_len, method, path)
    if not route then
      if params then
        return json_error(405, "method not allowed", { "Allow", table.concat(params, ", ") })
      end
      return json_error(404, "not found")
    end
    local req = setmetatable({
      method = method, path = path, params = params, query = build_query(qpairs),
      headers = build_headers(hpairs), body = body, route = route.key,
    }, Req)
    local ok, status, rbody, rheaders = xpcall(route.handler, traceback, req)
    local where = ("route %q (%s %s)"):format(route.key, method, path)
    if not ok then
      return fail(("%s raised an error (answered 500): %s"):format(where, status))
    end
    return shape(where, status, rbody, rheaders)
  end
end

---------------------------------------------------------------------------- serve
local Server = {}
Server.__index = Server

function Server:close()
  self._core:close()
end

function Server:listening() return self._core:listening() end

Server.__tostring = function(self) return tostring(self._core) end

local function opt_number(opts, name, min, integer)
  local v = opts[name]
  if v == nil then return nil end
  if type(v) ~= "number" or v < min or (integer and math.tointeger(v) == nil) then
    error(("nimbus.http.serve: `%s` must be %s >= %s"):format(name, integer and "an integer" or "a number", min), 3)
  end
  return integer and math.tointeger(v) or v
end

-- nimbus.http.serve(opts) -> server | nil, message, code
function M.serve(opts)
  if type(opts) ~= "table" then error("nimbus.http.serve expects a table { port = ..., routes = { ... } }", 2) end
  local by_len = compile(opts.routes, 3)
  local host = opts.host
  if host ~= nil and type(host) ~= "string" then error("nimbus.http.serve: `host` must be a string", 2) end
  local port = opt_number(opts, "port", 0, true)
  if port == nil then error("nimbus.http.serve: `port` is required (0 picks a free port)", 2) end
  if port > 65535 then error("nimbus.http.serve: `port` must be 0..65535", 2) end
  local max_body = opt_number(opts, "max_body", 1, true)
  local max_headers = opt_number(opts, "max_headers", 1, true)
  local timeout = opt_number(opts, "timeout", 0, false)
  local cpu_budget = opt_number(opts, "cpu_budget", 0, false)
  local idle = opt_number(opts, "idle_timeout", 1, true)
  local max_conn = opt_number(opts, "max_connections", 1, true)
  local c, err, code = get_core().listen(make_dispatch(by_len), host, port, max_body, max_headers,
    timeout or 30, cpu_budget, idle, max_conn)
  if not c then return nil, err, code end
  return setmetatable({ port = c:port(), host = host or "127.0.0.1", _core = c }, Server)
end

M._compile = compile
M._find = find
M._shape = shape
M._dispatcher = function(routes) return make_dispatch(compile(routes, 2)) end   -- host/fuzz
return M

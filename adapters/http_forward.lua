-- adapters.http_forward: deliver the events of an endpoint to an HTTP API, one request per
-- event, and turn the API's answer into the event's outcome.
--
--   local nimbus  = require("nimbus")
--   local forward = require("adapters.http_forward")
--   local poller  = require("adapters.job_poller")
--
--   -- a whole endpoint: every type in `types` is PUT to the ERP's order URL
--   local erp = forward.endpoint("ErpEndpoint", {
--     types    = { "OrderPlaced", "OrderChanged" },
--     url      = "http://127.0.0.1:5090/api/orders/{OrderId}",   -- {field}: from the event, encoded
--     method   = "PUT",
--     headers  = { Authorization = "Bearer demo-token" },
--     timeout  = 10,                        -- seconds for the whole delivery
--     outcomes = { [409] = "done" },        -- the order exists already: fine
--     idempotency_header = "Idempotency-Key",
--     endpoint = { concurrency = 50, transient = { max_attempts = 30, max_delay = 120 } },
--   })
--   -- a 202 Accepted with a Location parks the event; the poller settles it
--   poller.attach(erp, { every = 2, status_field = "job.state",
--                        done = { "Succeeded" }, failed = { "Failed", "Cancelled" } })
--
--   -- or one handler among others, with the request built from the event
--   local crm = nimbus.endpoint("CrmEndpoint")
--   crm:on("AccountCreated", forward.handler{
--     name = "CRM API",
--     url = "http://127.0.0.1:5080/api/accounts",
--     response = "json",                    -- a 2xx must carry JSON
--     map = function(account, ctx)
--       return { json = { legalName = account.LegalName }, headers = { ["X-Session"] = ctx.session_id } }
--     end,
--     on_response = function(res, account, ctx)
--       nimbus.publish("AccountLinked", { id = res.data.id }, { session = ctx.session_id })
--     end,
--   })
--
-- What an answer becomes (`outcomes` overrides it: exact statuses, then "2xx".."5xx"; values
-- "done", "handoff", "permanent", "transient", "failed" or a function(res, event, ctx)):
--   2xx                 done: Completed (on_response runs first)
--   202 + Location      handoff: Pending+Handoff, external_job_id = the absolute Location URL
--                       (a 202 without one completes, with a warning: there is nothing to poll)
--   301 302 307 308     followed (same method and body), 303 followed as GET, up to
--                       `max_redirects` (5); a loop or too many hops: transient
--   408 429 5xx         transient: Pending+Retrying under the endpoint's `transient` policy.
--                       A Retry-After (seconds or HTTP-date) up to `retry_wait` (5 s) is waited
--                       for inside the handler and the request sent again (3 times at most);
--                       after a longer one the host retries no sooner than it asks (up to
--                       the transient policy's `max_delay`: raise it to honour long waits).
--   other 4xx           permanent: DeadLettered with method, URL, status, reason and the first
--                       500 characters of the body; the session goes on
--   no answer in time, refused, reset, a malformed answer (a status outside 200-599, a 2xx that
--   is not JSON under response = "json"): transient. The whole delivery (hops and waits
--   included) stays inside `timeout` (30 s); keep it below the endpoint's handler `timeout`.
--   A bad URL built at run time (map, url function) fails the event (an adapter bug); an
--   event without a field of the URL template is dead-lettered.
--   no_answer = "failed": no answer (refused, reset, timed out) fails the event instead
--   (Failed, the session blocks until an operator resubmits): for APIs that must not be
--   retried behind the operator's back.
--   error_text = function(f) -> string: your wording of a refused or unanswered request
--   (keeps the outcome, replaces the text). f.kind is "status" (f.status, f.reason or nil,
--   f.body: the whole body, f.retry_after) or "no_answer" (f.message, f.code); both carry
--   f.name, f.method, f.url and f.path (path and query of f.url). E.g. a legacy format:
--     error_text = function(f)
--       if f.kind == "no_answer" then return ("%s %s unreachable: %s"):format(f.method, f.path, f.message) end
--       return ("%s %s → %d. Body: %s"):format(f.method, f.path, f.status, f.body:sub(1, 500))
--     end
local cjson = require("cjson.safe")

local M = {}

local DEFAULT_TIMEOUT = 30
local DEFAULT_MAX_REDIRECTS = 5
local DEFAULT_RETRY_WAIT = 5
local MAX_WAITS = 3           -- Retry-After waits inside one handler run
local BODY_CHARS = 500        -- of an answer's body in an error text

M.REASONS = {
  [200] = "OK", [201] = "Created", [202] = "Accepted", [203] = "Non-Authoritative Information",
  [204] = "No Content", [205] = "Reset Content", [206] = "Partial Content",
  [300] = "Multiple Choices", [301] = "Moved Permanently", [302] = "Found", [303] = "See Other",
  [304] = "Not Modified", [307] = "Temporary Redirect", [308] = "Permanent Redirect",
  [400] = "Bad Request", [401] = "Unauthorized", [402] = "Payment Required", [403] = "Forbidden",
  [404] = "Not Found", [405] = "Method Not Allowed", [406] = "Not Acceptable", [408] = "Request Timeout",
  [409] = "Conflict", [410] = "Gone", [411] = "Length Required", [412] = "Precondition Failed",
  [413] = "Content Too Large", [414] = "URI Too Long", [415] = "Unsupported Media Type",
  [421] = "Misdirected Request", [422] = "Unprocessable Content", [423] = "Locked", [425] = "Too Early",
  [428] = "Precondition Required", [429] = "Too Many Requests", [431] = "Request Header Fields Too Large",
  [451] = "Unavailable For Legal Reasons",
  [500] = "Internal Server Error", [501] = "Not Implemented", [502] = "Bad Gateway",
  [503] = "Service Unavailable", [504] = "Gateway Timeout", [505] = "HTTP Version Not Supported",
}

-- The answers nobody configured: exact statuses win over their class.
M.DEFAULT_OUTCOMES = {
  ["2xx"] = "done", [202] = "handoff",
  ["3xx"] = "transient",
  ["4xx"] = "permanent", [408] = "transient", [429] = "transient",
  ["5xx"] = "transient",
}

local ACTIONS = { done = true, handoff = true, permanent = true, transient = true, failed = true }
local ACTION_LIST = "done, handoff, permanent, transient, failed or a function(res, event, ctx)"
local REDIRECTS = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }
local METHODS = { GET = true, POST = true, PUT = true, PATCH = true, DELETE = true, HEAD = true, OPTIONS = true }
local NO_BODY = { GET = true, HEAD = true, DELETE = true, OPTIONS = true }   -- no event as default body

---------------------------------------------------------------------------- small helpers
-- The running adapter's nimbus, looked up at each use instead of once at load: under
-- nimbus.testing every loaded adapter has its own, and this module may have been required
-- outside all of them (a spec reading forward.REASONS at its top).
local function rt() return require("nimbus") end

-- The host's clock (the fake one under nimbus.testing).
local function now() return rt().now() end
M._now = now

-- First n characters of s (bytes when s is not UTF-8), marked when cut.
local function first_chars(s, n)
  s = s or ""
  if s == "" then return "(empty body)" end
  local len = utf8.len(s)
  if len == nil then
    if #s <= n then return s end
    return s:sub(1, n) .. "…"
  end
  if len <= n then return s end
  return s:sub(1, utf8.offset(s, n + 1) - 1) .. "…"
end
M._first_chars = first_chars

-- A response header by name, whatever its case (the host gives lower-case names).
local function header(headers, name)
  if type(headers) ~= "table" then return nil end
  local v = headers[name]
  if v ~= nil then return v end
  name = name:lower()
  for k, val in pairs(headers) do
    if type(k) == "string" and k:lower() == name then return val end
  end
  return nil
end
M.header = header

local function status_text(status)
  local reason = M.REASONS[status]
  return reason and (status .. " " .. reason) or tostring(status)
end

local function seconds_text(s)
  if s == math.floor(s) then return ("%d s"):format(s) end
  return ("%.1f s"):format(s)
end

-- Walks a dotted path ("job.state") through nested tables; nil when a step is missing.
local function get_path(t, path)
  for key in path:gmatch("[^.]+") do
    if type(t) ~= "table" then return nil end
    local v = t[key]
    if v == nil then v = t[tonumber(key)] end
    t = v
  end
  return t
end
M.get_path = get_path

local function percent_encode(s)
  return (s:gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

---------------------------------------------------------------------------- Retry-After
local MONTHS = { jan = 1, feb = 2, mar = 3, apr = 4, may = 5, jun = 6, jul = 7, aug = 8, sep = 9, oct = 10,
                 nov = 11, dec = 12 }

-- Seconds since the epoch of a UTC date of the proleptic Gregorian calendar. The year is
-- counted from March so that the leap day is the last day of its year.
local function epoch_of(y, mo, d, h, mi, s)
  if mo <= 2 then y, mo = y - 1, mo + 12 end
  local days = 365 * y + y // 4 - y // 100 + y // 400 + (153 * (mo - 3) + 2) // 5 + d - 719469
  return days * 86400 + h * 3600 + mi * 60 + s
end

-- An HTTP-date in any of the three forms HTTP/1.1 recipients accept (RFC 9110 5.6.7):
-- IMF-fixdate, the obsolete RFC 850 form and asctime's. Returns epoch seconds or nil.
local function parse_http_date(v)
  local d, mon, y, h, mi, s = v:match("^%a+, (%d%d?) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
  if not d then
    d, mon, y, h, mi, s = v:match("^%a+, (%d%d)%-(%a%a%a)%-(%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    if y then
      y = tonumber(y)
      y = y < 70 and 2000 + y or 1900 + y
    end
  end
  if not d then
    mon, d, h, mi, s, y = v:match("^%a+ (%a%a%a) +(%d%d?) (%d%d):(%d%d):(%d%d) (%d%d%d%d)$")
  end
  if not d then return nil end
  local m = MONTHS[mon:lower()]
  d, y, h, mi, s = tonumber(d), tonumber(y), tonumber(h), tonumber(mi), tonumber(s)
  if not m or d < 1 or d > 31 or h > 23 or mi > 59 or s > 60 then return nil end
  return epoch_of(y, m, d, h, mi, s)
end
M._parse_http_date = parse_http_date

-- forward.retry_after("120") -> 120; forward.retry_after("Wed, 21 Oct 2026 07:28:00 GMT")
-- -> seconds from now (0 when it is past); nil for anything else.
function M.retry_after(value, at)
  if type(value) == "number" then return value >= 0 and value or nil end
  if type(value) ~= "string" then return nil end
  value = value:match("^%s*(.-)%s*$")
  local secs = value:match("^%d+$")
  if secs then return tonumber(secs) end
  local t = parse_http_date(value)
  if not t then return nil end
  local delay = t - (at or now())
  if delay < 0 then return 0 end
  return math.floor(delay + 0.5)
end

---------------------------------------------------------------------------- URLs
-- scheme://authority, the path, the query (with its '?') of an absolute http(s) URL.
local function split_url(url)
  local origin, rest = url:match("^(https?://[^/?#]+)(.*)$")
  if not origin then return nil end
  rest = rest:gsub("#.*$", "")
  local path, query = rest:match("^([^?]*)(.*)$")
  if path == "" then path = "/" end
  return origin, path, query
end

-- An absolute URL for a Location header seen on an answer to `base` (RFC 3986 5.2, without
-- dot-segment removal: APIs send absolute or root-relative Locations).
local function resolve(base, loc)
  loc = loc:match("^%s*(.-)%s*$")
  if loc:match("^%a[%w+.-]*:") then return loc end
  local origin, path = split_url(base)
  if not origin then return nil end
  if loc:sub(1, 2) == "//" then return origin:match("^(https?:)") .. loc end
  if loc:sub(1, 1) == "/" then return origin .. loc end
  if loc:sub(1, 1) == "?" then return origin .. path .. loc end
  if loc == "" then return base end
  return origin .. path:gsub("[^/]*$", "") .. loc
end
M.resolve = resolve

local function origin_of(url)
  local o = split_url(url)
  return o and o:lower()
end

-- Compiles "http://x/api/orders/{OrderId}" into a function(event, ctx) -> url, or nil, missing
-- field. {ctx.session_id} reads the context instead of the event.
local function compile_template(tpl)
  if not tpl:find("{", 1, true) then return function() return tpl end end
  return function(event, ctx)
    local missing
    local url = tpl:gsub("{([%w_.]+)}", function(path)
      local v
      if path:sub(1, 4) == "ctx." then v = ctx[path:sub(5)] else v = get_path(event, path) end
      if type(v) == "number" then v = math.tointeger(v) or v end
      if type(v) ~= "string" and type(v) ~= "number" then
        missing = missing or path
        return ""
      end
      return percent_encode(tostring(v))
    end)
    if missing then return nil, missing end
    return url
  end
end

local function query_string(q)
  local keys = {}
  for k in pairs(q) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = q[k]
    if v == nil then v = q[tonumber(k)] end
    parts[#parts + 1] = percent_encode(k) .. "=" .. percent_encode(tostring(v))
  end
  return table.concat(parts, "&")
end

---------------------------------------------------------------------------- outcomes of errors
local function fail_permanent(text, etype) error(rt().permanent(text, etype), 0) end
local function fail_plain(text, etype) error({ message = text, type = etype }, 0) end

-- A transient error; its Retry-After (seconds) is the least wait before the next attempt:
-- the host waits for the longer of it and the endpoint's transient policy (up to max_delay).
local function fail_transient(text, etype, retry_after)
  error(rt().transient(text, { type = etype, retry_after = retry_after }), 0)
end

---------------------------------------------------------------------------- options
local HANDLER_KEYS = {
  name = "string", url = "string|function", method = "string", map = "function", headers = "table|function",
  timeout = "number", outcomes = "table", response = "string", on_response = "function",
  handoff = "table|boolean", max_redirects = "number", retry_wait = "number", idempotency_header = "string",
  no_answer = "string", error_text = "function",
}
local ENDPOINT_KEYS = { types = "table", endpoint = "table", poll = "table" }

local function key_list(...)
  local names = {}
  for _, set in ipairs({ ... }) do
    for k in pairs(set) do names[#names + 1] = k end
  end
  table.sort(names)
  return table.concat(names, ", ")
end
M._key_list = key_list   -- job_poller names its options the same way

local function check_type(where, k, v, want)
  for t in want:gmatch("[^|]+") do
    if type(v) == t then return end
  end
  error(("%s: option %s must be a %s, got %s"):format(where, k, want:gsub("|", " or "), type(v)), 0)
end

local function check_outcomes(where, outcomes)
  for k, v in pairs(outcomes) do
    local ok_key = (math.type(k) == "integer" and k >= 100 and k <= 599)
      or (type(k) == "string" and k:match("^[1-5]xx$"))
    if not ok_key then
      error(("%s: outcomes key %s must be a status (100-599) or a class \"1xx\"..\"5xx\""):format(where,
            type(k) == "string" and ("%q"):format(k) or tostring(k)), 0)
    end
    if not (type(v) == "function" or ACTIONS[v]) then
      error(("%s: outcomes[%s] = %s: expected %s"):format(where, tostring(k),
            type(v) == "string" and ("%q"):format(v) or tostring(v), ACTION_LIST), 0)
    end
  end
end

local function check_url_option(where, url)
  local bare = url:gsub("{[%w_.]+}", "x")
  if not bare:match("^https?://[^/?#]+") then
    error(("%s: url must be an http:// or https:// URL, got %q"):format(where, url), 0)
  end
  if bare:find("[{}]") then
    error(("%s: url %q has a malformed {placeholder}: use {Field}, {a.b} or {ctx.session_id}"):format(where, url), 0)
  end
end

local function check_handoff(where, handoff)
  if handoff == true then
    error(("%s: handoff must be a table { reason = ..., expected_by = seconds } or false"):format(where), 0)
  end
  if type(handoff) ~= "table" then return end
  for k, v in pairs(handoff) do
    if k ~= "reason" and k ~= "expected_by" then
      error(("%s: unknown handoff option %s (reason, expected_by)"):format(where, tostring(k)), 0)
    end
    if k == "reason" and (type(v) ~= "string" or v == "") then
      error(("%s: handoff.reason must be a non-empty string"):format(where), 0)
    end
    if k == "expected_by" and (type(v) ~= "number" or v < 0) then
      error(("%s: handoff.expected_by must be a number of seconds from now"):format(where), 0)
    end
  end
end

local function check_numbers(where, opts)
  if opts.timeout ~= nil and opts.timeout <= 0 then error(("%s: timeout must be > 0 seconds"):format(where), 0) end
  local mr = opts.max_redirects
  if mr ~= nil and (math.type(mr) ~= "integer" or mr < 0) then
    error(("%s: max_redirects must be a whole number >= 0"):format(where), 0)
  end
  if opts.retry_wait ~= nil and opts.retry_wait < 0 then
    error(("%s: retry_wait must be >= 0 seconds"):format(where), 0)
  end
end

-- Checks the handler options; returns the compiled configuration. Raises a string without
-- a position: the public functions re-raise it at their caller's line.
local function compile(opts, where, extra_keys)
  if type(opts) ~= "table" then
    error(("%s expects a table of options { url = ..., method = ..., ... }"):format(where), 0)
  end
  for k, v in pairs(opts) do
    local want = HANDLER_KEYS[k] or (extra_keys and extra_keys[k])
    if not want then
      error(("%s: unknown option %s (options: %s)"):format(where, tostring(k), key_list(HANDLER_KEYS, extra_keys or {})), 0)
    end
    check_type(where, k, v, want)
  end
  if opts.url == nil and opts.map == nil then
    error(("%s: give url = \"http://host/path\" (or a map function that returns { url = ... })"):format(where), 0)
  end
  if type(opts.url) == "string" then check_url_option(where, opts.url) end
  local method = (opts.method or "POST"):upper()
  if not METHODS[method] then
    error(("%s: method %q is not one of GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"):format(where, opts.method), 0)
  end
  check_numbers(where, opts)
  if opts.response ~= nil and opts.response ~= "json" then
    error(("%s: response must be \"json\" (a 2xx must carry JSON) or absent, got %q"):format(where, opts.response), 0)
  end
  if opts.outcomes then check_outcomes(where, opts.outcomes) end
  check_handoff(where, opts.handoff)
  if opts.no_answer ~= nil and opts.no_answer ~= "transient" and opts.no_answer ~= "failed" then
    error(("%s: no_answer must be \"transient\" (tried again later) or \"failed\", got %q"):format(where,
          opts.no_answer), 0)
  end
  return {
    name = opts.name, map = opts.map, headers = opts.headers, on_response = opts.on_response,
    idempotency_header = opts.idempotency_header, method = method,
    no_answer = opts.no_answer or "transient", error_text = opts.error_text,
    url = type(opts.url) == "string" and compile_template(opts.url) or opts.url,
    url_text = type(opts.url) == "string" and opts.url or nil,
    timeout = opts.timeout or DEFAULT_TIMEOUT,
    max_redirects = opts.max_redirects or DEFAULT_MAX_REDIRECTS,
    retry_wait = opts.retry_wait or DEFAULT_RETRY_WAIT,
    json_response = opts.response == "json",
    outcomes = opts.outcomes or {},
    handoff = opts.handoff ~= false and (opts.handoff or {}) or false,
  }
end

---------------------------------------------------------------------------- one delivery
local MAP_KEYS = { url = true, path = true, method = true, json = true, body = true, headers = true, query = true }

local function config_error(text) fail_plain("http_forward: " .. text, "ForwardConfigError") end

-- What map returned, checked: a table of MAP_KEYS, false (skip), or an adapter bug.
local function mapped(conf, event, ctx)
  if not conf.map then return {} end
  local r = conf.map(event, ctx)
  if r == false then return false end
  if type(r) ~= "table" then
    config_error(("map must return a request table { url, path, method, json, body, headers, query } or false to "
                  .. "skip the event, got %s"):format(type(r)))
  end
  for k in pairs(r) do
    if not MAP_KEYS[k] then
      config_error(("map returned an unknown request field %s (url, path, method, json, body, headers, query)")
                   :format(tostring(k)))
    end
  end
  if r.json ~= nil and r.body ~= nil then config_error("map returned both json and body; give one") end
  if r.body ~= nil and type(r.body) ~= "string" then
    config_error("map returned a body that is not a string (use json = {...} for tables)")
  end
  return r
end

-- The URL to call: map's url, else the url option (template filled from the event), then
-- map's path and query. An event without a field of the template is dead-lettered.
local function request_url(conf, r, event, ctx)
  local url = r.url
  if url == nil then
    if conf.url == nil then config_error("map returned no url and the handler has no url option") end
    local missing
    url, missing = conf.url(event, ctx)
    if url == nil and missing then
      fail_permanent(("http_forward: the event has no %s for the URL %s (it must be a string or a number); "
                      .. "fix the event and resubmit it"):format(missing, conf.url_text), "ForwardMissingField")
    end
  end
  if type(url) ~= "string" then config_error(("the URL to call must be a string, got %s"):format(type(url))) end
  if r.path ~= nil then url = url:gsub("/+$", "") .. "/" .. tostring(r.path):gsub("^/+", "") end
  if type(r.query) == "table" and next(r.query) ~= nil then
    url = url .. (url:find("?", 1, true) and "&" or "?") .. query_string(r.query)
  end
  if not url:match("^https?://[^/?#]+") then
    config_error(("the URL to call must be an http:// or https:// URL, got %s"):format(url))
  end
  return url
end

local function request_headers(conf, r, event, ctx)
  local headers, base = {}, conf.headers
  if type(base) == "function" then base = base(event, ctx) end
  for k, v in pairs(base or {}) do headers[k] = tostring(v) end
  for k, v in pairs(r.headers or {}) do headers[k] = tostring(v) end
  -- the event id is the same on every attempt: the API can drop a repeat
  if conf.idempotency_header then headers[conf.idempotency_header] = ctx.event_id end
  if conf.json_response and header(headers, "accept") == nil then headers.Accept = "application/json" end
  return headers
end

-- The request of one event, or false when map skips it.
local function build_request(conf, event, ctx)
  local r = mapped(conf, event, ctx)
  if r == false then return false end
  local method = (r.method or conf.method)
  method = type(method) == "string" and method:upper()
  if not METHODS[method] then config_error(("map returned the method %q"):format(tostring(r.method))) end
  local json = r.json
  if not conf.map and not NO_BODY[method] then json = event end
  return { url = request_url(conf, r, event, ctx), method = method, headers = request_headers(conf, r, event, ctx),
           body = r.body, json = json }
end

local function label(conf, req)
  return (conf.name and (conf.name .. ": ") or "") .. req.method .. " " .. req.url
end

-- The action configured for a status: the user's exact status, the user's class, then the
-- defaults in the same order.
local function action_for(outcomes, status)
  local class = (status // 100) .. "xx"
  return outcomes[status] or outcomes[class] or M.DEFAULT_OUTCOMES[status] or M.DEFAULT_OUTCOMES[class]
end

-- The path and query of a URL (error texts that name the API once and the path after it).
local function path_of(url)
  local _, path, query = split_url(url)
  if not path then return url end
  return path .. query
end

-- The adapter's own wording of a failure (option error_text), or nil without one. f gets
-- name, method, url (the one that answered), path; the caller filled in the rest.
local function custom_text(conf, req, url, f)
  if not conf.error_text then return nil end
  f.name, f.method, f.url, f.path = conf.name, req.method, url, path_of(url)
  local text = conf.error_text(f)
  if type(text) ~= "string" then
    config_error(("error_text must return the error text as a string, got %s"):format(type(text)))
  end
  return text
end

-- Raises the outcome of no answer: transient, or a plain failure under no_answer = "failed"
-- (an API whose callers want an operator to look, not a retry).
local function no_answer(conf, req, url, text, etype, msg, code)
  local custom = custom_text(conf, req, url, { kind = "no_answer", message = msg, code = code })
  if conf.no_answer == "failed" then fail_plain(custom or text, etype) end
  fail_transient(custom or (text .. "; tried again later"), etype)
end

-- Raises the outcome of a request that got no answer (see no_answer), but for a URL the
-- client refuses: that is an adapter bug, a plain failure.
local function transport_failure(conf, req, url, msg, code)
  local what = (conf.name and (conf.name .. ": ") or "") .. req.method .. " " .. req.url
  if url ~= req.url then what = what .. " (redirected to " .. url .. ")" end
  msg = tostring(msg)
  if code == "EINVAL" then
    fail_plain(("%s: the URL cannot be used: %s (EINVAL); fix the adapter's url"):format(what, msg),
               "ForwardConfigError")
  end
  if code == "ETIMEDOUT" then
    no_answer(conf, req, url, ("%s: no answer within %s (timeout = %s): %s")
              :format(what, seconds_text(conf.timeout), conf.timeout, msg), "HttpTimeout", msg, code)
  elseif code == "EMSGSIZE" then
    no_answer(conf, req, url, ("%s: the answer is too large: %s"):format(what, msg), "HttpBadResponse", msg, code)
  end
  no_answer(conf, req, url, ("%s: unreachable: %s (%s)"):format(what, msg, tostring(code)), "HttpUnreachable",
            msg, code)
end

-- Headers for a hop to another origin: credentials are for the API that was configured,
-- not for wherever it points.
local function without_credentials(headers)
  local kept = {}
  for k, v in pairs(headers) do
    local l = k:lower()
    if l ~= "authorization" and l ~= "cookie" and l ~= "proxy-authorization" then kept[k] = v end
  end
  return kept
end

-- The next URL of a redirect chain, or raises when the chain loops, is too long, or points
-- at something that is not an http(s) URL.
local function next_hop(conf, req, hop, res)
  local loc = header(res.headers, "location")
  local nxt = resolve(hop.url, loc)
  if not nxt or not nxt:match("^https?://[^/?#]+") then
    fail_transient(("%s: answered %s with a Location that is not an http(s) URL: %q; tried again later")
                   :format(label(conf, req), status_text(res.status), loc), "HttpBadResponse")
  end
  local chain = hop.chain
  chain[#chain + 1] = nxt
  if hop.seen[nxt] then
    fail_transient(("%s: redirect loop: %s; fix the URL or the API's redirects; tried again later")
                   :format(label(conf, req), table.concat(chain, " → ")), "HttpRedirectLoop")
  end
  if #chain - 1 > conf.max_redirects then
    fail_transient(("%s: more than %d redirects (max_redirects): %s; tried again later")
                   :format(label(conf, req), conf.max_redirects, table.concat(chain, " → ")), "HttpRedirectLoop")
  end
  hop.seen[nxt] = true
  return nxt
end

local function follows(conf, res)
  return REDIRECTS[res.status] and conf.max_redirects > 0 and conf.outcomes[res.status] == nil
    and header(res.headers, "location") ~= nil
end

-- Sends req, following redirects (nimbus.http.request does not), all within the deadline.
-- Returns the final answer and the URL that gave it; raises the outcome of no answer.
local function send(conf, req, deadline)
  local hop = { url = req.url, method = req.method, body = req.body, json = req.json, headers = req.headers,
                seen = { [req.url] = true }, chain = { req.url } }
  while true do
    local left = deadline - now()
    if left <= 0 then
      local msg = ("no answer within the delivery timeout of %s (timeout = %s)")
                  :format(seconds_text(conf.timeout), conf.timeout)
      no_answer(conf, req, hop.url, label(conf, req) .. ": " .. msg, "HttpTimeout", msg, "ETIMEDOUT")
    end
    local res, msg, code = rt().http.request{ method = hop.method, url = hop.url, headers = hop.headers,
                                              body = hop.body, json = hop.json, timeout = left }
    if not res then transport_failure(conf, req, hop.url, msg, code) end
    if not follows(conf, res) then return res, hop.url end
    local nxt = next_hop(conf, req, hop, res)
    if res.status == 303 then hop.method, hop.body, hop.json = "GET", nil, nil end
    if origin_of(nxt) ~= origin_of(hop.url) then hop.headers = without_credentials(hop.headers) end
    rt().log.debug("http_forward: following a redirect", { status = res.status, from = hop.url, to = nxt })
    hop.url = nxt
  end
end

-- A 2xx that is done: checks a JSON body when one is expected (res.data), runs on_response.
local function finish(conf, req, res, url, event, ctx)
  if conf.json_response and res.status ~= 204 and res.status ~= 205 and req.method ~= "HEAD" then
    local data, err = res:json()
    if data == nil then
      fail_transient(("%s: answered %s but the body is not JSON (%s), and response = \"json\" expects it; "
                      .. "tried again later. Body: %s"):format(label(conf, req), status_text(res.status), tostring(err),
                     first_chars(res.body, BODY_CHARS)), "HttpBadResponse")
    end
    res.data = data
  end
  res.url = url
  if conf.on_response then conf.on_response(res, event, ctx) end
end

local function handoff(conf, req, res, url, event, ctx)
  local loc = header(res.headers, "location")
  local job = loc and resolve(url, loc)
  if not job or not job:match("^https?://[^/?#]+") then
    rt().log.warn("http_forward: 202 Accepted without a usable Location: nothing to poll, the event completes",
                    { url = url, location = loc })
    return finish(conf, req, res, url, event, ctx)
  end
  finish(conf, req, res, url, event, ctx)
  local h = conf.handoff
  ctx:mark_pending_handoff{ reason = h.reason or ("Awaiting the job accepted by " .. label(conf, req)),
                            external_job_id = job, expected_by = h.expected_by }
  rt().log.info("http_forward: handed off", { job = job, status = res.status })
end

local function describe_answer(conf, req, res, url)
  local where = label(conf, req)
  if url ~= req.url then where = where .. " (redirected to " .. url .. ")" end
  return ("%s → %s"):format(where, status_text(res.status))
end

-- Raises the outcome of an answer that refuses the event: permanent, failed or transient
-- (with its Retry-After, if any, in the text and on the error).
local function refuse(conf, req, res, url, action, ra, raw)
  local what = describe_answer(conf, req, res, url)
  local body, etype = first_chars(res.body, BODY_CHARS), "HttpStatus" .. res.status
  local custom = custom_text(conf, req, url, { kind = "status", status = res.status, reason = M.REASONS[res.status],
                                               body = res.body or "", retry_after = ra })
  if custom then
    if action == "permanent" then fail_permanent(custom, etype) end
    if action == "failed" then fail_plain(custom, etype) end
    fail_transient(custom, etype, ra)
  end
  if action == "permanent" then
    fail_permanent(("%s: the API refused the event (dead-lettered: the same request gets the same answer); fix the "
                    .. "event and resubmit it, or skip it. Body: %s"):format(what, body), etype)
  elseif action == "failed" then
    fail_plain(("%s. Body: %s"):format(what, body), etype)
  end
  local after = ""
  if ra then after = (" (Retry-After: %s)"):format(seconds_text(ra))
  elseif raw then after = (" (Retry-After %q not understood)"):format(raw) end
  fail_transient(("%s: the API cannot take it now%s; tried again later. Body: %s"):format(what, after, body), etype, ra)
end

-- Seconds to wait before sending again inside this run, or nil: only a Retry-After up to
-- retry_wait, MAX_WAITS times, and never past the deadline. Also the Retry-After as read.
local function wait_for(conf, res, waits, deadline)
  local raw = header(res.headers, "retry-after")
  local ra = raw and M.retry_after(raw)
  if ra and ra <= conf.retry_wait and waits < MAX_WAITS and now() + ra < deadline then return ra, ra, raw end
  return nil, ra, raw
end

-- One delivery of one event: returns normally (done / handoff) or raises the outcome.
local function deliver(conf, event, ctx)
  local req = build_request(conf, event, ctx)
  if req == false then
    rt().log.info("http_forward: map returned false; the event completes without a request")
    return
  end
  local deadline, waits = now() + conf.timeout, 0
  while true do
    local res, url = send(conf, req, deadline)
    local status = res.status
    if math.type(status) ~= "integer" or status < 200 or status > 599 then
      fail_transient(("%s: malformed answer: status %s; tried again later. Body: %s")
                     :format(label(conf, req), tostring(status), first_chars(res.body, BODY_CHARS)), "HttpBadResponse")
    end
    local action = action_for(conf.outcomes, status)
    if type(action) == "function" then return action(res, event, ctx) end
    if action == "done" or (action == "handoff" and conf.handoff == false) then
      return finish(conf, req, res, url, event, ctx)
    end
    if action == "handoff" then return handoff(conf, req, res, url, event, ctx) end
    local wait, ra, raw
    if action == "transient" then wait, ra, raw = wait_for(conf, res, waits, deadline) end
    if not wait then refuse(conf, req, res, url, action, ra, raw) end
    waits = waits + 1
    rt().log.info("http_forward: the API asked to retry later; waiting", { status = status, retry_after = wait,
                                                                         url = url, attempt = waits })
    rt().sleep(wait)
  end
end

---------------------------------------------------------------------------- public API
-- forward.handler{ url = ..., ... } -> function(event, ctx), for ep:on(type, handler)
function M.handler(opts)
  local ok, conf = pcall(compile, opts, "http_forward.handler")
  if not ok then error(conf, 2) end
  return function(event, ctx) return deliver(conf, event, ctx) end
end

-- forward.endpoint(name, { types = {...}, endpoint = {...}, poll = {...}, <handler options> })
-- -> the endpoint: nimbus.endpoint(name, endpoint) with the handler on every type, and a
-- job_poller checker (adapters.job_poller) when `poll` is given.
function M.endpoint(name, opts)
  local where = "http_forward.endpoint"
  local ok, conf = pcall(compile, opts, where, ENDPOINT_KEYS)
  if not ok then error(conf, 2) end
  local types = opts.types
  if type(types) ~= "table" or #types == 0 then
    error(where .. ": types must be a list of event types, e.g. { \"OrderPlaced\" }", 2)
  end
  for i, t in ipairs(types) do
    if type(t) ~= "string" or t == "" then error(("%s: types[%d] must be a non-empty string"):format(where, i), 2) end
  end
  local ep
  ok, ep = pcall(rt().endpoint, name, opts.endpoint)
  if not ok then
    -- nimbus.endpoint blamed this file: name the caller's line instead
    error(where .. ": " .. tostring(ep):gsub("^[^\n]-:%d+: ", "", 1), 2)
  end
  local fn = function(event, ctx) return deliver(conf, event, ctx) end
  for _, t in ipairs(types) do ep:on(t, fn) end
  if opts.poll then
    local poller = require("adapters.job_poller")
    local pok, perr = pcall(poller.attach, ep, opts.poll)
    if not pok then error(where .. ": poll: " .. tostring(perr):gsub("^[^\n]-:%d+: ", "", 1), 2) end
  end
  return ep
end

return M

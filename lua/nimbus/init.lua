-- nimbus: the Lua API adapters are written against (docs/design.md section 4). An adapter
-- declares endpoints, their handlers, middleware and status checkers; the host runs each
-- message's handler as a task of its own and records its outcome.
--
--   local nimbus = require("nimbus")
--
--   local ep = nimbus.endpoint("Greeter", { concurrency = 10, retry = { max_retries = 2 } })
--
--   ep:on("CustomerSignedUp", function(customer, ctx)
--     if not customer.email then error(nimbus.permanent("no email")) end   -- dead-lettered
--     local res, err = nimbus.http.request{ method = "POST", url = "http://127.0.0.1:5080/mails",
--                                            json = { to = customer.email }, timeout = 2 }
--     if not res then error(nimbus.transient("mail service: " .. err)) end   -- retried later
--     nimbus.publish("WelcomeMailSent", { to = customer.email }, { session = ctx.session_id })
--     nimbus.log.info("welcome mail sent", { to = customer.email, at = nimbus.now() })
--   end)
--
--   local task = nimbus.spawn(function(n) nimbus.sleep(0.1); return n * 2 end, 21)
--   -- inside a task: task:wait() == 42 (or its error raised); task:cancel() stops it
--   nimbus.every(60, function() nimbus.log.info("still here") end)   -- a periodic task
--
-- Mistakes in an adapter's configuration (a misspelt option, a second handler for a type)
-- raise at the adapter's own line, never inside this file: error levels point past the
-- runtime (lua/nimbus/) and the adapter library (adapters/) to the first caller outside
-- them. `nimbus-host check` loads adapters in check mode, where those mistakes are
-- recorded instead and the adapter keeps loading, so every one of them is reported.
--
-- The host reaches the runtime's private half (the handler runner, the subscriptions,
-- hooks, liveness checks) through require("nimbus.internal"), not through this table.
local core = require("nimbus.core")   -- C functions registered by the host
local cjson = require("cjson.safe")
local errors = require("nimbus.errors")
local internal = require("nimbus.internal")

local M = { _VERSION = core.version }

local endpoints = {}           -- name -> endpoint object
local task_ctx = setmetatable({}, { __mode = "k" })   -- coroutine -> ctx of the running task
local decode = internal.decode

-- "check" under `nimbus-host check`: configuration mistakes are recorded, not raised
local CHECK = core.mode == "check"

---------------------------------------------------------------------------- blame
-- Source prefixes ("@dir/") of the runtime (this directory) and of the adapter library
-- beside lua/: frames there are skipped when an error is blamed. The host puts both on
-- package.path as canonical absolute paths (realpath: "/x/adapters/y.lua"); a path given
-- some other way (--lpath, LUA_PATH) may still read "<lua>/../adapters/y.lua".
local RUNTIME_SRC = debug.getinfo(1, "S").source:match("^(@.*/)[^/]*$")
local LUA_SRC = RUNTIME_SRC and RUNTIME_SRC:match("^(@.*/)[^/]+/$")
local LIBRARY_SRC = LUA_SRC and LUA_SRC .. "../adapters/"
local LIBRARY_SRC2 = LUA_SRC and LUA_SRC:match("^(@.*/)[^/]+/$")
LIBRARY_SRC2 = LIBRARY_SRC2 and LIBRARY_SRC2 .. "adapters/"

local function under(source, prefix)
  return prefix ~= nil and source:sub(1, #prefix) == prefix
end

local function in_library(source)
  return under(source, LIBRARY_SRC) or under(source, LIBRARY_SRC2)
end

-- The first Lua function on the stack outside the runtime and the library (else the
-- first outside the runtime): its level as error() counts it from the caller of
-- user_level, and its "file:line".
local function user_level()
  local level, fallback, fallback_where = 2, nil, nil
  while true do
    local info = debug.getinfo(level + 1, "Sl")
    if not info then return fallback or 2, fallback_where end
    if info.what ~= "C" and not under(info.source, RUNTIME_SRC) then
      local file = info.source:sub(1, 1) == "@" and info.source:sub(2) or info.short_src
      local where = file .. ":" .. tostring(info.currentline)
      if not in_library(info.source) then return level, where end
      if not fallback then fallback, fallback_where = level, where end
    end
    level = level + 1
  end
end

-- Raises msg at the user's line (runtime misuse: wrong arguments to publish, request...).
local function raise(msg)
  error(msg, (user_level()))
end

local problems = {}   -- check mode: { where, message } in the order they were found

-- A mistake in the adapter's configuration: raised at the user's line, or, in check
-- mode, recorded so loading goes on and `nimbus-host check` reports every mistake.
local function misuse(msg)
  local level, where = user_level()
  if CHECK then
    problems[#problems + 1] = { where = where or "?", message = msg }
    return
  end
  error(msg, level)
end

-- Where the user's code called into the runtime: "file:line".
local function call_site()
  local _, where = user_level()
  return where or "?"
end

---------------------------------------------------------------------------- options
local options = require("nimbus.options")
local suggest, unknown_option, names_of = options.suggest, options.unknown_option, options.names_of
local ENDPOINT_OPTIONS, HANDLER_OPTIONS, CHECKER_OPTIONS = options.ENDPOINT, options.HANDLER, options.CHECKER
local EVERY_OPTIONS, PUBLISH_OPTIONS, REQUEST_OPTIONS = options.EVERY, options.PUBLISH, options.REQUEST
local HANDOFF_FIELDS, RETENTION_OPTIONS = options.HANDOFF, options.RETENTION

-- Options of a call that must be nil or a table; returns the table (or {}), and whether
-- it was fine. Unknown keys and bad values are misuse.
local function check_options(opts, schema, what)
  if opts == nil then return {}, true end
  if type(opts) ~= "table" then
    misuse(("%s: options must be a table, got %s"):format(what, type(opts)))
    return {}, false
  end
  return opts, options.validate(opts, schema, what, "", misuse) == 0
end

-- Runtime calls (publish, request...): unknown keys raise at once. The names are kept as
-- a set on the schema: publish is a hot path.
local EMPTY = setmetatable({}, { __newindex = function() error("read-only", 2) end })

local function check_keys(opts, schema, what)
  if opts == nil then return EMPTY end
  if type(opts) ~= "table" then raise(("%s: options must be a table, got %s"):format(what, type(opts))) end
  local set = schema.set
  if not set then
    set = {}
    for _, f in ipairs(schema) do set[f[1]] = true end
    schema.set = set
  end
  for k in pairs(opts) do
    if not set[k] then raise(unknown_option(what, "", k, names_of(schema))) end
  end
  return opts
end

---------------------------------------------------------------------------- logging
-- A log line's fields as one flat list { key, value, ... } for core.log: the running
-- task's endpoint, event, session and type first, then the caller's fields by name. A
-- table value goes as { json } (written as JSON in --log-format json); anything else
-- but a string, number or boolean as its tostring.
local function log_fields(ctx, fields)
  local out = {}
  local nctx = 0
  if ctx then
    out[1], out[2] = "endpoint", ctx.endpoint
    if ctx.checker then
      out[3], out[4] = "checker", ctx.checker
    elseif ctx.hook then
      out[3], out[4] = "hook", ctx.hook
    else
      out[3], out[4] = "event_id", ctx.event_id
      out[5], out[6] = "session", ctx.session_id
      out[7], out[8] = "type", ctx.event_type
    end
    nctx = #out // 2
  end
  if type(fields) == "table" then
    local keys = {}
    for k in pairs(fields) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local v = fields[k]
      if v == nil then v = fields[tonumber(k)] end
      local tv = type(v)
      if tv == "table" then v = { cjson.encode(v) or tostring(v) }
      elseif tv ~= "string" and tv ~= "number" and tv ~= "boolean" then v = tostring(v) end
      out[#out + 1] = k
      out[#out + 1] = v
    end
  end
  return out, nctx
end

local function make_logger(level)
  return function(msg, fields)
    core.log(level, tostring(msg), log_fields(task_ctx[coroutine.running()], fields))   -- + how many are the task's
  end
end

M.log = setmetatable({
  debug = make_logger("debug"), info = make_logger("info"),
  warn = make_logger("warn"), error = make_logger("error"),
}, { __call = function(self, ...) return self.info(...) end })

---------------------------------------------------------------------------- errors, time, tasks
M.permanent = errors.permanent
M.transient = errors.transient

-- nimbus.now(): seconds since the epoch (a float, millisecond resolution); under
-- nimbus.testing the fake clock that nimbus.sleep moves.
M.now = core.now

-- Waiting calls yield the running task to the loop; see docs/design.md section 3.
M.sleep = core.sleep     -- nimbus.sleep(seconds)
M.run = core.run         -- nimbus.run(fn, ...): drive the loop until fn ends (-l scripts, tests)

-- nimbus.spawn(fn, ...) -> task: runs fn(...) as a task of its own, from the next loop
-- iteration. task:wait() (inside a task) returns fn's results or raises its error;
-- task:cancel() stops it (true if it was still running); task:status() is "running",
-- "done", "failed" or "cancelled". A task nobody waits for logs its error.
function M.spawn(fn, ...)
  if type(fn) ~= "function" then
    raise(("nimbus.spawn: the first argument must be the function to run, got %s"):format(type(fn)))
  end
  return core.spawn(fn, ...)
end

-- nimbus.every(seconds, fn, { timeout = s, name = "label" }) -> handle: fn() runs as a task
-- every `seconds` (a run never overlaps the previous one; `timeout`, default 60 s, stops a
-- run that takes longer). handle:cancel() stops the timer.
function M.every(secs, fn, opts)
  if type(secs) ~= "number" or not (secs > 0) then
    misuse(("nimbus.every: the interval must be a number of seconds > 0, got %s"):format(tostring(secs)))
    return nil
  end
  if type(fn) ~= "function" then
    misuse(("nimbus.every: the second argument must be the function to run, got %s"):format(type(fn)))
    return nil
  end
  local o, ok = check_options(opts, EVERY_OPTIONS, "nimbus.every")
  if not ok then return nil end
  local label = o.name or ("nimbus.every at " .. call_site())
  return core.every(secs, fn, label, o.timeout)
end

---------------------------------------------------------------------------- context
local Ctx = {}
local lazy = {
  -- ISO-8601 UTC with milliseconds, like every timestamp the CLI prints
  enqueued_at = function(ctx)
    local ms = rawget(ctx, "enqueued_ms") or 0
    return ("%s.%03dZ"):format(os.date("!%Y-%m-%dT%H:%M:%S", ms // 1000), ms % 1000)
  end,
}
local ctx_mt = {
  __index = function(ctx, k)
    local v = Ctx[k]
    if v ~= nil then return v end
    local f = lazy[k]
    if f then
      v = f(ctx)
      rawset(ctx, k, v)
      return v
    end
  end,
}

-- Marks the event as handed off to external work: after a normal return the host
-- settles the message, records Pending/Handoff and blocks the session. Last call wins;
-- an error raised after it wins over it.
function Ctx:mark_pending_handoff(opts)
  if type(opts) ~= "table" then
    raise("ctx:mark_pending_handoff expects a table { reason = ..., external_job_id = ..., expected_by = seconds }")
  end
  check_keys(opts, HANDOFF_FIELDS, "ctx:mark_pending_handoff")
  if type(opts.reason) ~= "string" or opts.reason == "" then
    raise("ctx:mark_pending_handoff: `reason` must be a non-empty string")
  end
  if opts.external_job_id ~= nil and type(opts.external_job_id) ~= "string" then
    raise("ctx:mark_pending_handoff: `external_job_id` must be a string")
  end
  if opts.expected_by ~= nil and (type(opts.expected_by) ~= "number" or opts.expected_by < 0) then
    raise("ctx:mark_pending_handoff: `expected_by` must be a number of seconds from now")
  end
  rawset(self, "_handoff", { reason = opts.reason, external_job_id = opts.external_job_id,
                             expected_by = opts.expected_by })
end

---------------------------------------------------------------------------- endpoints
local Endpoint = {}
Endpoint.__index = Endpoint

-- Where each declaration was made ("file:line"), for `nimbus-host check`.
local sites = setmetatable({}, { __mode = "k" })   -- endpoint -> { at, handlers = { [type] = at } }

local function new_endpoint(name, opts)
  local ep = setmetatable({ name = name, opts = opts, handlers = {}, handler_opts = {}, middleware = {} }, Endpoint)
  sites[ep] = { at = call_site(), handlers = {} }
  return ep
end

function M.endpoint(name, opts)
  if type(name) ~= "string" or not name:match("^[%w_%.%-]+$") then
    misuse(("nimbus.endpoint: the name must be a non-empty string of letters, digits, '_', '.', '-', got %s")
           :format(type(name) == "string" and ("%q"):format(name) or type(name)))
    return new_endpoint(tostring(name), {})   -- check mode: keep loading, declare nothing
  end
  local what = ("nimbus.endpoint(%s)"):format(name)   -- as the host names it
  local o, ok = check_options(opts, ENDPOINT_OPTIONS, what)
  if endpoints[name] then
    misuse(("%s: endpoint %s is already defined (at %s)"):format(what, name, sites[endpoints[name]].at))
    return new_endpoint(name, o)
  end
  local ep = new_endpoint(name, o)
  if ok then
    local done, err = core.register_endpoint(name, o)   -- the host's own validation
    if done == nil then
      misuse(err)
      return ep
    end
  end
  endpoints[name] = ep
  return ep
end

-- self must be an endpoint: ep.on(...) instead of ep:on(...) passes the type as self.
local function is_endpoint(self, method)
  if getmetatable(self) == Endpoint then return true end
  misuse(("endpoint:%s: call it with a colon, ep:%s(...), on an endpoint from nimbus.endpoint"):format(method, method))
  return false
end

local function add_handler(self, method, event_type, fn, opts, kind)
  if not is_endpoint(self, method) then return self end
  local what = ("endpoint:%s(%s)"):format(method, type(event_type) == "string" and ("%q"):format(event_type) or "?")
  if type(event_type) ~= "string" or event_type == "" then
    misuse(("endpoint:%s: the event type must be a non-empty string, got %s"):format(method, type(event_type)))
    return self
  end
  if type(fn) ~= "function" then
    misuse(("%s: the handler must be a function(event, ctx), got %s"):format(what, type(fn)))
    return self
  end
  local o = check_options(opts, HANDLER_OPTIONS, what)
  local site = sites[self]
  if self.handlers[event_type] then
    misuse(("%s: endpoint %s already has a handler for %s (at %s)"):format(what, self.name, event_type,
           site.handlers[event_type]))
    return self
  end
  local hopts = {}
  for k, v in pairs(o) do hopts[k] = v end
  if kind then hopts[kind] = true end
  self.handlers[event_type] = fn
  self.handler_opts[event_type] = hopts
  site.handlers[event_type] = call_site()
  return self
end

-- ep:on(event_type, fn(event, ctx), { is_alive = fn(ctx) }): the endpoint's handler of a type.
function Endpoint:on(event_type, fn, opts) return add_handler(self, "on", event_type, fn, opts, nil) end

-- A command has exactly one consuming endpoint: the host refuses to start a second one.
function Endpoint:command(command_type, fn, opts)
  return add_handler(self, "command", command_type, fn, opts, "command")
end

-- A request handler: what fn returns (a table) is sent back to the requester
-- (nimbus.request); an error sends an error reply and fails the request as usual.
function Endpoint:reply(request_type, fn, opts)
  return add_handler(self, "reply", request_type, fn, opts, "reply")
end

-- ep:use(fn(event, ctx, next)): middleware around every handler, outermost first.
function Endpoint:use(fn)
  if not is_endpoint(self, "use") then return self end
  if type(fn) ~= "function" then
    misuse(("endpoint:use: middleware must be a function(event, ctx, next), got %s"):format(type(fn)))
    return self
  end
  self.middleware[#self.middleware + 1] = fn
  return self
end

---------------------------------------------------------------------------- request/reply
-- Sends a request to the endpoint that replies to `request_type` (ep:reply) and waits
-- for its reply. Returns the decoded reply, or nil, message, code: "ETIMEDOUT" (no reply
-- in time, default 10 s), "EREPLY" (the responder failed: message is its error),
-- "ENOREPLIER" (no endpoint replies to the type).
function M.request(request_type, payload, opts)
  if type(request_type) ~= "string" or request_type == "" then
    raise("nimbus.request: request type must be a non-empty string")
  end
  if type(payload) ~= "table" then raise("nimbus.request: payload must be a table") end
  opts = check_keys(opts, REQUEST_OPTIONS, "nimbus.request")
  local body, err = cjson.encode(payload)
  if not body then raise("nimbus.request: payload cannot be encoded as JSON: " .. tostring(err)) end
  local timeout = opts.timeout or 10
  if type(timeout) ~= "number" or timeout <= 0 then raise("nimbus.request: timeout must be > 0 seconds") end
  local reply, msg, code = core.request(request_type, body, opts.session and tostring(opts.session), timeout)
  if reply == nil then return nil, msg, code end
  return decode(reply)
end

---------------------------------------------------------------------------- retention
-- nimbus.retention{ resolved = "7d", inbox = "30d" }: the host deletes resolved events
-- (Completed, Skipped, Unsupported) and their history once they are older than
-- `resolved`, and inbox entries older than `inbox`, in small batches in the background.
-- Unresolved events (Failed, Pending, Deferred, DeadLettered) are never deleted.
-- Ages: "45s", "30m", "12h", "7d", "2w", or a number of seconds. `--retention AGE` on the
-- command line overrides this.
function M.retention(opts)
  if type(opts) ~= "table" then
    return misuse("nimbus.retention: give a table { resolved = \"7d\", inbox = \"30d\" }")
  end
  local args, bad = {}, false
  local names = names_of(RETENTION_OPTIONS)
  for k, v in pairs(opts) do
    if k ~= "resolved" and k ~= "inbox" then
      misuse(unknown_option("nimbus.retention", "", k, names))
      bad = true
    else
      if type(v) == "number" then v = tostring(v) end
      if type(v) ~= "string" then
        misuse(("nimbus.retention: %s must be an age such as \"7d\""):format(k))
        bad = true
      end
      args[k] = v
    end
  end
  if bad then return end
  local ok, err = core.set_retention(args.resolved, args.inbox)
  if ok == nil then misuse("nimbus.retention: " .. err) end
end

---------------------------------------------------------------------------- hand-offs
local function coords_of(h, what)
  if type(h) ~= "table" or type(h.event_id) ~= "string" then
    raise(what .. ": the first argument must be a hand-off { event_id = ..., session_id = ..., message_id = ... }")
  end
  return h.event_id, h.endpoint, h.session_id, h.message_id
end

-- Settles a Pending+Handoff event from any task or script: the host completes it
-- (never running the handler again), unblocks its session and replays the parked
-- messages. Returns true, or nil and the reason when the event is not Pending+Handoff
-- (settled already, failed, unknown) — nothing changes then.
M.handoff = {}
function M.handoff.complete(h, result)
  local event_id, endpoint, session, message_id = coords_of(h, "nimbus.handoff.complete")
  local body
  if result ~= nil then
    local err
    body, err = cjson.encode(result)
    if not body then raise("nimbus.handoff.complete: result cannot be encoded as JSON: " .. tostring(err)) end
  end
  return core.handoff("complete", event_id, endpoint, session, message_id, body, h.store)
end

-- Fails it: the event becomes Failed with `text` verbatim and its session stays
-- blocked until an operator resubmits or skips it.
function M.handoff.fail(h, text, error_type)
  local event_id, endpoint, session, message_id = coords_of(h, "nimbus.handoff.fail")
  if type(text) ~= "string" or text == "" then raise("nimbus.handoff.fail: error text must be a non-empty string") end
  if error_type ~= nil and type(error_type) ~= "string" then raise("nimbus.handoff.fail: error type must be a string") end
  return core.handoff("fail", event_id, endpoint, session, message_id, nil, h.store, text, error_type)
end

---------------------------------------------------------------------------- checkers
local Checker = {}
Checker.__index = Checker

-- Pending+Handoff events of this endpoint, oldest first: { event_id, session_id,
-- message_id, event_type, endpoint, reason, external_job_id, expected_by (ISO-8601 or
-- nil), payload (decoded table) }.
function Checker:pending_handoffs()
  local rows = core.pending_handoffs(self.endpoint)
  for _, h in ipairs(rows) do
    if type(h.payload) == "string" then h.payload = decode(h.payload) end
  end
  return rows
end

function Checker:complete(h, result) return M.handoff.complete(h, result) end
function Checker:fail(h, text, error_type) return M.handoff.fail(h, text, error_type) end

-- ep:checker(name, { every = seconds, timeout = seconds }, fn): runs fn(chk) as a task
-- every `every` seconds; a run never overlaps the previous one of the same checker.
function Endpoint:checker(name, opts, fn)
  if not is_endpoint(self, "checker") then return nil end
  if type(name) ~= "string" or name == "" then
    misuse(("endpoint:checker: the name must be a non-empty string, got %s"):format(type(name)))
    return nil
  end
  local what = ("endpoint:checker(%q)"):format(name)
  if type(opts) ~= "table" then
    misuse(("%s: the second argument must be the options { every = seconds }, got %s"):format(what, type(opts)))
    return nil
  end
  local _, ok = check_options(opts, CHECKER_OPTIONS, what)
  if type(fn) ~= "function" then
    misuse(("%s: the checker must be a function(chk), got %s"):format(what, type(fn)))
    return nil
  end
  self.checkers = self.checkers or {}
  if self.checkers[name] then
    misuse(("%s: endpoint %s already has a checker %q (at %s)"):format(what, self.name, name, self.checkers[name].where))
    return nil
  end
  local chk = setmetatable({ endpoint = self.name, name = name }, Checker)
  self.checkers[name] = { every = opts.every, fn = fn, chk = chk, where = call_site() }
  if not ok then return chk end
  local log_ctx = { endpoint = self.name, checker = name }
  core.every(opts.every, function()
    task_ctx[coroutine.running()] = log_ctx
    return fn(chk)
  end, ("checker %s/%s"):format(self.name, name), opts.timeout, self.name, name)
  return chk
end

---------------------------------------------------------------------------- lifecycle hooks
-- nimbus.on(name, fn): fn(info) runs as a task of its own after the outcome committed
-- (docs/observability.md): it may log, publish or call HTTP; if it fails it is logged and
-- counted, and the outcome stands.
local hook_names = { "event_failed", "dead_lettered", "session_blocked", "session_unblocked", "handoff_overdue" }
local hooks = {}
for _, n in ipairs(hook_names) do hooks[n] = {} end

function M.on(name, fn)
  if type(name) ~= "string" or not hooks[name] then
    local hint = suggest(name, hook_names)
    return misuse(("nimbus.on: unknown hook %s%s (hooks: %s)"):format(
      name == nil and "nil" or ("%q"):format(tostring(name)), hint and (" (did you mean " .. hint .. "?)") or "",
      table.concat(hook_names, ", ")))
  end
  if type(fn) ~= "function" then return misuse(("nimbus.on(%q): the hook must be a function(info)"):format(name)) end
  local list = hooks[name]
  list[#list + 1] = fn
  core.hook_add(name)
end

---------------------------------------------------------------------------- publish
-- A payload given as JSON text is sent as those very bytes: re-encoding it through
-- lua-cjson would round integers of more than 14 digits and turn [] into {}. It must be
-- what every handler accepts (internal.run): a JSON object. Returns the body.
local function raw_body(text)
  if not text:find("^%s*{") then
    raise(("nimbus.publish: a payload given as a string must be the JSON text of an object ({...}), got %q; "
           .. "pass a table to have it encoded"):format(text:sub(1, 60)))
  end
  local v, err = cjson.decode(text)
  if type(v) ~= "table" then
    raise(("nimbus.publish: the payload string is not valid JSON (%s): %q; fix the text, or pass a table to have "
           .. "it encoded"):format(tostring(err or "not an object"), text:sub(1, 60)))
  end
  return text
end

-- nimbus.publish(type, payload, { session, correlation_id, to, message_id }) ->
-- message_id, duplicate | nil, message, code. payload: a table (encoded as JSON) or the
-- JSON text of an object (sent unchanged). Inside a handler it is sent when the handler's
-- outcome commits; elsewhere (a task, a script) at once.
function M.publish(event_type, payload, opts)
  if type(event_type) ~= "string" or event_type == "" then
    raise("nimbus.publish: event type must be a non-empty string")
  end
  local body, err
  if type(payload) == "string" then
    body = raw_body(payload)
  elseif type(payload) ~= "table" then
    raise(("nimbus.publish: payload must be a table (encoded as JSON) or the JSON text of an object, got %s")
          :format(type(payload)))
  end
  opts = check_keys(opts, PUBLISH_OPTIONS, "nimbus.publish")
  if not body then
    body, err = cjson.encode(payload)
    if not body then raise("nimbus.publish: payload cannot be encoded as JSON: " .. tostring(err)) end
  end
  local session, corr, to = opts.session, opts.correlation_id, opts.to
  if session ~= nil then session = tostring(session) end
  if corr ~= nil then corr = tostring(corr) end
  if to ~= nil and (type(to) ~= "string" or to == "") then raise("nimbus.publish: `to` must be an endpoint name") end
  local mid = opts.message_id
  if mid ~= nil and (type(mid) ~= "string" or #mid == 0 or #mid > 200 or not utf8.len(mid)) then
    raise("nimbus.publish: message_id must be a UTF-8 string of 1 to 200 bytes (the same id is published once "
          .. "within 24 h)")
  end
  local id, dup, code = core.publish(event_type, body, session, corr, to, mid)
  -- a script without a store to publish to: what to do, at the script's line
  if id == nil and code == "ENOSTORE" then raise("nimbus.publish: " .. tostring(dup)) end
  return id, dup, code
end

---------------------------------------------------------------------------- dispatch
local traceback = debug.traceback

-- Message handler for xpcall: keeps the error value, adds the Lua traceback.
local function capture(err)
  return { err = err, stack = traceback(nil, 2) }
end

-- Liveness checks of running handlers that gave one (ep:on(type, fn, { is_alive = f })),
-- by event id; the host asks at each lock renewal.
local alive_checks = {}

function internal.is_alive(event_id)
  local a = alive_checks[event_id]
  if not a then return true end
  -- its log lines name the handler's endpoint and event, as the handler's own do
  local co = coroutine.running()
  local prev = task_ctx[co]
  task_ctx[co] = a.ctx
  local ok, alive = pcall(a.fn, a.ctx)
  task_ctx[co] = prev
  if not ok then error(alive, 0) end
  return alive and true or false
end

local function run_chain(mw, handler, event, ctx)
  if mw[1] == nil then return handler(event, ctx) end
  local function step(i)
    local f = mw[i]
    if not f then return handler(event, ctx) end
    return f(event, ctx, function() return step(i + 1) end)
  end
  return step(1)
end

-- The outcome of most handlers: one table, read (never changed) by the host.
local COMPLETED = { status = "completed" }

-- Called by the host in a fresh coroutine for every message that needs a handler.
-- Returns a plain table the C side turns into an outcome.
function internal.run(epname, event_type, body, ctx)
  local ep = endpoints[epname]
  local handler = ep and ep.handlers[event_type]
  if not handler then
    return { status = "unsupported",
             error_text = ("endpoint %s has no handler for event type %s"):format(epname, tostring(event_type)) }
  end
  if not (body or ""):find("^%s*{") then
    return { status = "deadletter", error_type = "MalformedPayload",
             error_text = "payload must be a JSON object, got: " .. (body or ""):sub(1, 60) }
  end
  local event, derr = decode(body)
  if event == nil then
    return { status = "deadletter", error_type = "MalformedPayload",
             error_text = "malformed JSON payload: " .. tostring(derr) }
  end
  if type(event) ~= "table" then
    return { status = "deadletter", error_type = "MalformedPayload",
             error_text = "payload must be a JSON object, got " .. type(event) }
  end
  setmetatable(ctx, ctx_mt)
  local co = coroutine.running()
  task_ctx[co] = ctx
  local hopts = ep.handler_opts[event_type]
  local is_alive = hopts.is_alive
  if is_alive then alive_checks[ctx.event_id] = { fn = is_alive, ctx = ctx } end
  local ok, res = xpcall(run_chain, capture, ep.middleware, handler, event, ctx)
  task_ctx[co] = nil
  if is_alive then alive_checks[ctx.event_id] = nil end
  if not ok then
    if type(res) ~= "table" or getmetatable(res) ~= nil then
      -- the message handler itself failed: out of memory (it could not build its table)
      collectgarbage()
      if res == "not enough memory" or res == "error in error handling" then
        return { status = "failed", error_type = "MemoryLimit",
                 error_text = "not enough memory: the handler went past the VM's memory limit" }
      end
      res = { err = res }
    end
    local kind, text, etype, retry_after = errors.classify(res.err)
    return { status = kind, error_text = text, error_type = etype, error_stack = res.stack, retry_after = retry_after }
  end
  local h = rawget(ctx, "_handoff")
  if h then
    return { status = "handoff", handoff_reason = h.reason, external_job_id = h.external_job_id,
             expected_by = h.expected_by }
  end
  if hopts.reply then
    local rbody, jerr = cjson.encode(res == nil and cjson.null or res)
    if not rbody then
      return { status = "failed", error_type = "ReplyEncodingError",
               error_text = "the reply handler returned a value that cannot be encoded as JSON: " .. tostring(jerr) }
    end
    return { status = "completed", reply = rbody }
  end
  return COMPLETED
end

-- The event types an endpoint subscribes to (the host reads this after loading).
-- { [endpoint] = { type, ..., commands = { [type] = true } } }
function internal.subscriptions()
  local out = {}
  for name, ep in pairs(endpoints) do
    local types, commands = {}, {}
    for t in pairs(ep.handlers) do
      types[#types + 1] = t
      if ep.handler_opts[t].command then commands[t] = true end
    end
    table.sort(types)
    types.commands = commands
    out[name] = types
  end
  return out
end

function internal.hook(name, i, info)
  task_ctx[coroutine.running()] = { endpoint = info.endpoint, hook = name }
  return hooks[name][i](info)
end

---------------------------------------------------------------------------- check mode
local function sorted_keys(t)
  local keys = {}
  for k in pairs(t or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- What `nimbus-host check` prints for this adapter, as JSON: { problems = { { where,
-- message } }, endpoints = { { name, where, handlers = { { type, where, kind } },
-- checkers = { { name, where } } } } }. load_error: the error that stopped loading (its
-- first line is "file:line: message"), nil when the main chunk returned.
function internal.check_report(load_error)
  local out, eps = { problems = {}, endpoints = {} }, {}
  for _, p in ipairs(problems) do out.problems[#out.problems + 1] = p end
  for _, name in ipairs(sorted_keys(endpoints)) do
    local ep, site = endpoints[name], sites[endpoints[name]]
    local e = { name = name, where = site.at, handlers = {}, checkers = {} }
    for _, t in ipairs(sorted_keys(ep.handlers)) do
      local o = ep.handler_opts[t]
      e.handlers[#e.handlers + 1] = { type = t, where = site.handlers[t],
                                      kind = o.command and "command" or o.reply and "reply" or "event" }
    end
    for _, c in ipairs(sorted_keys(ep.checkers)) do
      local where = ep.checkers[c].where
      e.checkers[#e.checkers + 1] = { name = c, where = where }
      if #e.handlers == 0 then
        out.problems[#out.problems + 1] = { where = where, message = ("endpoint:checker(%q): endpoint %s handles "
          .. "no event type, so none of its events is ever handed off and the checker has nothing to settle; "
          .. "declare the handlers that call ctx:mark_pending_handoff on the same endpoint"):format(c, name) }
      end
    end
    eps[#eps + 1] = e
  end
  out.endpoints = eps
  if load_error then
    local first = tostring(load_error):match("^(.-)\n%s*stack traceback:") or tostring(load_error)
    out.error = first
  end
  setmetatable(out.problems, cjson.array_mt)
  for _, e in ipairs(eps) do
    setmetatable(e.handlers, cjson.array_mt)
    setmetatable(e.checkers, cjson.array_mt)
  end
  setmetatable(eps, cjson.array_mt)
  return cjson.encode(out)
end

internal.endpoints = endpoints
internal.classes = { Endpoint = Endpoint, Ctx = Ctx, Checker = Checker }

-- nimbus.json.decode(text) -> value | nil, message: integral numbers come back as
-- integers, as in handler payloads. nimbus.json.encode(value) -> text | nil, message.
-- nimbus.json.null stands for JSON null in both directions.
M.json = { decode = decode, encode = cjson.encode, null = cjson.null }

M.http = { request = require("nimbus.http").request, serve = require("nimbus.httpd").serve }
M.sqlite = require("nimbus.sqlite")
M.crypto = require("nimbus.crypto")
return M

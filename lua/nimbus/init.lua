-- nimbus: the Lua half of nimbus-host. Adapters `require("nimbus")` and declare
-- endpoints, handlers and middleware; the host's dispatcher calls M._run for each
-- message, inside its own coroutine, and maps the returned table to an outcome.
local core = require("nimbus.core")   -- C functions registered by the host
local cjson = require("cjson.safe")
local errors = require("nimbus.errors")

local M = { _VERSION = core.version }

local endpoints = {}           -- name -> endpoint object
local task_ctx = setmetatable({}, { __mode = "k" })   -- coroutine -> ctx of the running task

M.permanent = errors.permanent
M.transient = errors.transient

-- Waiting calls yield the running task to the loop; see docs/design.md section 3.
M.sleep = core.sleep     -- nimbus.sleep(seconds)
M.spawn = core.spawn     -- nimbus.spawn(fn, ...): a detached task
M.run = core.run         -- nimbus.run(fn, ...): drive the loop until fn ends (-l scripts, tests)

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

---------------------------------------------------------------------------- context
local Ctx = {}
local lazy = {
  -- ISO-8601 UTC with milliseconds, like every timestamp the CLI prints
  enqueued_at = function(ctx)
    local ms = rawget(ctx, "enqueued_ms") or 0
    return ("%s.%03dZ"):format(os.date("!%Y-%m-%dT%H:%M:%S", ms // 1000), ms % 1000)
  end,
}
Ctx.__index = function(ctx, k)
  local v = Ctx[k]
  if v ~= nil then return v end
  local f = lazy[k]
  if f then
    v = f(ctx)
    rawset(ctx, k, v)
    return v
  end
end

-- Marks the event as handed off to external work: after a normal return the host
-- settles the message, records Pending/Handoff and blocks the session. Last call wins;
-- an error raised after it wins over it.
function Ctx:mark_pending_handoff(opts)
  if type(opts) ~= "table" then
    error("ctx:mark_pending_handoff expects a table { reason = ..., external_job_id = ..., expected_by = seconds }", 2)
  end
  if type(opts.reason) ~= "string" or opts.reason == "" then
    error("ctx:mark_pending_handoff: `reason` must be a non-empty string", 2)
  end
  if opts.external_job_id ~= nil and type(opts.external_job_id) ~= "string" then
    error("ctx:mark_pending_handoff: `external_job_id` must be a string", 2)
  end
  if opts.expected_by ~= nil and (type(opts.expected_by) ~= "number" or opts.expected_by < 0) then
    error("ctx:mark_pending_handoff: `expected_by` must be a number of seconds from now", 2)
  end
  rawset(self, "_handoff", { reason = opts.reason, external_job_id = opts.external_job_id,
                             expected_by = opts.expected_by })
end

---------------------------------------------------------------------------- endpoints
local Endpoint = {}
Endpoint.__index = Endpoint

function M.endpoint(name, opts)
  if type(name) ~= "string" or not name:match("^[%w_%.%-]+$") then
    error("nimbus.endpoint: name must be a non-empty string of letters, digits, '_', '.', '-'", 2)
  end
  if endpoints[name] then error(("nimbus.endpoint: endpoint %q is already defined"):format(name), 2) end
  if opts ~= nil and type(opts) ~= "table" then error("nimbus.endpoint: options must be a table", 2) end
  local ep = setmetatable({ name = name, opts = opts or {}, handlers = {}, handler_opts = {},
                            middleware = {} }, Endpoint)
  local ok, err = core.register_endpoint(name, ep.opts)   -- validates the options
  if ok == nil then error(err, 2) end
  endpoints[name] = ep
  return ep
end

function Endpoint:on(event_type, fn, opts)
  if type(event_type) ~= "string" or event_type == "" then
    error("endpoint:on: event type must be a non-empty string", 2)
  end
  if type(fn) ~= "function" then error(("endpoint:on(%q): handler must be a function"):format(event_type), 2) end
  if opts ~= nil and type(opts) ~= "table" then error("endpoint:on: options must be a table", 2) end
  if self.handlers[event_type] then
    error(("endpoint %s already has a handler for %s"):format(self.name, event_type), 2)
  end
  if opts and opts.is_alive ~= nil and type(opts.is_alive) ~= "function" then
    error("endpoint:on: is_alive must be a function", 2)
  end
  self.handlers[event_type] = fn
  self.handler_opts[event_type] = opts or {}
  return self
end

-- A command has exactly one consuming endpoint: the host refuses to start a second one.
function Endpoint:command(command_type, fn, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("endpoint:command: options must be a table", 2) end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.command = true
  return self:on(command_type, fn, o)
end

-- A request handler: what fn returns (a table) is sent back to the requester
-- (nimbus.request); an error sends an error reply and fails the request as usual.
function Endpoint:reply(request_type, fn, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("endpoint:reply: options must be a table", 2) end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.reply = true
  return self:on(request_type, fn, o)
end

function Endpoint:use(fn)
  if type(fn) ~= "function" then error("endpoint:use: middleware must be a function(event, ctx, next)", 2) end
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
    error("nimbus.request: request type must be a non-empty string", 2)
  end
  if type(payload) ~= "table" then error("nimbus.request: payload must be a table", 2) end
  opts = opts or {}
  local body, err = cjson.encode(payload)
  if not body then error("nimbus.request: payload cannot be encoded as JSON: " .. tostring(err), 2) end
  local timeout = opts.timeout or 10
  if type(timeout) ~= "number" or timeout <= 0 then error("nimbus.request: timeout must be > 0 seconds", 2) end
  local reply, msg, code = core.request(request_type, body, opts.session and tostring(opts.session), timeout)
  if reply == nil then return nil, msg, code end
  return M._decode(reply)
end

---------------------------------------------------------------------------- hand-offs
local function coords_of(h, what)
  if type(h) ~= "table" or type(h.event_id) ~= "string" then
    error(what .. ": the first argument must be a hand-off { event_id = ..., session_id = ..., message_id = ... }", 3)
  end
  return h.event_id, h.endpoint, h.session_id, h.message_id
end

-- Settles a Pending+Handoff event from any task or script: the host completes it
-- (never running the handler again), unblocks its session and replays the parked
-- messages. Returns true, or nil and the reason when the event is not Pending+Handoff
-- (settled already, failed, unknown) — nothing changes then.
-- nimbus.retention{ resolved = "7d", inbox = "30d" }: the host deletes resolved events
-- (Completed, Skipped, Unsupported) and their history once they are older than
-- `resolved`, and inbox entries older than `inbox`, in small batches in the background.
-- Unresolved events (Failed, Pending, Deferred, DeadLettered) are never deleted.
-- Ages: "45s", "30m", "12h", "7d", "2w", or a number of seconds. `--retention AGE` on the
-- command line overrides this.
function M.retention(opts)
  if type(opts) ~= "table" then error("nimbus.retention: give a table { resolved = \"7d\", inbox = \"30d\" }", 2) end
  local args = {}
  for k, v in pairs(opts) do
    if k ~= "resolved" and k ~= "inbox" then
      error(("nimbus.retention: unknown option %s (resolved, inbox)"):format(tostring(k)), 2)
    end
    if type(v) == "number" then v = tostring(v) end
    if type(v) ~= "string" then error(("nimbus.retention: %s must be an age such as \"7d\""):format(k), 2) end
    args[k] = v
  end
  local ok, err = core.set_retention(args.resolved, args.inbox)
  if ok == nil then error("nimbus.retention: " .. err, 2) end
end

M.handoff = {}
function M.handoff.complete(h, result)
  local event_id, endpoint, session, message_id = coords_of(h, "nimbus.handoff.complete")
  local body
  if result ~= nil then
    local err
    body, err = cjson.encode(result)
    if not body then error("nimbus.handoff.complete: result cannot be encoded as JSON: " .. tostring(err), 2) end
  end
  return core.handoff("complete", event_id, endpoint, session, message_id, body, h.store)
end

-- Fails it: the event becomes Failed with `text` verbatim and its session stays
-- blocked until an operator resubmits or skips it.
function M.handoff.fail(h, text, error_type)
  local event_id, endpoint, session, message_id = coords_of(h, "nimbus.handoff.fail")
  if type(text) ~= "string" or text == "" then error("nimbus.handoff.fail: error text must be a non-empty string", 2) end
  if error_type ~= nil and type(error_type) ~= "string" then error("nimbus.handoff.fail: error type must be a string", 2) end
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
    if type(h.payload) == "string" then h.payload = M._decode(h.payload) end
  end
  return rows
end

function Checker:complete(h, result) return M.handoff.complete(h, result) end
function Checker:fail(h, text, error_type) return M.handoff.fail(h, text, error_type) end

-- ep:checker(name, { every = seconds, timeout = seconds }, fn): runs fn(chk) as a task
-- every `every` seconds; a run never overlaps the previous one of the same checker.
function Endpoint:checker(name, opts, fn)
  if type(name) ~= "string" or name == "" then error("endpoint:checker: name must be a non-empty string", 2) end
  if type(opts) ~= "table" or type(opts.every) ~= "number" or opts.every <= 0 then
    error(("endpoint:checker(%q): options must give every = seconds (> 0)"):format(name), 2)
  end
  if type(fn) ~= "function" then error(("endpoint:checker(%q): the checker must be a function(chk)"):format(name), 2) end
  self.checkers = self.checkers or {}
  if self.checkers[name] then error(("endpoint %s already has a checker %q"):format(self.name, name), 2) end
  local chk = setmetatable({ endpoint = self.name, name = name }, Checker)
  self.checkers[name] = { every = opts.every, fn = fn, chk = chk }
  local log_ctx = { endpoint = self.name, checker = name }
  core.every(opts.every, function()
    task_ctx[coroutine.running()] = log_ctx
    return fn(chk)
  end, ("checker %s/%s"):format(self.name, name), opts.timeout, self.name, name)
  return chk
end

-- The event types an endpoint subscribes to (the host reads this after loading).
-- { [endpoint] = { type, ..., commands = { [type] = true } } }
function M._subscriptions()
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

---------------------------------------------------------------------------- lifecycle hooks
-- nimbus.on(name, fn): fn(info) runs as a task of its own after the outcome committed
-- (docs/observability.md): it may log, publish or call HTTP; if it fails it is logged and
-- counted, and the outcome stands.
local hook_names = { "event_failed", "dead_lettered", "session_blocked", "session_unblocked", "handoff_overdue" }
local hooks = {}
for _, n in ipairs(hook_names) do hooks[n] = {} end

function M.on(name, fn)
  if type(name) ~= "string" or not hooks[name] then
    error(("nimbus.on: unknown hook %s (hooks: %s)"):format(name == nil and "nil" or ("%q"):format(tostring(name)),
          table.concat(hook_names, ", ")), 2)
  end
  if type(fn) ~= "function" then error(("nimbus.on(%q): the hook must be a function(info)"):format(name), 2) end
  local list = hooks[name]
  list[#list + 1] = fn
  core.hook_add(name)
end

function M._hook(name, i, info)
  task_ctx[coroutine.running()] = { endpoint = info.endpoint, hook = name }
  return hooks[name][i](info)
end

---------------------------------------------------------------------------- publish
function M.publish(event_type, payload, opts)
  if type(event_type) ~= "string" or event_type == "" then
    error("nimbus.publish: event type must be a non-empty string", 2)
  end
  if type(payload) ~= "table" then error("nimbus.publish: payload must be a table", 2) end
  if opts ~= nil and type(opts) ~= "table" then error("nimbus.publish: options must be a table", 2) end
  opts = opts or {}
  local body, err = cjson.encode(payload)
  if not body then error("nimbus.publish: payload cannot be encoded as JSON: " .. tostring(err), 2) end
  local session = opts.session
  if session ~= nil then session = tostring(session) end
  local mid = opts.message_id
  if mid ~= nil and (type(mid) ~= "string" or #mid == 0 or #mid > 200 or not utf8.len(mid)) then
    error("nimbus.publish: message_id must be a UTF-8 string of 1 to 200 bytes (the same id is published once "
          .. "within 24 h)", 2)
  end
  return core.publish(event_type, body, session, opts.correlation_id, opts.to, mid)
end

---------------------------------------------------------------------------- dispatch
local traceback = debug.traceback
local tointeger = math.tointeger

-- lua-cjson decodes every number as a float; JSON has one number type, and adapter
-- authors expect 42 (not 42.0) in messages, keys and string concatenation.
local function integralize(t, depth)
  if depth > 64 then return end
  for k, v in pairs(t) do
    local tv = type(v)
    if tv == "number" then
      local i = tointeger(v)
      if i then t[k] = i end
    elseif tv == "table" then
      integralize(v, depth + 1)
    end
  end
end

local function decode(body)
  local v, err = cjson.decode(body or "")
  if type(v) == "table" then integralize(v, 0) end
  return v, err
end
M._decode = decode

-- Message handler for xpcall: keeps the error value, adds the Lua traceback.
local function capture(err)
  return { err = err, stack = traceback(nil, 2) }
end

-- Liveness checks of running handlers that gave one (ep:on(type, fn, { is_alive = f })),
-- by event id; the host asks at each lock renewal.
local alive_checks = {}

function M._is_alive(event_id)
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

-- Called by the host in a fresh coroutine for every message that needs a handler.
-- Returns a plain table the C side turns into an outcome.
function M._run(epname, event_type, body, ctx)
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
  setmetatable(ctx, Ctx)
  local co = coroutine.running()
  task_ctx[co] = ctx
  local is_alive = ep.handler_opts[event_type].is_alive
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
    local kind, text, etype = errors.classify(res.err)
    return { status = kind, error_text = text, error_type = etype, error_stack = res.stack }
  end
  local h = rawget(ctx, "_handoff")
  if h then
    return { status = "handoff", handoff_reason = h.reason, external_job_id = h.external_job_id,
             expected_by = h.expected_by }
  end
  if ep.handler_opts[event_type].reply then
    local body, jerr = cjson.encode(res == nil and cjson.null or res)
    if not body then
      return { status = "failed", error_type = "ReplyEncodingError",
               error_text = "the reply handler returned a value that cannot be encoded as JSON: " .. tostring(jerr) }
    end
    return { status = "completed", reply = body }
  end
  return { status = "completed" }
end

M._endpoints = endpoints
M.http = { request = require("nimbus.http").request, serve = require("nimbus.httpd").serve }
M.sqlite = require("nimbus.sqlite")
return M

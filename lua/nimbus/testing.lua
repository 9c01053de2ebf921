-- nimbus.testing: unit tests for adapter handlers under busted, without a broker, a store
-- or the host's event loop. Runs under stock lua5.4 and inside `nimbus-host -l busted`.
--
--   local testing = require("nimbus.testing")
--   local app = testing.load("adapters/erp.lua", { http = routes_or_fn, now = 1764680000 })
--   local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" }, { session_id = "A1" })
--   testing.assert_completed(out)
--   local run = app:run_checker("ErpEndpoint", "dmf-jobs", { pending = { { event_id = "e1", ... } } })
--
-- testing.load(path | function, opts): runs the adapter's main chunk in a fresh `nimbus`
--   (its own endpoint registry) over fake C modules; raises if the adapter raises.
--   opts.http: a function(req) or a table { ["PUT http://x/y"] = response | function(req) }.
--     req = { method, url, headers, body, json (decoded body), timeout }. A response is
--     { status = 200, headers = {}, body = "..." | json = {...}, delay = seconds } (or just a
--     status number); a delay >= the request's timeout gives nil, msg, "ETIMEDOUT". A function
--     may return nil, msg, code. A URL without a fake gets nil, "no fake response for METHOD
--     URL", "ECONNREFUSED". A fake that raises makes app:send raise (it is the test's bug).
--   opts.now: the fake clock's start (seconds; default os.time()). nimbus.sleep returns at
--     once and moves it; so do response delays. nimbus.now() and ctx.enqueued_at read it;
--     os.time() does not.
--   app:set_http(conf) replaces the fake; app:advance(s) moves the clock; app.nimbus is the
--   adapter's nimbus; app.endpoints its declared endpoints by name ({ name, opts, handlers,
--   handler_opts, middleware, checkers }); app.startup records what the main chunk did
--   (logs, published, ...). Mistakes in the adapter's configuration (an unknown endpoint
--   option, a second handler for a type) raise from testing.load, naming the adapter's line.
-- app:send(endpoint, event_type, payload, ctx_fields) -> out. payload: a table (sent as
--   JSON) or a string (sent as is: malformed JSON). ctx defaults: event_id "test-event-N",
--   message_id "test-message-N", session_id "test-session", kind "event", retry_count 0.
--   out.status: completed | failed | deadletter | transient | unsupported | handoff, and
--   out.error_text, error_type, error_stack, handoff { reason, external_job_id, expected_by },
--   reply (what an ep:reply handler returned, decoded),
--   exactly as the runtime's handler runner returns them to the host (and out.retry_after,
--   the seconds a transient error asked for). out.published { type, payload, body, message_id,
--   opts { session, correlation_id, to, message_id } }: a handler's publishes count only when it
--   completes or hands off (as in the host); otherwise they are in out.discarded. A message_id
--   given to nimbus.publish is the message's id, and, as in the host, is published once: a
--   second publish of it returns id, true (a duplicate) and is not recorded (a handler's
--   publishes claim their ids when it completes, per endpoint; others at once). out.http:
--   the requests made. out.slept (total seconds), out.sleeps, out.logs { level, message },
--   out.ctx, out.settled { completed, failed } (nimbus.handoff.* calls).
--   nimbus.spawn: spawned tasks run after the handler's outcome is known, in order, each to
--   completion, unless task:wait() runs one earlier (at once, to completion); their
--   publishes are sent at once (they are not the handler's); the errors of tasks nobody
--   waited for are in out.spawn_errors. task:cancel() before it ran means it never runs.
--   A task still waiting after testing.max_waits waits is stopped and listed in out.stopped.
-- app:run_checker(endpoint, name, { pending = rows }) -> run: runs the checker once;
--   chk:pending_handoffs() returns copies of rows not settled yet (payload tables are
--   decoded the host's way). run.completed { h, result }, run.failed { h, text, type },
--   run.error / error_stack when the checker raised, plus published, http, logs, slept.
--   Settling an event twice gives nil, msg, "ESTATE"; an unknown event nil, msg, "ENOTFOUND".
-- app:run_every(name) -> run: runs a nimbus.every function once (name: its `name` option,
--   else "nimbus.every at FILE:LINE"); run has published, http, logs, slept, error.
-- app:serve_request(method, "/path?q=1", { headers, body | json, port }) -> { status,
--   headers, body, json, error, published, http, logs }: calls a route of the server the
--   adapter started with nimbus.http.serve (no socket is opened).
-- nimbus.sqlite and nimbus.crypto are the real ones inside nimbus-host; under plain lua5.4
-- using them raises.
-- Not simulated: checker timeouts, CPU budgets, memory limits.
-- Assertions with readable failures: testing.assert_completed(out), assert_failed(out,
--   pattern), assert_dead_lettered(out, pattern), assert_transient(out, pattern),
--   assert_unsupported(out), assert_handoff(out, { field = value }). Patterns are Lua patterns.
local cjson = require("cjson.safe")

local M = {}

local unpack, pack = table.unpack, table.pack

-- A spawned task (or a handler) is abandoned after this many waits: a background loop
-- (`while true do nimbus.sleep(5) ... end`) would otherwise never end under a fake clock.
M.max_waits = 1000

local SQLITE_MISSING = "nimbus.sqlite is implemented in C by nimbus-host and plain lua5.4 does not have it: "
  .. "run this spec inside the host: nimbus-host -l /usr/bin/busted --lpath=... SPEC"

---------------------------------------------------------------------------- helpers
local function copy(t)
  local c = {}
  for k, v in pairs(t or {}) do c[k] = v end
  return c
end

local function errtext(e)
  if type(e) == "string" then return e end
  local mt = getmetatable(e)
  if mt and mt.__tostring then return tostring(e) end
  if type(e) == "table" and (e.message or e.msg) then return tostring(e.message or e.msg) end
  return "(error object is a " .. type(e) .. " value)"
end

local function new_record()
  return { logs = {}, published = {}, discarded = {}, buffered = {}, http = {}, sleeps = {}, slept = 0,
           spawned = {}, spawn_errors = {}, stopped = {}, completed = {}, failed = {} }
end

local App = {}
App.__index = App

---------------------------------------------------------------------------- module isolation
local function is_private(name)
  return (name == "nimbus" or name:sub(1, 7) == "nimbus.") and name ~= "nimbus.testing"
end

local FAKED = { "nimbus.core", "nimbus.http.core", "nimbus.httpd.core", "nimbus.sqlite.core" }

-- Swaps this app's modules into package.loaded (and its fakes into package.preload) for the
-- length of fn, then puts back exactly what was there; modules loaded meanwhile stay the app's.
function App:_within(rec, fn, ...)
  local saved_loaded, saved_preload, saved_path = {}, {}, package.path
  for k, v in pairs(package.loaded) do saved_loaded[k] = v end
  for _, name in ipairs(FAKED) do saved_preload[name] = package.preload[name] end
  for k in pairs(saved_loaded) do if is_private(k) then package.loaded[k] = nil end end
  for k, v in pairs(self._modules) do package.loaded[k] = v end
  for name, open in pairs(self._preload) do
    if name ~= "nimbus.sqlite.core" or saved_preload[name] == nil then package.preload[name] = open end
  end
  if self._dir then package.path = self._dir .. "/?.lua;" .. self._dir .. "/?/init.lua;" .. package.path end
  local outer = self._rec
  self._rec = rec
  local r = pack(pcall(fn, ...))
  self._rec = outer
  for k, v in pairs(package.loaded) do
    if saved_loaded[k] ~= v then self._modules[k] = v end
  end
  for k in pairs(self._modules) do package.loaded[k] = saved_loaded[k] end
  for k, v in pairs(saved_loaded) do package.loaded[k] = v end
  for _, name in ipairs(FAKED) do package.preload[name] = saved_preload[name] end
  package.path = saved_path
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, r.n)
end

---------------------------------------------------------------------------- tasks
-- Runs fn(...) in a coroutine the way the host runs a task; every wait (nimbus.sleep,
-- nimbus.http.request) yields to this driver, which resumes at once (the fake clock moved).
function App:_task(fn, ...)
  local co = coroutine.create(fn)
  self._tasks[co] = true
  local was = self._running
  self._running = true
  local r = pack(coroutine.resume(co, ...))
  local waits = 0
  while r[1] and coroutine.status(co) == "suspended" do
    waits = waits + 1
    if waits > M.max_waits then
      self._running = was
      self._tasks[co] = nil
      return false, ("stopped by nimbus.testing after %d waits (a task that never ends?)"):format(M.max_waits),
             debug.traceback(co), true
    end
    r = pack(coroutine.resume(co))
  end
  self._running = was
  self._tasks[co] = nil
  if not r[1] then return false, r[2], debug.traceback(co) end
  return true, pack(unpack(r, 2, r.n))
end

function App:_wait_check(what)
  local co, main = coroutine.running()
  if main or not self._tasks[co] then
    error(("%s must be called from a task (a handler, middleware, status checker, HTTP route or "
           .. "nimbus.spawn function), not from %s"):format(what, self._running and "a coroutine created inside one"
           or "the main chunk"), 3)
  end
  if not coroutine.isyieldable() then
    error(("%s cannot wait here: it was called across a C boundary (a __gc or other metamethod, a "
           .. "table.sort comparator, a string.gsub callback...)"):format(what), 3)
  end
end

-- Runs one spawned task to completion. Its publishes are its own, sent at once, even
-- when a handler waits for it; an error nobody waits for is logged, as the host does.
function App:_run_spawned(rec, task)
  task._state = "started"
  local was = rec.in_handler
  rec.in_handler = false
  local ok, res, _, stopped = self:_task(unpack(task._call, 1, task._call.n))
  rec.in_handler = was
  if task._state == "cancelled" then return end   -- cancelled while it ran (from a task it waited for)
  if ok then
    task._state, task._results = "done", res
    return
  end
  task._state, task._error = "failed", res
  if stopped then
    rec.stopped[#rec.stopped + 1] = res
  elseif not task._waited then
    rec.spawn_errors[#rec.spawn_errors + 1] = errtext(res)
    rec.logs[#rec.logs + 1] = { level = "error", message = "a nimbus.spawn task failed: " .. errtext(res) }
  end
end

-- Spawned tasks run after the call that spawned them, in order, each to completion.
function App:_drain(rec)
  local i = 1
  while rec.spawned[i] do
    local task = rec.spawned[i]
    if task._state == "pending" then self:_run_spawned(rec, task) end
    i = i + 1
  end
end

---------------------------------------------------------------------------- task handles
-- What nimbus.spawn returns under test: the host's task handle, driven by the fake loop.
local Task = {}
Task.__index = Task

function Task:wait()
  local app = self._app
  app:_wait_check("task:wait")
  self._waited = true
  if self._state == "pending" then app:_run_spawned(app._rec, self) end
  if self._state == "started" then
    error("task:wait: the task is waiting, directly or through the tasks it waits for, for the task that "
          .. "waits for it: neither can ever end", 2)
  end
  if self._state == "cancelled" then error("task:wait: the task was cancelled (task:cancel())", 2) end
  if self._state == "failed" then error(self._error, 0) end
  return unpack(self._results, 1, self._results.n)
end

function Task:cancel()
  if self._state == "pending" or self._state == "started" then
    self._state = "cancelled"
    return true
  end
  return false
end

function Task:status()
  if self._state == "pending" or self._state == "started" then return "running" end
  return self._state
end

Task.__tostring = function(t) return "nimbus task (" .. t:status() .. ")" end

local Every = {}
Every.__index = Every
function Every:cancel()
  local was = not self._entry.cancelled
  self._entry.cancelled = true
  return was
end

---------------------------------------------------------------------------- fake C modules
local function decode_table(s)
  if type(s) ~= "string" then return nil end
  local v = cjson.decode(s)
  if type(v) ~= "table" then return nil end
  return v
end

function App:_decode(s)
  local internal = self._internal
  if internal and type(s) == "string" then
    local v = internal.decode(s)
    if type(v) == "table" then return v end
    return nil
  end
  return decode_table(s)
end

local LEVELS = { debug = true, info = true, warn = true, error = true }

function App:_make_core()
  local app = self
  local core = { version = "nimbus.testing" }
  -- list: { key, value, ... } from nimbus.log, the first nctx pairs the running task's
  -- (endpoint, event_id, ...). A record { level, message } keeps the line as specs have
  -- always read it: "[endpoint event_id] msg key=value ...".
  function core.log(level, msg, list, nctx)
    level = level or "info"
    if not LEVELS[level] then error("bad argument #1 to 'log' (invalid option '" .. tostring(level) .. "')", 2) end
    local text, prefix = tostring(msg), {}
    list, nctx = list or {}, nctx or 0
    for i = 1, #list - 1, 2 do
      local k, v = list[i], list[i + 1]
      if type(v) == "table" then v = v[1] end   -- JSON text of a table value
      if (i + 1) // 2 <= nctx then
        if k == "endpoint" or k == "event_id" or k == "checker" then prefix[#prefix + 1] = tostring(v) end
      else
        text = text .. " " .. k .. "=" .. tostring(v)
      end
    end
    if #prefix > 0 then text = "[" .. table.concat(prefix, " ") .. "] " .. text end
    local logs = app._rec.logs
    logs[#logs + 1] = { level = level, message = text }
  end
  function core.now() return app.clock end
  function core.register_endpoint(name, opts)
    app._declared[#app._declared + 1] = name
    return true
  end
  function core.set_retention(resolved, inbox)
    app._retention = { resolved = resolved, inbox = inbox }   -- nothing to delete under test
    return true
  end
  -- As the host (dispatch/nh_vmhost.c): a given message_id is the published message's id,
  -- and one already claimed gives (id, true) and publishes nothing. A handler's publish
  -- claims its id when the handler commits (app:send), in the endpoint's scope; any other
  -- publish claims it at once, in one scope shared by all of them.
  function core.publish(event_type, body, session, correlation_id, to, message_id)
    if type(event_type) ~= "string" then error("bad argument #1 to 'publish' (string expected)", 2) end
    if type(body) ~= "string" then error("bad argument #2 to 'publish' (string expected)", 2) end
    local rec = app._rec
    local scope = rec.in_handler and ("endpoint " .. tostring(rec.endpoint)) or "publish"
    if message_id ~= nil and app._claimed[scope .. "\0" .. message_id] then return message_id, true end
    app._msgseq = app._msgseq + 1
    local id = message_id or ("test-published-%d"):format(app._msgseq)
    local entry = { type = event_type, payload = app:_decode(body), body = body, message_id = id,
                    opts = { session = session, correlation_id = correlation_id, to = to, message_id = message_id } }
    if rec.in_handler then
      entry.claim = message_id and (scope .. "\0" .. message_id)
      rec.buffered[#rec.buffered + 1] = entry
    else
      if message_id then app._claimed[scope .. "\0" .. message_id] = true end
      rec.published[#rec.published + 1] = entry
    end
    return id, false
  end
  function core.sleep(secs)
    if type(secs) ~= "number" then error("bad argument #1 to 'sleep' (number expected, got " .. type(secs) .. ")", 2) end
    if not (secs >= 0 and secs < 1e9) then error("bad argument #1 to 'sleep' (seconds must be >= 0)", 2) end
    app:_wait_check("nimbus.sleep")
    local rec = app._rec
    rec.sleeps[#rec.sleeps + 1] = secs
    rec.slept = rec.slept + secs
    app.clock = app.clock + secs
    coroutine.yield()
  end
  function core.spawn(fn, ...)
    if type(fn) ~= "function" then error("bad argument #1 to 'spawn' (function expected, got " .. type(fn) .. ")", 2) end
    local rec = app._rec
    local task = setmetatable({ _app = app, _call = pack(fn, ...), _state = "pending" }, Task)
    rec.spawned[#rec.spawned + 1] = task
    return task
  end
  function core.run(fn, ...)
    if type(fn) ~= "function" then error("bad argument #1 to 'run' (function expected, got " .. type(fn) .. ")", 2) end
    if app._running then
      error("nimbus.run drives the event loop and cannot be called from a task; "
            .. "call the function directly or use nimbus.spawn", 2)
    end
    local ok, res = app:_task(fn, ...)
    app:_drain(app._rec)
    if not ok then error(res, 0) end
    return unpack(res, 1, res.n)
  end
  -- nimbus.on (it validated the name): counted; the host fires hooks, a test calls them
  function core.hook_add(name)
    app.hooks[name] = (app.hooks[name] or 0) + 1
  end
  function core.every(secs, fn, label, timeout, endpoint, checker)
    if type(secs) ~= "number" or secs <= 0 then error("bad argument #1 to 'every' (interval must be > 0 seconds)", 2) end
    if type(fn) ~= "function" then error("bad argument #2 to 'every' (function expected)", 2) end
    local entry = { every = secs, fn = fn, label = label, timeout = timeout, checker = checker and endpoint .. "/" .. checker }
    app._everies[#app._everies + 1] = entry
    return setmetatable({ _entry = entry }, Every)
  end
  -- rows for chk:pending_handoffs(): copies of the run's `pending`, minus those settled
  function core.pending_handoffs(endpoint)
    local rec, rows = app._rec, {}
    for _, h in ipairs(rec.pending or {}) do
      if (h.endpoint or rec.endpoint) == endpoint and not rec.settled[h.event_id] then
        local row = copy(h)
        row.endpoint = row.endpoint or endpoint
        if type(row.payload) == "table" then row.payload = cjson.encode(row.payload) end
        rows[#rows + 1] = row
      end
    end
    return rows
  end
  function core.handoff(kind, event_id, endpoint, session, message_id, result, store, text, error_type)
    local rec = app._rec
    local h = { event_id = event_id, endpoint = endpoint, session_id = session, message_id = message_id }
    if rec.pending then
      local found
      for _, p in ipairs(rec.pending) do if p.event_id == event_id then found = p end end
      if not found then return nil, ("event %s not found"):format(event_id), "ENOTFOUND" end
      if rec.settled[event_id] then
        return nil, ("event %s is not Pending+Handoff (settled already)"):format(event_id), "ESTATE"
      end
      rec.settled[event_id] = true
      h = found
    end
    if kind == "complete" then
      rec.completed[#rec.completed + 1] = { event_id = event_id, h = h, result = app:_decode(result), body = result }
    else
      rec.failed[#rec.failed + 1] = { event_id = event_id, h = h, text = text, type = error_type }
    end
    return true
  end
  return core
end

-- The configured fake for one request: a function(req) or a table of "METHOD URL" routes.
function App:_respond(req)
  local conf, responder = self._http, nil
  if type(conf) == "function" then
    responder = conf
  elseif type(conf) == "table" then
    responder = conf[req.method .. " " .. req.url]
  end
  if responder == nil then
    return nil, ("no fake response for %s %s"):format(req.method, req.url), "ECONNREFUSED"
  end
  local res, msg, code = responder, nil, nil
  if type(responder) == "function" then
    local r = pack(pcall(responder, req))
    if not r[1] then
      error(("nimbus.testing: the fake http response for %s %s raised: %s"):format(req.method, req.url, errtext(r[2])), 0)
    end
    res, msg, code = r[2], r[3], r[4]
  end
  if res == nil then
    if msg == nil then
      error(("nimbus.testing: the fake http response for %s %s returned nothing; return a response "
             .. "{ status, headers, body | json } or nil, message, code"):format(req.method, req.url), 0)
    end
    return nil, tostring(msg), code and tostring(code) or "EIO"
  end
  if type(res) == "number" then res = { status = res } end
  if type(res) ~= "table" then
    error(("nimbus.testing: the fake http response for %s %s is a %s; expected a table { status, headers, body | json }")
          :format(req.method, req.url, type(res)), 0)
  end
  local status = math.tointeger(res.status or 200)
  if not status then error(("nimbus.testing: the fake http response for %s %s has a bad status %s")
                           :format(req.method, req.url, tostring(res.status)), 0) end
  local headers, body = copy(res.headers), res.body
  if res.json ~= nil then
    body = assert(cjson.encode(res.json))
    local has_ct = false
    for k in pairs(headers) do if k:lower() == "content-type" then has_ct = true end end
    if not has_ct then headers["Content-Type"] = "application/json" end
  end
  local timeout = req.timeout or 30
  if res.delay then
    if res.delay >= timeout then
      self.clock = self.clock + timeout
      return nil, ("Timeout was reached (fake: the response takes %gs, the timeout is %gs)"):format(res.delay, timeout),
             "ETIMEDOUT"
    end
    self.clock = self.clock + res.delay
  end
  return status, headers, body == nil and "" or tostring(body)
end

function App:_make_http_core()
  local app = self
  return { request = function(method, url, headers, body, timeout)
    app:_wait_check("nimbus.http.request")
    local rec = app._rec
    local req = { method = method, url = url, headers = copy(headers), body = body, json = decode_table(body),
                  timeout = timeout }
    rec.http[#rec.http + 1] = req
    local ok, status, h, b = pcall(app._respond, app, req)
    coroutine.yield()
    if not ok then
      rec.kit_error = rec.kit_error or status
      return nil, status, "EFAKE"
    end
    return status, h, b
  end }
end

-- nimbus.http.serve never binds a socket here: the server is recorded and app:serve_request
-- drives its routes (route matching and response shaping are the real nimbus.httpd code).
function App:_make_httpd_core()
  local app = self
  local Listener = {}
  Listener.__index = Listener
  function Listener:port() return self._srv.port end
  function Listener:close() self._srv.open = false end
  function Listener:listening() return self._srv.open end
  Listener.__tostring = function(l) return ("fake HTTP server %s:%d"):format(l._srv.host, l._srv.port) end
  return { listen = function(dispatch, host, port)
    local srv = { dispatch = dispatch, host = host or "127.0.0.1", open = true }
    srv.port = (port and port ~= 0) and port or (49151 + #app._servers + 1)
    app._servers[#app._servers + 1] = srv
    return setmetatable({ _srv = srv }, Listener)
  end }
end

local function sqlite_missing() error(SQLITE_MISSING, 2) end

function App:_make_preload()
  local core, http_core, httpd_core = self:_make_core(), self:_make_http_core(), self:_make_httpd_core()
  return {
    ["nimbus.core"] = function() return core end,
    ["nimbus.http.core"] = function() return http_core end,
    ["nimbus.httpd.core"] = function() return httpd_core end,
    -- only used when the real one (inside nimbus-host) is not there
    ["nimbus.sqlite.core"] = function() return { open = sqlite_missing, blob = sqlite_missing } end,
  }
end

---------------------------------------------------------------------------- load
local LOAD_OPTS = { http = true, now = true }

-- testing.load(path | function, { http = fn | routes, now = seconds }) -> app
function M.load(adapter, opts)
  if type(adapter) ~= "string" and type(adapter) ~= "function" then
    error("nimbus.testing.load expects the adapter's path (or a function that is the adapter)", 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error("nimbus.testing.load: options must be a table", 2) end
  opts = opts or {}
  for k in pairs(opts) do
    if not LOAD_OPTS[k] then error(("nimbus.testing.load: unknown option %q (http, now)"):format(tostring(k)), 2) end
  end
  if opts.now ~= nil and type(opts.now) ~= "number" then error("nimbus.testing.load: `now` must be seconds", 2) end
  local chunk, name, dir = adapter, "function", nil
  if type(adapter) == "string" then
    local err
    chunk, err = loadfile(adapter, "t")
    if not chunk then error("nimbus.testing.load: " .. tostring(err), 2) end
    name, dir = adapter, adapter:match("^(.*)/[^/]*$") or "."
  end
  local app = setmetatable({ clock = opts.now or os.time(), _http = opts.http, _dir = dir, _modules = {},
                             _tasks = setmetatable({}, { __mode = "k" }), _running = false, _declared = {},
                             _everies = {}, hooks = {}, _servers = {}, _msgseq = 0, _seq = 0,
                             _claimed = {} }, App)
  app:set_http(opts.http)
  app._preload = app:_make_preload()
  app.startup = new_record()   -- what the main chunk (and tasks it spawned) logged, published, ...
  local ok, err = pcall(app._within, app, app.startup, function()
    app.nimbus = require("nimbus")
    app._internal = require("nimbus.internal")
    app.endpoints = app._internal.endpoints
    local ok, e = xpcall(chunk, function(e) return debug.traceback(errtext(e), 2) end)
    if not ok then error(e, 0) end
    app:_drain(app.startup)
  end)
  if not ok then
    error(("nimbus.testing.load(%s): the adapter raised an error: %s"):format(name, errtext(err)), 2)
  end
  return app
end

-- app:set_http(fn | routes | nil): the fake answering nimbus.http.request from now on.
function App:set_http(conf)
  if conf ~= nil and type(conf) ~= "function" and type(conf) ~= "table" then
    error("app:set_http: expected a function(req) or a table of \"METHOD URL\" = response | function", 2)
  end
  self._http = conf
end

-- app:advance(seconds): moves the fake clock (nimbus.core's now, ctx.enqueued_at).
function App:advance(secs)
  self.clock = self.clock + secs
  return self.clock
end

function App:_endpoint(name, what)
  local ep = type(name) == "string" and self.endpoints[name]
  if not ep then
    local names = {}
    for n in pairs(self.endpoints) do names[#names + 1] = n end
    table.sort(names)
    error(("%s: the adapter declares no endpoint %q (it declares: %s)")
          :format(what, tostring(name), #names > 0 and table.concat(names, ", ") or "none"), 3)
  end
  return ep
end

---------------------------------------------------------------------------- send
-- app:send(endpoint, event_type, payload (table | raw string), ctx_fields) -> out
function App:send(endpoint, event_type, payload, ctx)
  self:_endpoint(endpoint, "app:send")
  if type(event_type) ~= "string" then error("app:send: event type must be a string", 2) end
  local body
  if type(payload) == "table" then
    local err
    body, err = cjson.encode(payload)
    if not body then error("app:send: payload cannot be encoded as JSON: " .. tostring(err), 2) end
  elseif type(payload) == "string" then
    body = payload
  else
    error("app:send: payload must be a table (sent as JSON) or a string (sent as is)", 2)
  end
  if ctx ~= nil and type(ctx) ~= "table" then error("app:send: ctx must be a table of context fields", 2) end
  self._seq = self._seq + 1
  local n = self._seq
  local c = { endpoint = endpoint, event_type = event_type, event_id = "test-event-" .. n,
              message_id = "test-message-" .. n, session_id = "test-session", correlation_id = "test-message-" .. n,
              kind = "event", retry_count = 0, delivery_count = 1, enqueued_ms = math.floor(self.clock * 1000),
              trace_id = ("%032x"):format(n), traceparent = ("00-%032x-%016x-01"):format(n, n) }
  for k, v in pairs(ctx or {}) do c[k] = v end

  local rec = new_record()
  rec.endpoint = endpoint   -- the scope of its publishes' message ids
  local res = self:_within(rec, function()
    rec.in_handler = true
    local ok, r = self:_task(self._internal.run, endpoint, event_type, body, c)
    rec.in_handler = false
    if not ok then error("nimbus.testing: the handler task did not finish: " .. errtext(r), 0) end
    r = r[1]
    if r.status == "completed" or r.status == "handoff" then
      for _, p in ipairs(rec.buffered) do
        if p.claim then self._claimed[p.claim] = true end
        p.claim = nil
        rec.published[#rec.published + 1] = p
      end
    else
      rec.discarded = rec.buffered
    end
    self:_drain(rec)
    return r
  end)
  if rec.kit_error then error(rec.kit_error, 2) end

  local out = { status = res.status, error_text = res.error_text, error_type = res.error_type,
                error_stack = res.error_stack, retry_after = res.retry_after, ctx = c, published = rec.published, discarded = rec.discarded,
                http = rec.http, slept = rec.slept, sleeps = rec.sleeps, logs = rec.logs,
                spawn_errors = rec.spawn_errors, stopped = rec.stopped,
                settled = { completed = rec.completed, failed = rec.failed } }
  if res.reply ~= nil then out.reply = require("cjson").decode(res.reply) end   -- ep:reply handlers
  if res.status == "handoff" then
    out.handoff = { reason = res.handoff_reason, external_job_id = res.external_job_id, expected_by = res.expected_by }
  end
  return out
end

---------------------------------------------------------------------------- checkers
-- app:run_checker(endpoint, name, { pending = { hand-off rows } }) -> run
function App:run_checker(endpoint, name, opts)
  local ep = self:_endpoint(endpoint, "app:run_checker")
  local entry = ep.checkers and ep.checkers[name]
  if not entry then
    local names = {}
    for n in pairs(ep.checkers or {}) do names[#names + 1] = n end
    table.sort(names)
    error(("app:run_checker: endpoint %s has no checker %q (it has: %s)")
          :format(endpoint, tostring(name), #names > 0 and table.concat(names, ", ") or "none"), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error("app:run_checker: options must be a table { pending = {...} }", 2) end
  local pending = (opts or {}).pending or {}
  for i, h in ipairs(pending) do
    if type(h) ~= "table" or type(h.event_id) ~= "string" then
      error(("app:run_checker: pending[%d] must be a table with an event_id string"):format(i), 2)
    end
  end
  local rec = new_record()
  rec.pending, rec.settled, rec.endpoint = pending, {}, endpoint
  local ok, err, stack = self:_within(rec, function()
    local ok, err, stack = self:_task(entry.fn, entry.chk)
    if not ok then
      rec.logs[#rec.logs + 1] = { level = "error", message = ("checker %s/%s failed (it runs again at the next tick): %s")
                                  :format(endpoint, name, errtext(err)) }
    end
    self:_drain(rec)
    return ok, err, stack
  end)
  if rec.kit_error then error(rec.kit_error, 2) end
  return { completed = rec.completed, failed = rec.failed, published = rec.published, http = rec.http,
           slept = rec.slept, sleeps = rec.sleeps, logs = rec.logs, spawn_errors = rec.spawn_errors,
           stopped = rec.stopped, error = (not ok) and errtext(err) or nil, error_value = (not ok) and err or nil,
           error_stack = (not ok) and stack or nil }
end

---------------------------------------------------------------------------- periodic tasks
-- app:run_every(name) -> run: runs a nimbus.every function once, as its timer would.
function App:run_every(name)
  local found, names = nil, {}
  for _, e in ipairs(self._everies) do
    if not e.checker then
      names[#names + 1] = ("%q"):format(e.label)
      if e.label == name then found = e end
    end
  end
  if not found then
    error(("app:run_every: the adapter has no nimbus.every named %q (it has: %s)")
          :format(tostring(name), #names > 0 and table.concat(names, ", ") or "none"), 2)
  end
  if found.cancelled then error(("app:run_every: %q was cancelled (handle:cancel())"):format(name), 2) end
  local rec = new_record()
  local ok, err, stack = self:_within(rec, function()
    local ok, err, stack = self:_task(found.fn)
    if not ok then
      rec.logs[#rec.logs + 1] = { level = "error", message = ("%s failed (it runs again at the next tick): %s")
                                  :format(name, errtext(err)) }
    end
    self:_drain(rec)
    return ok, err, stack
  end)
  if rec.kit_error then error(rec.kit_error, 2) end
  return { published = rec.published, http = rec.http, slept = rec.slept, sleeps = rec.sleeps, logs = rec.logs,
           spawn_errors = rec.spawn_errors, stopped = rec.stopped, error = (not ok) and errtext(err) or nil,
           error_value = (not ok) and err or nil, error_stack = (not ok) and stack or nil }
end

---------------------------------------------------------------------------- HTTP routes
local function query_pairs(q)
  local out = {}
  for part in q:gmatch("[^&]+") do
    local k, v = part:match("^([^=]*)=(.*)$")
    out[#out + 1] = k or part
    out[#out + 1] = v or false
  end
  return out
end

-- app:serve_request(method, "/path?query", { headers = {}, body = "" | json = {}, port = n }) -> response
-- Calls a route of the server the adapter started with nimbus.http.serve.
function App:serve_request(method, target, opts)
  if type(method) ~= "string" or type(target) ~= "string" or target:sub(1, 1) ~= "/" then
    error("app:serve_request expects a method and a target like \"/api/customers/1?full=1\"", 2)
  end
  opts = opts or {}
  local srv
  for _, s in ipairs(self._servers) do
    if s.open and (opts.port == nil or s.port == opts.port) then srv = s end
  end
  if not srv then error("app:serve_request: the adapter has no open server (nimbus.http.serve)"
                        .. (opts.port and (" on port " .. opts.port) or ""), 2) end
  local path, query = target:match("^([^?#]*)%??([^#]*)")
  local hpairs, body = {}, opts.body
  for k, v in pairs(opts.headers or {}) do hpairs[#hpairs + 1] = k; hpairs[#hpairs + 1] = tostring(v) end
  if opts.json ~= nil then
    body = assert(cjson.encode(opts.json))
    hpairs[#hpairs + 1] = "Content-Type"; hpairs[#hpairs + 1] = "application/json"
  end
  local rec = new_record()
  local ok, r = self:_within(rec, function()
    local ok, r = self:_task(srv.dispatch, method:upper(), path, query_pairs(query), hpairs, body or "")
    self:_drain(rec)
    return ok, r
  end)
  if rec.kit_error then error(rec.kit_error, 2) end
  if not ok then error("nimbus.testing: the route dispatcher raised (a bug in nimbus.httpd?): " .. errtext(r), 2) end
  local status, rbody, rh, logmsg = unpack(r, 1, r.n)
  local headers = {}
  for i = 1, #(rh or {}), 2 do headers[rh[i]] = rh[i + 1] end
  if logmsg then rec.logs[#rec.logs + 1] = { level = "error", message = logmsg } end
  return { status = status, headers = headers, body = rbody or "", json = self:_decode(rbody), error = logmsg,
           published = rec.published, http = rec.http, slept = rec.slept, sleeps = rec.sleeps, logs = rec.logs,
           spawn_errors = rec.spawn_errors }
end

---------------------------------------------------------------------------- assertions
local function describe(out)
  if type(out) ~= "table" then return "not an outcome: " .. tostring(out) end
  local s = "got status " .. tostring(out.status)
  if out.error_text then s = s .. ": " .. out.error_text end
  if out.error_type then s = s .. " [" .. out.error_type .. "]" end
  if out.handoff then
    s = s .. (" (reason %q, external_job_id %s, expected_by %s)"):format(tostring(out.handoff.reason),
      tostring(out.handoff.external_job_id), tostring(out.handoff.expected_by))
  end
  if out.logs and #out.logs > 0 then
    local lines = {}
    for i = math.max(1, #out.logs - 9), #out.logs do
      lines[#lines + 1] = "  " .. out.logs[i].level .. ": " .. out.logs[i].message
    end
    s = s .. "\nlogs:\n" .. table.concat(lines, "\n")
  end
  if out.error_stack then s = s .. "\n" .. out.error_stack end
  return s
end
M.describe = describe

local function expect_status(out, status, pattern, what)
  if type(out) ~= "table" or out.status ~= status then
    error(("expected %s, %s"):format(what, describe(out)), 3)
  end
  if pattern ~= nil and not tostring(out.error_text):find(pattern) then
    error(("expected %s with an error text matching %q, %s"):format(what, pattern, describe(out)), 3)
  end
  return out
end

-- (parenthesised: not tail calls, so error level 3 is the spec's line)
function M.assert_completed(out) return (expect_status(out, "completed", nil, "a completed outcome")) end
function M.assert_failed(out, pattern) return (expect_status(out, "failed", pattern, "a failed outcome")) end
function M.assert_dead_lettered(out, pattern)
  return (expect_status(out, "deadletter", pattern, "a dead-lettered outcome"))
end
function M.assert_transient(out, pattern) return (expect_status(out, "transient", pattern, "a transient outcome")) end
function M.assert_unsupported(out) return (expect_status(out, "unsupported", nil, "an unsupported outcome")) end

-- assert_handoff(out, { reason = ..., external_job_id = ..., expected_by = ... }): each given field equal
function M.assert_handoff(out, fields)
  expect_status(out, "handoff", nil, "a pending hand-off")
  for k, v in pairs(fields or {}) do
    if out.handoff[k] ~= v then
      error(("expected a hand-off with %s = %s, got %s = %s (%s)"):format(k, tostring(v), k,
            tostring(out.handoff[k]), describe(out)), 2)
    end
  end
  return out
end

return M

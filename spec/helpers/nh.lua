-- nh: helpers for the functional specs (spec/functional). Every spec spawns real
-- nimbus-host processes against its own temporary directory and store.
--
-- Plain lua5.4 (no luv): processes are spawned through `sh -c`; waiting is done by
-- polling a condition with a generous deadline (`nh.eventually`), never a fixed sleep.
--
--   local nh = require("nh")
--   local sb = nh.sandbox()                 -- temp dir + store path + call log path
--   local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" } }
--   local host = sb:start(adapter)          -- waits for `ready:`
--   local mid = sb:publish("Ok", { tag = "a" }, { session = "s1" })
--   local row = sb:wait_message(mid, "Completed")
--   sb:cleanup()                            -- stops every host, removes the dir (after_each)
--
-- Transport: with NH_TRANSPORT unset the hosts use the embedded transport (the store file).
-- With NH_TRANSPORT=amqp://user:pass@host:port (or amqps://) every sandbox gets a fresh
-- RabbitMQ vhost (nh-<hex>, created through the management API at NH_RMQ_MGMT, default
-- http://127.0.0.1:15672, with the URL's credentials) and `sb.transport_url` is the base URL
-- with that vhost as its path. Only the commands that talk to the broker get
-- `--transport sb.transport_url`: the host (`sb:spawn`) and `publish` (`sb:publish`, or
-- `sb:cli{"publish", ...}`); operator commands work on the store alone. `nh.transport` is
-- "embedded" or "amqp"; cleanup deletes the vhost after the hosts stopped.
local cjson = require("cjson")

local M = {}

M.DEADLINE = 20          -- seconds: default deadline for every wait
M.POLL = "0.02"          -- seconds between two checks of a polled condition

---------------------------------------------------------------------------- basics

local function host_bin()
  local bin = os.getenv("NIMBUS_HOST")
  if bin and bin ~= "" then return bin end
  local src = os.getenv("NIMBUS_SOURCE_DIR")
  if src and src ~= "" then return src .. "/build/host/nimbus-host" end
  error("NIMBUS_HOST is not set: run the functional specs through ctest, or export NIMBUS_HOST=path/to/nimbus-host")
end
M.bin = host_bin

-- Quotes one word for sh.
function M.q(s)
  return "'" .. (tostring(s):gsub("'", [['\'']])) .. "'"
end
local q = M.q

local function argv(list)
  local out = {}
  for i, a in ipairs(list) do out[i] = q(a) end
  return table.concat(out, " ")
end

function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function M.write(path, content)
  local f = assert(io.open(path, "wb"))
  assert(f:write(content))
  assert(f:close())
  return path
end

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function sh(cmd)
  local ok, how, code = os.execute(cmd)
  if how == "exit" then return code end
  return 128 + (code or 0)
end
M.sh = sh

-- Runs a shell command line; returns { code, out, err }.
local tmp_seq = 0
function M.capture(cmdline, dir)
  tmp_seq = tmp_seq + 1
  dir = dir or os.getenv("TMPDIR") or "/tmp"
  local base = ("%s/.cmd-%d-%d"):format(dir, tmp_seq, math.random(1, 1e9))
  local code = sh(("%s >%s 2>%s </dev/null"):format(cmdline, q(base .. ".out"), q(base .. ".err")))
  local res = { code = code, out = M.read(base .. ".out") or "", err = M.read(base .. ".err") or "" }
  os.remove(base .. ".out")
  os.remove(base .. ".err")
  return res
end

-- One HTTP request with curl (the admin API's specs): status code and the body decoded
-- with cjson (nulls stay cjson.null). method defaults to GET; body is a string; headers a
-- list of "Name: value", by default Content-Type: application/json when there is a body.
-- The samples of a Prometheus text exposition: { ['name{labels}'] = value }, labels as
-- the host rendered them.
function M.prom_samples(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do
    if not line:find("^#") then
      local key, value = line:match("^(%S+) (%S+)$")
      if key then out[key] = tonumber(value) end
    end
  end
  return out
end

function M.http_json(url, method, body, headers)
  local extra = ""
  for _, h in ipairs(headers or (body and { "Content-Type: application/json" }) or {}) do
    extra = extra .. " -H " .. q(h)
  end
  if body then extra = extra .. " --data-binary " .. q(body) end
  local r = M.capture(("curl -sS --max-time 30 -X %s%s -w '\\n%%{http_code}' %s"):format(method or "GET", extra, q(url)))
  assert(r.code == 0, "curl failed: " .. r.err)
  local text, status = r.out:match("^(.*)\n(%d+)$")
  local ok, decoded = pcall(cjson.decode, text)
  assert(ok, "not JSON: " .. tostring(text))
  return tonumber(status), decoded
end

---------------------------------------------------------------------------- transport

local function percent_decode(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- Splits scheme://[user[:pass]@]hostport[/path][?query]; nil when it is not such a URL.
local function parse_url(url)
  local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
  if not scheme then return nil end
  local query = rest:match("%?.*$") or ""
  rest = rest:sub(1, #rest - #query)
  local authority, path = rest:match("^([^/]*)(.*)$")
  local userinfo, hostport = authority:match("^(.*)@([^@]*)$")
  hostport = hostport or authority
  local user, pass
  if userinfo then
    user, pass = userinfo:match("^([^:]*):(.*)$")
    if not user then user = userinfo end
    user, pass = percent_decode(user), pass and percent_decode(pass)
  end
  return { scheme = scheme:lower(), authority = authority, hostport = hostport, user = user,
           password = pass, path = path, query = query }
end
M.parse_url = parse_url

-- NH_TRANSPORT selects the transport of every sandbox (see the header).
local function transport_config()
  local url = os.getenv("NH_TRANSPORT")
  if url == nil or url == "" or url == "embedded" then return { kind = "embedded" } end
  local u = parse_url(url)
  if not u or (u.scheme ~= "amqp" and u.scheme ~= "amqps") or u.hostport == "" then
    error(("NH_TRANSPORT=%s: expected an amqp:// or amqps:// base URL such as amqp://guest:guest@127.0.0.1:5672"):format(url))
  end
  if u.path ~= "" and u.path ~= "/" then
    error(("NH_TRANSPORT=%s: give the base URL without a vhost path; every sandbox makes its own vhost"):format(url))
  end
  local mgmt = os.getenv("NH_RMQ_MGMT")
  if not mgmt or mgmt == "" then
    mgmt = u.query:match("[?&]management=([^&]+)")
    mgmt = mgmt and percent_decode(mgmt) or "http://127.0.0.1:15672"
  end
  return { kind = "amqp", base = u.scheme .. "://" .. u.authority, query = u.query,
           user = u.user or "guest", password = u.password or "guest", mgmt = mgmt:gsub("/+$", "") }
end

local TRANSPORT = transport_config()
M.transport = TRANSPORT.kind          -- "embedded" or "amqp"
M.transport_config = TRANSPORT

local function random_hex(nbytes)
  local f = io.open("/dev/urandom", "rb")
  local raw = f and f:read(nbytes)
  if f then f:close() end
  if not raw or #raw < nbytes then
    raw = {}
    for i = 1, nbytes do raw[i] = string.char(math.random(0, 255)) end
    raw = table.concat(raw)
  end
  return (raw:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end
M.random_hex = random_hex

-- One call of the RabbitMQ management HTTP API (curl). path is below /api and already
-- percent-encoded. Returns { code, out, err, status } (status = the HTTP status, 0 when
-- there was no answer); raises unless the status is 2xx, unless opts.ok(status) says otherwise.
function M.rmq_api(method, path, body, opts)
  opts = opts or {}
  local cfg = opts.config or TRANSPORT
  local mgmt = opts.mgmt or cfg.mgmt or "http://127.0.0.1:15672"
  local user, pass = opts.user or cfg.user or "guest", opts.password or cfg.password or "guest"
  local args = { "curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}", "-u", user .. ":" .. pass, "-X", method }
  if body then
    args[#args + 1] = "-H"; args[#args + 1] = "content-type: application/json"
    args[#args + 1] = "--data-binary"; args[#args + 1] = type(body) == "string" and body or M.encode(body)
  end
  args[#args + 1] = mgmt .. "/api" .. path
  local out = {}
  for i, a in ipairs(args) do out[i] = M.q(a) end
  local r = M.capture(table.concat(out, " "))
  -- stdout = the response body, then a line with the HTTP status (000: no answer)
  local status_at = r.out:find("\n%d+%s*$")
  r.status = status_at and tonumber(r.out:sub(status_at):match("%d+")) or 0
  r.body = status_at and r.out:sub(1, status_at - 1) or r.out
  local ok = opts.ok or function(st) return st >= 200 and st < 300 end
  if not ok(r.status) then
    error(("management API %s %s/api%s: HTTP %d (curl exit %d) %s %s"):format(method, mgmt, path, r.status, r.code,
      r.body, r.err), 2)
  end
  return r
end

-- Names of a vhost's queues, sorted, from the management API (mgmt: another broker's).
function M.rmq_queue_names(vhost, mgmt)
  local r = M.rmq_api("GET", "/queues/" .. M.urlencode(vhost), nil, { mgmt = mgmt })
  local names = {}
  for _, q in ipairs(M.decode(r.body)) do names[#names + 1] = q.name end
  table.sort(names)
  return names
end

-- One queue of a vhost as the management API shows it (decoded), or nil when there is none.
function M.rmq_queue(vhost, name)
  local r = M.rmq_api("GET", "/queues/" .. M.urlencode(vhost) .. "/" .. M.urlencode(name), nil,
    { ok = function(st) return st == 200 or st == 404 end })
  return r.status == 200 and M.decode(r.body) or nil
end

-- The partition of a session among `partitions` on RabbitMQ: FNV-1a of its id, low bits
-- (host/src/transport/nh_amqp_msg.c, docs/broker-partitions.md).
function M.partition_of(session, partitions)
  local h = 2166136261
  for i = 1, #session do h = ((h ~ session:byte(i)) * 16777619) & 0xffffffff end
  return (h & 0xff) & (partitions - 1)
end

-- A session id `prefix`<k> whose events land in partition `p` of `partitions`.
function M.session_in(p, partitions, prefix)
  for k = 1, 10000 do
    local s = prefix .. k
    if M.partition_of(s, partitions) == p then return s end
  end
end

-- Creates a fresh vhost with full permissions for the transport's user; returns its name.
local function create_vhost()
  local name = "nh-" .. random_hex(8)
  M.rmq_api("PUT", "/vhosts/" .. name)
  M.rmq_api("PUT", "/permissions/" .. name .. "/" .. M.urlencode(TRANSPORT.user),
    { configure = ".*", write = ".*", read = ".*" })
  return name
end

local function delete_vhost(name)
  -- 404: already gone (a second cleanup)
  M.rmq_api("DELETE", "/vhosts/" .. name, nil, { ok = function(st) return (st >= 200 and st < 300) or st == 404 end })
end

function M.urlencode(s)
  return (tostring(s):gsub("[^%w%-._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

-- Polls fn() until it returns a truthy value; returns that value. On timeout raises
-- an error with `what` (a string or a function returning one) for the diagnosis.
function M.eventually(fn, timeout_s, what)
  timeout_s = timeout_s or M.DEADLINE
  local deadline = os.time() + timeout_s + 1   -- os.time is whole seconds: never cut short
  while true do
    local v = fn()
    if v then return v end
    if os.time() > deadline then
      if type(what) == "function" then what = what() end
      error(("condition not met within %d s: %s"):format(timeout_s, tostring(what or "(no description)")), 2)
    end
    os.execute("sleep " .. M.POLL)
  end
end

---------------------------------------------------------------------------- JSON

local null = cjson.null

-- cjson.null -> nil, integral floats -> integers (cjson decodes every number as a float).
local function normalize(v, depth)
  if v == null then return nil end
  if type(v) == "number" then return math.tointeger(v) or v end
  if type(v) ~= "table" or depth > 32 then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = normalize(x, depth + 1) end
  return out
end

function M.decode(s)
  return normalize(cjson.decode(s), 0)
end

function M.encode(v) return cjson.encode(v) end

function M.json_lines(s)
  local rows = {}
  for line in s:gmatch("[^\n]+") do rows[#rows + 1] = M.decode(line) end
  return rows
end

---------------------------------------------------------------------------- hosts

local Host = {}
Host.__index = Host

function Host:log() return M.read(self.log_path) or "" end

-- The port of the host's admin listener, from its log line (nil before it is logged).
function Host:admin_port()
  local log = self:log()
  -- on a PostgreSQL store the listener serves health, readiness and metrics only, and says so
  return tonumber(log:match("operator API on http://127%.0%.0%.1:(%d+)/api/v1/")
                  or log:match("%[admin%] on http://127%.0%.0%.1:(%d+)/") or "")
end

-- The host's exit status, or nil while it runs (the wrapper shell records it).
function Host:exit_code()
  local s = M.read(self.rc_path)
  return s and tonumber(s:match("%d+")) or nil
end

function Host:alive()
  if self:exit_code() then return false end
  return sh("kill -0 " .. self.pid .. " 2>/dev/null") == 0
end

function Host:signal(sig)
  if self:exit_code() == nil then sh(("kill -%s %d 2>/dev/null"):format(sig, self.pid)) end
end

-- Waits for the host to exit; returns its exit status (128+n when killed by signal n).
function Host:wait_exit(timeout_s)
  M.eventually(function() return self:exit_code() ~= nil end, timeout_s or 30,
    function() return ("host pid %d did not exit; log:\n%s"):format(self.pid, self:log()) end)
  return self:exit_code()
end

-- SIGTERM, then waits for the exit (the host drains running handlers first).
function Host:stop()
  self:signal("TERM")
  local ok, code = pcall(self.wait_exit, self, 30)
  if not ok then
    self:signal("KILL")
    self:wait_exit(10)
    error("host did not stop on SIGTERM within 30 s; killed it. log:\n" .. self:log())
  end
  return code
end

-- SIGKILL, then waits for the exit.
function Host:kill()
  self:signal("KILL")
  return self:wait_exit(10)
end

function Host:wait_log(pattern, timeout_s)
  return M.eventually(function() return self:log():find(pattern, 1, true) ~= nil end, timeout_s,
    function() return ("no %q in the host log:\n%s"):format(pattern, self:log()) end)
end

---------------------------------------------------------------------------- sandbox

local Sandbox = {}
Sandbox.__index = Sandbox

function M.sandbox()
  local p = assert(io.popen("mktemp -d \"${TMPDIR:-/tmp}/nh-func.XXXXXXXX\""))
  local dir = p:read("l")
  p:close()
  assert(dir and dir ~= "", "mktemp -d failed")
  local sb = setmetatable({ dir = dir, store = dir .. "/nimbus.db", calls_path = dir .. "/calls.log",
                            adapter_dir = dir .. "/adapters", hosts = {}, nstarts = 0 }, Sandbox)
  assert(sh("mkdir -p " .. q(sb.adapter_dir)) == 0)
  sb.transport = M.transport
  -- NH_STORE_BACKEND=postgres: the sandbox's store is a fresh database of the test cluster
  -- (spec/helpers/pg.lua), dropped at cleanup; the same spec then runs on PostgreSQL.
  if os.getenv("NH_STORE_BACKEND") == "postgres" then
    local pg = require("pg")
    sb.pg_db, sb.store = pg.createdb("sandbox")
  end
  if M.transport == "amqp" then
    local ok, vhost = pcall(create_vhost)
    if not ok then
      sh("rm -rf " .. q(dir))
      error("cannot create the sandbox's RabbitMQ vhost (is the broker up? scripts/rabbitmq.sh start): " .. tostring(vhost), 2)
    end
    sb.vhost = vhost
    sb.transport_url = TRANSPORT.base .. "/" .. M.urlencode(vhost) .. TRANSPORT.query
  end
  return sb
end

function Sandbox:path(name) return self.dir .. "/" .. name end

-- Creates (or empties) the sandbox file `name`; returns its path.
function Sandbox:touch(name) return M.write(self:path(name), "") end

-- Stops every host this sandbox started (SIGTERM, SIGKILL if it lingers), then
-- removes the directory. Safe to call twice and after failures.
function Sandbox:cleanup()
  for _, h in ipairs(self.hosts) do
    if h:exit_code() == nil then
      h:signal("TERM")
      if not pcall(h.wait_exit, h, 15) then
        h:signal("KILL")
        pcall(h.wait_exit, h, 10)
      end
    end
  end
  self.hosts = {}
  if self.pg_db and os.getenv("NH_KEEP") == nil then
    local db = self.pg_db
    self.pg_db = nil
    pcall(require("pg").dropdb, db)
  end
  if self.dir and os.getenv("NH_KEEP") == nil then sh("rm -rf " .. q(self.dir)) end
  if self.vhost and os.getenv("NH_KEEP") == nil then
    local vhost = self.vhost
    self.vhost = nil
    delete_vhost(vhost)
  end
end

-- Appends `--transport URL` to args for the commands that talk to the broker:
-- opts.transport = false leaves it off, a string replaces the sandbox's URL.
function Sandbox:transport_args(args, opts)
  local url = self.transport_url
  if opts and opts.transport ~= nil then url = opts.transport or nil end
  if url then args[#args + 1] = "--transport"; args[#args + 1] = url end
  return args
end

-- Writes an adapter file into the sandbox's adapter directory (kept apart from the
-- store and logs, so watching the adapter directory never sees test traffic).
function Sandbox:adapter(name, source)
  return M.write(self.adapter_dir .. "/" .. name, source)
end

-- Starts `nimbus-host ADAPTER... --store STORE [--transport URL] [args]` in the background.
-- Waits for `ready:` unless opts.wait == false; raises (with the log) if the host exits
-- first. opts.transport: false = no --transport, a string = that URL (see transport_args).
function Sandbox:spawn(adapters, opts)
  opts = opts or {}
  if type(adapters) == "string" then adapters = { adapters } end
  self.nstarts = self.nstarts + 1
  local base = ("%s/host-%d"):format(self.dir, self.nstarts)
  local h = setmetatable({ log_path = base .. ".log", rc_path = base .. ".rc", sb = self }, Host)
  local args = {}
  for _, a in ipairs(adapters) do args[#args + 1] = a end
  if opts.store ~= false then args[#args + 1] = "--store"; args[#args + 1] = opts.store or self.store end
  self:transport_args(args, opts)
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
  -- The wrapper shell records the pid, waits for the host and records its exit status.
  local wrapper = [[bin="$1"; log="$2"; base="$3"; shift 3
"$bin" "$@" >"$log" 2>&1 </dev/null &
p=$!
echo $p >"$base.pid.tmp" && mv "$base.pid.tmp" "$base.pid"
wait $p
echo $? >"$base.rc.tmp" && mv "$base.rc.tmp" "$base.rc"]]
  local env = ""
  for k, v in pairs(opts.env or {}) do env = env .. k .. "=" .. q(v) .. " " end
  local cmd = ("%ssh -c %s sh %s %s %s %s >/dev/null 2>&1 </dev/null &"):format(env, q(wrapper), q(host_bin()),
    q(h.log_path), q(base), argv(args))
  assert(sh(cmd) == 0, "cannot spawn the host")
  local pid = M.eventually(function()
    local s = M.read(base .. ".pid")
    return s and tonumber(s:match("%d+"))
  end, 10, "the host's pid file")
  h.pid = pid
  self.hosts[#self.hosts + 1] = h
  if opts.wait ~= false then
    M.eventually(function()
      return h:log():find("ready:", 1, true) ~= nil or h:exit_code() ~= nil
    end, M.DEADLINE, function() return "host never logged ready:\n" .. h:log() end)
    if not h:log():find("ready:", 1, true) then
      error(("host exited with status %s before ready:\n%s"):format(tostring(h:exit_code()), h:log()), 2)
    end
  end
  return h
end
Sandbox.start = Sandbox.spawn

-- Runs `nimbus-host ARGS... --store STORE` synchronously: { code, out, err }.
-- Pass opts.store = false to leave --store off. A `publish` also gets --transport
-- (opts.transport as in transport_args); no other subcommand does.
function Sandbox:cli(args, opts)
  opts = opts or {}
  local full = {}
  for _, a in ipairs(args) do full[#full + 1] = a end
  if opts.store ~= false then full[#full + 1] = "--store"; full[#full + 1] = opts.store or self.store end
  if args[1] == "publish" then self:transport_args(full, opts) end
  return M.capture(q(host_bin()) .. " " .. argv(full), self.dir)
end

-- Like cli but raises unless the command exits 0; returns stdout.
function Sandbox:cli_ok(args, opts)
  local r = self:cli(args, opts)
  if r.code ~= 0 then
    error(("nimbus-host %s exited %d\nstdout: %s\nstderr: %s"):format(table.concat(args, " "), r.code, r.out, r.err), 2)
  end
  return r.out
end

-- Publishes one event; returns its MessageId. payload: a table (encoded) or a string.
-- Under NH_TRANSPORT it goes over the broker (opts.transport as in transport_args).
function Sandbox:publish(event_type, payload, opts)
  opts = opts or {}
  local args = { "publish", event_type, type(payload) == "string" and payload or M.encode(payload or {}) }
  if opts.session then args[#args + 1] = "--session"; args[#args + 1] = opts.session end
  if opts.correlation_id then args[#args + 1] = "--correlation-id"; args[#args + 1] = opts.correlation_id end
  if opts.to then args[#args + 1] = "--to"; args[#args + 1] = opts.to end
  if opts.raw then args[#args + 1] = "--raw" end
  local out = self:cli_ok(args, { transport = opts.transport })
  local mid = out:match("^%s*(%S+)")
  assert(mid, "publish printed no MessageId")
  return mid
end

-- Audit rows (JSON Lines of `events --json`), decoded, in creation order.
function Sandbox:events(filters)
  local args = { "events", "--json" }
  for k, v in pairs(filters or {}) do args[#args + 1] = "--" .. k; args[#args + 1] = v end
  return M.json_lines(self:cli_ok(args))
end

function Sandbox:show(event_id)
  return M.decode(self:cli_ok({ "show", event_id, "--json" }))
end

function Sandbox:sessions(filters)
  local args = { "sessions", "--json" }
  for k, v in pairs(filters or {}) do
    args[#args + 1] = "--" .. k
    if v ~= true then args[#args + 1] = v end
  end
  return M.json_lines(self:cli_ok(args))
end

-- The session's state row ({blocked_by, draining, parked, retry_due}), or nil when free.
function Sandbox:session(session_id, endpoint)
  for _, s in ipairs(self:sessions(endpoint and { endpoint = endpoint } or nil)) do
    if s.session_id == session_id then return s end
  end
  return nil
end

-- The audit row of event_id, or nil.
function Sandbox:row(event_id)
  for _, r in ipairs(self:events()) do
    if r.event_id == event_id then return r end
  end
  return nil
end

local function describe_rows(rows)
  local out = {}
  for _, r in ipairs(rows) do
    out[#out + 1] = ("%s %s %s %s%s %s"):format(r.endpoint, r.session_id, r.event_id, r.status,
      r.sub_status and ("+" .. r.sub_status) or "", r.error_text or "")
  end
  return table.concat(out, "\n")
end
M.describe_rows = describe_rows

-- Waits for the audit row of the message `mid` (matched on message_id, and on the
-- endpoint when given) to have `status`; returns the row.
function Sandbox:wait_message(mid, status, endpoint)
  local last
  return M.eventually(function()
    last = self:events()
    for _, r in ipairs(last) do
      if r.message_id == mid and (not endpoint or r.endpoint == endpoint) and (not status or r.status == status) then
        return r
      end
    end
  end, M.DEADLINE, function()
    return ("no row for message %s with status %s; rows:\n%s"):format(mid, tostring(status), describe_rows(last or {}))
  end)
end

-- Waits for the audit row of `event_id` to have `status` (and sub_status if given).
function Sandbox:wait_event(event_id, status, sub_status)
  local last
  return M.eventually(function()
    last = self:events()
    for _, r in ipairs(last) do
      if r.event_id == event_id and r.status == status and (sub_status == nil or r.sub_status == sub_status) then
        return r
      end
    end
  end, M.DEADLINE, function()
    return ("event %s never reached %s; rows:\n%s"):format(event_id, status, describe_rows(last or {}))
  end)
end

-- Waits until pred(rows) is truthy for the full list of audit rows; returns the rows.
function Sandbox:wait_rows(pred, what)
  local last
  M.eventually(function()
    last = self:events()
    return pred(last)
  end, M.DEADLINE, function() return (what or "rows") .. "; rows:\n" .. describe_rows(last or {}) end)
  return last
end

-- Waits until at least n audit rows are Completed; returns the rows.
function Sandbox:wait_completed(n)
  return self:wait_rows(function(rows)
    return M.count(rows, function(r) return r.status == "Completed" end) >= n
  end, n .. " Completed events")
end

-- How many messages the store's queue holds (either store: the queue is its table), of
-- those that `where` (SQL both dialects read alike, such as "event_type = 'Follow'") picks.
function Sandbox:queued(where)
  local sql = "SELECT count(*) FROM queue" .. (where and " WHERE " .. where or "")
  if self.pg_db then return tonumber(require("pg").value(self.store, sql)) end
  local r = M.capture(("sqlite3 %s %s"):format(q(self.store), q(sql)))
  assert(r.code == 0, "sqlite3 failed: " .. r.err)
  return tonumber(r.out:match("%d+"))
end

-- Waits until an operator command for event_id has been applied: nothing is queued for
-- it any more, which `show` reveals through its history (the command's
-- "Requested" entry followed by a later one). Returns the show object.
function Sandbox:wait_applied(event_id, requested_count)
  local last
  return M.eventually(function()
    last = self:show(event_id)
    local requested, after = 0, false
    for _, h in ipairs(last.history or {}) do
      if h.status == "Requested" then requested = requested + 1; after = false
      else after = requested > 0 end
    end
    return requested >= (requested_count or 1) and after and last
  end, M.DEADLINE, function() return "operator command never applied: " .. M.encode(last or {}) end)
end

---------------------------------------------------------------------------- call log

-- The recorder adapter appends one JSON object per handler call to calls.log.
function Sandbox:calls()
  local s = M.read(self.calls_path) or ""
  return M.json_lines(s)
end

-- The call log of the multi-host specs' sink adapters (pg_host, pg_amqp), whose lines are
-- "<phase> <session> <seq> <host tag>", as { phase, session, seq, tag } rows in written order.
function Sandbox:sink_calls()
  local rows = {}
  for phase, session, seq, tag in (M.read(self.calls_path) or ""):gmatch("(%a+) (%S+) (%d+) (%S+)\n") do
    rows[#rows + 1] = { phase = phase, session = session, seq = tonumber(seq), tag = tag }
  end
  return rows
end

-- Calls whose field `key` equals `value`.
function Sandbox:calls_where(key, value)
  local out = {}
  for _, c in ipairs(self:calls()) do
    if c[key] == value then out[#out + 1] = c end
  end
  return out
end

function Sandbox:call_count(tag) return #self:calls_where("tag", tag) end

-- Tags of the calls (optionally of one session), in call order.
function Sandbox:call_tags(session)
  local out = {}
  for _, c in ipairs(self:calls()) do
    if not session or c.session == session then out[#out + 1] = c.tag end
  end
  return out
end

-- Generates the standard test adapter. Its handler records every call, then acts on
-- the payload (`n` = calls already made for this tag before this one):
--   fail = true                plain error("boom: <tag>") on every call
--   fail_times = k             plain error while n < k (then completes)
--   message = "text"           the error message for fail / fail_times
--   permanent = "text"         error(nimbus.permanent(text))
--   permanent_from = k         error(nimbus.permanent(...)) once n >= k (after fail_times)
--   transient_times = k        error(nimbus.transient("busy")) while n < k
--   handoff = "reason"         ctx:mark_pending_handoff{ reason, external_job_id = job, expected_by }
--   publish = { {type=, payload=, session=}, ... }   nimbus.publish before the outcome
--   gate = "name"              after recording the call, wait (up to 60 s) until the
--                              sandbox file `name` exists (sb:touch("name"))
-- opts: endpoint (name), types (list of handled types), options (Lua source of the
-- endpoint options table body, e.g. "concurrency = 4, retry = { max_retries = 2 }"),
-- name (file name), extra (more Lua source appended, may use `nimbus`, `record`, `make_handler`).
function Sandbox:recorder(opts)
  opts = opts or {}
  local endpoint = opts.endpoint or "Ep"
  local types = opts.types or { "Ok" }
  local tlist = {}
  for i, t in ipairs(types) do tlist[i] = ("%q"):format(t) end
  local src = ([[
local nimbus = require("nimbus")
local cjson = require("cjson")
local CALLS = %q
local DIR = %q

local function prior_calls(tag)
  local n, f = 0, io.open(CALLS, "r")
  if not f then return 0 end
  for line in f:lines() do
    local ok, c = pcall(cjson.decode, line)
    if ok and c.tag == tag then n = n + 1 end
  end
  f:close()
  return n
end

local function record(event, ctx, endpoint)
  local line = cjson.encode({ tag = event.tag, endpoint = endpoint, event_id = ctx.event_id,
    message_id = ctx.message_id, session = ctx.session_id, correlation_id = ctx.correlation_id,
    type = ctx.event_type, kind = ctx.kind, retry_count = ctx.retry_count }) .. "\n"
  local f = assert(io.open(CALLS, "a"))
  f:setvbuf("full", 4096)
  f:write(line)
  f:close()
end

local function make_handler(endpoint)
  return function(event, ctx)
    local n = prior_calls(event.tag)
    record(event, ctx, endpoint)
    local msg = event.message or ("boom: " .. tostring(event.tag))
    if event.gate then
      -- Holds the handler (and so the host's loop) until the test creates the gate file.
      local deadline = os.time() + 60
      while os.time() < deadline do
        local f = io.open(DIR .. "/" .. event.gate, "r")
        if f then f:close() break end
        -- io.popen, not os.execute: system() ignores SIGINT while it waits, which
        -- would swallow a stop signal sent to the host during the wait.
        local p = io.popen("sleep 0.01")
        if p then p:close() end
      end
    end
    if event.hold then
      -- Holds the handler, not the loop (nimbus.sleep yields), until the test creates the file.
      local deadline = os.time() + 60
      while os.time() < deadline do
        local f = io.open(DIR .. "/" .. event.hold, "r")
        if f then f:close() break end
        nimbus.sleep(0.02)
      end
    end
    if event.publish then
      for _, p in ipairs(event.publish) do
        local id, dup = nimbus.publish(p.type, p.payload or {}, { session = p.session, message_id = p.message_id })
        if p.message_id then   -- what the call said, for specs of idempotent publishing
          local f = assert(io.open(DIR .. "/published.jsonl", "a"))
          f:write(cjson.encode({ by = event.tag, id = id, duplicate = dup }), "\n")
          f:close()
        end
      end
    end
    if event.fail then error(msg) end
    if event.fail_times and n < event.fail_times then error(msg) end
    if event.permanent then error(nimbus.permanent(event.permanent)) end
    if event.permanent_from and n >= event.permanent_from then error(nimbus.permanent("permanent: " .. msg)) end
    if event.transient_times and n < event.transient_times then error(nimbus.transient("busy")) end
    if event.handoff then
      ctx:mark_pending_handoff{ reason = event.handoff, external_job_id = event.job, expected_by = event.expected_by }
    end
  end
end

local ep = nimbus.endpoint(%q, { %s })
for _, t in ipairs({ %s }) do ep:on(t, make_handler(%q)) end
%s
]]):format(self.calls_path, self.dir, endpoint, opts.options or "", table.concat(tlist, ", "), endpoint, opts.extra or "")
  return self:adapter(opts.name or (endpoint .. ".lua"), src)
end

---------------------------------------------------------------------------- AMQP

M.PYTHON = "/usr/bin/python3"   -- Debian's, with python3-qpid-proton (not a pyenv python3)

local function helpers_dir()
  local src = debug.getinfo(1, "S").source
  return (src:sub(1, 1) == "@" and src:sub(2):match("^(.*)/[^/]*$")) or "."
end

-- A RabbitMQ broker of a test's own beside the suite's (one the test stops and starts):
-- scripts/rabbitmq.sh with its own node name (`name`-<hex>), state dir and free ports.
-- b.run("start" | "stop" | ...) raises unless the script succeeds; b.url is its default vhost
-- with the management API in the query, b.mgmt the API's base URL.
function M.private_broker(dir, name)
  local b = {
    env = {
      NH_RMQ_DIR = dir,
      NH_RMQ_NODE = name .. "-" .. M.random_hex(4) .. "@localhost",
      NH_RMQ_PORT = tostring(M.free_port(5682)),
      NH_RMQ_MGMT_PORT = tostring(M.free_port(15682)),
      NH_RMQ_DIST_PORT = tostring(M.free_port(25682)),
      NH_RMQ_TLS_PORT = tostring(M.free_port(5692)),
    },
  }
  local script = (os.getenv("NIMBUS_SOURCE_DIR") or ".") .. "/scripts/rabbitmq.sh"
  function b.run(cmd)
    local env = {}
    for k, v in pairs(b.env) do env[#env + 1] = k .. "=" .. q(v) end
    table.sort(env)
    local r = M.capture(("env %s %s %s"):format(table.concat(env, " "), q(script), cmd))
    if r.code ~= 0 then error(("rabbitmq.sh %s exited %d\n%s%s"):format(cmd, r.code, r.out, r.err), 2) end
    return r
  end
  b.mgmt = "http://127.0.0.1:" .. b.env.NH_RMQ_MGMT_PORT
  b.url = ("amqp://guest:guest@127.0.0.1:%s/?management=%s"):format(b.env.NH_RMQ_PORT, b.mgmt)
  return b
end

-- Puts hand-made AMQP 1.0 messages on the broker with spec/helpers/amqp_send.py.
-- messages: a list of { body =, body_type =, properties = {...}, application_properties = {...} }
-- (see the script); opts.url defaults to the sandbox's transport URL. Raises unless every
-- message was accepted; returns the script's { code, out, err } otherwise.
function Sandbox:amqp_send(address, messages, opts)
  opts = opts or {}
  local url = opts.url or self.transport_url
  assert(url, "amqp_send needs an AMQP transport (NH_TRANSPORT) or opts.url")
  local arg = M.encode({ url = url, address = address, messages = messages })
  local r = M.capture(("%s %s %s"):format(q(M.PYTHON), q(helpers_dir() .. "/amqp_send.py"), q(arg)), self.dir)
  if r.code ~= 0 and not opts.may_fail then
    error(("amqp_send to %s exited %d\nstdout: %s\nstderr: %s"):format(address, r.code, r.out, r.err), 2)
  end
  return r
end

-- A TCP port nothing listens on at 127.0.0.1 right now: `preferred` if it is free, else one
-- the kernel picks.
function M.free_port(preferred)
  local py = [[
import socket, sys
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
p = int(sys.argv[1])
print((p and free(p)) or free(0))
]]
  local r = M.capture(("%s -c %s %d"):format(q(M.PYTHON), q(py), preferred or 0))
  local port = tonumber(r.out:match("%d+"))
  assert(r.code == 0 and port, "cannot find a free port: " .. r.err)
  return port
end

---------------------------------------------------------------------------- misc

function M.count(list, pred)
  local n = 0
  for _, x in ipairs(list) do if pred(x) then n = n + 1 end end
  return n
end

-- How many times `needle` (plain text) occurs in `text`.
function M.occurrences(text, needle)
  local n, at = 0, 1
  while true do
    local i = text:find(needle, at, true)
    if not i then return n end
    n, at = n + 1, i + #needle
  end
end

-- Rows of `rows` whose field `key` equals `value`.
function M.where(rows, key, value)
  local out = {}
  for _, r in ipairs(rows) do if r[key] == value then out[#out + 1] = r end end
  return out
end

math.randomseed(os.time() ~ (tonumber(tostring({}):match("0x(%x+)"), 16) or 0))

return M

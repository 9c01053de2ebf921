-- The fake Service Bus peer (host/tests/fake_servicebus.c) for the specs: start it in a
-- sandbox, read its JSON log, stop it. Shared by servicebus_fake_spec.lua and
-- servicebus_sessions_fake_spec.lua. NH_FAKE_SERVICEBUS = the fake's binary.
local nh = require("nh")

local M = {}
local FAKE = os.getenv("NH_FAKE_SERVICEBUS")

function M.require_fake(spec)
  if not FAKE or FAKE == "" then
    error(spec .. " needs NH_FAKE_SERVICEBUS=path/to/fake-servicebus (run it with ctest, or export it: "
      .. "<build>/host/tests/fake-servicebus)")
  end
end

local q = nh.q
local TOPIC = "nimbus.events"
-- A SAS key looks like base64 (with + / =), so the URL carries it percent-encoded.
local KEY_NAME = "RootManageSharedAccessKey"
local KEY = "Xk7/2fQ+PqLmN3vR8sTzYw1aBcDeFgHiJkLmNoPqRs0="

function M.sub_address(endpoint) return TOPIC .. "/Subscriptions/" .. endpoint end

---------------------------------------------------------------------------- the fake peer

local Fake = {}
Fake.__index = Fake

-- Starts fake-servicebus in the sandbox (files fake-N.{out,err,log,pid,rc}); waits for its
-- "listening PORT". opts: subs = { Endpoint = { types } }, missing = { Endpoint }, lock = seconds,
-- lock_ms = milliseconds, sessions = { Endpoint } (session-enabled), session_wait_ms.
function M.start(sb, opts)
  sb.nfakes = (sb.nfakes or 0) + 1
  local base = ("%s/fake-%d"):format(sb.dir, sb.nfakes)
  M.require_fake("the fake Service Bus peer")
  local f = setmetatable({ base = base, log_path = base .. ".log", sb = sb }, Fake)
  local args = { FAKE, "--port", "0", "--log", f.log_path, "--key-name", KEY_NAME, "--key", KEY, "--topic", TOPIC }
  local names = {}
  for ep in pairs(opts.subs or {}) do names[#names + 1] = ep end
  table.sort(names)
  for _, ep in ipairs(names) do
    args[#args + 1] = "--sub"
    args[#args + 1] = ep .. "=" .. table.concat(opts.subs[ep], ",")
  end
  for _, ep in ipairs(opts.missing or {}) do args[#args + 1] = "--missing"; args[#args + 1] = ep end
  if opts.lock then args[#args + 1] = "--lock-duration"; args[#args + 1] = tostring(opts.lock) end
  if opts.lock_ms then args[#args + 1] = "--lock-duration-ms"; args[#args + 1] = tostring(opts.lock_ms) end
  for _, ep in ipairs(opts.sessions or {}) do args[#args + 1] = "--sessions"; args[#args + 1] = ep end
  if opts.session_wait_ms then
    args[#args + 1] = "--session-wait-ms"; args[#args + 1] = tostring(opts.session_wait_ms)
  end
  local quoted = {}
  for i, a in ipairs(args) do quoted[i] = q(a) end
  local wrapper = [[base="$1"; shift
"$@" >"$base.out" 2>"$base.err" </dev/null &
p=$!
echo $p >"$base.pid.tmp" && mv "$base.pid.tmp" "$base.pid"
wait $p
echo $? >"$base.rc.tmp" && mv "$base.rc.tmp" "$base.rc"]]
  assert(nh.sh(("sh -c %s sh %s %s >/dev/null 2>&1 </dev/null &"):format(q(wrapper), q(base),
    table.concat(quoted, " "))) == 0, "cannot spawn fake-servicebus")
  f.pid = nh.eventually(function()
    local s = nh.read(base .. ".pid")
    return s and tonumber(s:match("%d+"))
  end, 10, "the fake's pid file")
  f.port = nh.eventually(function()
    local s = nh.read(base .. ".out") or ""
    local port = tonumber(s:match("listening (%d+)"))
    if port then return port end
    if nh.exists(base .. ".rc") then
      error("fake-servicebus exited before listening: " .. (nh.read(base .. ".err") or ""))
    end
  end, 10, function() return "fake-servicebus never printed `listening PORT`: " .. (nh.read(base .. ".err") or "") end)
  sb.fakes = sb.fakes or {}
  sb.fakes[#sb.fakes + 1] = f
  return f
end

-- The host's transport URL for this fake (key and name percent-encoded).
function Fake:url(key, key_name)
  return ("amqp://%s:%s@127.0.0.1:%d/?profile=servicebus"):format(nh.urlencode(key_name or KEY_NAME),
    nh.urlencode(key or KEY), self.port)
end

-- The fake's JSON log, decoded (optionally only the lines with ev == `ev`).
function Fake:events(ev)
  local out = {}
  for _, e in ipairs(nh.json_lines(nh.read(self.log_path) or "")) do
    if not ev or e.ev == ev then out[#out + 1] = e end
  end
  return out
end

function Fake:dump()
  return "fake-servicebus log:\n" .. (nh.read(self.log_path) or "(none)")
end

-- Polls until pred(event) holds for some logged event of kind ev; returns it.
function Fake:wait_event(ev, pred, what, timeout)
  return nh.eventually(function()
    for _, e in ipairs(self:events(ev)) do
      if not pred or pred(e) then return e end
    end
  end, timeout, function() return (what or ev) .. "\n" .. self:dump() end)
end

-- Sends a signal (USR1: the fake drops every connection, keeping its state).
function Fake:signal(sig) nh.sh(("kill -%s %d 2>/dev/null"):format(sig, self.pid)) end

-- SIGTERM; the fake must exit 0.
function Fake:stop()
  if not nh.exists(self.base .. ".rc") then nh.sh(("kill -TERM %d 2>/dev/null"):format(self.pid)) end
  nh.eventually(function() return nh.exists(self.base .. ".rc") end, 10, "fake-servicebus did not exit on SIGTERM")
  return tonumber((nh.read(self.base .. ".rc") or ""):match("%d+"))
end

-- Hosts first (they close their connections on a live peer), then the fakes, then the dir.
function M.teardown(sb)
  for _, h in ipairs(sb.hosts) do
    if h:exit_code() == nil then pcall(h.stop, h) end
  end
  local codes = {}
  for _, f in ipairs(sb.fakes or {}) do codes[#codes + 1] = f:stop() end
  sb:cleanup()
  for _, code in ipairs(codes) do
    if code ~= 0 then error(("fake-servicebus exit status after SIGTERM: %s"):format(tostring(code)), 2) end
  end
end

-- An adapter whose endpoint Slow (options: Lua source of its options) takes 4 s per Long event
-- (nimbus.sleep: the loop runs meanwhile), writing each call's tag to sb.calls_path.
function M.slow_adapter(sb, options)
  return sb:adapter("slow.lua", ([[
local nimbus = require("nimbus")
local CALLS = %q
nimbus.endpoint("Slow", { %s }):on("Long", function(ev, ctx)
  local f = assert(io.open(CALLS, "a")) f:write(ev.tag, "\n") f:close()
  nimbus.sleep(4)
end)
]]):format(sb.calls_path, options))
end

M.TOPIC, M.KEY_NAME, M.KEY = TOPIC, KEY_NAME, KEY
return M

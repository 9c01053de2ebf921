-- Helpers shared by the benches in spec/bench (run as `nimbus-host -l spec/bench/X.lua ...`):
--   local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
-- and by their adapters (the host puts an adapter's directory on package.path):
--   local B = require("benchlib")
-- Only plain Lua at load time; luasystem and lua-cjson are required where they are used.
local B = {}

-- This directory (spec/bench), where the adapters are.
B.dir = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

-- An integer from the environment, or the default.
function B.env_int(name, default)
  local v = tonumber(os.getenv(name) or "")
  return v and math.tointeger(v) or default
end

-- Quotes one word for sh.
function B.sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs a shell command; returns its output and exit status.
function B.sh(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end

function B.read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function B.write_file(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

-- The nimbus-host binary a bench drives: arg[1], else $NIMBUS_HOST. Exits 2 with the usage
-- line when there is none or it is not executable.
function B.host_binary(script)
  local host = arg[1] or os.getenv("NIMBUS_HOST")
  if not host then
    io.stderr:write("usage: nimbus-host -l spec/bench/" .. script .. " NIMBUS_HOST_BINARY\n")
    os.exit(2)
  end
  if not os.execute("test -x " .. B.sh_quote(host)) then
    io.stderr:write("bench: " .. host .. " is not an executable nimbus-host binary (build it: make build)\n")
    os.exit(2)
  end
  return host
end

-- Ends the bench with a failure the main loop reports (and cleans up after).
function B.die(msg)
  error({ bench_failure = msg }, 0)
end

-- `nimbus-host publish` of one event into a store; a failure ends the bench.
function B.publish(host, store, etype, json, session)
  local out, code = B.sh(B.sh_quote(host) .. " publish " .. etype .. " " .. B.sh_quote(json) .. " --session " ..
                         B.sh_quote(session) .. " --store " .. B.sh_quote(store) .. " 2>&1")
  if code ~= 0 then B.die("publish " .. etype .. " failed (" .. tostring(code) .. "): " .. out) end
end

-- The process runs (a zombie does not count).
function B.alive(pid)
  local st = B.read_file("/proc/" .. pid .. "/status")
  if not st then return false end
  return not st:match("\nState:%s+Z")
end

function B.mb(kb) return kb and ("%.1f MB"):format(kb / 1024) or "n/a" end

-- A field of /proc/PID/status in kB (VmRSS, VmHWM, ...), or nil.
function B.proc_field(pid, key)
  local st = B.read_file("/proc/" .. pid .. "/status") or ""
  local kb = st:match("\n" .. key .. ":%s+(%d+) kB")
  return kb and tonumber(kb)
end

local clk_tck
-- utime + stime of a live process, in seconds, or nil.
function B.proc_cpu(pid)
  local st = B.read_file("/proc/" .. pid .. "/stat")
  if not st then return nil end
  clk_tck = clk_tck or tonumber((B.sh("getconf CLK_TCK 2>/dev/null"))) or 100
  local rest = st:match("^.*%)%s+(.*)$")   -- after "pid (comm)"; comm may hold spaces or ')'
  local f = {}
  for w in rest:gmatch("%S+") do f[#f + 1] = w end
  -- fields from 3 (state) on: utime is field 14, stime 15
  return (tonumber(f[12]) + tonumber(f[13])) / clk_tck
end

-- A fresh temp dir, /tmp/PREFIX.XXXXXX.
function B.tmpdir(prefix)
  local dir = (B.sh("mktemp -d -t " .. prefix .. ".XXXXXX")):gsub("%s+$", "")
  if dir == "" or not dir:find(prefix, 1, true) then error("mktemp -d failed") end
  return dir
end

-- Writes t as one JSON line to path, by rename: a reader never sees a half-written file.
-- (For the adapters too: they load this file with require("benchlib").)
function B.write_json(path, t)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(require("cjson").encode(t), "\n")
  f:close()
  assert(os.rename(tmp, path))
end

---------------------------------------------------------------------------- processes
-- The background processes (hosts) of a bench, their logs and exit statuses in dir:
--   local hosts = B.hosts(dir)
--   local h = hosts:spawn(name, cmd)   -- h.pid, h.log, h.t_launch (epoch seconds)
--   hosts:wait_ready(h, timeout)       -- the host logged `ready:`; h.t_ready
--   hosts:stop(h, timeout)             -- SIGTERM, SIGKILL after timeout; the exit status
--   hosts:check_stop(h)                -- the same, and a failure unless it exited 0
--   hosts:cleanup(keep)                -- stops every one still running, removes dir unless keep
local Hosts = {}
Hosts.__index = Hosts

function B.hosts(dir)
  return setmetatable({ dir = dir, list = {}, system = require("system") }, Hosts)
end

-- Runs `cmd` in the background under a `sh` wrapper that records its pid ($!) and, when it
-- ends, its exit status; its stderr and stdout go to h.log.
function Hosts:spawn(name, cmd)
  local system, base = self.system, self.dir .. "/" .. name
  local h = { name = name, log = base .. ".log", rcfile = base .. ".rc", pidfile = base .. ".pid" }
  local inner = cmd .. " </dev/null 2>" .. B.sh_quote(h.log) .. " >&2 & echo $! > " .. B.sh_quote(h.pidfile) ..
                "; wait $!; echo $? > " .. B.sh_quote(h.rcfile)
  if not os.execute("sh -c " .. B.sh_quote(inner) .. " >/dev/null 2>&1 &") then B.die("cannot start " .. name) end
  local t0 = system.monotime()
  while not h.pid do
    local s = B.read_file(h.pidfile)
    if s and s:match("%d+\n") then h.pid = tonumber(s:match("%d+")) end
    if system.monotime() - t0 > 10 then B.die(name .. ": no pid after 10 s") end
    if not h.pid then system.sleep(0.005) end
  end
  h.t_launch = system.gettime()
  self.list[#self.list + 1] = h
  return h
end

function Hosts:log(h) return B.read_file(h.log) or "" end
function Hosts:log_tail(h) return self:log(h):sub(-2000) end

-- The exit status the wrapper recorded, or nil while the process runs.
function Hosts:rc(h) return tonumber((B.read_file(h.rcfile) or ""):match("%d+")) end

-- Fails the bench: the host is gone although it had work.
function Hosts:died(h)
  B.die(("%s: host exited (status %s) while it had work:\n%s"):format(h.name, tostring(self:rc(h)), self:log_tail(h)))
end

-- The host logs `ready:` once its endpoints are subscribed and dispatching.
function Hosts:wait_ready(h, timeout)
  local system, t0 = self.system, self.system.monotime()
  while not self:log(h):match("ready:") do
    if not B.alive(h.pid) then self:died(h) end
    if system.monotime() - t0 > timeout then
      B.die(("%s: no `ready:` line after %s s:\n%s"):format(h.name, timeout, self:log_tail(h)))
    end
    system.sleep(0.005)
  end
  h.t_ready = system.gettime()
end

-- SIGTERM, SIGKILL after `timeout` (15 s); returns the exit status (nil if none was recorded).
function Hosts:stop(h, timeout)
  if h.stopped then return h.rc end
  local system = self.system
  timeout = timeout or 15
  if B.alive(h.pid) then os.execute("kill -TERM " .. h.pid .. " 2>/dev/null") end
  local t0 = system.monotime()
  while B.alive(h.pid) do
    if system.monotime() - t0 > timeout then
      io.stderr:write(("bench: %s did not stop within %s s of SIGTERM: SIGKILL\n"):format(h.name, timeout))
      os.execute("kill -KILL " .. h.pid .. " 2>/dev/null")
      system.sleep(0.1)
      break
    end
    system.sleep(0.01)
  end
  local t1, rc = system.monotime(), nil
  repeat   -- the wrapper shell writes the status right after the process exits
    rc = self:rc(h)
    if not rc then system.sleep(0.01) end
  until rc or system.monotime() - t1 > 2
  h.stopped, h.rc = true, rc
  return rc
end

function Hosts:check_stop(h, timeout)
  local rc = self:stop(h, timeout)
  if rc ~= 0 then
    B.die(("%s: host exit status %s after SIGTERM (expected 0):\n%s"):format(h.name, tostring(rc), self:log_tail(h)))
  end
end

-- Stops every process still running (SIGTERM to all, SIGKILL to those left after
-- `timeout`, 10 s), then removes the dir, unless keep.
function Hosts:cleanup(keep, timeout)
  local system = self.system
  for _, h in ipairs(self.list) do
    if not h.stopped and B.alive(h.pid) then os.execute("kill -TERM " .. h.pid .. " 2>/dev/null") end
  end
  local t0 = system.monotime()
  for _, h in ipairs(self.list) do
    if not h.stopped then self:stop(h, math.max(0, (timeout or 10) - (system.monotime() - t0))) end
  end
  if keep then
    io.stderr:write("bench: kept " .. self.dir .. "\n")
  else
    os.execute("rm -rf " .. B.sh_quote(self.dir))
  end
end

-- Runs main(), then cleanup() whatever happened; exits with main's status, or 1 with the
-- failure (a B.die message, or any error with its traceback).
function B.run(main, cleanup)
  local ok, res = xpcall(main, function(err)
    if type(err) == "table" and err.bench_failure then return err end
    return debug.traceback(tostring(err), 2)
  end)
  cleanup()
  if not ok then
    io.stderr:write("bench FAILED: " .. (type(res) == "table" and res.bench_failure or tostring(res)) .. "\n")
    os.exit(1)
  end
  os.exit(res)
end

return B

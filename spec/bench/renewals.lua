-- make bench: the CPU cost of lock renewal with 10,000 long handlers in flight.
--   nimbus-host -l spec/bench/renewals.lua PATH/TO/nimbus-host [N]
-- Starts a host whose endpoint holds N handlers asleep (nimbus.sleep) under a 3 s lock
-- (renewed every second), waits until all N are in flight, then samples the host's CPU
-- time (utime + stime from /proc) over a window and reports CPU per second with and
-- without renewals due, and the renewals per second that implies.
local host = assert(arg[1], "usage: renewals.lua NIMBUS_HOST [N]")
local N = tonumber(arg[2]) or tonumber(os.getenv("BENCH_RENEW_N")) or 10000
local LOCK = 3

local function sh(cmd) return os.execute(cmd) end
local function read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
local function now()
  local p = io.popen("date +%s.%N")
  local s = p:read("l")
  p:close()
  return tonumber(s)
end
local function pause(s) sh("sleep " .. s) end   -- pacing of the sampling window (a bench, not a test)

local dir = io.popen("mktemp -d"):read("l")
local adapter = dir .. "/renew.lua"
local f = assert(io.open(adapter, "w"))
f:write(([[
local nimbus = require("nimbus")
local n = %d
nimbus.endpoint("Producer", {}):on("Start", function()
  for i = 1, n do nimbus.publish("Work", { i = i }, { session = "s" .. i }) end
end)
local started = 0
nimbus.endpoint("Long", { concurrency = n, lock = { duration = %d, renew_max = 3600 }, timeout = 3600 })
  :on("Work", function(e)
    started = started + 1
    if started == n then local f = io.open(%q, "w") f:write("all\n") f:close() end
    nimbus.sleep(3600)
  end)
]]):format(N, LOCK, dir .. "/inflight"))
f:close()
local store = dir .. "/nimbus.db"
sh(("%s %s --store %s --no-reload >%s/host.log 2>&1 & echo $! > %s/pid"):format(host, adapter, store, dir, dir))
local pid
for _ = 1, 200 do
  pid = tonumber(read(dir .. "/pid") or "")
  if pid and (read(dir .. "/host.log") or ""):find("ready:", 1, true) then break end
  pause(0.05)
end
assert(pid, "host did not start")
sh(("%s publish Start '{}' --store %s >/dev/null"):format(host, store))
local t0 = now()
while not read(dir .. "/inflight") do
  assert(now() - t0 < 120, "handlers did not all start")
  pause(0.1)
end
local function cpu()
  local stat = read("/proc/" .. pid .. "/stat")
  local fields = {}
  for x in stat:gsub("^.-%) ", ""):gmatch("%S+") do fields[#fields + 1] = x end
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100   -- utime + stime, clock ticks
end
local WINDOW = 6 * LOCK / 3   -- six renewal rounds
local c0, w0 = cpu(), now()
pause(WINDOW)
local c1, w1 = cpu(), now()
local rss = (read("/proc/" .. pid .. "/status") or ""):match("VmHWM:%s*(%d+)")
sh("kill -TERM " .. pid)
for _ = 1, 400 do
  if not sh("kill -0 " .. pid .. " 2>/dev/null") then break end
  pause(0.05)
end
sh("rm -rf " .. dir)
local cps = (c1 - c0) / (w1 - w0)
local rate = N / (LOCK / 3)
print(("renewals: %d handlers in flight under a %d s lock: host CPU %.1f%% of a core (%.3f CPU-s/s), "
  .. "%.0f renewals/s, %.1f us CPU per renewal, peak RSS %.1f MB")
  :format(N, LOCK, cps * 100, cps, rate, cps / rate * 1e6, (tonumber(rss) or 0) / 1024))
print(("RESULT renew_inflight=%d cpu_core_fraction=%.3f renewals_per_s=%.0f us_per_renewal=%.1f peak_rss_mb=%.1f")
  :format(N, cps, rate, cps / rate * 1e6, (tonumber(rss) or 0) / 1024))

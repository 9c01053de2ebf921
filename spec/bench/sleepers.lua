-- make bench: 10,000 concurrently sleeping tasks. Reports the time to spawn them, the
-- wake-up rate once their timers fire, and the host's peak RSS. Run inside the host:
--   nimbus-host -l spec/bench/sleepers.lua [N]
local nimbus = require("nimbus")
local core = require("nimbus.core")

local N = tonumber(arg and arg[1]) or tonumber(os.getenv("BENCH_SLEEPERS")) or 10000
local SLEEP = 0.5

local function vm_hwm_kb()
  local f = io.open("/proc/self/status", "r")
  if not f then return 0 end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmHWM:%s*(%d+)")) or 0
end

local rss0 = vm_hwm_kb()
local woke, first, last = 0, nil, nil
local t0 = core.now()
nimbus.run(function()
  for _ = 1, N do
    nimbus.spawn(function()
      nimbus.sleep(SLEEP)
      local t = core.now()
      first = first or t
      last = t
      woke = woke + 1
    end)
  end
  local spawned = core.now()
  io.write(("spawned %d tasks in %.1f ms\n"):format(N, (spawned - t0) * 1000))
  while woke < N do nimbus.sleep(0.01) end
end)
local span = (last - first)
print(("sleepers: %d tasks, all woke %.3f s after the first; wake-up rate %.0f tasks/s; peak RSS %.1f MB (%.1f MB before)")
  :format(N, span, span > 0 and N / span or 0, vm_hwm_kb() / 1024, rss0 / 1024))
print(("RESULT sleepers=%d wake_span_s=%.3f wake_rate_per_s=%.0f peak_rss_mb=%.1f")
  :format(N, span, span > 0 and N / span or 0, vm_hwm_kb() / 1024))

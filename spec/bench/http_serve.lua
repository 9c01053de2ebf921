-- HTTP server throughput: wrk against a trivial JSON route of nimbus.http.serve.
--
--   nimbus-host -l spec/bench/http_serve.lua
--
-- Environment: BENCH_HTTP_THREADS (wrk -t, 1), BENCH_HTTP_CONNECTIONS (wrk -c, 16),
-- BENCH_HTTP_DURATION (seconds, 5), BENCH_HTTP_SLEEP (seconds each request sleeps in
-- its route first, 0: a pure CPU/IO figure; > 0 shows requests overlapping in tasks).
-- Prints wrk's report and one "http_serve: N requests/s" line; exits 1 if wrk failed,
-- 0 with a note if wrk is not installed.
local nimbus = require("nimbus")
local now = nimbus.now or require("nimbus.core").now

local function env_num(name, default) return tonumber(os.getenv(name) or "") or default end
local THREADS = math.tointeger(env_num("BENCH_HTTP_THREADS", 1))
local CONNS = math.tointeger(env_num("BENCH_HTTP_CONNECTIONS", 16))
local DURATION = math.tointeger(env_num("BENCH_HTTP_DURATION", 5))
local SLEEP = env_num("BENCH_HTTP_SLEEP", 0)

if not os.execute("command -v wrk >/dev/null 2>&1") then
  print("http_serve: wrk is not installed (apt-get install wrk); skipped")
  os.exit(0)
end

local served = 0
local srv = assert(nimbus.http.serve{ port = 0, routes = {
  ["GET /ping"] = function(req)
    if SLEEP > 0 then nimbus.sleep(SLEEP) end
    served = served + 1
    return 200, { ok = true, n = served }
  end,
} })

local out = os.tmpname()
os.remove(out)
local url = ("http://127.0.0.1:%d/ping"):format(srv.port)
os.execute(("(wrk -t%d -c%d -d%ds --latency %s > %s.tmp 2>&1; echo $? >> %s.tmp; mv %s.tmp %s) &")
  :format(THREADS, CONNS, DURATION, url, out, out, out, out))

local report
nimbus.run(function()
  local deadline = now() + DURATION + 30
  while now() < deadline do
    local f = io.open(out)
    if f then report = f:read("a"); f:close(); return end
    nimbus.sleep(0.05)
  end
end)
srv:close()
os.remove(out)

if not report then
  io.stderr:write("http_serve: wrk did not finish\n")
  os.exit(1)
end
local rc = tonumber(report:match("(%d+)%s*$"))
io.write((report:gsub("%d+%s*$", "")))
local rps = report:match("Requests/sec:%s*([%d%.]+)")
if not rps or rc ~= 0 then
  io.stderr:write("http_serve: wrk failed\n")
  os.exit(1)
end
print(("http_serve: %s requests/s (wrk -t%d -c%d -d%ds, route sleep %gs, %d served)")
  :format(rps, THREADS, CONNS, DURATION, SLEEP, served))

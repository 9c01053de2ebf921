-- What observability costs: metrics and tracing on the hot path, and the /metrics scrape.
--
--   make bench
--   nimbus-host -l spec/bench/observability.lua path/to/nimbus-host
--
-- 1. End to end on the embedded transport (spec/bench/bench_adapter.lua in its e2e mode,
--    as spec/bench/throughput.lua runs it), each run in a fresh store, in rounds that
--    alternate three variants (the order rotates from round to round so drift of the
--    machine spreads over all three):
--      on     metrics on (the default)
--      off    `--metrics off`
--      otlp   metrics on and `--otlp http://127.0.0.1:PORT`, PORT a local OTLP/HTTP
--             receiver the bench starts (a `nimbus-host -l` script on nimbus.http.serve
--             answering POST /v1/traces with 200 {}; it counts requests and spans)
--    Prints the events/s and the host's CPU time per event (all threads, schedstat) of
--    every run, each variant's median, what metrics cost (on against off, paired within
--    each round, the median of the rounds; target under 3%) and what tracing costs (otlp
--    against on; target under 10%), and what the receiver got. The CPU figures are the
--    steadier ones on a machine that does other work. Also checks once that /metrics of
--    a host with `--metrics off` answers 200 with its one comment line.
-- 2. GET /metrics of a host with BENCH_OBS_ENDPOINTS endpoints (50) handling two event
--    types each, after events went through every one (every series of the per-endpoint
--    and per-type families exists): median and p90 of BENCH_SCRAPES scrapes (20) with
--    curl (time_total), the body's size and sample count; promtool checks the body when
--    it is installed (target: under 5 ms).
--
-- Environment: BENCH_ROUNDS (rounds of the three variants, 5), BENCH_N (events per run,
-- 40000), BENCH_SESSIONS, BENCH_CONCURRENCY, BENCH_CHUNK, BENCH_WINDOW (as for
-- throughput.lua), BENCH_OBS_ENDPOINTS (50), BENCH_SCRAPES (20), BENCH_SKIP_E2E=1,
-- BENCH_SKIP_SCRAPE=1, BENCH_KEEP=1 (keep the temp dir), BENCH_DEADLINE (seconds for the
-- whole bench, 300). Loopback only. The targets are printed, never enforced: the bench
-- exits 1 only when a run did not complete (or promtool rejected the exposition).
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local env_int, sh_quote, sh, read_file, die = B.env_int, B.sh_quote, B.sh, B.read_file, B.die

local HOST = B.host_binary("observability.lua")

local ROUNDS = math.max(1, env_int("BENCH_ROUNDS", 5))
local N = env_int("BENCH_N", 40000)
local SESSIONS = env_int("BENCH_SESSIONS", 1000)
local CONC = env_int("BENCH_CONCURRENCY", 256)
local CHUNK = env_int("BENCH_CHUNK", CONC)
local WINDOW = env_int("BENCH_WINDOW", 2 * CHUNK)
local ENDPOINTS = env_int("BENCH_OBS_ENDPOINTS", 50)
local SCRAPES = math.max(1, env_int("BENCH_SCRAPES", 20))
local DEADLINE_S = env_int("BENCH_DEADLINE", 300)
local t_bench0 = system.monotime()

local E2E_ADAPTER = B.dir .. "/bench_adapter.lua"
local SCRAPE_ADAPTER = B.dir .. "/observability_adapter.lua"
local OFF_TEXT = "# metrics are off (nimbus-host run --metrics off)\n"

local TMP = B.tmpdir("nimbus-bench-obs")
local hosts = B.hosts(TMP)

local function remaining() return DEADLINE_S - (system.monotime() - t_bench0) end
local function cleanup() hosts:cleanup(os.getenv("BENCH_KEEP") == "1") end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

local function percentile(t, p)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  return s[math.max(1, math.ceil(#s * p))]
end

-- Waits for a line of the process's log matching `pattern`; returns its capture.
local function wait_log(h, pattern, timeout)
  local t0 = system.monotime()
  while true do
    local found = hosts:log(h):match(pattern)
    if found then return found end
    if not B.alive(h.pid) then hosts:died(h) end
    if system.monotime() - t0 > timeout then
      die(("%s: no line matching %q after %s s:\n%s"):format(h.name, pattern, timeout, hosts:log_tail(h)))
    end
    system.sleep(0.01)
  end
end

local function admin_port(h)
  return tonumber(wait_log(h, "operator API on http://127%.0%.0%.1:(%d+)/", 20))
end

-- curl: the status, the body (written to `file` when given) and time_total in ms.
local function http(method, url, file)
  local out, code = sh(("curl -sS --max-time 10 -X %s -o %s -w '%%{http_code} %%{time_total} %%{size_download}' %s 2>&1")
                       :format(method, sh_quote(file or "/dev/null"), sh_quote(url)))
  local status, secs, size = out:match("(%d+) ([%d.]+) (%d+)$")
  if code ~= 0 or not status then die(("%s %s: curl failed (%s): %s"):format(method, url, tostring(code), out)) end
  return tonumber(status), tonumber(secs) * 1000, tonumber(size)
end

-- CPU seconds the process has run, all its threads (/proc/PID/task/*/schedstat, in ns; the
-- clock-tick figures of /proc/PID/stat are 10 ms coarse); nil when it is gone.
local function cpu_seconds(pid)
  local out = sh("cat /proc/" .. pid .. "/task/*/schedstat 2>/dev/null")
  local ns, any = 0, false
  for first in out:gmatch("(%d+)[^\n]*\n") do
    ns, any = ns + tonumber(first), true
  end
  return any and ns / 1e9 or nil
end

local function publish(store, etype, json, session) B.publish(HOST, store, etype, json, session) end

---------------------------------------------------------------------------- the OTLP receiver
-- A `nimbus-host -l` script: POST /v1/traces answers 200 {} and counts the request, its
-- bytes and its spans (occurrences of "spanId", so that counting costs little CPU beside
-- the host under test); GET /count gives the counts; POST /quit ends it (so does its own
-- deadline, OTLP_LIFETIME seconds).
local RECEIVER = [=[
local nimbus = require("nimbus")
local now = nimbus.now or require("nimbus.core").now
local requests, spans, bytes = 0, 0, 0
local quit = false
local srv = assert(nimbus.http.serve{ host = "127.0.0.1", port = 0, max_body = 64 * 1024 * 1024, routes = {
  ["POST /v1/traces"] = function(req)
    requests = requests + 1
    bytes = bytes + #req.body
    local at = 1
    while true do
      local s, e = req.body:find('"spanId"', at, true)
      if not s then break end
      spans = spans + 1
      at = e + 1
    end
    return 200, "{}", { ["Content-Type"] = "application/json" }
  end,
  ["GET /count"] = function() return 200, { requests = requests, spans = spans, bytes = bytes } end,
  ["POST /quit"] = function() quit = true; return 200, { requests = requests, spans = spans, bytes = bytes } end,
} })
io.stdout:write(("otlp receiver on http://127.0.0.1:%d/\n"):format(srv.port))
io.stdout:flush()
local deadline = now() + (tonumber(os.getenv("OTLP_LIFETIME") or "") or 600)
nimbus.run(function()
  while not quit and now() < deadline do nimbus.sleep(0.05) end
end)
srv:close()
]=]

local receiver   -- { h = process, base = "http://127.0.0.1:PORT" }

local function start_receiver()
  local script = TMP .. "/otlp_receiver.lua"
  B.write_file(script, RECEIVER)
  local h = hosts:spawn("otlp-receiver", ("OTLP_LIFETIME=%d %s -l %s"):format(math.ceil(remaining()) + 30,
                        sh_quote(HOST), sh_quote(script)))
  local port = wait_log(h, "otlp receiver on http://127%.0%.0%.1:(%d+)/", 20)
  receiver = { h = h, base = "http://127.0.0.1:" .. port }
  return receiver
end

local function receiver_counts()
  local f = TMP .. "/otlp-count.json"
  local status = http("GET", receiver.base .. "/count", f)
  if status ~= 200 then die("otlp receiver: GET /count answered " .. status) end
  return cjson.decode(read_file(f))
end

local function stop_receiver()
  if not receiver then return end
  local f = TMP .. "/otlp-quit.json"
  if B.alive(receiver.h.pid) then http("POST", receiver.base .. "/quit", f) end
  local t0 = system.monotime()   -- it ends within its next 50 ms sleep
  while B.alive(receiver.h.pid) and system.monotime() - t0 < 5 do system.sleep(0.01) end
  local rc = hosts:stop(receiver.h, 10)
  if rc ~= 0 then io.stderr:write(("bench: the otlp receiver exited with status %s\n"):format(tostring(rc))) end
end

---------------------------------------------------------------------------- end to end
local VARIANTS = { "on", "off", "otlp" }
local run_seq = 0

local function variant_args(v)
  if v == "off" then return " --metrics off" end
  if v == "otlp" then return " --otlp " .. sh_quote(receiver.base) end
  return ""
end

-- One end-to-end run of `variant` in a fresh store: N events; returns events/s.
local function run_e2e(variant, check_off_metrics)
  run_seq = run_seq + 1
  local name = ("e2e-%02d-%s"):format(run_seq, variant)
  local store, result = TMP .. "/" .. name .. ".db", TMP .. "/" .. name .. ".json"
  local env = {
    "BENCH_MODE=e2e", "BENCH_RESULT=" .. sh_quote(result), "BENCH_N=" .. N, "BENCH_SESSIONS=" .. SESSIONS,
    "BENCH_CHUNK=" .. CHUNK, "BENCH_CONCURRENCY=" .. CONC, "BENCH_WINDOW=" .. WINDOW,
  }
  local cmd = table.concat(env, " ") .. " " .. sh_quote(HOST) .. " " .. sh_quote(E2E_ADAPTER) .. " --store " ..
              sh_quote(store) .. " --no-reload --admin 127.0.0.1:0" .. variant_args(variant)
  local h = hosts:spawn(name, cmd)
  hosts:wait_ready(h, 20)
  local cpu0 = cpu_seconds(h.pid)
  if check_off_metrics then   -- `--metrics off`: /metrics still answers, with its one comment line
    local f = TMP .. "/" .. name .. ".metrics"
    local status = http("GET", ("http://127.0.0.1:%d/metrics"):format(admin_port(h)), f)
    local body = read_file(f) or ""
    if status ~= 200 or body ~= OFF_TEXT then
      die(("%s: /metrics with --metrics off answered %s %q, expected 200 %q"):format(name, status, body, OFF_TEXT))
    end
  end
  publish(store, "BenchStart", "{}", "bench-producer")
  local t0 = system.monotime()
  local r
  while not r do
    local s = read_file(result)
    if s then
      r = cjson.decode(s)
      r.cpu = cpu_seconds(h.pid)
    end
    if not r then
      if not B.alive(h.pid) then hosts:died(h) end
      if system.monotime() - t0 > math.max(5, remaining() - 5) then
        die(("%s: not finished within the deadline (BENCH_DEADLINE=%d):\n%s"):format(name, DEADLINE_S, hosts:log_tail(h)))
      end
      system.sleep(0.02)
    end
  end
  hosts:check_stop(h)
  os.remove(store)
  os.remove(store .. "-wal")
  os.remove(store .. "-shm")
  if r.count ~= N then die(("%s: %s events consumed, expected %d"):format(name, tostring(r.count), N)) end
  -- events/s, and the host's CPU time (user + system, all threads) per event from ready
  -- to the last handler: steadier than the rate on a machine that does other work
  return r.count / (r.t_last - r.t_first_publish), cpu0 and r.cpu and (r.cpu - cpu0) / r.count * 1e6
end

-- A cost as a signed percentage ("+1.2%": slower, or more CPU).
local function pct(x) return x and ("%+.1f%%"):format(x * 100) or "n/a" end

local function e2e()
  print("")
  print(("end to end (embedded transport, %d events per run, %d rounds of on / off / otlp, order rotating):")
        :format(N, ROUNDS))
  print("  events/s (host CPU us per event)")
  start_receiver()
  local rate, cpu = { on = {}, off = {}, otlp = {} }, { on = {}, off = {}, otlp = {} }
  -- per round, paired: what metrics cost (1 - on/off) and tracing (1 - otlp/on); CPU: on/off - 1
  local m_cost, t_cost, m_cpu, t_cpu = {}, {}, {}, {}
  local checked_off = false
  for round = 1, ROUNDS do
    local line, r, c = {}, {}, {}
    for k = 0, #VARIANTS - 1 do
      local v = VARIANTS[(round - 1 + k) % #VARIANTS + 1]
      r[v], c[v] = run_e2e(v, v == "off" and not checked_off)
      if v == "off" then checked_off = true end
      table.insert(rate[v], r[v])
      if c[v] then table.insert(cpu[v], c[v]) end
      line[#line + 1] = ("%-4s %6.0f (%s)"):format(v, r[v], c[v] and ("%.1f"):format(c[v]) or "n/a")
    end
    m_cost[round], t_cost[round] = 1 - r.on / r.off, 1 - r.otlp / r.on
    if c.on and c.off and c.otlp then
      m_cpu[#m_cpu + 1], t_cpu[#t_cpu + 1] = c.on / c.off - 1, c.otlp / c.on - 1
    end
    print(("  round %d: %s"):format(round, table.concat(line, "   ")))
  end
  local got = receiver_counts()
  stop_receiver()
  local m_on, m_off, m_otlp = median(rate.on), median(rate.off), median(rate.otlp)
  local mc, tc = median(m_cost), median(t_cost)
  print(("  medians         on %.0f   off %.0f   otlp %.0f events/s;   CPU on %s  off %s  otlp %s us per event")
        :format(m_on, m_off, m_otlp, ("%.1f"):format(median(cpu.on) or 0), ("%.1f"):format(median(cpu.off) or 0),
                ("%.1f"):format(median(cpu.otlp) or 0)))
  print(("  metrics on      costs %s of the rate (median of the rounds' 1 - on/off; medians: %.0f / %.0f = %.3f), " ..
         "%s CPU per event (target under 3%%: %s)")
        :format(pct(mc), m_on, m_off, m_on / m_off, pct(median(m_cpu)), mc < 0.03 and "met" or "NOT met"))
  print(("  tracing on      costs %s of the rate (median of the rounds' 1 - otlp/on; medians: %.0f / %.0f = %.3f), " ..
         "%s CPU per event (target under 10%%: %s)")
        :format(pct(tc), m_otlp, m_on, m_otlp / m_on, pct(median(t_cpu)), tc < 0.10 and "met" or "NOT met"))
  local otlp_events = N * ROUNDS
  print(("  otlp receiver   %d requests, %d spans (%.2f per event of the otlp runs), %.1f MB of OTLP/JSON%s")
        :format(got.requests, got.spans, got.spans / otlp_events, got.bytes / 1048576,
                got.spans == 0 and " (no spans exported: this host does not export them yet)" or ""))
  print("  /metrics with --metrics off: 200, only the comment line")
  return { on = m_on, off = m_off, otlp = m_otlp, metrics_cost = mc * 100, tracing_cost = tc * 100,
           spans = got.spans, requests = got.requests }
end

---------------------------------------------------------------------------- the scrape
-- The counted total of nimbus_events_total with outcome="completed", or 0.
local function completed_in(text)
  local n = 0
  for v in text:gmatch('\nnimbus_events_total{[^}\n]*outcome="completed"} (%S+)') do n = n + (tonumber(v) or 0) end
  return n
end

local function scrape()
  print("")
  print(("GET /metrics (%d endpoints x 2 event types, every series present; %d scrapes with curl):")
        :format(ENDPOINTS, SCRAPES))
  local store = TMP .. "/scrape.db"
  local h = hosts:spawn("scrape", ("BENCH_OBS_ENDPOINTS=%d %s %s --store %s --no-reload --admin 127.0.0.1:0")
                        :format(ENDPOINTS, sh_quote(HOST), sh_quote(SCRAPE_ADAPTER), sh_quote(store)))
  hosts:wait_ready(h, 30)
  local url = ("http://127.0.0.1:%d/metrics"):format(admin_port(h))
  -- each publish fans out to every endpoint: two events of each type per endpoint
  for _, t in ipairs({ "ObsA", "ObsB", "ObsA", "ObsB" }) do publish(store, t, "{}", "s-" .. t) end
  local want, body_file = 4 * ENDPOINTS, TMP .. "/metrics.txt"
  local t0 = system.monotime()
  while true do
    local status = http("GET", url, body_file)
    if status ~= 200 then die("GET /metrics answered " .. status) end
    if completed_in("\n" .. (read_file(body_file) or "")) >= want then break end
    if not B.alive(h.pid) then hosts:died(h) end
    if system.monotime() - t0 > math.max(10, math.min(60, remaining() - 5)) then
      die(("scrape: %d of %d events completed after %.0f s:\n%s"):format(
        completed_in("\n" .. (read_file(body_file) or "")), want, system.monotime() - t0, hosts:log_tail(h)))
    end
    system.sleep(0.1)
  end
  http("GET", url)   -- the buffer sized by the previous render, as in steady scraping
  local ms, size = {}, 0
  for i = 1, SCRAPES do   -- the body to /dev/null: time_total is not also a file write
    local status, t, bytes = http("GET", url)
    if status ~= 200 then die("GET /metrics answered " .. status) end
    ms[i], size = t, bytes
  end
  if http("GET", url, body_file) ~= 200 then die("GET /metrics failed") end
  local text = read_file(body_file) or ""
  local samples, families = 0, 0
  for line in text:gmatch("[^\n]+") do
    if line:sub(1, 1) ~= "#" then samples = samples + 1
    elseif line:match("^# TYPE ") then families = families + 1 end
  end
  local promtool = "not installed (apt-get install prometheus)"
  if os.execute("command -v promtool >/dev/null 2>&1") then
    local out, code = sh("promtool check metrics < " .. sh_quote(body_file) .. " 2>&1")
    if code ~= 0 then die("promtool check metrics rejected the exposition:\n" .. out) end
    promtool = "passes"
  end
  hosts:check_stop(h)
  local p50, p90 = median(ms), percentile(ms, 0.9)
  print(("  scrape time     median %.2f ms  p90 %.2f ms  min %.2f ms  max %.2f ms (curl time_total, loopback; target under 5 ms: %s)")
        :format(p50, p90, percentile(ms, 0), percentile(ms, 1), p50 < 5 and "met" or "NOT met"))
  print(("  exposition      %.1f KB, %d samples in %d families; promtool check metrics %s")
        :format(size / 1024, samples, families, promtool))
  return { p50 = p50, p90 = p90, size = size, samples = samples }
end

---------------------------------------------------------------------------- main
local function main()
  local ver = (sh(sh_quote(HOST) .. " --version 2>&1")):gsub("%s+$", "")
  print(("nimbus-host observability bench: %s"):format(ver))
  print(("  temp dir %s; deadline %d s"):format(TMP, DEADLINE_S))
  local e, s
  if os.getenv("BENCH_SKIP_E2E") ~= "1" then e = e2e() end
  if os.getenv("BENCH_SKIP_SCRAPE") ~= "1" then s = scrape() end
  print("")
  local parts = {}
  if e then
    parts[#parts + 1] = ("on_events_per_s=%.0f off_events_per_s=%.0f otlp_events_per_s=%.0f metrics_cost_pct=%.1f " ..
                         "tracing_cost_pct=%.1f otlp_spans=%d"):format(e.on, e.off, e.otlp, e.metrics_cost,
                                                                       e.tracing_cost, e.spans)
  end
  if s then
    parts[#parts + 1] = ("scrape_p50_ms=%.2f scrape_p90_ms=%.2f scrape_kb=%.1f scrape_samples=%d")
                        :format(s.p50, s.p90, s.size / 1024, s.samples)
  end
  print("RESULT " .. table.concat(parts, " "))
  return 0
end

B.run(main, cleanup)

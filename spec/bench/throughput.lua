-- Throughput benchmark of nimbus-host on the embedded transport.
--
--   make bench
--   nimbus-host -l spec/bench/throughput.lua path/to/nimbus-host      (or lua5.4 ...)
--
-- Environment: BENCH_N (events, default 50000), BENCH_SESSIONS (1000), BENCH_CONCURRENCY
-- (consumer, 256), BENCH_CHUNK (events per producer handler, = concurrency, so the
-- producer publishes about what the consumer takes per batch), BENCH_WINDOW (max
-- published-but-unconsumed in the end-to-end run, 2 * chunk), BENCH_PAYLOAD
-- (padding bytes per event, 64), BENCH_TARGET (events/s, 13000), BENCH_STRICT=1 (exit 1
-- when the end-to-end rate is below target), BENCH_SKIP_CONSUME=1, BENCH_KEEP=1 (keep
-- the temp dir), BENCH_PERF=FILE (attach `perf record -g`, or BENCH_PERF_OPTS, to the end-to-end host and
-- write the profile to FILE), BENCH_DEADLINE (seconds for the whole bench, 110).
--
-- A/B: `nimbus-host -l spec/bench/throughput.lua NEW_HOST OLD_HOST` (or BENCH_BASELINE=OLD_HOST)
-- then runs the end-to-end run BENCH_AB_ROUNDS (3) more times with each binary, alternating,
-- and prints the medians (events/s, CPU per 1,000 events, p99) and the ratios NEW/OLD.
--
-- Runs, each in a fresh store in a temp dir:
--   1. end to end: a producer handler publishes chunks of events while a consumer
--      endpoint with a trivial handler consumes them (audit rows and history written
--      as always); events/s, p50/p99 latency from enqueue to handler, host peak RSS;
--      then again with the producer held to half that rate (BENCH_RATE, chunks of 16):
--      the latency under a steady load;
--   2. consume only: N events are pre-loaded by a producer-only host, then a
--      consumer-only host drains them; also reports the publish-only (pre-load) rate.
-- Exits 1 if a run did not complete (or is below target with BENCH_STRICT=1).
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local env_int, sh_quote, sh, read_file, die, alive, mb = B.env_int, B.sh_quote, B.sh, B.read_file, B.die, B.alive, B.mb

local HOST = B.host_binary("throughput.lua")   -- changes during the A/B rounds
local BASELINE = arg[2] or os.getenv("BENCH_BASELINE")

local N = env_int("BENCH_N", 50000)
local SESSIONS = env_int("BENCH_SESSIONS", 1000)
local CONC = env_int("BENCH_CONCURRENCY", 256)
local CHUNK = env_int("BENCH_CHUNK", CONC)
local WINDOW = env_int("BENCH_WINDOW", 2 * CHUNK)
local TARGET = env_int("BENCH_TARGET", 13000)
local STRICT = os.getenv("BENCH_STRICT") == "1"
local DEADLINE_S = env_int("BENCH_DEADLINE", 110)   -- whole bench; each phase gets what is left
local t_bench0 = system.monotime()

local ADAPTER = B.dir .. "/bench_adapter.lua"

---------------------------------------------------------------------------- processes
local TMP = B.tmpdir("nimbus-bench")
local hosts = B.hosts(TMP)   -- every host started, for the clean-up

-- Starts a host on the bench adapter in the given mode.
local function start_host(name, mode, store, extra_env)
  local result = TMP .. "/" .. name .. ".json"
  local env = {
    "BENCH_MODE=" .. mode, "BENCH_RESULT=" .. sh_quote(result), "BENCH_N=" .. N,
    "BENCH_SESSIONS=" .. SESSIONS, "BENCH_CHUNK=" .. CHUNK, "BENCH_CONCURRENCY=" .. CONC,
    "BENCH_WINDOW=" .. WINDOW,
  }
  if os.getenv("BENCH_PAYLOAD") then env[#env + 1] = "BENCH_PAYLOAD=" .. env_int("BENCH_PAYLOAD", 64) end
  for _, e in ipairs(extra_env or {}) do env[#env + 1] = e end
  local cmd = table.concat(env, " ") .. " " .. sh_quote(HOST) .. " " .. sh_quote(ADAPTER) .. " --store " ..
              sh_quote(store) .. " --no-reload"
  local h = hosts:spawn(name, cmd)
  h.result = result
  return h
end

local function cleanup() hosts:cleanup(os.getenv("BENCH_KEEP") == "1") end

local function remaining()
  return DEADLINE_S - (system.monotime() - t_bench0)
end

local function publish(store, etype, json, session) B.publish(HOST, store, etype, json, session) end

-- Polls for the host's result file; tracks peak RSS on the way (VmHWM is the kernel's
-- own high-water mark; the sampled VmRSS max is printed beside it as a cross-check).
local function wait_result(h, budget)
  local t0 = system.monotime()
  while true do
    local s = read_file(h.result)
    if s then
      h.hwm_kb = B.proc_field(h.pid, "VmHWM")
      h.cpu_done = B.proc_cpu(h.pid)
      local io_ = read_file("/proc/" .. h.pid .. "/io") or ""
      h.wchar = tonumber(io_:match("wchar:%s*(%d+)"))
      h.rchar = tonumber(io_:match("rchar:%s*(%d+)"))
      return cjson.decode(s)
    end
    if not alive(h.pid) then hosts:died(h) end
    local el = system.monotime() - t0
    if el > budget then die(("%s: not finished after %.0f s:\n%s"):format(h.name, el, hosts:log_tail(h))) end
    system.sleep(0.02)
  end
end

local function audit_counts(store, endpoint)
  local out, code = sh(sh_quote(HOST) .. " events --json --endpoint " .. endpoint .. " --store " .. sh_quote(store) ..
                       " 2>/dev/null")
  if code ~= 0 then return nil end
  local counts, total = {}, 0
  for line in out:gmatch("[^\n]+") do
    local row = cjson.decode(line)
    counts[row.status] = (counts[row.status] or 0) + 1
    total = total + 1
  end
  return counts, total
end

---------------------------------------------------------------------------- runs
local function run_e2e(tag, extra_env)
  local name = "e2e" .. (tag or "")
  local store = TMP .. "/" .. name .. ".db"
  local h = start_host(name, "e2e", store, extra_env)
  hosts:wait_ready(h, 20)
  local perf
  if os.getenv("BENCH_PERF") then
    perf = hosts:spawn("perf", "perf record " .. (os.getenv("BENCH_PERF_OPTS") or "-F 999 -g") .. " -p " .. h.pid
      .. " -o " .. sh_quote(os.getenv("BENCH_PERF")))
    system.sleep(0.5)   -- let perf attach
  end
  local t_kick = system.gettime()
  local cpu_kick = B.proc_cpu(h.pid)
  publish(store, "BenchStart", "{}", "bench-producer")
  local r = wait_result(h, math.max(5, remaining() - 30))
  hosts:check_stop(h)
  if perf then hosts:stop(perf, 30) end   -- perf ends with its target; SIGTERM if not
  local counts, total = audit_counts(store, "BenchConsumer")
  r.audit_completed = counts and counts.Completed or -1
  r.audit_total = total or -1
  r.hwm_kb, r.wchar, r.rchar = h.hwm_kb, h.wchar, h.rchar
  r.t_kick = t_kick
  r.cpu_s = h.cpu_done - cpu_kick
  return r
end

local function run_consume()
  local store = TMP .. "/consume.db"
  -- 1. record the consumer's subscription (the store keeps it across restarts)
  local s = start_host("subscribe", "subscribe", store)
  hosts:wait_ready(s, 20)
  hosts:check_stop(s)
  -- 2. pre-load N events with a producer-only host
  local p = start_host("preload", "preload", store)
  hosts:wait_ready(p, 20)
  publish(store, "BenchStart", "{}", "bench-producer")
  local pr = wait_result(p, math.max(5, (remaining() - 10) / 2))
  hosts:check_stop(p)
  -- 3. drain them with a consumer-only host
  local c = start_host("consume", "consume", store)
  local t_start = system.gettime()
  hosts:wait_ready(c, 20)
  local t_ready = system.gettime()
  local cpu_ready = B.proc_cpu(c.pid)
  local r = wait_result(c, math.max(5, remaining() - 5))
  hosts:check_stop(c)
  r.hwm_kb, r.wchar, r.rchar = c.hwm_kb, c.wchar, c.rchar
  r.cpu_s = c.cpu_done - cpu_ready
  r.preload = pr
  r.t_start, r.t_ready = t_start, t_ready
  return r
end

---------------------------------------------------------------------------- A/B

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

-- Alternating end-to-end runs of the baseline and this binary: the machine's state drifts
-- (other processes, the page cache), so both see the same drift.
local function run_ab()
  local rounds = env_int("BENCH_AB_ROUNDS", 3)
  local new = HOST
  local got = { old = { rate = {}, cpu = {}, p99 = {} }, new = { rate = {}, cpu = {}, p99 = {} } }
  for i = 1, rounds do
    for _, which in ipairs({ "old", "new" }) do
      HOST = which == "old" and BASELINE or new
      local e = run_e2e("-" .. which .. i)
      if e.audit_completed ~= N then die(("A/B %s: %d Completed audit rows, expected %d"):format(HOST, e.audit_completed, N)) end
      local g = got[which]
      g.rate[i] = e.count / (e.t_last - e.t_first_publish)
      g.cpu[i] = e.cpu_s * 1e6 / e.count
      g.p99[i] = e.p99_ms
    end
  end
  HOST = new
  local o, n = got.old, got.new
  local orate, nrate, ocpu, ncpu = median(o.rate), median(n.rate), median(o.cpu), median(n.cpu)
  print("")
  print(("A/B end to end, medians of %d alternating runs each:"):format(rounds))
  print(("  baseline  %s: %7.0f events/s  %5.1f ms CPU per 1,000  p99 %3.0f ms"):format(BASELINE, orate, ocpu, median(o.p99)))
  print(("  this      %s: %7.0f events/s  %5.1f ms CPU per 1,000  p99 %3.0f ms"):format(new, nrate, ncpu, median(n.p99)))
  print(("  ratio     %.2fx the rate, %.2fx the CPU"):format(nrate / orate, ncpu / ocpu))
  print(("RESULT ab_rate_ratio=%.2f ab_cpu_ratio=%.2f"):format(nrate / orate, ncpu / ocpu))
end

---------------------------------------------------------------------------- report

-- Bytes the host moved through read/write syscalls (sqlite's WAL, checkpoints and page
-- cache misses; the log is tiny), per event: the store's write amplification.
local function io_line(r, n)
  if not r.wchar then return "n/a" end
  return ("%.1f KB written, %.1f KB read per event (host read/write syscalls, /proc/PID/io)")
         :format(r.wchar / n / 1024, r.rchar / n / 1024)
end

local function main()
  local ver = (sh(sh_quote(HOST) .. " --version 2>&1")):gsub("%s+$", "")
  print(("nimbus-host throughput bench: %s"):format(ver))
  print(("  N=%d events  sessions=%d  producer chunk=%d  consumer concurrency=%d  window=%d  payload pad=%d B")
        :format(N, SESSIONS, CHUNK, CONC, WINDOW, env_int("BENCH_PAYLOAD", 64)))
  print(("  store in %s (WAL, synchronous=NORMAL as the host sets it); audit + history on"):format(TMP))

  local e = run_e2e()
  local span = e.t_last - e.t_first_publish
  local rate = e.count / span
  print("")
  print("end to end (publish + consume in one host, embedded transport):")
  print(("  events          %d consumed; audit rows Completed %d of %d"):format(e.count, e.audit_completed, e.audit_total))
  print(("  time            %.3f s (first publish to last handler)"):format(span))
  print(("  throughput      %.0f events/s   (target %d: %s)"):format(rate, TARGET, rate >= TARGET and "met" or "NOT met"))
  print(("  latency         p50 %.0f ms  p90 %.0f ms  p99 %.0f ms  max %.0f ms  mean %.1f ms (enqueue commit -> handler)")
        :format(e.p50_ms, e.p90_ms, e.p99_ms, e.max_ms, e.mean_ms))
  print(("  CPU             %.1f ms per 1,000 events (host user + system, publish and consume)")
        :format(e.cpu_s * 1e6 / e.count))
  print(("  peak RSS        %s (VmHWM of the host)"):format(mb(e.hwm_kb)))
  print(("  store I/O       %s"):format(io_line(e, e.count)))

  -- the same at half that rate, in chunks of 16 (latency under a steady load, not a burst)
  local half = math.floor(rate / 2)
  local hr = run_e2e("-half", { "BENCH_RATE=" .. half, "BENCH_CHUNK=16" })
  print(("  at half rate    %d events/s offered: latency p50 %.0f ms  p99 %.0f ms  max %.0f ms; CPU %.1f ms per 1,000")
        :format(half, hr.p50_ms, hr.p99_ms, hr.max_ms, hr.cpu_s * 1e6 / hr.count))

  local c
  if os.getenv("BENCH_SKIP_CONSUME") ~= "1" then
    c = run_consume()
    local cspan = c.t_last - c.t_first
    local pspan = c.preload.t_done - c.preload.t_first_publish
    print("")
    print("consume only (N pre-loaded, then a consumer-only host drains them):")
    print(("  throughput      %.0f events/s   (%d events in %.3f s, first to last handler)"):format(c.count / cspan, c.count, cspan))
    print(("  start-up        first handler %.3f s after the host was launched"):format(c.t_first - c.t_start))
    print(("  CPU             %.1f ms per 1,000 events (from ready to the last handler)"):format(c.cpu_s * 1e6 / c.count))
    print(("  peak RSS        %s"):format(mb(c.hwm_kb)))
    print(("  store I/O       %s"):format(io_line(c, c.count)))
    print(("publish only (the pre-load):  %.0f events/s   (%d events in %.3f s)"):format(c.preload.published / pspan,
          c.preload.published, pspan))
  end
  print("")
  print(("RESULT e2e_events_per_s=%.0f p50_ms=%.0f p99_ms=%.0f peak_rss_mb=%.1f e2e_cpu_ms_per_1k=%.1f "
         .. "half_rate_p99_ms=%.0f half_rate_cpu_ms_per_1k=%.1f%s")
        :format(rate, e.p50_ms, e.p99_ms, (e.hwm_kb or 0) / 1024, e.cpu_s * 1e6 / e.count, hr.p99_ms,
                hr.cpu_s * 1e6 / hr.count, c and (" consume_events_per_s=%.0f"):format(c.count / (c.t_last - c.t_first)) or ""))
  if e.audit_completed ~= N then die(("audit: %d Completed rows for BenchConsumer, expected %d"):format(e.audit_completed, N)) end
  if BASELINE then run_ab() end
  if STRICT and rate < TARGET then
    io.stderr:write(("bench: %.0f events/s is below the target %d\n"):format(rate, TARGET))
    return 1
  end
  return 0
end

B.run(main, cleanup)

-- Throughput bench adapter, run by spec/bench/throughput.lua (not by hand).
--
-- Two endpoints share this one Lua VM:
--   BenchProducer handles BenchStart: publishes the next chunk of BenchWork events
--     (spread round-robin over BENCH_SESSIONS sessions) and, while events remain and
--     the backlog is under BENCH_WINDOW, the next BenchStart to itself. Every publish
--     is buffered and commits with the handler's outcome (one store transaction per batch).
--   BenchConsumer handles BenchWork: a trivial handler that records the latency
--     from enqueue (ctx.enqueued_ms) to handler start and counts; at BENCH_N events
--     it writes the results as JSON to BENCH_RESULT.
--
-- BENCH_MODE selects what is defined:
--   e2e        both endpoints (publish and consume at once)       [default]
--   subscribe  consumer only, started and stopped at once: records its subscription
--              in the store (it persists), while the queue is still empty
--   preload    producer only: fills the consumer's queue with N events, then writes
--              BENCH_RESULT once the last chunk has committed
--   consume    consumer only: drains the pre-loaded queue
local nimbus = require("nimbus")
local core = require("nimbus.core")
local B = require("benchlib")   -- spec/bench/benchlib.lua (the adapter's directory is on package.path)
local env_int = B.env_int

local MODE = os.getenv("BENCH_MODE") or "e2e"
local N = env_int("BENCH_N", 50000)
local SESSIONS = env_int("BENCH_SESSIONS", 1000)
local CONC = env_int("BENCH_CONCURRENCY", 256)
local CHUNK = env_int("BENCH_CHUNK", CONC)
-- Max events published but not yet consumed (e2e only). Bounds queueing delay so the
-- latency figures describe a loaded steady state, not the length of a backlog.
local WINDOW = env_int("BENCH_WINDOW", 2 * CHUNK)
-- Events/s the producer holds to (0: as fast as the window lets it): for latency at a set load.
local RATE = env_int("BENCH_RATE", 0)
local RESULT = os.getenv("BENCH_RESULT")
if not RESULT then error("BENCH_RESULT (the result file) is not set; run spec/bench/throughput.lua") end

local now = core.now   -- seconds since the epoch, ms resolution

local function write_result(t) B.write_json(RESULT, t) end

local published, consumed = 0, 0
local start_pending = false         -- a BenchStart is queued or running
local t_first_publish

local PAYLOAD_PAD = string.rep("x", env_int("BENCH_PAYLOAD", 64))

local producer_mode = MODE == "e2e" or MODE == "preload"
local consumer_mode = MODE == "e2e" or MODE == "consume" or MODE == "subscribe"

local function want_more()
  if published >= N then return false end
  if MODE == "preload" then return true end
  return published - consumed < WINDOW
end

if producer_mode then
  local producer = nimbus.endpoint("BenchProducer", { concurrency = 1 })
  producer:on("BenchStart", function(ev)
    if ev.flush then
      -- Runs after every earlier BenchStart's publishes have committed.
      write_result({ mode = MODE, published = published, t_first_publish = t_first_publish, t_done = now() })
      return
    end
    t_first_publish = t_first_publish or now()
    if RATE > 0 then
      local wait = t_first_publish + published / RATE - now()
      if wait > 0 then nimbus.sleep(wait) end
    end
    local k = math.min(CHUNK, N - published)
    for _ = 1, k do
      published = published + 1
      nimbus.publish("BenchWork", { i = published, pad = PAYLOAD_PAD },
                     { session = "s" .. (published % SESSIONS) })
    end
    start_pending = false
    if want_more() then
      start_pending = true
      nimbus.publish("BenchStart", {}, { session = "bench-producer" })
    elseif MODE == "preload" then
      nimbus.publish("BenchStart", { flush = true }, { session = "bench-producer" })
    end
  end)
end

if consumer_mode then
  local consumer = nimbus.endpoint("BenchConsumer", { concurrency = CONC })
  local lat = {}                  -- ms, enqueue (commit of the publish) to handler start
  local t_first, t_last
  consumer:on("BenchWork", function(_, ctx)
    local t = now()
    consumed = consumed + 1
    lat[consumed] = t * 1000 - ctx.enqueued_ms
    t_first = t_first or t
    t_last = t
    -- Backpressure: the producer stopped at the window; restart it from here (the
    -- publish commits with this batch).
    if producer_mode and not start_pending and published < N and published - consumed < WINDOW then
      start_pending = true
      nimbus.publish("BenchStart", {}, { session = "bench-producer" })
    end
    if consumed == N then
      table.sort(lat)
      local function pct(p) return lat[math.max(1, math.ceil(#lat * p))] end
      local sum = 0
      for i = 1, #lat do sum = sum + lat[i] end
      write_result({
        mode = MODE, count = consumed, t_first_publish = t_first_publish, t_first = t_first, t_last = t_last,
        p50_ms = pct(0.50), p90_ms = pct(0.90), p99_ms = pct(0.99), max_ms = lat[#lat], mean_ms = sum / #lat,
        lua_kb = collectgarbage("count"),
      })
    end
  end)
end

-- Outage bench adapter, run by spec/bench/outage.lua (not by hand).
--
-- Two endpoints share this one Lua VM:
--   OutageProducer handles OutageStart: publishes the next chunk (OUTAGE_CHUNK, 500) of
--     OutageWork events and then the next OutageStart to itself, until
--     BENCH_OUTAGE_SESSIONS x BENCH_OUTAGE_PER_SESSION events are out. The events go out
--     in rounds: round r publishes event r of every session (OUTAGE_PREFIX .. 1 ..
--     OUTAGE_PREFIX .. N, prefix "s"), so every head comes before any second event and the
--     siblings interleave across sessions, as the traffic of a real outage would. A last
--     OutageStart {flush = true} runs after every chunk has committed and writes
--     BENCH_RESULT .. ".producer" (published, t_first_publish, t_done).
--   OutageErp handles OutageWork. While the marker file OUTAGE_MARKER exists, the head
--     (event 1) of every session raises "ERP unavailable: ..." and, with no retries
--     (retry.max_retries = 0), is Failed at once and blocks its session; the host parks
--     the later events of that session (Deferred) without running this handler. Without
--     the marker every event succeeds. The handler counts each event's first successful
--     run (a resubmitted head and the replayed siblings count once each) and writes
--     BENCH_RESULT when all of them have succeeded; BENCH_RESULT .. ".heads" is written
--     when every head has failed once.
--
-- BENCH_MODE selects what is defined:
--   e2e        both endpoints: traffic arrives while the consumer works (or parks)
--   subscribe  consumer only, started and stopped at once: records its subscription in
--              the store while the queue is still empty
--   preload    producer only
--   consume    consumer only                                          [default]
local nimbus = require("nimbus")
local core = require("nimbus.core")
local B = require("benchlib")   -- spec/bench/benchlib.lua (the adapter's directory is on package.path)
local env_int = B.env_int

local MODE = os.getenv("BENCH_MODE") or "consume"
local SESSIONS = env_int("BENCH_OUTAGE_SESSIONS", 10000)
local PER = env_int("BENCH_OUTAGE_PER_SESSION", 10)
local N = SESSIONS * PER
local CHUNK = env_int("OUTAGE_CHUNK", 500)
local CONC = env_int("OUTAGE_CONCURRENCY", 256)
local PREFIX = os.getenv("OUTAGE_PREFIX") or "s"
local MARKER = os.getenv("OUTAGE_MARKER")
local RESULT = os.getenv("BENCH_RESULT")
if not RESULT then error("BENCH_RESULT (the result file) is not set; run spec/bench/outage.lua") end
if PER > 63 then error("BENCH_OUTAGE_PER_SESSION must be <= 63 (one bit per event of a session)") end

local now = core.now   -- seconds since the epoch, ms resolution

local t_first_publish  -- the producer's first publish (e2e: the consumer's result has it too)

if MODE == "e2e" or MODE == "preload" then
  local published = 0
  local producer = nimbus.endpoint("OutageProducer", { concurrency = 1 })
  producer:on("OutageStart", function(ev)
    if ev.flush then
      -- runs after every earlier OutageStart's publishes have committed
      B.write_json(RESULT .. ".producer", { mode = MODE, published = published, t_first_publish = t_first_publish,
                                            t_done = now() })
      return
    end
    t_first_publish = t_first_publish or now()
    local k = math.min(CHUNK, N - published)
    for _ = 1, k do
      local i, r = published % SESSIONS + 1, published // SESSIONS + 1   -- session i, its event r
      nimbus.publish("OutageWork", { i = i, seq = r, order = PREFIX .. i .. "-" .. r }, { session = PREFIX .. i })
      published = published + 1
    end
    nimbus.publish("OutageStart", published < N and {} or { flush = true }, { session = PREFIX .. "-producer" })
  end)
end

if MODE ~= "preload" then
  local erp = nimbus.endpoint("OutageErp", { concurrency = CONC, retry = { max_retries = 0 } })
  -- Per session i: ok[i] has bit r-1 set once event r succeeded, failed[i] once its head
  -- failed. Integer arrays, so the bench's own memory stays small next to the host's.
  local ok, failed = {}, {}
  local ok_count, failed_count, runs = 0, 0, 0
  local t_first, t_first_ok, t_last, t_last_fail
  erp:on("OutageWork", function(ev)
    local t = now()
    local i, r = ev.i, ev.seq
    runs = runs + 1
    t_first = t_first or t
    if r == 1 and MARKER then
      local f = io.open(MARKER, "r")
      if f then
        f:close()
        if not failed[i] then
          failed[i] = true
          failed_count = failed_count + 1
          t_last_fail = t
          if failed_count == SESSIONS then
            B.write_json(RESULT .. ".heads", { failed = failed_count, t_first = t_first, t_last_fail = t_last_fail })
          end
        end
        error("ERP unavailable: connection to erp-7 refused (order " .. tostring(ev.order) .. ")")
      end
    end
    local bits, bit = ok[i] or 0, 1 << (r - 1)
    if bits & bit == 0 then
      ok[i] = bits | bit
      ok_count = ok_count + 1
      t_first_ok = t_first_ok or t
      t_last = t
      if ok_count == N then
        B.write_json(RESULT, { mode = MODE, count = ok_count, runs = runs, failed_heads = failed_count,
                               t_first_publish = t_first_publish, t_first = t_first, t_first_ok = t_first_ok,
                               t_last = t_last, lua_kb = collectgarbage("count") })
      end
    end
  end)
end

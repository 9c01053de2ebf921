-- Outage bench adapter, run by spec/bench/outage.lua (not by hand).
--
-- Two endpoints share this one Lua VM:
--   OutageProducer handles OutageStart: publishes the next chunk (OUTAGE_CHUNK, 500) of
--     OutageWork events and then the next OutageStart to itself, until
--     BENCH_OUTAGE_SESSIONS x BENCH_OUTAGE_PER_SESSION events are out. The events go out
--     in rounds: round r publishes event r of every session ("s1".."sN"), so every head
--     comes before any second event and the siblings interleave across sessions, as the
--     traffic of a real outage would. A last OutageStart {flush = true} runs after every
--     chunk has committed and writes BENCH_RESULT.
--   OutageErp handles OutageWork. While the marker file OUTAGE_MARKER exists, the head
--     (event 1) of every session raises "ERP unavailable: ..." and, with no retries
--     (retry.max_retries = 0), is Failed at once and blocks its session; the host parks
--     the later events of that session (Deferred) without running this handler. Without
--     the marker every event succeeds. The handler counts each event's first successful
--     run (by event id: a resubmitted head and the replayed siblings count once each) and
--     writes BENCH_RESULT when all of them have succeeded; BENCH_RESULT .. ".heads" is
--     written when every head has failed once.
--
-- BENCH_MODE selects what is defined:
--   subscribe  consumer only, started and stopped at once: records its subscription in
--              the store while the queue is still empty
--   preload    producer only
--   consume    consumer only
local nimbus = require("nimbus")
local core = require("nimbus.core")
local cjson = require("cjson")

local function env_int(name, default)
  local v = tonumber(os.getenv(name) or "")
  return v and math.tointeger(v) or default
end

local MODE = os.getenv("BENCH_MODE") or "consume"
local SESSIONS = env_int("BENCH_OUTAGE_SESSIONS", 10000)
local PER = env_int("BENCH_OUTAGE_PER_SESSION", 10)
local N = SESSIONS * PER
local CHUNK = env_int("OUTAGE_CHUNK", 500)
local CONC = env_int("OUTAGE_CONCURRENCY", 256)
local MARKER = os.getenv("OUTAGE_MARKER")
local RESULT = os.getenv("BENCH_RESULT")
if not RESULT then error("BENCH_RESULT (the result file) is not set; run spec/bench/outage.lua") end

local now = core.now   -- seconds since the epoch, ms resolution

local function write_json(path, t)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(cjson.encode(t), "\n")
  f:close()
  assert(os.rename(tmp, path))   -- the runner never sees a half-written file
end

if MODE == "preload" then
  local published, t_first_publish = 0, nil
  local producer = nimbus.endpoint("OutageProducer", { concurrency = 1 })
  producer:on("OutageStart", function(ev)
    if ev.flush then
      -- runs after every earlier OutageStart's publishes have committed
      write_json(RESULT, { mode = MODE, published = published, t_first_publish = t_first_publish, t_done = now() })
      return
    end
    t_first_publish = t_first_publish or now()
    local k = math.min(CHUNK, N - published)
    for _ = 1, k do
      local seq = published                      -- 0-based position in the publish order
      local i, r = seq % SESSIONS + 1, seq // SESSIONS + 1
      nimbus.publish("OutageWork", { id = "s" .. i .. "-" .. r, seq = r }, { session = "s" .. i })
      published = published + 1
    end
    nimbus.publish("OutageStart", published < N and {} or { flush = true }, { session = "outage-producer" })
  end)
else
  local erp = nimbus.endpoint("OutageErp", { concurrency = CONC, retry = { max_retries = 0 } })
  local ok_ids, ok_count = {}, 0        -- event ids whose handler succeeded (once each)
  local failed_ids, failed_count = {}, 0
  local runs = 0
  local t_first, t_first_ok, t_last, t_last_fail
  erp:on("OutageWork", function(ev, ctx)
    local t = now()
    runs = runs + 1
    t_first = t_first or t
    if ev.seq == 1 and MARKER then
      local f = io.open(MARKER, "r")
      if f then
        f:close()
        if not failed_ids[ctx.event_id] then
          failed_ids[ctx.event_id] = true
          failed_count = failed_count + 1
          t_last_fail = t
          if failed_count == SESSIONS then
            write_json(RESULT .. ".heads", { failed = failed_count, t_first = t_first, t_last_fail = t_last_fail })
          end
        end
        error("ERP unavailable: connection to erp-7 refused (order " .. tostring(ev.id) .. ")")
      end
    end
    if not ok_ids[ctx.event_id] then
      ok_ids[ctx.event_id] = true
      ok_count = ok_count + 1
      t_first_ok = t_first_ok or t
      t_last = t
      if ok_count == N then
        write_json(RESULT, { mode = MODE, count = ok_count, runs = runs, failed_heads = failed_count,
                             t_first = t_first, t_first_ok = t_first_ok, t_last = t_last,
                             lua_kb = collectgarbage("count") })
      end
    end
  end)
end

-- Outage benchmark of nimbus-host: a downstream system goes away while traffic keeps
-- arriving, every session blocks on its head event, the rest of the traffic is parked, then
-- the operator recovers it in bulk (one `resubmit --all --group G`) and purges what is done.
--
--   make bench
--   nimbus-host -l spec/bench/outage.lua path/to/nimbus-host
--   BENCH_OUTAGE_SESSIONS=100000 BENCH_DEADLINE=1800 nimbus-host -l spec/bench/outage.lua ...
--                                                       (the issue's full size, 1,000,000 events)
--
-- Environment: BENCH_OUTAGE_SESSIONS (10000), BENCH_OUTAGE_PER_SESSION (events per
-- session, 10, at most 63), BENCH_DEADLINE (seconds for the whole bench, 300), BENCH_KEEP=1
-- (keep the temp dir), BENCH_OUTAGE_PHASES (the phases to run, comma-separated, default
-- "1,1b,2b,2,3,4,6"; 3, 4 and 6 need 2, a ratio needs 1: "1,2,4" profiles the drain alone). The adapter is spec/bench/outage_adapter.lua; N = sessions x
-- per_session, published in rounds (event r of every session, then event r+1), 500 per
-- producer handler. Real nimbus-host processes, each phase in a fresh store in a temp dir:
--   1.  happy path: producer and consumer in one host, no outage; events/s from the first
--       publish to the last handler.
--   1b. pre-loaded happy path: N events pre-loaded by a producer-only host, drained by a
--       consumer-only host; events/s from the first to the last handler (the consume-only rate).
--   2b. pre-loaded outage: the marker file exists (the head of every session fails, no
--       retries, and blocks it), N events pre-loaded, then a consumer-only host parks the
--       siblings; events/s from its first handler to the last park; the host is stopped.
--   2.  outage: the marker exists and producer and consumer run in one host, so every
--       sibling arrives while sessions block; once the host is idle, `events --count`
--       confirms every head Failed and every sibling Deferred (the counts are not polled
--       while it works: each scans the audit on a core the host could use); events/s from
--       the first publish to the last park (the latest `updated_at` of the Deferred rows),
--       the ratio to phase 1 (target >= 0.7), the host's memory (VmHWM; target < 100 MB).
--       The host keeps running for 3 and 4.
--   3.  one `events --count --status deferred` call, timed (target < 1 s).
--   4.  recovery, the phase-2 host running: `failures` timed, the one group id from
--       `failures --json`, the marker removed, `resubmit --all --group G` timed (requests
--       queued/s from its wall time, target >= 5000/s), then until every event is Completed
--       (the resubmitted heads run, the parked siblings replay): drain events/s and the
--       ratio to phase 1 (target >= 0.7).
--   6.  retention: unless `purge` is not in the binary ("purge: not available yet"), the
--       phase-2 host is stopped, the store purged (`purge --resolved-before 0s`; a binary
--       that refuses an age of 0 gets 1s, once the last event is older) and its size taken
--       (the .db and its -wal), phases 2 and 4 run again into it (fresh session names), it
--       is purged again and the two sizes compared (target: no larger).
--   Then a summary, one figure per line with its target (and a warning when the binary was
--   rebuilt during the run). The stores of 1, 1b and 2b are removed once their phase is
--   over (about 600 MB each at full size).
-- A missed target does not fail the bench; exit 1 when a phase did not complete within
-- the deadline or a host died (the figures reached so far are printed first).
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local env_int, sh_quote, sh, read_file, write_file, die, alive, mb =
  B.env_int, B.sh_quote, B.sh, B.read_file, B.write_file, B.die, B.alive, B.mb

local HOST = B.host_binary("outage.lua")

local SESSIONS = env_int("BENCH_OUTAGE_SESSIONS", 10000)
local PER = env_int("BENCH_OUTAGE_PER_SESSION", 10)
local N = SESSIONS * PER
local SIBLINGS = N - SESSIONS
local DEADLINE_S = env_int("BENCH_DEADLINE", 300)   -- whole bench; each phase gets what is left
local RESERVE_S = 3                                  -- kept back for the report and the clean-up
local POLL_S = 0.5                                   -- CLI polls start at least this far apart
local ENDPOINT = "OutageErp"
local T_RATIO, T_RSS_MB, T_COUNT_S, T_RESUBMIT = 0.7, 100, 1, 5000
local t_bench0 = system.monotime()

if SESSIONS < 1 or PER < 2 or PER > 63 then
  io.stderr:write("bench: BENCH_OUTAGE_SESSIONS must be >= 1 and BENCH_OUTAGE_PER_SESSION from 2 to 63\n")
  os.exit(2)
end

local ADAPTER = B.dir .. "/outage_adapter.lua"

local TMP = B.tmpdir("nimbus-outage")
local hosts = B.hosts(TMP)   -- every host started, for the clean-up

local function remaining() return DEADLINE_S - (system.monotime() - t_bench0) end
local function budget() return math.max(1, remaining() - RESERVE_S) end

---------------------------------------------------------------------------- the binary
-- The binary's modification time (seconds since the epoch) or nil: a rebuild during the
-- run is reported with the figures, which then mix two builds.
local function binary_mtime()
  return tonumber((sh("stat -c %Y " .. sh_quote(HOST) .. " 2>/dev/null")):match("%d+"))
end
local MTIME0 = binary_mtime()

-- The binary may be rebuilt while the bench runs: wait for it to be back (up to 60 s).
local function wait_binary()
  local t0 = system.monotime()
  while not os.execute("test -x " .. sh_quote(HOST)) do
    if system.monotime() - t0 > 60 then die(HOST .. " has been missing for 60 s") end
    system.sleep(0.5)
  end
end

-- Runs a CLI command line (`HOST ...` prefixed here); stdout, the exit status and the wall
-- time of the try that ran, retried a few times when the shell could not exec the binary
-- (126/127: missing or being written). Each try is bounded by what is left of the
-- deadline (`timeout`: exit 124 when it ran out).
local function cli(args, redirect)
  for attempt = 1, 10 do
    wait_binary()
    local t0 = system.monotime()
    local out, code = sh(("timeout -k 5 %d "):format(math.ceil(budget())) .. sh_quote(HOST) .. " " .. args .. " " ..
                         (redirect or "2>/dev/null"))
    local secs = system.monotime() - t0
    if code == 124 or code == 137 then
      die(("`nimbus-host %s` did not return within the deadline (BENCH_DEADLINE=%d s)"):format(args, DEADLINE_S))
    end
    if code ~= 126 and code ~= 127 then return out, code, secs end
    if attempt < 10 then system.sleep(1) end
  end
  die("cannot run " .. HOST .. " " .. args)
end

local function first_line(s) return (s:match("^%s*([^\n]*)") or ""):gsub("%s+$", "") end

---------------------------------------------------------------------------- hosts
-- Starts a host on the outage adapter in the given mode (e2e, subscribe, preload,
-- consume); opts.marker (the outage is on while it exists), opts.prefix (session names).
local function start_host(name, mode, store, opts)
  opts = opts or {}
  wait_binary()
  local result = TMP .. "/" .. name .. ".json"
  local env = {
    "BENCH_MODE=" .. mode, "BENCH_RESULT=" .. sh_quote(result), "BENCH_OUTAGE_SESSIONS=" .. SESSIONS,
    "BENCH_OUTAGE_PER_SESSION=" .. PER, "OUTAGE_MARKER=" .. sh_quote(opts.marker or (TMP .. "/no-outage.marker")),
    "OUTAGE_PREFIX=" .. sh_quote(opts.prefix or "s"),
  }
  local cmd = table.concat(env, " ") .. " " .. sh_quote(HOST) .. " " .. sh_quote(ADAPTER) .. " --store " ..
              sh_quote(store) .. " --no-reload"
  local h = hosts:spawn(name, cmd)
  h.result, h.prefix = result, opts.prefix or "s"
  return h
end

-- Memory of a running host: max sampled VmRSS and the kernel's high-water mark VmHWM.
local function sample_mem(h)
  if h.stopped then return end
  local rss, hwm = B.proc_field(h.pid, "VmRSS"), B.proc_field(h.pid, "VmHWM")
  if rss and rss > (h.max_rss_kb or 0) then h.max_rss_kb = rss end
  if hwm and hwm > (h.hwm_kb or 0) then h.hwm_kb = hwm end
end

-- Polls for a result file of the host (sampling its memory) for at most `limit` seconds;
-- on time-out calls partial() (which records what was reached and says it) and fails.
local function wait_file(h, path, limit, partial)
  local t0 = system.monotime()
  while true do
    sample_mem(h)
    local s = read_file(path)
    if s then return cjson.decode(s) end
    if not alive(h.pid) then hosts:died(h) end
    local el = system.monotime() - t0
    if el > limit then
      local what = partial and partial(el) or ""
      die(("%s: not finished after %.0f s (deadline BENCH_DEADLINE=%d s)%s"):format(h.name, el, DEADLINE_S, what))
    end
    system.sleep(0.02)
  end
end

local function publish(store, etype, json, session)
  local out, code = cli("publish " .. etype .. " " .. sh_quote(json) .. " --session " .. sh_quote(session) ..
                        " --store " .. sh_quote(store), "2>&1")
  if code ~= 0 then die("publish " .. etype .. " failed (" .. tostring(code) .. "): " .. out) end
end

-- Starts the host's producer (e2e, preload).
local function kick(h, store) publish(store, "OutageStart", "{}", h.prefix .. "-producer") end

---------------------------------------------------------------------------- the store
-- The audit rows of a status (and endpoint), by `events --count`; nil if it failed.
local function count_events(store, status, endpoint)
  local out, code = cli("events --count --status " .. status .. (endpoint and (" --endpoint " .. endpoint) or "") ..
                        " --store " .. sh_quote(store), "2>/dev/null")
  return code == 0 and tonumber(out:match("(%d+)")) or nil
end

-- Polls (sampling h's memory) until the store has n rows of the status, for at most
-- `limit` seconds; returns the last count.
local function wait_count(h, store, status, n, limit)
  local t0, got = system.monotime(), nil
  while true do
    if h then sample_mem(h) end
    got = count_events(store, status, ENDPOINT)
    if got == n or system.monotime() - t0 > limit then return got end
    system.sleep(POLL_S)
  end
end

-- Seconds since the epoch of an ISO 8601 UTC time as the CLI prints it
-- (2025-01-31T12:34:56.789Z), without the local time zone getting involved.
local function iso_to_epoch(s)
  local y, mo, d, h, mi, se, ms = s:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)%.?(%d*)Z$")
  if not y then return nil end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  -- days from 1970-01-01 (the proleptic Gregorian calendar, years counted from March)
  local yy = mo <= 2 and y - 1 or y
  local era = yy // 400
  local yoe = yy - era * 400
  local doy = (153 * (mo > 2 and mo - 3 or mo + 9) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(se) + (tonumber(ms ~= "" and ms or "0") / 1000)
end

-- The latest updated_at of the rows of a status: when the last of them got there (the
-- times are ISO 8601 UTC of one width, so the greatest string is the latest).
local function latest_update(store, status)
  local out = sh(("timeout -k 5 %d "):format(math.ceil(budget())) .. sh_quote(HOST) .. " events --json --status " ..
                 status .. " --endpoint " .. ENDPOINT .. " --store " .. sh_quote(store) ..
                 " 2>/dev/null | sed -n 's/.*\"updated_at\":\"\\([^\"]*\\)\".*/\\1/p'" ..
                 " | awk '$0 > m { m = $0 } END { print m }'")
  return iso_to_epoch((out:gsub("%s+$", "")))
end

-- The store file's size in bytes: the .db and its -wal.
local function store_bytes(store)
  local n = 0
  for _, p in ipairs({ store, store .. "-wal" }) do
    local f = io.open(p, "rb")
    if f then
      n = n + f:seek("end")
      f:close()
    end
  end
  return n
end

-- Removes a store whose phase is over (they are large at full size), unless BENCH_KEEP=1.
local function drop_store(store)
  if os.getenv("BENCH_KEEP") == "1" then return end
  for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(store .. suffix) end
end

local function fmt_mb(bytes) return ("%.1f MB"):format(bytes / 1048576) end

---------------------------------------------------------------------------- phases
local R = {}   -- figures reached so far, for the summary
local function ratio(rate) return R.happy and R.happy.rate and rate and rate / R.happy.rate end
local function ratio_str(rate, base)
  local r = ratio(rate)
  return r and ("%.2f x the %s rate"):format(r, base or "happy-path") or "no happy-path rate"
end

-- 1: producer and consumer in one host, no outage.
local function phase1()
  print("")
  print("1. happy path (no outage): producer and consumer in one host")
  local store = TMP .. "/happy.db"
  local h = start_host("happy", "e2e", store)
  local H = { partial = true }
  R.happy = H
  hosts:wait_ready(h, 20)
  kick(h, store)
  local r = wait_file(h, h.result, budget(), function()
    H.completed = count_events(store, "completed", ENDPOINT)
    return ("; %s of %d events Completed"):format(tostring(H.completed), N)
  end)
  local done = wait_count(h, store, "completed", N, math.min(30, budget()))
  if done ~= N then die(("happy path: the adapter handled all %d events, the audit has %s Completed"):format(N, tostring(done))) end
  local p = wait_file(h, h.result .. ".producer", math.min(30, budget()))
  sample_mem(h)
  hosts:check_stop(h)
  H.span = r.t_last - r.t_first_publish
  H.rate, H.partial, H.hwm_kb = N / H.span, false, h.hwm_kb
  H.publish_rate = p.published / (p.t_done - p.t_first_publish)
  print(("  traffic          %d events published at %.0f events/s (first to last publish committed)")
        :format(p.published, H.publish_rate))
  print(("  happy path       %d events Completed, %.3f s from the first publish to the last handler: %.0f events/s")
        :format(N, H.span, H.rate))
  print(("  memory           VmHWM %s, max sampled VmRSS %s"):format(mb(h.hwm_kb), mb(h.max_rss_kb)))
  drop_store(store)
end

-- A fresh store with the consumer's subscription and N events pre-loaded in rounds.
local function preload(tag, marker)
  local store = TMP .. "/" .. tag .. ".db"
  local s = start_host(tag .. "-subscribe", "subscribe", store, { marker = marker })
  hosts:wait_ready(s, 20)
  hosts:check_stop(s)
  local p = start_host(tag .. "-preload", "preload", store, { marker = marker })
  hosts:wait_ready(p, 20)
  kick(p, store)
  local pr = wait_file(p, p.result .. ".producer", budget(), function()
    return ("; pre-load of %d events into %s incomplete"):format(N, store)
  end)
  hosts:check_stop(p)
  if pr.published ~= N then die(("%s: pre-load published %d events, expected %d"):format(tag, pr.published, N)) end
  pr.rate = pr.published / (pr.t_done - pr.t_first_publish)
  return store, pr
end

-- 1b: the consume-only rate.
local function phase1b()
  print("")
  print("1b. happy path, pre-loaded: a producer-only host pre-loads N, a consumer-only host drains them")
  local store, pr = preload("happy-pre")
  local P = { partial = true, preload_rate = pr.rate }
  R.happy_pre = P
  print(("  pre-load         %d events published at %.0f events/s"):format(pr.published, pr.rate))
  local c = start_host("happy-pre-consume", "consume", store)
  hosts:wait_ready(c, 20)
  local r = wait_file(c, c.result, budget(), function()
    P.completed = count_events(store, "completed", ENDPOINT)
    return ("; %s of %d events Completed"):format(tostring(P.completed), N)
  end)
  sample_mem(c)
  hosts:check_stop(c)
  P.span = r.t_last - r.t_first
  P.rate, P.partial, P.hwm_kb, P.startup = r.count / P.span, false, c.hwm_kb, r.t_first - c.t_launch
  print(("  consume          %d events in %.3f s (first to last handler): %.0f events/s"):format(r.count, P.span, P.rate))
  print(("  start-up         first handler %.3f s after launch; host VmHWM %s"):format(P.startup, mb(c.hwm_kb)))
  drop_store(store)
end

-- Waits until every head is Failed and every sibling Deferred, sampling the host's memory;
-- O.parked, O.failed, O.t_poll on the way. A count scans the audit (0.4 s at 900,000 rows,
-- on a core the host could use), so the counts are not polled while the host works: first
-- the adapter's files (`needs`: every head has failed, the producer is done), then the
-- host's CPU time, and the counts once the host is idle (under 20 % of a core over 0.5 s)
-- or else every max(5 s, 10 x the last count's time). The times come from the audit rows,
-- not from when a poll saw them.
local function wait_parked(O, h, store, needs, since_label)
  local limit, t0 = budget(), system.monotime()
  local function check()
    sample_mem(h)
    if not alive(h.pid) then hosts:died(h) end
    if system.monotime() - t0 <= limit then return end
    O.parked = count_events(store, "deferred", ENDPOINT) or O.parked
    O.failed = count_events(store, "failed", ENDPOINT) or O.failed
    O.t_poll = system.gettime()
    local since = O.t_poll - O.t0
    die(("%s: %d of %d siblings Deferred (%.0f parked/s so far), %s of %d heads Failed, " ..
         "%.1f s after %s (deadline BENCH_DEADLINE=%d s)")
        :format(O.tag, O.parked, SIBLINGS, O.parked / math.max(since, 0.001), tostring(O.failed or "?"), SESSIONS, since,
                since_label, DEADLINE_S))
  end
  for _, path in ipairs(needs) do
    while not read_file(path) do
      check()
      system.sleep(0.05)
    end
  end
  local cpu0, m0 = B.proc_cpu(h.pid), system.monotime()
  local last_count, count_cost = -math.huge, 0
  while true do
    check()
    system.sleep(0.5)
    local cpu, m = B.proc_cpu(h.pid), system.monotime()
    local busy = cpu and cpu0 and (cpu - cpu0) / (m - m0) or 1
    if busy < 0.2 or m - last_count >= math.max(5, 10 * count_cost) then
      local n = count_events(store, "deferred", ENDPOINT)
      O.t_poll = system.gettime()
      if n then O.parked = n end
      if O.parked >= SIBLINGS then
        O.failed = count_events(store, "failed", ENDPOINT)
        if O.failed and O.failed >= SESSIONS then break end
      end
      last_count = system.monotime()
      count_cost = last_count - m
      cpu, m = B.proc_cpu(h.pid), system.monotime()
    end
    cpu0, m0 = cpu, m
  end
  sample_mem(h)
  O.hwm_kb, O.max_rss_kb = h.hwm_kb, h.max_rss_kb
  -- the last park and the last failure, from the audit rows (ms); the poll that saw them
  -- is the fallback
  local function latest(status)
    local t = latest_update(store, status)
    if t and t >= O.t0 - 1 and t <= O.t_poll + 1 then return t, "audit updated_at" end
    return O.t_poll, "the poll that saw it"
  end
  O.t_last_park, O.park_src = latest("deferred")
  O.t_last_fail = latest("failed")
  O.span = math.max(O.t_last_park, O.t_last_fail) - O.t0
  O.park_span = O.t_last_park - O.t0
  O.rate = N / O.span
  O.park_rate = SIBLINGS / O.park_span
  O.partial = false
end

local function print_parked(O, since_label)
  print(("  heads            %d Failed, the last %.3f s after %s"):format(O.failed, O.t_last_fail - O.t0, since_label))
  print(("  parked           %d Deferred, the last %.3f s after %s (%s; polling saw it at %.1f s)")
        :format(O.parked, O.park_span, since_label, O.park_src, O.t_poll - O.t0))
  print(("  outage rate      %.0f events/s settled (heads Failed + siblings Deferred, %d in %.3f s); %.0f parked/s")
        :format(O.rate, N, O.span, O.park_rate))
end

-- 2b: the pre-loaded outage (each sibling arrives at an already blocked session).
local function phase2b()
  print("")
  print(("2b. outage, pre-loaded: N pre-loaded with the ERP down, a consumer-only host fails %d heads, parks %d siblings")
        :format(SESSIONS, SIBLINGS))
  local marker = TMP .. "/erp-7-down.marker"
  write_file(marker, "ERP erp-7 is down\n")
  local store, pr = preload("outage-pre", marker)
  print(("  pre-load         %d events published at %.0f events/s"):format(pr.published, pr.rate))
  local h = start_host("outage-pre-consume", "consume", store, { marker = marker })
  local O = { tag = "outage (pre-loaded)", partial = true, parked = 0, t0 = h.t_launch }
  R.outage_pre = O
  hosts:wait_ready(h, 20)
  wait_parked(O, h, store, { h.result .. ".heads" }, "the consumer's launch")
  local heads = wait_file(h, h.result .. ".heads", math.min(10, budget()))
  hosts:check_stop(h)
  -- from the first handler, as 1b
  O.span, O.park_span = O.span - (heads.t_first - O.t0), O.park_span - (heads.t_first - O.t0)
  O.t0 = heads.t_first
  O.rate, O.park_rate = N / O.span, SIBLINGS / O.park_span
  print_parked(O, "the first handler")
  print(("  ratio            %s (pre-loaded: consume-only)"):format(R.happy_pre and R.happy_pre.rate and
        ("%.2f x the 1b rate"):format(O.rate / R.happy_pre.rate) or "no 1b rate"))
  print(("  memory           VmHWM %s, max sampled VmRSS %s"):format(mb(O.hwm_kb), mb(O.max_rss_kb)))
  os.remove(marker)
  drop_store(store)
end

-- 2 (and 6): the outage with traffic arriving, producer and consumer in one host started
-- on `store`; the host keeps running. Fills O (the figures) and returns the round:
-- { tag, store, marker, host, O }.
local function run_outage(tag, store, prefix, O)
  local marker = TMP .. "/" .. tag .. "-erp-7-down.marker"
  write_file(marker, "ERP erp-7 is down\n")
  local h = start_host(tag, "e2e", store, { marker = marker, prefix = prefix })
  O.tag, O.partial, O.parked, O.t0 = tag, true, 0, h.t_launch
  local round = { tag = tag, store = store, marker = marker, host = h, O = O }
  hosts:wait_ready(h, 20)
  kick(h, store)
  wait_parked(O, h, store, { h.result .. ".heads", h.result .. ".producer" }, "the consumer's launch")
  local p = wait_file(h, h.result .. ".producer", math.min(30, budget()))
  -- from the first publish
  local shift = p.t_first_publish - O.t0
  O.span, O.park_span, O.t0 = O.span - shift, O.park_span - shift, p.t_first_publish
  O.rate, O.park_rate = N / O.span, SIBLINGS / O.park_span
  O.publish_rate = p.published / (p.t_done - p.t_first_publish)
  print(("  traffic          %d events published at %.0f events/s (first to last publish committed)")
        :format(p.published, O.publish_rate))
  print_parked(O, "the first publish")
  print(("  ratio            %s"):format(ratio_str(O.rate)))
  print(("  memory           VmHWM %s, max sampled VmRSS %s"):format(mb(O.hwm_kb), mb(O.max_rss_kb)))
  return round
end

local outage   -- the phase-2 round

local function phase2()
  print("")
  print(("2. outage, traffic arriving: producer and consumer in one host, the ERP down; %d heads fail, %d siblings park")
        :format(SESSIONS, SIBLINGS))
  R.outage = {}
  outage = run_outage("outage", TMP .. "/outage.db", "s", R.outage)
end

local function phase3()
  print("")
  print("3. events --count --status deferred")
  local out, code, secs = cli("events --count --status deferred --store " .. sh_quote(outage.store), "2>&1")
  if code ~= 0 then
    R.count = { failed = true }
    print(("  events --count failed (exit %s): %s"):format(tostring(code), first_line(out)))
    return
  end
  local n = tonumber(out:match("(%d+)"))
  R.count = { secs = secs, n = n }
  print(("  one call         %.3f s, printed %q%s"):format(secs, first_line(out),
        n == SIBLINGS and "" or (" (expected %d)"):format(SIBLINGS)))
end

-- 4 (and 6): recovery of a round, its host running. Fills D (the figures) and returns it.
local function run_recovery(round, D)
  local h, store = round.host, round.store
  D.stage = "failures"
  -- the operator looks
  local out, code, secs = cli("failures --store " .. sh_quote(store), "2>&1")
  if code ~= 0 then die(("failures failed (exit %s): %s"):format(tostring(code), out)) end
  D.failures_s = secs
  local rows = {}
  for l in out:gmatch("[^\n]+") do if not l:match("^GROUP") and not l:match("^resubmit") then rows[#rows + 1] = l end end
  print(("  failures         %.3f s, %d group%s:"):format(secs, #rows, #rows == 1 and "" or "s"))
  for i = 1, math.min(#rows, 3) do print("                     " .. rows[i]) end
  local jout, jcode, jsecs = cli("failures --json --store " .. sh_quote(store), "2>&1")
  if jcode ~= 0 then die(("failures --json failed (exit %s): %s"):format(tostring(jcode), jout)) end
  local groups = {}
  for l in jout:gmatch("[^\n]+") do
    local g = cjson.decode(l)
    if g.endpoint == ENDPOINT then groups[#groups + 1] = g end
  end
  D.failures_json_s = jsecs
  local filter
  if #groups == 1 then
    D.group = groups[1].group
    filter = "--group " .. sh_quote(D.group)
    print(("  failures --json  %.3f s: group %s, %d events, %q"):format(jsecs, D.group, groups[1].count, groups[1].message))
    if groups[1].count ~= SESSIONS then
      print(("  warning          the group has %d events, expected %d (one per head)"):format(groups[1].count, SESSIONS))
    end
  else
    filter = "--endpoint " .. ENDPOINT .. " --status failed"
    print(("  warning          %d failure groups for %s, expected 1: resubmitting %s instead"):format(#groups, ENDPOINT, filter))
  end
  -- the ERP is back; one resubmit --all
  os.remove(round.marker)
  D.stage = "resubmit"
  local errf = TMP .. "/" .. round.tag .. "-resubmit.err"
  local t_start = system.gettime()
  out, code, secs = cli("resubmit --all " .. filter .. " --store " .. sh_quote(store), "2>" .. sh_quote(errf))
  if code ~= 0 then
    die(("resubmit --all %s failed (exit %s): %s%s"):format(filter, tostring(code), read_file(errf) or "", out))
  end
  D.queued = tonumber(out:match("queued (%d+)"))
  D.resubmit_s = secs
  D.resubmit_rate = (D.queued or 0) / secs
  print(("  resubmit --all   %s: %.3f s, %.0f requests/s (printed %q)"):format(filter, secs, D.resubmit_rate, first_line(out)))
  if D.queued ~= SESSIONS then
    print(("  warning          %s requests queued, expected %d (one per Failed head)"):format(tostring(D.queued), SESSIONS))
  end
  -- the heads run, the siblings replay
  D.stage = "drain"
  local r = wait_file(h, h.result, budget(), function()
    D.completed = count_events(store, "completed", ENDPOINT)
    local el = system.gettime() - t_start
    return ("; %s of %d events Completed %.1f s after resubmit --all started (%.0f events/s so far)")
           :format(tostring(D.completed), N, el, (D.completed or 0) / el)
  end)
  -- the handler returned; its outcome commits just after: wait for the audit to agree
  local done = wait_count(h, store, "completed", N, math.min(30, budget()))
  if done ~= N then die(("recovery: the adapter handled all %d events, the audit has %s Completed"):format(N, tostring(done))) end
  sample_mem(h)
  D.t_last = r.t_last
  D.span = r.t_last - r.t_first_ok
  D.rate = N / D.span
  D.wall = r.t_last - t_start
  D.stage = nil
  D.hwm_kb, D.max_rss_kb = h.hwm_kb, h.max_rss_kb
  print(("  drain            %d events Completed, first to last successful handler %.3f s: %.0f events/s (%s)")
        :format(N, D.span, D.rate, ratio_str(D.rate)))
  print(("  wall             %.3f s from resubmit --all starting to the last handler"):format(D.wall))
  print(("  memory           VmHWM %s, max sampled VmRSS %s (since the host's launch: outage and recovery)")
        :format(mb(h.hwm_kb), mb(h.max_rss_kb)))
  return D
end

local function phase4()
  print("")
  print("4. recovery, the phase-2 host running: failures, marker removed, resubmit --all --group G, parked events replay")
  R.drain = {}
  run_recovery(outage, R.drain)
end

-- Purges every resolved event of a store (its hosts stopped); returns the size after and
-- before, in bytes, and the purge's wall time. The age asked for is 0s; a binary that
-- refuses it (it wants 1s at least) is given 1s, once the last event is older than that.
local purge_age = "0s"
local function purge(store, t_last)
  local before = store_bytes(store)
  if purge_age == "1s" then
    local wait = t_last + 1.5 - system.gettime()
    if wait > 0 then system.sleep(wait) end
  end
  local out, code, secs = cli("purge --resolved-before " .. purge_age .. " --store " .. sh_quote(store), "2>&1")
  if code == 2 and purge_age == "0s" then
    print(("  purge 0s         refused (exit 2): %s"):format(first_line(out)))
    purge_age = "1s"
    return purge(store, t_last)
  end
  if code ~= 0 then die(("purge --resolved-before %s failed (exit %s): %s"):format(purge_age, tostring(code), out)) end
  local after = store_bytes(store)
  print(("  purge %-10s %.3f s, store %s -> %s (.db + -wal; printed %q)"):format(purge_age, secs, fmt_mb(before),
        fmt_mb(after), first_line(out)))
  local left = count_events(store, "completed")
  if left ~= 0 then print(("  warning          %s Completed rows left after the purge"):format(tostring(left))) end
  return after, before, secs
end

-- 6: retention. Stops the phase-2 host.
local function phase6()
  print("")
  print("6. retention: purge after recovery, the whole outage and recovery again into the same store, purge again")
  local store = outage.store
  hosts:check_stop(outage.host)
  local out, code = cli("purge --resolved-before 0s --dry-run --store " .. sh_quote(store), "2>&1")
  if code == 2 and out:match("unknown command") then
    R.purge = { available = false }
    print("purge: not available yet")
    return
  end
  local P = { available = true, stage = "first purge" }
  R.purge = P
  if code == 0 then print(("  dry run          %s"):format(first_line(out))) end
  P.size1, P.before1, P.secs1 = purge(store, R.drain.t_last)
  print("  again            the outage (fresh session names) and its recovery into the same store:")
  P.stage = "second outage"
  P.outage, P.drain = {}, {}
  local again = run_outage("again", store, "r2s", P.outage)
  P.stage = "second recovery"
  run_recovery(again, P.drain)
  hosts:check_stop(again.host)
  P.stage = "second purge"
  P.size2, P.before2, P.secs2 = purge(store, P.drain.t_last)
  P.stage = nil
  P.grew = P.size2 > P.size1
  print(("  store size       %s after the first purge, %s after the second: %s")
        :format(fmt_mb(P.size1), fmt_mb(P.size2), P.grew and ("grew by %s"):format(fmt_mb(P.size2 - P.size1)) or "no larger"))
end

---------------------------------------------------------------------------- report
local function verdict(ok) return ok and "met" or "NOT met" end

local function summary(failure)
  local H, O, D = R.happy or {}, R.outage or {}, R.drain or {}
  local lines = {}
  local function add(label, fmt, ...) lines[#lines + 1] = ("  %-30s " .. fmt):format(label, ...) end
  local function rate_line(label, X, what)
    if X and X.rate then
      add(label, "%8.0f events/s   (%s)", X.rate, what(X))
      return true
    elseif X and X.partial then
      add(label, "NOT COMPLETED")
    else
      add(label, "not reached")
    end
  end
  rate_line("1  happy path", H, function(X) return ("%d in %.1f s, first publish to last handler"):format(N, X.span) end)
  rate_line("1b happy path, pre-loaded", R.happy_pre, function(X)
    return ("%d in %.1f s, consume only; pre-load %.0f events/s"):format(N, X.span, X.preload_rate)
  end)
  rate_line("2b outage, pre-loaded", R.outage_pre, function(X)
    return ("%d in %.1f s from the first handler; %s"):format(N, X.span, R.happy_pre and R.happy_pre.rate and
           ("%.2f x 1b"):format(X.rate / R.happy_pre.rate) or "no 1b")
  end)
  if rate_line("2  outage", O, function(X)
    return ("%d in %.1f s, first publish to last park; %.0f parked/s"):format(N, X.span, X.park_rate)
  end) and ratio(O.rate) then
    add("     ratio to happy path", "%8.3f          (target >= %.1f: %s)", ratio(O.rate), T_RATIO, verdict(ratio(O.rate) >= T_RATIO))
  elseif O.partial and O.t_poll and O.t0 then
    local since = O.t_poll - O.t0
    add("     reached", "%d of %d parked after %.1f s (%.0f parked/s so far)", O.parked or 0, SIBLINGS, since,
        (O.parked or 0) / math.max(since, 0.001))
  end
  local hwm = D.hwm_kb or O.hwm_kb
  if hwm then
    add("   outage host peak RSS", "%8.1f MB VmHWM (max VmRSS %.1f MB; target < %d MB: %s)", hwm / 1024,
        (D.max_rss_kb or O.max_rss_kb or 0) / 1024, T_RSS_MB, verdict(hwm / 1024 < T_RSS_MB))
  end
  local C = R.count
  if C and C.secs then
    add("3  events --count deferred", "%8.3f s          (target < %d s: %s)", C.secs, T_COUNT_S, verdict(C.secs < T_COUNT_S))
  else
    add("3  events --count deferred", C and "FAILED" or "not reached")
  end
  if D.failures_s then
    add("4  failures", "%8.3f s          (--json %.3f s%s)", D.failures_s, D.failures_json_s or 0,
        D.group and (", group " .. D.group) or ", no single group")
  else
    add("4  failures", "not reached")
  end
  if D.resubmit_rate then
    add("   resubmit --all --group", "%8.0f requests/s (%s in %.3f s; target >= %d/s: %s)", D.resubmit_rate,
        tostring(D.queued), D.resubmit_s, T_RESUBMIT, verdict(D.resubmit_rate >= T_RESUBMIT))
  else
    add("   resubmit --all --group", D.stage == "resubmit" and "NOT COMPLETED" or "not reached")
  end
  if D.rate then
    add("   recovery drain", "%8.0f events/s   (%d in %.1f s, first to last handler; %.1f s wall from resubmit)",
        D.rate, N, D.span, D.wall)
    if ratio(D.rate) then
      add("     ratio to happy path", "%8.3f          (target >= %.1f: %s)", ratio(D.rate), T_RATIO, verdict(ratio(D.rate) >= T_RATIO))
    end
  elseif D.stage == "drain" then
    add("   recovery drain", "NOT COMPLETED: %s of %d Completed at the deadline", tostring(D.completed), N)
  else
    add("   recovery drain", "not reached")
  end
  local P = R.purge
  if P and P.size2 then
    add("6  store after purge", "%8.1f MB, then %.1f MB after a second outage, recovery and purge (target: no larger: %s)",
        P.size1 / 1048576, P.size2 / 1048576, verdict(not P.grew))
    add("     before each purge", "%8.1f MB, %.1f MB; purge %.3f s, %.3f s", P.before1 / 1048576, P.before2 / 1048576,
        P.secs1, P.secs2)
    add("     second round", "outage %.0f events/s (%.2f x happy), drain %.0f events/s (%.2f x happy), resubmit %.0f " ..
        "requests/s, peak RSS %.1f MB", P.outage.rate or 0, ratio(P.outage.rate) or 0, P.drain.rate or 0,
        ratio(P.drain.rate) or 0, P.drain.resubmit_rate or 0, (P.drain.hwm_kb or 0) / 1024)
  elseif P and P.available == false then
    add("6  purge", "not available yet")
  elseif P then
    add("6  purge", "NOT COMPLETED (%s)", P.stage or "?")
  else
    add("6  purge", "not reached")
  end
  print("")
  print(("summary (%d sessions x %d events = %d; %s):"):format(SESSIONS, PER, N,
        failure and "INCOMPLETE, see the failure below" or ("%.0f s in all"):format(system.monotime() - t_bench0)))
  for _, l in ipairs(lines) do print(l) end
  local kv = { ("sessions=%d"):format(SESSIONS), ("per_session=%d"):format(PER) }
  local function kvf(k, v, f) if v then kv[#kv + 1] = ("%s=" .. f):format(k, v) end end
  kvf("happy_events_per_s", H.rate, "%.0f")
  kvf("happy_preloaded_events_per_s", R.happy_pre and R.happy_pre.rate, "%.0f")
  kvf("outage_preloaded_events_per_s", R.outage_pre and R.outage_pre.rate, "%.0f")
  kvf("outage_events_per_s", O.rate, "%.0f")
  kvf("outage_ratio", ratio(O.rate), "%.3f")
  kvf("outage_peak_rss_mb", hwm and hwm / 1024, "%.1f")
  kvf("count_s", C and C.secs, "%.3f")
  kvf("failures_s", D.failures_s, "%.3f")
  kvf("resubmit_per_s", D.resubmit_rate, "%.0f")
  kvf("drain_events_per_s", D.rate, "%.0f")
  kvf("drain_ratio", ratio(D.rate), "%.3f")
  kvf("store_mb_after_purge", P and P.size1 and P.size1 / 1048576, "%.1f")
  kvf("store_mb_after_second_purge", P and P.size2 and P.size2 / 1048576, "%.1f")
  print(("load average %s (1, 5, 15 min) at the end, %d CPUs (work beside the bench skews its rates)")
        :format((read_file("/proc/loadavg") or "?"):match("^(%S+ %S+ %S+)") or "?",
                tonumber((sh("nproc 2>/dev/null")):match("%d+")) or 0))
  local mtime = binary_mtime()
  if mtime ~= MTIME0 then
    print(("warning: %s was rebuilt during the run (%s): the figures mix two builds"):format(HOST,
          os.date("!%Y-%m-%dT%H:%M:%SZ", mtime or 0)))
  end
  print("RESULT " .. table.concat(kv, " ") .. (failure and " incomplete=1" or "") .. (mtime ~= MTIME0 and " rebuilt=1" or ""))
end

local function cleanup() hosts:cleanup(os.getenv("BENCH_KEEP") == "1") end

local PHASES = { { "1", phase1 }, { "1b", phase1b }, { "2b", phase2b }, { "2", phase2 }, { "3", phase3 },
                 { "4", phase4 }, { "6", phase6 } }
local wanted = {}
for p in (os.getenv("BENCH_OUTAGE_PHASES") or "1,1b,2b,2,3,4,6"):gmatch("[^,%s]+") do
  local known = false
  for _, q in ipairs(PHASES) do known = known or q[1] == p end
  if not known then
    io.stderr:write(("bench: BENCH_OUTAGE_PHASES: unknown phase %q (known: 1,1b,2b,2,3,4,6)\n"):format(p))
    os.exit(2)
  end
  wanted[p] = true
end
if (wanted["3"] or wanted["4"] or wanted["6"]) and not wanted["2"] then
  io.stderr:write("bench: BENCH_OUTAGE_PHASES: phases 3, 4 and 6 run on phase 2's host: add 2\n")
  os.exit(2)
end

local function main()
  local ver = (sh(sh_quote(HOST) .. " --version 2>&1")):gsub("%s+$", "")
  print(("nimbus-host outage bench: %s"):format(ver))
  print(("  %d sessions x %d events = %d (%d heads, %d siblings), published in rounds, 500 per producer handler;")
        :format(SESSIONS, PER, N, SESSIONS, SIBLINGS))
  print(("  consumer concurrency 256, retry max_retries 0; deadline %d s; stores in %s"):format(DEADLINE_S, TMP))
  io.stdout:flush()
  local ok, err = xpcall(function()
    for _, p in ipairs(PHASES) do
      if wanted[p[1]] then
        p[2]()
        io.stdout:flush()
      end
    end
    if outage and not outage.host.stopped then hosts:check_stop(outage.host) end
  end, function(e)
    if type(e) == "table" and e.bench_failure then return e end
    return debug.traceback(tostring(e), 2)
  end)
  summary(not ok)
  io.stdout:flush()
  if not ok then error(err, 0) end
  return 0
end

B.run(main, cleanup)

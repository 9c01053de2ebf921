-- Outage benchmark of nimbus-host: a downstream system goes away, every session blocks on
-- its head event, the rest of the backlog is parked, then the operator recovers it in bulk.
--
--   make bench
--   nimbus-host -l spec/bench/outage.lua path/to/nimbus-host
--
-- Environment: BENCH_OUTAGE_SESSIONS (10000), BENCH_OUTAGE_PER_SESSION (events per
-- session, 10), BENCH_DEADLINE (seconds for the whole bench, 300), BENCH_KEEP=1 (keep the
-- temp dir). The adapter is spec/bench/outage_adapter.lua; N = sessions x per_session.
--
-- Phases, each store fresh in a temp dir, with real nimbus-host processes:
--   1. happy path: N events pre-loaded by a producer-only host, drained by a consumer-only
--      host with no outage; events/s from first to last handler (the adapter's result file).
--   2. outage: the marker file exists, so the head of every session fails (no retries)
--      and blocks it; N events pre-loaded, then a consumer host is started and
--      `events --count --status deferred` is polled (every 0.5 s at most) until every head
--      is Failed and every sibling Deferred; parked events/s from the consumer's launch to
--      the last park (the latest `updated_at` of the Deferred audit rows), its ratio to
--      phase 1 (target >= 0.7) and the host's memory (VmHWM, sampled VmRSS; target < 100 MB).
--   3. one `events --count --status deferred` call, timed (target < 1 s).
--   4. recovery: the marker removed, `resubmit --all --endpoint OutageErp --status failed`
--      is timed (requests queued/s, target >= 5000/s), then the time until every event is
--      Completed (the resubmitted heads run, the parked siblings replay): drain events/s and
--      its ratio to phase 1 (target >= 0.7).
--   5. a summary, one figure per line with its target.
-- A missed target does not fail the bench; exit 1 when a phase did not complete within
-- the deadline or a host died (the figures reached so far are printed first).
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local env_int, sh_quote, sh, read_file, write_file, die, alive, mb =
  B.env_int, B.sh_quote, B.sh, B.read_file, B.write_file, B.die, B.alive, B.mb

local HOST = arg[1] or os.getenv("NIMBUS_HOST")
if not HOST then
  io.stderr:write("usage: nimbus-host -l spec/bench/outage.lua NIMBUS_HOST_BINARY\n")
  os.exit(2)
end

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

if SESSIONS < 1 or PER < 2 then
  io.stderr:write("bench: BENCH_OUTAGE_SESSIONS must be >= 1 and BENCH_OUTAGE_PER_SESSION >= 2\n")
  os.exit(2)
end
if not os.execute("test -x " .. sh_quote(HOST)) then
  io.stderr:write("bench: " .. HOST .. " is not an executable nimbus-host binary (build it: make build)\n")
  os.exit(2)
end

local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local ADAPTER = here .. "/outage_adapter.lua"

local TMP = (sh("mktemp -d -t nimbus-outage.XXXXXX")):gsub("%s+$", "")
assert(TMP ~= "" and TMP:match("nimbus%-outage"), "mktemp failed")

local function remaining() return DEADLINE_S - (system.monotime() - t_bench0) end
local function budget() return math.max(1, remaining() - RESERVE_S) end

---------------------------------------------------------------------------- the binary
-- The binary may be rebuilt while the bench runs: wait for it to be back (up to 60 s).
local function wait_binary()
  local t0 = system.monotime()
  while not os.execute("test -x " .. sh_quote(HOST)) do
    if system.monotime() - t0 > 60 then die(HOST .. " has been missing for 60 s") end
    system.sleep(0.5)
  end
end

-- Runs a CLI command line (`HOST ...` prefixed here); stdout and the exit status, retried a
-- few times when the shell could not exec the binary (126/127: missing or being written).
-- Each try is bounded by what is left of the deadline (`timeout`: exit 124 when it ran out).
local function cli(args, redirect)
  for attempt = 1, 10 do
    wait_binary()
    local out, code = sh(("timeout -k 5 %d "):format(math.ceil(budget())) .. sh_quote(HOST) .. " " .. args .. " " ..
                         (redirect or "2>/dev/null"))
    if code == 124 or code == 137 then
      die(("`nimbus-host %s` did not return within the deadline (BENCH_DEADLINE=%d s)"):format(args, DEADLINE_S))
    end
    if code ~= 126 and code ~= 127 then return out, code end
    if attempt < 10 then system.sleep(1) end
  end
  die("cannot run " .. HOST .. " " .. args)
end

---------------------------------------------------------------------------- processes
local hosts = {}          -- every host started, for the clean-up

local function proc_field(pid, key)
  local st = read_file("/proc/" .. pid .. "/status") or ""
  local kb = st:match("\n" .. key .. ":%s+(%d+) kB")
  return kb and tonumber(kb)
end

-- Runs `cmd` in the background under a `sh` wrapper that records its pid ($!) and, when it
-- ends, its exit status; stderr goes to h.log.
local function spawn(h, cmd)
  h.log, h.rcfile, h.pidfile = TMP .. "/" .. h.name .. ".log", TMP .. "/" .. h.name .. ".rc",
                               TMP .. "/" .. h.name .. ".pid"
  local inner = cmd .. " </dev/null 2>" .. sh_quote(h.log) .. " >&2 & echo $! > " .. sh_quote(h.pidfile) ..
                "; wait $!; echo $? > " .. sh_quote(h.rcfile)
  if not os.execute("sh -c " .. sh_quote(inner) .. " >/dev/null 2>&1 &") then die("cannot start " .. h.name) end
  local t0 = system.monotime()
  while not h.pid do
    local s = read_file(h.pidfile)
    if s and s:match("%d+\n") then h.pid = tonumber(s:match("%d+")) end
    if system.monotime() - t0 > 10 then die(h.name .. ": no pid after 10 s") end
    if not h.pid then system.sleep(0.005) end
  end
  h.t_launch = system.gettime()
  hosts[#hosts + 1] = h
  return h
end

-- Starts a host on the outage adapter in the given mode (subscribe, preload, consume).
local function start_host(name, mode, store, marker)
  wait_binary()
  local h = { name = name, result = TMP .. "/" .. name .. ".json" }
  local env = {
    "BENCH_MODE=" .. mode, "BENCH_RESULT=" .. sh_quote(h.result), "BENCH_OUTAGE_SESSIONS=" .. SESSIONS,
    "BENCH_OUTAGE_PER_SESSION=" .. PER, "OUTAGE_MARKER=" .. sh_quote(marker or (TMP .. "/no-outage.marker")),
  }
  local cmd = table.concat(env, " ") .. " " .. sh_quote(HOST) .. " " .. sh_quote(ADAPTER) .. " --store " ..
              sh_quote(store) .. " --no-reload"
  return spawn(h, cmd)
end

local function host_log(h) return read_file(h.log) or "" end
local function log_tail(h) return host_log(h):sub(-2000) end

local function host_died(h)
  local rc = tonumber((read_file(h.rcfile) or ""):match("%d+"))
  die(("%s: host exited (status %s) while it had work:\n%s"):format(h.name, tostring(rc), log_tail(h)))
end

-- The host logs `ready:` once its endpoints are subscribed and dispatching.
local function wait_ready(h, timeout)
  local t0 = system.monotime()
  while not host_log(h):match("ready:") do
    if not alive(h.pid) then host_died(h) end
    if system.monotime() - t0 > timeout then die(h.name .. ": no `ready:` line after " .. timeout .. " s:\n" .. log_tail(h)) end
    system.sleep(0.005)
  end
  h.t_ready = system.gettime()
end

-- SIGTERM, SIGKILL after `timeout` (15 s); returns the exit status.
local function stop_host(h, timeout)
  if h.stopped then return h.rc end
  if alive(h.pid) then os.execute("kill -TERM " .. h.pid .. " 2>/dev/null") end
  local t0 = system.monotime()
  while alive(h.pid) do
    if system.monotime() - t0 > (timeout or 15) then
      io.stderr:write(("bench: %s did not stop within %d s of SIGTERM: SIGKILL\n"):format(h.name, timeout or 15))
      os.execute("kill -KILL " .. h.pid .. " 2>/dev/null")
      system.sleep(0.1)
      break
    end
    system.sleep(0.01)
  end
  local t1, rc = system.monotime(), nil
  repeat   -- the wrapper shell writes the status right after the host exits
    rc = tonumber((read_file(h.rcfile) or ""):match("%d+"))
    if not rc then system.sleep(0.01) end
  until rc or system.monotime() - t1 > 2
  h.stopped, h.rc = true, rc
  return rc
end

local function check_stop(h)
  local rc = stop_host(h)
  if rc ~= 0 then die(("%s: host exit status %s after SIGTERM (expected 0):\n%s"):format(h.name, tostring(rc), log_tail(h))) end
end

local function cleanup()
  for _, h in ipairs(hosts) do
    if not h.stopped and h.pid then pcall(stop_host, h, 15) end
  end
  if os.getenv("BENCH_KEEP") == "1" then
    io.stderr:write("bench: kept " .. TMP .. "\n")
  else
    os.execute("rm -rf " .. sh_quote(TMP))
  end
end

-- Memory of a running host: max sampled VmRSS and the kernel's high-water mark VmHWM.
local function sample_mem(h)
  local rss, hwm = proc_field(h.pid, "VmRSS"), proc_field(h.pid, "VmHWM")
  if rss and rss > (h.max_rss_kb or 0) then h.max_rss_kb = rss end
  if hwm and hwm > (h.hwm_kb or 0) then h.hwm_kb = hwm end
end

-- Polls for the host's result file (sampling its memory) for at most `limit` seconds;
-- on time-out calls partial() (which records what was reached) and fails.
local function wait_result(h, limit, partial)
  local t0 = system.monotime()
  while true do
    sample_mem(h)
    local s = read_file(h.result)
    if s then return cjson.decode(s) end
    if not alive(h.pid) then host_died(h) end
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

---------------------------------------------------------------------------- counting
-- `events --count` is new; nil until first tried, then true or false.
local count_available

-- Counts audit rows of a status (and endpoint): `events --count` when the binary has it,
-- else the lines of `events --json` (counted by awk, the CLI's exit status kept).
local function count_events(store, status, endpoint)
  local filter = "--status " .. status .. (endpoint and (" --endpoint " .. endpoint) or "") ..
                 " --store " .. sh_quote(store)
  if count_available ~= false then
    local out, code = cli("events --count " .. filter, "2>/dev/null")
    if code == 0 then
      count_available = true
      local n = tonumber(out:match("(%d+)"))
      if n then return n end
    elseif code == 2 and count_available == nil then
      count_available = false
    end
  end
  local out = sh(("(timeout -k 5 %d "):format(math.ceil(budget())) .. sh_quote(HOST) .. " events --json " .. filter ..
                 " 2>/dev/null; echo \"exit=$?\")" ..
                 " | awk '/^exit=/ { rc = substr($0, 6); next } { n++ } END { print n + 0, rc }'")
  local n, rc = out:match("(%d+)%s+(%d+)")
  if rc ~= "0" then return nil end
  return tonumber(n)
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

-- The latest updated_at of the rows of a status: when the last of them got there.
local function latest_update(store, status)
  local out = sh(("timeout -k 5 %d "):format(math.ceil(budget())) .. sh_quote(HOST) .. " events --json --status " ..
                 status .. " --store " .. sh_quote(store) ..
                 " 2>/dev/null | sed -n 's/.*\"updated_at\":\"\\([^\"]*\\)\".*/\\1/p' | sort | tail -n 1")
  return iso_to_epoch((out:gsub("%s+$", "")))
end

---------------------------------------------------------------------------- phases
local R = {}   -- figures reached so far, for the summary

-- A fresh store with the consumer's subscription and N events pre-loaded in rounds.
local function preload(tag, marker)
  local store = TMP .. "/" .. tag .. ".db"
  local s = start_host(tag .. "-subscribe", "subscribe", store, marker)
  wait_ready(s, 20)
  check_stop(s)
  local p = start_host(tag .. "-preload", "preload", store, marker)
  wait_ready(p, 20)
  publish(store, "OutageStart", "{}", "outage-producer")
  local pr = wait_result(p, budget(), function()
    return ("; pre-load of %d events into %s incomplete"):format(N, store)
  end)
  check_stop(p)
  if pr.published ~= N then die(("%s: pre-load published %d events, expected %d"):format(tag, pr.published, N)) end
  pr.rate = pr.published / (pr.t_done - pr.t_first_publish)
  return store, pr
end

local function phase1()
  print("")
  print("1. happy path (no outage): N pre-loaded, a consumer-only host drains them")
  local store, pr = preload("happy")
  R.preload_rate = pr.rate
  print(("  pre-load         %d events published at %.0f events/s"):format(pr.published, pr.rate))
  local c = start_host("happy-consume", "consume", store)
  wait_ready(c, 20)
  local r = wait_result(c, budget(), function()
    local done = count_events(store, "completed", ENDPOINT)
    R.happy = { partial = true, completed = done }
    return ("; %s of %d events Completed"):format(tostring(done), N)
  end)
  sample_mem(c)
  check_stop(c)
  local span = r.t_last - r.t_first
  R.happy = { rate = r.count / span, span = span, count = r.count, hwm_kb = c.hwm_kb,
              startup = r.t_first - c.t_launch }
  print(("  consume          %d events in %.3f s (first to last handler): %.0f events/s"):format(r.count, span, R.happy.rate))
  print(("  start-up         first handler %.3f s after launch; host VmHWM %s"):format(R.happy.startup, mb(c.hwm_kb)))
end

local outage   -- { store, marker, host }

local function phase2()
  print("")
  print(("2. outage: the head of every session fails (no retries), %d siblings to park"):format(SIBLINGS))
  local marker = TMP .. "/erp-7-down.marker"
  write_file(marker, "ERP erp-7 is down\n")
  local store, pr = preload("outage", marker)
  print(("  pre-load         %d events published at %.0f events/s"):format(pr.published, pr.rate))
  local h = start_host("outage-consume", "consume", store, marker)
  outage = { store = store, marker = marker, host = h }
  local O = { partial = true, parked = 0 }
  R.outage = O
  wait_ready(h, 20)
  O.ready = h.t_ready - h.t_launch
  local limit, t0 = budget(), system.monotime()
  local last_poll, parked, failed = -math.huge, 0, nil
  while true do
    sample_mem(h)
    O.max_rss_kb, O.hwm_kb = h.max_rss_kb, h.hwm_kb
    if not alive(h.pid) then host_died(h) end
    if system.monotime() - last_poll >= POLL_S then
      last_poll = system.monotime()
      local n = count_events(store, "deferred")
      local t = system.gettime()
      if n then
        parked = n
        O.parked, O.t_poll = n, t
      end
      if parked >= SIBLINGS then
        failed = count_events(store, "failed")
        O.failed = failed
        if failed and failed >= SESSIONS then break end
      end
    end
    local el = system.monotime() - t0
    if el > limit then
      local since = (O.t_poll or system.gettime()) - h.t_launch
      O.failed = O.failed or count_events(store, "failed")
      die(("outage: %d of %d siblings Deferred (%.0f parked/s so far), %s of %d heads Failed, at the last poll " ..
           "%.1f s after the consumer's launch (deadline BENCH_DEADLINE=%d s)")
          :format(parked, SIBLINGS, parked / since, tostring(O.failed or "?"), SESSIONS, since, DEADLINE_S))
    end
    system.sleep(0.1)
  end
  sample_mem(h)
  O.max_rss_kb, O.hwm_kb = h.max_rss_kb, h.hwm_kb
  -- the last park, from the audit rows (ms); the poll that saw it is the fallback
  local t_last_park = latest_update(store, "deferred")
  O.last_park_src = "latest updated_at of the Deferred rows"
  if not t_last_park or t_last_park < h.t_launch or t_last_park > O.t_poll + 1 then
    t_last_park, O.last_park_src = O.t_poll, "the poll that saw the last one"
  end
  O.span = t_last_park - h.t_launch
  O.rate = SIBLINGS / O.span
  O.seen = O.t_poll - h.t_launch
  local heads = read_file(h.result .. ".heads")
  if heads then
    heads = cjson.decode(heads)
    O.heads_span = heads.t_last_fail - h.t_launch
  end
  O.partial = false
  print(("  consumer         ready %.3f s after launch"):format(O.ready))
  if O.heads_span then
    print(("  heads            %d Failed, the last %.3f s after the consumer's launch"):format(failed, O.heads_span))
  end
  print(("  parked           %d Deferred, the last %.3f s after the consumer's launch (%s; polling saw it at %.1f s)")
        :format(parked, O.span, O.last_park_src, O.seen))
  print(("  park rate        %.0f parked events/s (%.2f x the happy-path consume rate)")
        :format(O.rate, R.happy and R.happy.rate and O.rate / R.happy.rate or 0))
  print(("  memory           VmHWM %s, max sampled VmRSS %s"):format(mb(O.hwm_kb), mb(O.max_rss_kb)))
end

local function phase3()
  print("")
  print("3. events --count --status deferred")
  local args = "events --count --status deferred --store " .. sh_quote(outage.store)
  wait_binary()
  local t0 = system.monotime()
  local out, code = cli(args, "2>&1")
  local el = system.monotime() - t0
  if code == 2 then
    R.count = { available = false }
    print("  events --count: not available")
    local t1 = system.monotime()
    local n = count_events(outage.store, "deferred")
    R.count.fallback_s = system.monotime() - t1
    print(("  (events --status deferred --json, lines counted: %s in %.3f s)"):format(tostring(n), R.count.fallback_s))
    return
  end
  if code ~= 0 then
    R.count = { available = false, failed = true }
    print(("  events --count failed (exit %s): %s"):format(tostring(code), (out:gsub("%s+$", ""))))
    return
  end
  local n = tonumber(out:match("(%d+)"))
  R.count = { available = true, secs = el, n = n }
  print(("  one call         %.3f s, printed %q%s"):format(el, (out:gsub("%s+$", "")),
        n == SIBLINGS and "" or (" (expected %d)"):format(SIBLINGS)))
end

local function phase4()
  print("")
  print("4. recovery: marker removed, resubmit --all, parked events replay")
  local h, store = outage.host, outage.store
  os.remove(outage.marker)
  local errf = TMP .. "/resubmit.err"
  local args = "resubmit --all --endpoint " .. ENDPOINT .. " --status failed --store " .. sh_quote(store)
  R.resubmit = { running = true }
  wait_binary()
  local t_start, m0 = system.gettime(), system.monotime()
  local out, code = cli(args, "2>" .. sh_quote(errf))
  local el = system.monotime() - m0
  local err = read_file(errf) or ""
  if code == 2 and (err:match("EVENT_ID") or err:match("unknown option %-%-all")) then
    R.resubmit = { available = false }
    print("  resubmit --all: not available yet")
    print("  (" .. (err:gsub("%s+$", "")) .. ")")
    return
  end
  if code ~= 0 then
    R.resubmit = { available = false, failed = true }
    die(("resubmit --all failed (exit %s): %s%s"):format(tostring(code), err, out))
  end
  local line = out:match("[^\n]*%d[^\n]*") or ""
  local queued = tonumber(line:match("(%d+)"))
  R.resubmit = { available = true, secs = el, queued = queued, rate = SESSIONS / el }
  print(("  resubmit --all   %.3f s, %s requests/s (printed %q)"):format(el, ("%.0f"):format(SESSIONS / el),
        (out:gsub("%s+$", ""))))
  if queued ~= SESSIONS then
    print(("  warning          %s requests queued, expected %d (one per Failed head)"):format(tostring(queued), SESSIONS))
  end
  local D = { partial = true }
  R.drain = D
  local r = wait_result(h, budget(), function(w)
    local done = count_events(store, "completed", ENDPOINT)
    D.completed, D.waited = done, w
    return ("; %s of %d events Completed %.1f s after resubmit --all started (%.0f events/s so far)")
           :format(tostring(done), N, system.gettime() - t_start, (done or 0) / (system.gettime() - t_start))
  end)
  sample_mem(h)
  -- the handler returned; its outcome commits just after: wait for the audit to agree
  local t0, done = system.monotime(), nil
  repeat
    done = count_events(store, "completed", ENDPOINT)
    if done ~= N then system.sleep(POLL_S) end
  until done == N or system.monotime() - t0 > math.min(30, budget())
  if done ~= N then die(("recovery: the adapter handled all %d events, the audit has %s Completed"):format(N, tostring(done))) end
  D.span = r.t_last - r.t_first_ok
  D.rate = N / D.span
  D.wall = r.t_last - t_start
  D.partial = false
  D.hwm_kb, D.max_rss_kb = h.hwm_kb, h.max_rss_kb
  print(("  drain            %d events Completed, first to last successful handler %.3f s: %.0f events/s (%.2f x happy path)")
        :format(N, D.span, D.rate, R.happy and R.happy.rate and D.rate / R.happy.rate or 0))
  print(("  wall             %.3f s from resubmit --all starting to the last handler"):format(D.wall))
  print(("  memory           VmHWM %s, max sampled VmRSS %s (since the outage host's launch)"):format(mb(h.hwm_kb), mb(h.max_rss_kb)))
end

---------------------------------------------------------------------------- report
local function verdict(ok) return ok and "met" or "NOT met" end

local function summary(failure)
  local H, O = R.happy or {}, R.outage or {}
  local lines = {}
  local function add(label, fmt, ...) lines[#lines + 1] = ("  %-28s " .. fmt):format(label, ...) end
  if H.rate then
    add("happy-path consume", "%8.0f events/s", H.rate)
  elseif H.partial then
    add("happy-path consume", "NOT COMPLETED (%s of %d Completed at the deadline)", tostring(H.completed), N)
  else
    add("happy-path consume", "not reached")
  end
  local happy = H.rate
  if O.rate then
    add("outage park rate", "%8.0f parked/s   (%d in %.1f s from the consumer's launch)", O.rate, SIBLINGS, O.span)
    if happy then
      add("  ratio to happy path", "%8.2f          (target >= %.1f: %s)", O.rate / happy, T_RATIO, verdict(O.rate / happy >= T_RATIO))
    end
  elseif O.partial then
    local since = O.t_poll and outage and (O.t_poll - outage.host.t_launch)
    add("outage park rate", "NOT COMPLETED: %d of %d parked%s", O.parked or 0, SIBLINGS,
        since and since > 0 and (" after %.1f s (%.0f parked/s so far)"):format(since, (O.parked or 0) / since) or "")
    if happy and since and since > 0 then
      add("  ratio to happy path", "%8.2f so far   (target >= %.1f: %s)", (O.parked or 0) / since / happy, T_RATIO,
          verdict((O.parked or 0) / since / happy >= T_RATIO))
    end
  else
    add("outage park rate", "not reached")
  end
  if O.hwm_kb then
    add("outage host memory", "%8.1f MB VmHWM (max VmRSS %.1f MB; target < %d MB: %s)", O.hwm_kb / 1024,
        (O.max_rss_kb or 0) / 1024, T_RSS_MB, verdict(O.hwm_kb / 1024 < T_RSS_MB))
  end
  local C = R.count
  if C and C.available then
    add("events --count deferred", "%8.3f s          (target < %d s: %s)", C.secs, T_COUNT_S, verdict(C.secs < T_COUNT_S))
  elseif C then
    add("events --count deferred", "not available%s", C.fallback_s and (" (--json line count: %.3f s)"):format(C.fallback_s) or "")
  else
    add("events --count deferred", "not reached")
  end
  local S = R.resubmit
  if S and S.available then
    add("resubmit --all", "%8.0f requests/s (%d in %.3f s; target >= %d/s: %s)", S.rate, SESSIONS, S.secs, T_RESUBMIT,
        verdict(S.rate >= T_RESUBMIT))
  elseif S and S.failed then
    add("resubmit --all", "FAILED")
  elseif S and S.running then
    add("resubmit --all", "NOT COMPLETED (did not return within the deadline)")
  elseif S then
    add("resubmit --all", "not available yet")
  else
    add("resubmit --all", "not reached")
  end
  local D = R.drain
  if D and D.rate then
    add("recovery drain", "%8.0f events/s   (%d in %.1f s, first to last handler; %.1f s wall from resubmit)",
        D.rate, N, D.span, D.wall)
    if happy then
      add("  ratio to happy path", "%8.2f          (target >= %.1f: %s)", D.rate / happy, T_RATIO, verdict(D.rate / happy >= T_RATIO))
    end
  elseif D and D.partial then
    add("recovery drain", "NOT COMPLETED: %s of %d Completed at the deadline", tostring(D.completed), N)
  elseif S and not S.available and not S.running and not S.failed then
    add("recovery drain", "skipped (no resubmit --all)")
  else
    add("recovery drain", "not reached")
  end
  print("")
  print(("summary (%d sessions x %d events = %d; %s):"):format(SESSIONS, PER, N,
        failure and "INCOMPLETE, see the failure below" or ("%.0f s in all"):format(system.monotime() - t_bench0)))
  for _, l in ipairs(lines) do print(l) end
  local kv = { ("sessions=%d"):format(SESSIONS), ("per_session=%d"):format(PER) }
  local function kvf(k, v, f) if v then kv[#kv + 1] = ("%s=" .. f):format(k, v) end end
  kvf("happy_events_per_s", H.rate, "%.0f")
  kvf("park_events_per_s", O.rate, "%.0f")
  kvf("park_ratio", happy and O.rate and O.rate / happy, "%.2f")
  kvf("outage_peak_rss_mb", O.hwm_kb and O.hwm_kb / 1024, "%.1f")
  kvf("count_s", C and C.secs, "%.3f")
  kvf("resubmit_per_s", S and S.rate, "%.0f")
  kvf("drain_events_per_s", D and D.rate, "%.0f")
  kvf("drain_ratio", happy and D and D.rate and D.rate / happy, "%.2f")
  print("RESULT " .. table.concat(kv, " ") .. (failure and " incomplete=1" or ""))
end

local function main()
  local ver = (sh(sh_quote(HOST) .. " --version 2>&1")):gsub("%s+$", "")
  print(("nimbus-host outage bench: %s"):format(ver))
  print(("  %d sessions x %d events = %d (%d heads, %d siblings), published in rounds, 500 per producer handler;")
        :format(SESSIONS, PER, N, SESSIONS, SIBLINGS))
  print(("  consumer concurrency 256, retry max_retries 0; deadline %d s; stores in %s"):format(DEADLINE_S, TMP))
  io.stdout:flush()
  local ok, err = xpcall(function()
    phase1()
    io.stdout:flush()
    phase2()
    io.stdout:flush()
    phase3()
    io.stdout:flush()
    phase4()
    check_stop(outage.host)
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

-- Failover on a PostgreSQL store (issue 16, docs/store-backends.md): three host processes
-- standing in for three machines share one store; 20,000 events over 500 sessions with
-- failures (retried, then blocking their session), hand-offs and flaky handlers that pass on
-- their retry. One host is killed with SIGKILL mid-stream and a fourth starts; then every
-- host is restarted, one at a time, each while work is still to come (the producer waits at
-- gates the test opens one restart at a time). Afterwards nothing is lost, every outcome is recorded
-- once, each session's handlers ran in order across hosts, the blocked sessions are blocked
-- with their later events parked, and they are released from the CLI. Runs as ctest
-- functional_pg_failover against the cluster of the fixture "postgres".
local nh = require("nh")
local pg = require("pg")

local N, SESSIONS, CHUNK = 20000, 500, 500

local function fails(i) return i % 1009 == 0 end      -- fails its attempt and its retry: blocks
local function hands_off(i) return i % 1013 == 0 end  -- a hand-off: blocks until completed
local function flaky(i) return i % 53 == 0 end        -- fails its first attempt only

local function adapter_source(sb)
  return ([[
local nimbus = require("nimbus")
local CALLS, N, SESSIONS, CHUNK, DIR = %q, %d, %d, %d, %q
local TAG = os.getenv("NH_HOST_TAG") or "-"
local function log(phase, ctx, i)
  local f = assert(io.open(CALLS, "a"))
  f:write(("%%s %%s %%d %%d %%s\n"):format(phase, ctx.session_id, i, ctx.retry_count or 0, TAG))
  f:close()
end
-- the producer: each Go publishes a chunk of Work and the next Go (all with its outcome)
-- A chunk that starts at a gate (GATES: its first i) waits until the test opens it (the file
-- gate-<i>), so the test can restart a host while work is still to come.
local feeder = nimbus.endpoint("Feeder", { concurrency = 1 })
local GATES = { [10001] = true, [13001] = true, [16001] = true, [19001] = true }
feeder:on("Go", function(ev)
  if GATES[ev.from] then
    while true do
      local f = io.open(DIR .. "/gate-" .. ev.from, "r")
      if f then f:close() break end
      nimbus.sleep(0.05)
    end
  end
  local to = math.min(ev.from + CHUNK - 1, N)
  for i = ev.from, to do
    nimbus.publish("Work", { i = i }, { session = "s" .. (i %% SESSIONS) })
  end
  if to < N then nimbus.publish("Go", { from = to + 1 }, { session = "feeder" }) end
end)
local sink = nimbus.endpoint("Sink", { concurrency = 8,
  retry = { max_retries = 1, strategy = "exponential", base = 0.05 } })
sink:on("Work", function(ev, ctx)
  log("start", ctx, ev.i)
  coroutine.yield()
  if not ev.fixed then
    if ev.i %% 1009 == 0 then error("ERP rejected " .. ev.i) end
    if ev.i %% 1013 == 0 then
      ctx:mark_pending_handoff{ reason = "approval", external_job_id = "J" .. ev.i, expected_by = 3600 }
      log("end", ctx, ev.i)
      return
    end
    if ev.i %% 53 == 0 and (ctx.retry_count or 0) == 0 then error("flaky " .. ev.i) end
  end
  log("end", ctx, ev.i)
end)
]]):format(sb.calls_path, N, SESSIONS, CHUNK, sb.dir)
end

-- What the store must end with: per session, events in order until the first blocker
-- (Completed), the blocker (Failed, or Pending for a hand-off), then Deferred.
local function model()
  local status, first_blocker = {}, {}
  for s = 0, SESSIONS - 1 do
    local blocked
    local i = s == 0 and SESSIONS or s
    while i <= N do
      if blocked then status[i] = "Deferred"
      elseif fails(i) then status[i], blocked = "Failed", i
      elseif hands_off(i) then status[i], blocked = "Pending", i
      else status[i] = "Completed" end
      i = i + SESSIONS
    end
    first_blocker[s] = blocked
  end
  return status, first_blocker
end

local function counts(status)
  local c = {}
  for _, st in pairs(status) do c[st] = (c[st] or 0) + 1 end
  return c
end

local function store_counts(url)
  local c = {}
  for _, row in ipairs(pg.psql(url, "SELECT status, count(*) FROM audit WHERE endpoint = 'Sink' GROUP BY status")) do
    c[row[1]] = tonumber(row[2])
  end
  return c
end

local function same_counts(a, b)
  for k, v in pairs(a) do if b[k] ~= v then return false end end
  for k, v in pairs(b) do if a[k] ~= v then return false end end
  return true
end

local function show_counts(c)
  local parts = {}
  for k, v in pairs(c) do parts[#parts + 1] = k .. "=" .. v end
  table.sort(parts)
  return table.concat(parts, " ")
end

-- The event id of Work i, read back through its payload.
local function event_of(url, i)
  return pg.value(url, ("SELECT event_id FROM audit WHERE endpoint = 'Sink' AND "
                        .. "convert_from(payload, 'UTF8')::json->>'i' = '%d'"):format(i))
end

describe("hosts on one PostgreSQL store", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function()
    sb:cleanup()
    pg.cleanup()
  end)

  it("fail over: kill -9 one of three, start a fourth, restart each in turn; nothing lost, each outcome once, "
     .. "sessions in order, blocked sessions released from the CLI", function()
    local _, url = pg.createdb("failover")
    local adapter = sb:adapter("failover.lua", adapter_source(sb))
    local hosts = {}
    local function start(tag)
      hosts[tag] = sb:spawn(adapter, { store = url, transport = false, env = { NH_HOST_TAG = tag } })
    end
    start("A"); start("B"); start("C")
    sb:cli_ok({ "publish", "Go", nh.encode({ from = 1 }), "--session", "feeder" }, { store = url, transport = false })
    local function resolved()
      local c = store_counts(url)
      return (c.Completed or 0) + (c.Failed or 0) + (c.Pending or 0) + (c.Deferred or 0)
    end
    nh.eventually(function() return resolved() >= N / 5 end, nh.DEADLINE, "a fifth resolved")
    hosts.B:signal("KILL")
    hosts.B:wait_exit(10)
    start("D")
    nh.eventually(function() return resolved() >= N / 2 end, nh.DEADLINE, "half resolved (the first gate)")
    -- a rolling restart, each host while work is still to come: the next gate is shut
    for k, tag in ipairs({ "A", "C", "D" }) do
      nh.write(sb:path("gate-" .. ({ 10001, 13001, 16001 })[k]), "")
      hosts[tag]:signal("TERM")
      hosts[tag]:wait_exit(30)
      assert.equal(0, hosts[tag]:exit_code(), hosts[tag]:log())
      assert.is_true(resolved() < N, "the stream ended before the restart of " .. tag)
      start(tag)
    end
    nh.write(sb:path("gate-19001"), "")
    local want_status, first_blocker = model()
    local want = counts(want_status)
    nh.eventually(function() return same_counts(store_counts(url), want) end, 180,
      function() return ("store %s, want %s"):format(show_counts(store_counts(url)), show_counts(want)) end)

    -- nothing lost, each outcome recorded once
    assert.equal(tostring(N), pg.value(url, "SELECT count(*) FROM audit WHERE endpoint = 'Sink'"))
    assert.equal("0", pg.value(url, "SELECT count(*) FROM (SELECT event_id FROM history WHERE endpoint = 'Sink' AND "
                                 .. "status = 'Completed' GROUP BY event_id HAVING count(*) <> 1) x"))
    assert.equal(tostring(want.Completed), pg.value(url, "SELECT count(DISTINCT event_id) FROM history WHERE "
                                                       .. "endpoint = 'Sink' AND status = 'Completed'"))
    assert.equal(tostring(want.Deferred), pg.value(url, "SELECT count(*) FROM parked"))
    for i, st in pairs(want_status) do
      if st ~= "Completed" and st ~= "Deferred" then
        assert.equal(st, pg.value(url, ("SELECT status FROM audit WHERE event_id = '%s'"):format(event_of(url, i))),
                     "Work " .. i)
      end
    end
    -- each session's handlers started in order, whichever host ran them (an attempt may
    -- start again: a retry, or a handler whose host was killed before its outcome)
    local last, ran = {}, {}
    for phase, session, i, _, tag in nh.read(sb.calls_path):gmatch("(%a+) (%S+) (%d+) (%d+) (%S+)\n") do
      i = tonumber(i)
      if phase == "start" then
        assert.is_true(i >= (last[session] or 0), ("%s: Work %d started after %d"):format(session, i, last[session] or 0))
        last[session] = i
        ran[tag] = true
      end
    end
    for _, tag in ipairs({ "A", "B", "C", "D" }) do assert.is_true(ran[tag], "host " .. tag .. " ran nothing") end

    -- blocked sessions are released from the CLI: a failure resubmitted with a fixed body,
    -- a hand-off completed; their parked events replay in order
    local failed, handed
    for s, b in pairs(first_blocker) do
      if b and fails(b) and not failed then failed = { s = s, i = b } end
      if b and hands_off(b) and not handed then handed = { s = s, i = b } end
    end
    sb:cli_ok({ "resubmit", event_of(url, failed.i), "--body", nh.encode({ i = failed.i, fixed = true }) },
              { store = url })
    sb:cli_ok({ "handoff", "complete", event_of(url, handed.i) }, { store = url })
    local function session_done(s)
      return pg.value(url, ("SELECT count(*) FROM audit WHERE endpoint = 'Sink' AND session_id = 's%d' AND "
                            .. "status NOT IN ('Completed')"):format(s))
    end
    nh.eventually(function() return session_done(failed.s) == "0" and session_done(handed.s) == "0" end, nh.DEADLINE,
      "the released sessions replayed")
  end)
end)

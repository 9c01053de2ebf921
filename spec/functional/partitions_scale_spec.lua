-- Session ownership on the broker at scale (docs/broker-partitions.md): three hosts on one
-- PostgreSQL store and a RabbitMQ broker of this test's own, one endpoint of 8 partitions,
-- 20,000 events over 500 sessions with failures, hand-offs and retries. Mid-stream one host is
-- killed with SIGKILL and another started; later the broker is stopped for a few seconds and
-- started again. Afterwards: every event Completed once the operator resubmitted the failures and
-- completed the hand-offs, per-session order kept across hosts (the order handlers started in),
-- no event run again after its outcome was recorded, and every partition owned by exactly one
-- live host, spread evenly. Runs as ctest functional_pgamqp_partitions_scale (fixture
-- "postgres"; NH_STORE_BACKEND=postgres gives the sandbox its database). NH_SCALE_EVENTS makes
-- it smaller for a quick run by hand.
local nh = require("nh")
local pg = require("pg")

if not os.getenv("NH_STORE_BACKEND") or os.getenv("NH_STORE_BACKEND") ~= "postgres" then
  error("partitions_scale_spec.lua needs NH_STORE_BACKEND=postgres and the test cluster (run it with "
    .. "`ctest -R functional_pgamqp_partitions_scale`, which starts it)")
end

local N_EVENTS = tonumber(os.getenv("NH_SCALE_EVENTS") or "20000")
local N_SESSIONS = 500
local PER_SEED = 1000
local PARTITIONS = 8

-- What event i (1-based, of session "s<(i-1) % 500>") does; the same text is in the adapters.
local KIND = [[
local function kind(i)
  if i % 997 == 0 then return "fail" end       -- fails past its retries: its session blocks until resubmitted
  if i % 1009 == 0 then return "handoff" end   -- finishes elsewhere: the operator completes it
  if i % 101 == 0 then return "flaky" end      -- fails once: the retry policy runs it again
  return "ok"
end
]]
local kind = load(KIND .. " return kind")()

-- Writes one line per handler call: "start <i> <host tag> <retry count> <ms since the epoch>".
local function endpoint_adapter(calls)
  return ([[
local nimbus = require("nimbus")
local CALLS, TAG = %q, os.getenv("NH_HOST_TAG") or "-"
%s
local ep = nimbus.endpoint("Ep", { partitions = %d, concurrency = 16, lock = { duration = 3 },
  retry = { max_retries = 3, strategy = "fixed", base = 0.2 } })
ep:on("Ev", function(event, ctx)
  local f = assert(io.open(CALLS, "a"))
  f:write(("start %%d %%s %%d %%.0f\n"):format(event.i, TAG, ctx.retry_count or 0, nimbus.now() * 1000))
  f:close()
  local k = kind(event.i)
  if k == "fail" and not event.fixed then error("event " .. event.i .. " fails") end
  if k == "flaky" and (ctx.retry_count or 0) < 1 then error("event " .. event.i .. " is flaky") end
  if k == "handoff" then ctx:mark_pending_handoff{ reason = "import job " .. event.i } end
end)
]]):format(calls, KIND, PARTITIONS)
end

-- A host of its own publishes the events: each Seed publishes PER_SEED of them in one
-- transaction, and every Seed is in one session, so the events go out in order.
local function seeder_adapter()
  return ([[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Seed", { concurrency = 1 })
ep:on("Seed", function(event)
  for i = event.from, event.to do nimbus.publish("Ev", { i = i }, { session = "s" .. ((i - 1) %% %d) }) end
end)
]]):format(N_SESSIONS)
end

-- Per partition the connection RabbitMQ made active, and per connection on how many.
local function owners(b)
  local r = nh.rmq_api("GET", "/consumers/%2F", nil, { mgmt = b.mgmt })
  local owner, active = {}, {}
  for _, c in ipairs(nh.decode(r.body)) do
    local i = tonumber(c.queue.name:match("^Ep%.p(%d+)$"))
    local conn = type(c.channel_details) == "table" and c.channel_details.connection_name
    if i and conn then
      active[conn] = (active[conn] or 0) + (c.active and 1 or 0)
      if c.active then owner[i] = (owner[i] and owner[i] .. " AND " or "") .. conn end
    end
  end
  return owner, active
end

local function spread_evenly(b, hosts)
  local owner, active = owners(b)
  for i = 0, PARTITIONS - 1 do
    if not owner[i] or owner[i]:find(" AND ", 1, true) then return false end
  end
  local n = 0
  for _, k in pairs(active) do
    n = n + 1
    if k < PARTITIONS // hosts or k > -(-PARTITIONS // hosts) then return false end
  end
  return n == hosts
end

local function describe_owners(b, hosts)
  local owner, active = owners(b)
  local s = {}
  for i = 0, PARTITIONS - 1 do s[#s + 1] = ("p%d: %s"):format(i, owner[i] or "none") end
  for conn, n in pairs(active) do s[#s + 1] = ("%s active on %d"):format(conn, n) end
  local out = table.concat(s, "; ")
  for tag, h in pairs(hosts) do out = out .. ("\n--- %s:\n%s"):format(tag, h:log():sub(-2500)) end
  return out
end

local function statuses(sb)
  local by = {}
  for _, row in ipairs(pg.psql(sb.store, "SELECT status, count(*) FROM audit WHERE endpoint = 'Ep' GROUP BY status")) do
    by[row[1]] = tonumber(row[2])
  end
  return by
end

local function describe_statuses(sb)
  local s = {}
  for st, n in pairs(statuses(sb)) do s[#s + 1] = st .. "=" .. n end
  table.sort(s)
  return table.concat(s, " ")
end

local occurrences = nh.occurrences

describe("partitions at scale on a PostgreSQL store", function()
  local sb, b

  before_each(function() sb = nh.sandbox() end)
  after_each(function()
    if b then pcall(b.run, "stop") end
    sb:cleanup()
  end)

  it(("three hosts, 8 partitions, %d events over %d sessions with failures, hand-offs and retries; a kill -9, "
    .. "a new host, the broker stopped and started: nothing lost, every session in order"):format(N_EVENTS,
    N_SESSIONS), function()
    b = nh.private_broker(sb:path("rabbitmq"), "nhscale")   -- stopped mid-stream: not the suite's
    b.run("start")
    local calls = sb:path("calls.log")
    local ep = sb:adapter("Ep.lua", endpoint_adapter(calls))
    local seeder = sb:adapter("Seed.lua", seeder_adapter())
    local hosts = {}
    local function start(tag)
      hosts[tag] = sb:spawn(ep, { transport = b.url, env = { NH_HOST_TAG = tag } })
      return hosts[tag]
    end
    start("h1")
    start("h2")
    start("h3")
    nh.eventually(function() return spread_evenly(b, 3) end, 90, function() return describe_owners(b, hosts) end)
    sb:spawn(seeder, { transport = b.url })
    local nseeds, seeded = math.ceil(N_EVENTS / PER_SEED), 0
    local function seed(upto)
      while seeded < upto do
        seeded = seeded + 1
        sb:publish("Seed", { from = (seeded - 1) * PER_SEED + 1, to = math.min(seeded * PER_SEED, N_EVENTS) },
          { session = "seed", transport = b.url })
      end
    end
    local function settled(n, why)
      nh.eventually(function()
        local by = statuses(sb)
        return (by.Completed or 0) >= n
      end, 300, function() return why .. ": " .. describe_statuses(sb) end)
    end

    -- a quarter in, kill -9 of a host mid-stream, and a new one
    seed(math.ceil(nseeds / 2))
    settled(N_EVENTS // 4, "a quarter of the events Completed")
    assert.equal(137, hosts.h1:kill())
    start("h4")

    -- half in, the broker goes away for a few seconds
    settled(math.min(N_EVENTS // 2, seeded * PER_SEED // 2), "half of the events Completed")
    local reconnecting = occurrences(hosts.h2:log(), "reconnecting in")
    local connected = occurrences(hosts.h2:log(), "AMQP connected")
    b.run("stop")
    nh.eventually(function() return occurrences(hosts.h2:log(), "reconnecting in") > reconnecting end, 60,
      function() return "h2 never noticed the broker went:\n" .. hosts.h2:log():sub(-2000) end)
    b.run("start")
    nh.eventually(function() return occurrences(hosts.h2:log(), "AMQP connected") > connected end, 90,
      function() return "h2 never connected again:\n" .. hosts.h2:log():sub(-2000) end)
    seed(nseeds)

    -- everything ran that can: the rest waits on the operator
    local fails, handoffs = 0, 0
    for i = 1, N_EVENTS do
      local k = kind(i)
      if k == "fail" then fails = fails + 1 elseif k == "handoff" then handoffs = handoffs + 1 end
    end
    nh.eventually(function()
      local by = statuses(sb)
      local total = 0
      for _, n in pairs(by) do total = total + n end
      return total == N_EVENTS and (by.Failed or 0) == fails and (by.Pending or 0) == handoffs
        and (by.Completed or 0) + (by.Deferred or 0) + fails + handoffs == N_EVENTS
    end, 600, function() return "the events never all settled: " .. describe_statuses(sb) end)

    -- the operator: every failure resubmitted with a fix, every hand-off completed
    for _, row in ipairs(pg.psql(sb.store, "SELECT event_id, convert_from(payload, 'UTF8') FROM audit "
      .. "WHERE endpoint = 'Ep' AND status = 'Failed'")) do
      local body = nh.decode(row[2])
      body.fixed = true
      sb:cli_ok({ "resubmit", row[1], "--body", nh.encode(body) })
    end
    local pending = "SELECT event_id FROM audit WHERE endpoint = 'Ep' AND status = 'Pending'"
    for _, row in ipairs(pg.psql(sb.store, pending)) do
      sb:cli_ok({ "handoff", "complete", row[1] })
    end
    nh.eventually(function() return (statuses(sb).Completed or 0) == N_EVENTS end, 300,
      function() return "not every event Completed after the operator: " .. describe_statuses(sb) end)

    -- Per session, the events' handlers started in publishing order: the next event, or the
    -- same one again (a retry, a resubmit, a run whose outcome was never recorded), never an
    -- earlier one and never one skipped ahead.
    local at, runs, last_start = {}, {}, {}
    for line in io.lines(calls) do
      local i, tag, ms = line:match("^start (%d+) (%S+) %d+ (%d+)")
      i = tonumber(i)
      if i then
        local s = (i - 1) % N_SESSIONS
        local prev = at[s] or (s + 1 - N_SESSIONS)   -- the session's first event is s + 1
        assert(i == prev or i == prev + N_SESSIONS, ("session s%d started event %d after %d"):format(s, i, prev))
        at[s] = i
        runs[i] = (runs[i] or 0) + 1
        last_start[i] = { ms = tonumber(ms), tag = tag }
      end
    end
    for s = 0, N_SESSIONS - 1 do
      local last = s + 1 + ((N_EVENTS - (s + 1)) // N_SESSIONS) * N_SESSIONS
      if s + 1 <= N_EVENTS then assert.equal(last, at[s], "session s" .. s .. " did not reach its last event") end
    end
    -- No handler started after its event's outcome was recorded (the Completed history row's
    -- time, written by the host before its commit): a run again is one whose outcome never
    -- committed (the killed host's, a pass rolled back).
    local done = {}
    for _, row in ipairs(pg.psql(sb.store, "SELECT convert_from(a.payload, 'UTF8'), h.at FROM history h JOIN audit a "
      .. "ON a.endpoint = h.endpoint AND a.event_id = h.event_id WHERE h.endpoint = 'Ep' AND h.status = 'Completed'"))
    do
      done[nh.decode(row[1]).i] = tonumber(row[2])
    end
    local extra = 0
    for i = 1, N_EVENTS do
      local k = kind(i)
      local lo = k == "fail" and 2 or 1   -- a failure: once failing, once after the resubmit
      assert((runs[i] or 0) >= lo, ("event %d (%s) ran %d time(s)"):format(i, k, runs[i] or 0))
      assert(done[i], ("event %d has no Completed history row"):format(i))
      assert(last_start[i].ms <= done[i], ("event %d (%s) started on %s at %d, after its outcome was recorded at %d")
        :format(i, k, last_start[i].tag, last_start[i].ms, done[i]))
      if k == "ok" and runs[i] > 1 then extra = extra + 1 end
    end
    -- one audit row and one Completed history row per event
    assert.equal(tostring(N_EVENTS), pg.value(sb.store, "SELECT count(DISTINCT event_id) FROM history WHERE "
      .. "endpoint = 'Ep' AND status = 'Completed'"))
    assert.equal("0", pg.value(sb.store, "SELECT count(*) FROM (SELECT event_id FROM history WHERE endpoint = 'Ep' "
      .. "AND status = 'Completed' GROUP BY event_id HAVING count(*) > 1) d"))

    -- the live hosts share the partitions, one each at a time
    local live = { h2 = hosts.h2, h3 = hosts.h3, h4 = hosts.h4 }
    for tag, h in pairs(live) do assert.is_true(h:alive(), tag .. " died:\n" .. h:log():sub(-2000)) end
    nh.eventually(function() return spread_evenly(b, 3) end, 90, function() return describe_owners(b, live) end)
    print(("# %d events, %d of the plain ones ran more than once (outcome not committed)"):format(N_EVENTS, extra))
  end)
end)

-- The scale shape shared by partitions_scale_spec.lua (RabbitMQ partitions) and
-- servicebus_sessions_scale_spec.lua (Service Bus sessions, fake peer): one endpoint "Ep" on a
-- PostgreSQL store, N events over 500 sessions with failures, hand-offs and retries, published
-- in order by a seeder host; then the operator's part and the checks of order and outcomes.
local nh = require("nh")
local pg = require("pg")

local M = {}

M.N_EVENTS = tonumber(os.getenv("NH_SCALE_EVENTS") or "20000")
M.N_SESSIONS = 500
M.PER_SEED = 1000

-- What event i (1-based, of session "s<(i-1) % 500>") does; the same text is in the adapters.
local KIND = [[
local function kind(i)
  if i % 997 == 0 then return "fail" end       -- fails past its retries: its session blocks until resubmitted
  if i % 1009 == 0 then return "handoff" end   -- finishes elsewhere: the operator completes it
  if i % 101 == 0 then return "flaky" end      -- fails once: the retry policy runs it again
  return "ok"
end
]]
M.kind = load(KIND .. " return kind")()

-- The endpoint's adapter; `options` is the Lua source of its broker option ("partitions = 8").
-- Writes one line per handler call: "start <i> <host tag> <retry count> <ms since the epoch>".
function M.endpoint_adapter(calls, options)
  return ([[
local nimbus = require("nimbus")
local CALLS, TAG = %q, os.getenv("NH_HOST_TAG") or "-"
%s
local ep = nimbus.endpoint("Ep", { %s, concurrency = 16, lock = { duration = 3 },
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
]]):format(calls, KIND, options)
end

-- A host of its own publishes the events: each Seed publishes PER_SEED of them in one
-- transaction, and every Seed is in one session, so the events go out in order.
function M.seeder_adapter()
  return ([[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Seed", { concurrency = 1 })
ep:on("Seed", function(event)
  for i = event.from, event.to do nimbus.publish("Ev", { i = i }, { session = "s" .. ((i - 1) %% %d) }) end
end)
]]):format(M.N_SESSIONS)
end

-- seed(upto): publishes Seed messages until `upto` of them went out (through `transport`).
function M.seeder(sb, transport)
  local st = { n = math.ceil(M.N_EVENTS / M.PER_SEED), done = 0 }
  function st.seed(upto)
    while st.done < upto do
      st.done = st.done + 1
      sb:publish("Seed", { from = (st.done - 1) * M.PER_SEED + 1, to = math.min(st.done * M.PER_SEED, M.N_EVENTS) },
        { session = "seed", transport = transport })
    end
  end
  return st
end

function M.statuses(sb)
  local by = {}
  for _, row in ipairs(pg.psql(sb.store, "SELECT status, count(*) FROM audit WHERE endpoint = 'Ep' GROUP BY status")) do
    by[row[1]] = tonumber(row[2])
  end
  return by
end

function M.describe_statuses(sb)
  local s = {}
  for st, n in pairs(M.statuses(sb)) do s[#s + 1] = st .. "=" .. n end
  table.sort(s)
  return table.concat(s, " ")
end

-- Waits until at least n events are Completed.
function M.settled(sb, n, why)
  nh.eventually(function() return (M.statuses(sb).Completed or 0) >= n end, 300,
    function() return why .. ": " .. M.describe_statuses(sb) end)
end

-- Everything ran that can; then the operator resubmits every failure with a fix and completes
-- every hand-off; then every event is Completed.
function M.operate(sb)
  local fails, handoffs = 0, 0
  for i = 1, M.N_EVENTS do
    local k = M.kind(i)
    if k == "fail" then fails = fails + 1 elseif k == "handoff" then handoffs = handoffs + 1 end
  end
  nh.eventually(function()
    local by = M.statuses(sb)
    local total = 0
    for _, n in pairs(by) do total = total + n end
    return total == M.N_EVENTS and (by.Failed or 0) == fails and (by.Pending or 0) == handoffs
      and (by.Completed or 0) + (by.Deferred or 0) + fails + handoffs == M.N_EVENTS
  end, 600, function() return "the events never all settled: " .. M.describe_statuses(sb) end)
  for _, row in ipairs(pg.psql(sb.store, "SELECT event_id, convert_from(payload, 'UTF8') FROM audit "
    .. "WHERE endpoint = 'Ep' AND status = 'Failed'")) do
    local body = nh.decode(row[2])
    body.fixed = true
    sb:cli_ok({ "resubmit", row[1], "--body", nh.encode(body) })
  end
  for _, row in ipairs(pg.psql(sb.store, "SELECT event_id FROM audit WHERE endpoint = 'Ep' AND status = 'Pending'")) do
    sb:cli_ok({ "handoff", "complete", row[1] })
  end
  nh.eventually(function() return (M.statuses(sb).Completed or 0) == M.N_EVENTS end, 300,
    function() return "not every event Completed after the operator: " .. M.describe_statuses(sb) end)
end

-- The checks on the handlers' call log; returns how many plain events ran more than once.
-- Per session, the events' handlers started in publishing order: the next event, or the same
-- one again (a retry, a resubmit, a run whose outcome was never recorded), never an earlier
-- one and never one skipped ahead. No handler started after its event's outcome was recorded
-- (the Completed history row's time, written by the host before its commit). One Completed
-- history row per event.
function M.check(sb, calls)
  local N, NS = M.N_EVENTS, M.N_SESSIONS
  local at, runs, last_start = {}, {}, {}
  for line in io.lines(calls) do
    local i, tag, ms = line:match("^start (%d+) (%S+) %d+ (%d+)")
    i = tonumber(i)
    if i then
      local s = (i - 1) % NS
      local prev = at[s] or (s + 1 - NS)   -- the session's first event is s + 1
      assert(i == prev or i == prev + NS, ("session s%d started event %d after %d"):format(s, i, prev))
      at[s] = i
      runs[i] = (runs[i] or 0) + 1
      last_start[i] = { ms = tonumber(ms), tag = tag }
    end
  end
  for s = 0, NS - 1 do
    local last = s + 1 + ((N - (s + 1)) // NS) * NS
    if s + 1 <= N then assert(last == at[s], ("session s%d did not reach its last event"):format(s)) end
  end
  local done = {}
  for _, row in ipairs(pg.psql(sb.store, "SELECT convert_from(a.payload, 'UTF8'), h.at FROM history h JOIN audit a "
    .. "ON a.endpoint = h.endpoint AND a.event_id = h.event_id WHERE h.endpoint = 'Ep' AND h.status = 'Completed'"))
  do
    done[nh.decode(row[1]).i] = tonumber(row[2])
  end
  local extra = 0
  for i = 1, N do
    local k = M.kind(i)
    local lo = k == "fail" and 2 or 1   -- a failure: once failing, once after the resubmit
    assert((runs[i] or 0) >= lo, ("event %d (%s) ran %d time(s)"):format(i, k, runs[i] or 0))
    assert(done[i], ("event %d has no Completed history row"):format(i))
    assert(last_start[i].ms <= done[i], ("event %d (%s) started on %s at %d, after its outcome was recorded at %d")
      :format(i, k, last_start[i].tag, last_start[i].ms, done[i]))
    if k == "ok" and runs[i] > 1 then extra = extra + 1 end
  end
  local distinct = pg.value(sb.store, "SELECT count(DISTINCT event_id) FROM history WHERE endpoint = 'Ep' AND "
    .. "status = 'Completed'")
  assert(distinct == tostring(N), ("%s events have a Completed history row, not %d"):format(distinct, N))
  local twice = pg.value(sb.store, "SELECT count(*) FROM (SELECT event_id FROM history WHERE endpoint = 'Ep' "
    .. "AND status = 'Completed' GROUP BY event_id HAVING count(*) > 1) d")
  assert(twice == "0", twice .. " events have two Completed history rows")
  return extra
end

return M

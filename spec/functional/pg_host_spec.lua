-- Hosts on a PostgreSQL store (docs/store-backends.md): real host processes run an adapter
-- with `--store postgresql://...`, the queue in the store's database, events published with
-- `nimbus-host publish` to the same URL; the store is read back with psql. A host killed
-- with SIGKILL mid-stream and started again loses nothing and records no outcome twice;
-- two hosts on one store share the work and keep each session's order. Runs as ctest
-- functional_pg_host against the cluster of the fixture "postgres".
local nh = require("nh")
local pg = require("pg")

local N_EVENTS, N_SESSIONS = 200, 10

local function session_of(seq) return "s" .. ((seq - 1) % N_SESSIONS + 1) end

-- Every call appends "<phase> <session> <seq> <host tag>" (phase start, then end) to the
-- call log; a few coroutine yields between them let the host take other work meanwhile.
-- With `hold` (a file the test made), the handler of seq HOLD_SEQ waits (yielding) until the
-- file is gone, holding its session's later events behind it.
local HOLD_SEQ = 100
local function adapter_source(sb, hold)
  return ([[
local nimbus = require("nimbus")
local CALLS, HOLD, HOLD_SEQ = %q, %q, %d
local TAG = os.getenv("NH_HOST_TAG") or "-"
local function log(phase, event, ctx)
  local f = assert(io.open(CALLS, "a"))
  f:write(("%%s %%s %%d %%s\n"):format(phase, ctx.session_id, event.seq, TAG))
  f:close()
end
local ep = nimbus.endpoint("Sink", { concurrency = 4 })
ep:on("Tick", function(event, ctx)
  log("start", event, ctx)
  for _ = 1, 3 do coroutine.yield() end
  while event.seq == HOLD_SEQ and io.open(HOLD, "r") do nimbus.sleep(0.05) end
  log("end", event, ctx)
end)
]]):format(sb.calls_path, hold or "", HOLD_SEQ)
end

-- seq = 1..n round-robin over the sessions, in one shell run of `publish` processes.
local function publish_all(sb, url, n)
  local lines = { "set -e" }
  for seq = 1, n do
    lines[#lines + 1] = ([["$NH_BIN" publish Tick '{"seq":%d}' --session %s --store %s >/dev/null 2>&1]]):format(
      seq, session_of(seq), nh.q(url))
  end
  local script = nh.write(sb:path("publish.sh"), table.concat(lines, "\n") .. "\n")
  local r = nh.capture(("NH_BIN=%s sh %s"):format(nh.q(nh.bin()), nh.q(script)), sb.dir)
  assert.equal(0, r.code, r.err)
end

local function completed(url)
  return tonumber(pg.value(url, "SELECT count(*) FROM audit WHERE status = 'Completed'"))
end

local function calls(sb) return sb:sink_calls() end

-- Every event completed once in the store: one audit row, one Completed history row each.
local function assert_recorded_once(url)
  assert.equal(N_EVENTS, completed(url))
  assert.equal("0", pg.value(url, "SELECT count(*) FROM audit WHERE status <> 'Completed'"))
  assert.equal("0", pg.value(url, "SELECT count(*) FROM (SELECT event_id FROM history WHERE status = 'Completed'"
                              .. " GROUP BY event_id HAVING count(*) <> 1) x"))
  assert.equal(tostring(N_EVENTS), pg.value(url, "SELECT count(DISTINCT event_id) FROM history WHERE status = 'Completed'"))
  assert.equal("0", pg.value(url, "SELECT count(*) FROM queue"))
  assert.equal("0", pg.value(url, "SELECT count(*) FROM session_locks WHERE owner IS NOT NULL"))
end

-- Within each session, handlers started in publish order: a seq never starts before an
-- earlier one of its session, though one whose outcome a crash lost may start again.
local function assert_session_order(rows)
  local last = {}
  for _, r in ipairs(rows) do
    if r.phase == "start" then
      local prev = last[r.session] or 0
      assert.is_true(r.seq >= prev, ("session %s: seq %d started after %d"):format(r.session, r.seq, prev))
      last[r.session] = r.seq
    end
  end
end

-- A cluster of the spec's own (scripts/postgres.sh with its own directory and port), to stop
-- and start under a running host without disturbing the suites that share the fixture's.
local function private_cluster(sb)
  -- the server runs as the OS user postgres when we are root: it must reach the directory
  assert(nh.sh("chmod o+x " .. nh.q(sb.dir)) == 0)
  local env = ("env -u NH_PG_ADMIN_URL NH_PG_DIR=%s NH_PG_PORT=%d "):format(nh.q(sb:path("pg")), nh.free_port(56432))
  local function script(...)
    local args = {}
    for _, a in ipairs({ ... }) do args[#args + 1] = nh.q(a) end
    local r = nh.capture(("%stimeout -k 5 %d %s %s"):format(env, pg.DEADLINE, nh.q(pg.script()), table.concat(args, " ")))
    assert.equal(0, r.code, ("postgres.sh %s: %s%s"):format(table.concat({ ... }, " "), r.out, r.err))
    return r.out
  end
  return script
end

describe("hosts on a PostgreSQL store", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function()
    sb:cleanup()
    pg.cleanup()
  end)

  it("lose nothing and record nothing twice when one is killed mid-stream and started again", function()
    local _, url = pg.createdb("crash")
    -- the held handler keeps its session's later events queued, so the kill lands mid-stream
    local hold = sb:touch("hold")
    local adapter = sb:adapter("sink.lua", adapter_source(sb, hold))
    -- the first start subscribes the endpoint; the backlog is queued while no host runs
    local h = sb:spawn(adapter, { store = url, transport = false })
    h:signal("TERM")
    h:wait_exit(15)
    publish_all(sb, url, N_EVENTS)
    h = sb:spawn(adapter, { store = url, transport = false })
    nh.eventually(function() return completed(url) >= N_EVENTS / 3 end, nh.DEADLINE, "a third completed")
    nh.eventually(function() return (nh.read(sb.calls_path) or ""):find("start %S+ " .. HOLD_SEQ .. " ") end,
      nh.DEADLINE, "the held handler started")
    h:signal("KILL")
    h:wait_exit(10)
    local at_kill = completed(url)
    assert.is_true(at_kill < N_EVENTS, "everything completed before the kill: nothing was tested")
    os.remove(hold)
    sb:spawn(adapter, { store = url, transport = false })
    nh.eventually(function() return completed(url) == N_EVENTS end, nh.DEADLINE,
      function() return ("%d of %d completed"):format(completed(url), N_EVENTS) end)
    assert_recorded_once(url)
    local rows = calls(sb)
    assert_session_order(rows)
    local ends = nh.count(rows, function(r) return r.phase == "end" end)
    assert.is_true(ends >= N_EVENTS, "handlers ended " .. ends .. " times")
  end)

  it("block a failing session and park its later events, and release it with the API's skip and the CLI's resubmit", function()
    local _, url = pg.createdb("ops")
    local adapter = sb:adapter("ops.lua", ([[
local nimbus = require("nimbus")
local CALLS = %q
local ep = nimbus.endpoint("Orders", { retry = { max_retries = 0 } })
ep:on("Placed", function(event, ctx)
  local f = assert(io.open(CALLS, "a"))
  f:write(ctx.session_id, " ", event.n, "\n")
  f:close()
  if event.fail then error("ERP rejected order " .. event.n) end
end)
]]):format(sb.calls_path))
    local h1 = sb:spawn(adapter, { store = url, transport = false })
    local function pub(session, n, fail)
      sb:cli_ok({ "publish", "Placed", nh.encode({ n = n, fail = fail or nil }), "--session", session },
                { store = url, transport = false })
    end
    local function status_of(n)
      return pg.value(url, ("SELECT status FROM audit WHERE convert_from(payload, 'UTF8')::json->>'n' = '%d'"):format(n))
    end
    local function event_of(n)
      return pg.value(url, ("SELECT event_id FROM audit WHERE convert_from(payload, 'UTF8')::json->>'n' = '%d'"):format(n))
    end
    pub("a", 1, true); pub("a", 2); pub("a", 3)
    pub("b", 11, true); pub("b", 12)
    nh.eventually(function()
      return status_of(1) == "Failed" and status_of(3) == "Deferred" and status_of(11) == "Failed"
             and status_of(12) == "Deferred"
    end, nh.DEADLINE, "both sessions blocked, their later events parked")
    assert.equal("3", pg.value(url, "SELECT count(*) FROM parked"))
    -- /metrics tells the store-wide gauges: the host that blocked them, and a second host
    -- started now, which reads them from the store (its admin API's store routes say they
    -- are not built on PostgreSQL, and what does it instead)
    local h2 = sb:spawn(adapter, { store = url, transport = false })
    local function gauges(h)
      local port = nh.eventually(function() return h:admin_port() end, nh.DEADLINE, "the admin listener")
      local r = nh.capture(("curl -sS --max-time 30 http://127.0.0.1:%d/metrics"):format(port))
      assert.equal(0, r.code, r.err)
      local m = nh.prom_samples(r.out)
      return m['nimbus_sessions_blocked{endpoint="Orders"}'], m['nimbus_events_parked{endpoint="Orders"}']
    end
    local function gauges_are(blocked, parked)
      for _, h in ipairs({ h1, h2 }) do
        nh.eventually(function()
          local b, p = gauges(h)
          return b == blocked and p == parked
        end, nh.DEADLINE, function()
          local b, p = gauges(h)
          return ("gauges: blocked %s, parked %s"):format(tostring(b), tostring(p))
        end)
      end
    end
    gauges_are(2, 3)
    -- the operator API reads the store on either host (on the thread pool: the loop never
    -- waits for PostgreSQL); its actions and live stream say they are not built on it yet
    local api = ("http://127.0.0.1:%d/api/v1"):format(h2:admin_port())
    local status, body = nh.http_json(api .. "/endpoints")
    assert.equal(200, status, nh.encode(body))
    assert.equal(1, #body.endpoints, nh.encode(body))
    local orders = body.endpoints[1]
    assert.equal("Orders", orders.endpoint)
    assert.same({ 2, 3, 2 }, { orders.counts.Failed, orders.counts.Deferred, orders.blocked_sessions }, nh.encode(orders))
    assert.equal(2, orders.live_hosts)
    local page1
    status, page1 = nh.http_json(api .. "/events?status=failed&limit=1")
    assert.equal(200, status, nh.encode(page1))
    assert.equal(1, #page1.events)
    local page2
    status, page2 = nh.http_json(api .. "/events?status=failed&limit=1&after=" .. page1.next)
    assert.equal(200, status, nh.encode(page2))
    assert.equal(1, #page2.events)
    local listed = { page1.events[1].event_id, page2.events[1].event_id }
    table.sort(listed)
    local blockers = { event_of(1), event_of(11) }
    table.sort(blockers)
    assert.same(blockers, listed)
    local newest
    status, newest = nh.http_json(api .. "/events?order=newest&limit=1")
    assert.equal(200, status, nh.encode(newest))
    assert.equal(event_of(12), newest.events[1].event_id)
    local ev
    status, ev = nh.http_json(api .. "/events/" .. event_of(11))
    assert.equal(200, status, nh.encode(ev))
    assert.equal("Failed", ev.status)
    assert.equal(11, ev.payload.n)
    assert.truthy(nh.encode(ev.history):find("ERP rejected order 11", 1, true), nh.encode(ev.history))
    local sessions
    status, sessions = nh.http_json(api .. "/sessions")
    assert.equal(200, status, nh.encode(sessions))
    local parked = {}
    for _, row in ipairs(sessions.sessions) do parked[row.session_id] = row.parked end
    assert.same({ a = 2, b = 1 }, parked)
    local groups
    status, groups = nh.http_json(api .. "/failures")
    assert.equal(200, status, nh.encode(groups))
    assert.equal(1, #groups.groups, nh.encode(groups))   -- "ERP rejected order <n>"
    assert.equal(2, groups.groups[1].count)
    status, body = nh.http_json(api .. "/events/nope-not-an-event")
    assert.equal(404, status, nh.encode(body))
    status, body = nh.http_json(api .. "/events?endpoint=Nope")
    assert.equal(400, status, nh.encode(body))
    local origin = { "Content-Type: application/json", ("Origin: http://127.0.0.1:%d"):format(h2:admin_port()),
                     "api-version: 2" }
    local nimbus
    status, nimbus = nh.http_json((api:gsub("/v1$", "")) .. "/endpoint/status/count", "POST", '["Orders"]', origin)
    assert.equal(200, status, nh.encode(nimbus))   -- NimBus's own read, the same counts
    assert.same({ 2, 3 }, { nimbus[1].failedCount, nimbus[1].deferredCount })
    local who
    status, who = nh.http_json(api .. "/whoami")
    assert.same({ 200, "postgresql", true }, { status, who.store, who.live })
    status, body = nh.http_json(api .. "/bulk/skip", "POST", '{"filter":{"status":"failed"},"dry_run":true}', origin)
    assert.equal(200, status, nh.encode(body))   -- a bulk action's dry run: the two blockers
    assert.equal(2, body.matched)
    local sampled = { body.sample[1].event_id, body.sample[2].event_id }
    table.sort(sampled)
    assert.same(blockers, sampled)
    -- the live stream answers (an event stream: cut off after 2 s, its status read)
    local r = nh.capture(("curl -sS --max-time 2 -o /dev/null -w '%%{http_code}' %s/stream"):format(api))
    assert.equal("200", r.out)
    status = nh.http_json((api:gsub("/api/v1$", "")) .. "/readyz")
    assert.equal(200, status)
    -- the CLI lists them from the same URL
    local failed = sb:cli_ok({ "events", "--status", "failed", "--json" }, { store = url })
    local ids = {}
    for _, row in ipairs(nh.json_lines(failed)) do ids[#ids + 1] = row.event_id end
    table.sort(ids)
    local want = { event_of(1), event_of(11) }
    table.sort(want)
    assert.same(want, ids)
    assert.equal("3\n", sb:cli_ok({ "events", "--status", "deferred", "--count" }, { store = url }))
    assert.equal("2\n", sb:cli_ok({ "events", "--session", "b", "--count" }, { store = url }))

    -- skip the blocker of a through the API (on the pool, queued as the CLI queues it): 2
    -- and 3 replay in order
    local skipped
    status, skipped = nh.http_json(api .. "/events/" .. event_of(1) .. "/skip", "POST", '{"reason":"duplicate"}', origin)
    assert.equal(202, status, nh.encode(skipped))
    assert.same({ "skip", event_of(1) }, { skipped.queued, skipped.event.event_id })
    -- resubmit b's blocker with a body that passes: it runs again, then 12
    sb:cli_ok({ "resubmit", event_of(11), "--body", nh.encode({ n = 11 }) }, { store = url })
    nh.eventually(function()
      return status_of(1) == "Skipped" and status_of(3) == "Completed" and status_of(11) == "Completed"
             and status_of(12) == "Completed"
    end, nh.DEADLINE, "both sessions released and replayed")
    assert.equal("0", pg.value(url, "SELECT count(*) FROM parked"))
    assert.equal("0", pg.value(url, "SELECT count(*) FROM sessions"))
    -- whichever host released them, both read the store again (within seconds) and agree
    gauges_are(0, 0)
    -- per session, the handlers in order (the sessions interleave freely)
    local per = { a = {}, b = {} }
    for session, n in nh.read(sb.calls_path):gmatch("(%S+) (%d+)\n") do table.insert(per[session], n) end
    assert.equal("1 2 3", table.concat(per.a, " "))
    assert.equal("11 11 12", table.concat(per.b, " "))
    assert.equal("1", pg.value(url, ("SELECT count(*) FROM operator_log WHERE event_id = '%s' AND action = 'skip'")
                                 :format(event_of(1))))
    -- `show` reads the event and its history from the same URL
    local shown = sb:cli_ok({ "show", event_of(11) }, { store = url })
    assert.truthy(shown:find("status     Completed", 1, true), shown)
    assert.truthy(shown:find("ERP rejected order 11", 1, true), shown)   -- the failed run, in the history
    assert.truthy(shown:find("Requested", 1, true), shown)               -- the resubmit request
    -- a second request for a released event is refused with the reason
    local r = sb:cli({ "skip", event_of(3) }, { store = url })
    assert.equal(2, r.code, r.err)
    assert.truthy(r.err:find("already Completed", 1, true), r.err)
  end)

  it("ride out PostgreSQL stopping mid-stream and starting again: every event recorded once", function()
    local cluster = private_cluster(sb)
    cluster("start")
    local ok, err = pcall(function()
      local url = cluster("createdb", "outage"):match("(postgres%S+)")
      local hold = sb:touch("hold")
      local adapter = sb:adapter("sink.lua", adapter_source(sb, hold))
      local h = sb:spawn(adapter, { store = url, transport = false })
      h:signal("TERM")
      h:wait_exit(15)
      publish_all(sb, url, N_EVENTS)
      h = sb:spawn(adapter, { store = url, transport = false })
      -- the server goes while a handler runs and its session's later events wait
      nh.eventually(function() return (nh.read(sb.calls_path) or ""):find("start %S+ " .. HOLD_SEQ .. " ") end,
        nh.DEADLINE, "the held handler started")
      cluster("stop")
      nh.eventually(function() return h:log():find("retrying (after", 1, true) ~= nil end, nh.DEADLINE,
        function() return "the host never noticed the server go:\n" .. h:log() end)
      assert.is_nil(h:exit_code(), "the host exited while the server was away:\n" .. h:log())
      cluster("start")
      os.remove(hold)
      -- A fill in flight when the server went may have committed its leases with its answer lost:
      -- those sessions wait for the leases to end (30 s, the transport's lock time), as a dead
      -- host's would, so the deadline covers one lease
      nh.eventually(function() return completed(url) == N_EVENTS end, 30 + nh.DEADLINE,
        function() return ("%d of %d completed:\n%s"):format(completed(url), N_EVENTS, h:log():sub(-3000)) end)
      assert.truthy(h:log():find("connected again", 1, true), h:log())
      assert_recorded_once(url)
      assert_session_order(calls(sb))
    end)
    pcall(cluster, "stop")
    assert(ok, err)
  end)

  it("share one store's work, each event once and each session in order", function()
    local _, url = pg.createdb("pair")
    local adapter = sb:adapter("sink.lua", adapter_source(sb))
    sb:spawn(adapter, { store = url, transport = false, env = { NH_HOST_TAG = "A" } })
    sb:spawn(adapter, { store = url, transport = false, env = { NH_HOST_TAG = "B" } })
    publish_all(sb, url, N_EVENTS)
    nh.eventually(function() return completed(url) == N_EVENTS end, nh.DEADLINE,
      function() return ("%d of %d completed"):format(completed(url), N_EVENTS) end)
    assert_recorded_once(url)
    local rows = calls(sb)
    assert_session_order(rows)
    assert.equal(N_EVENTS, nh.count(rows, function(r) return r.phase == "start" end))   -- no event ran twice
    assert.is_true(nh.count(rows, function(r) return r.tag == "A" end) > 0, "host A took no work")
    assert.is_true(nh.count(rows, function(r) return r.tag == "B" end) > 0, "host B took no work")
  end)

  it("are followed by events --follow, a change whose transaction commits after a later one's included", function()
    -- PostgreSQL hands history ids out at insert, not at commit: a row can become visible
    -- below the last id the follow read. Here a psql session holds such a row uncommitted
    -- while a later event completes, then commits it.
    local _, url = pg.createdb("follow")
    local adapter = sb:adapter("follow.lua", [[
local nimbus = require("nimbus")
nimbus.endpoint("Orders"):on("Placed", function() end)
]])
    sb:spawn(adapter, { store = url, transport = false })
    local function publish(session)
      local mid = "m-" .. session
      sb:cli_ok({ "publish", "Placed", "{}", "--session", session, "--message-id", mid }, { store = url, transport = false })
      local id
      nh.eventually(function()
        id = pg.value(url, ("SELECT event_id FROM audit WHERE session_id = '%s' AND status = 'Completed'"):format(session))
        return id ~= ""
      end, nh.DEADLINE, session .. " completed")
      return id
    end
    local first = publish("a")
    local follow = sb:spawn({ "events", "--follow", "--json" }, { store = url, wait = false, transport = false })
    local function seen(id)
      local n = 0
      for _, r in ipairs(nh.json_lines(follow:log())) do if r.event_id == id then n = n + 1 end end
      return n
    end
    nh.eventually(function() return seen(first) == 1 end, nh.DEADLINE, "the listing")
    local held = assert(io.popen(("psql -X -q -v ON_ERROR_STOP=1 %s >/dev/null 2>&1"):format(nh.q(url)), "w"))
    held:write(("BEGIN;\nINSERT INTO history(endpoint, event_id, message_type, status, detail, at)"
                .. " VALUES ('Orders', '%s', 'Note', 'Completed', 'late', 0);\n"):format(first))
    held:flush()
    nh.eventually(function()
      return pg.value(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           .. " AND state = 'idle in transaction'") == "1"
    end, nh.DEADLINE, "the held insert")
    local second = publish("b")
    nh.eventually(function() return seen(second) >= 1 end, nh.DEADLINE, "the later event followed")
    assert.equal(1, seen(first), follow:log())
    held:write("COMMIT;\n")
    held:close()
    nh.eventually(function() return seen(first) == 2 end, nh.DEADLINE,
      function() return "the late change never followed:\n" .. follow:log() end)
    assert.equal(0, follow:stop())
  end)

  it("flag an overdue hand-off once among two hosts and delete resolved events with --retention", function()
    local _, url = pg.createdb("chores")
    local adapter = sb:adapter("chores.lua", ([[
local nimbus = require("nimbus")
local cjson = require("cjson")
local HOOKS = %q
nimbus.on("handoff_overdue", function(info)
  local f = assert(io.open(HOOKS, "a"))
  f:write(cjson.encode({ event_id = info.event_id, job = info.external_job_id }), "\n")
  f:close()
end)
local ep = nimbus.endpoint("Erp", { concurrency = 2 })
ep:on("Import", function(event, ctx)
  if event.handoff then
    ctx:mark_pending_handoff{ reason = "erp import", external_job_id = "J7", expected_by = 0.2 }
  end
end)
]]):format(sb:path("hooks.jsonl")))
    -- two hosts run the scan; one flags the hand-off
    local a = sb:spawn(adapter, { store = url, transport = false, args = { "--retention", "1s" } })
    local b = sb:spawn(adapter, { store = url, transport = false, args = { "--retention", "1s" } })
    sb:cli_ok({ "publish", "Import", '{"handoff":true}', "--session", "h" }, { store = url })
    for k = 1, 20 do sb:cli_ok({ "publish", "Import", ('{"n":%d}'):format(k), "--session", "s" .. k % 4 }, { store = url }) end
    local ev = nh.eventually(function()
      return pg.value(url, "SELECT event_id FROM audit WHERE overdue_at IS NOT NULL")
    end, nh.DEADLINE, "the overdue flag")
    local hooked = nh.eventually(function() return nh.read(sb:path("hooks.jsonl")) end, nh.DEADLINE, "the hook")
    local info = nh.decode(hooked:match("[^\n]+"))
    assert.equal(ev, info.event_id)
    assert.equal("J7", info.job)
    nh.eventually(function()
      return (a:log() .. b:log()):find("hand-off overdue", 1, true)
    end, nh.DEADLINE, "the overdue warning")
    -- the resolved events go, with their history; the pending hand-off stays
    nh.eventually(function() return pg.value(url, "SELECT count(*) FROM audit") == "1" end, 60,
      function() return "audit rows left: " .. pg.value(url, "SELECT count(*) FROM audit") end)
    assert.equal("Pending", pg.value(url, "SELECT status FROM audit"))
    assert.equal("0", pg.value(url, ("SELECT count(*) FROM history WHERE event_id <> '%s'"):format(ev)))
    -- flagged once, told once, though both hosts kept scanning
    assert.equal("1", pg.value(url, ("SELECT count(*) FROM history WHERE event_id = '%s'"
                                     .. " AND message_type = 'HandoffOverdue'"):format(ev)))
    local n = 0
    for _ in nh.read(sb:path("hooks.jsonl")):gmatch("[^\n]+") do n = n + 1 end
    assert.equal(1, n)
    -- settled from the CLI: no longer overdue (the flag goes with the status)
    sb:cli_ok({ "handoff", "complete", ev }, { store = url })
    nh.eventually(function() return pg.value(url, "SELECT count(*) FROM audit") == "0" end, 60,
      "the completed hand-off to be deleted too")
  end)
end)

-- Hosts with a broker beside a PostgreSQL store (docs/store-backends.md, "Several hosts with a
-- broker"): real host processes with `--store postgresql://... --transport amqp://...`, events
-- published over RabbitMQ with `nimbus-host publish`, the store read back with psql. Two hosts
-- consuming one endpoint share one audit trail and one set of blocked sessions; a host killed
-- with SIGKILL mid-stream loses nothing and has no outcome recorded twice. Per-session order
-- across hosts on the broker is issue 17, so it is not asserted here. Runs as ctest
-- functional_pg_amqp (fixtures "postgres" and "rabbitmq"; NH_STORE_BACKEND=postgres gives the
-- sandbox its database, NH_TRANSPORT its vhost).
local nh = require("nh")
local pg = require("pg")

local N_EVENTS, N_SESSIONS = 120, 12

local function session_of(seq) return "s" .. ((seq - 1) % N_SESSIONS + 1) end

-- Every call appends "<phase> <session> <seq> <host tag>"; the handler of seq HOLD_SEQ waits
-- while the file `hold` exists, and one whose seq is FAIL_SEQ fails while `fail` exists.
local HOLD_SEQ, FAIL_SEQ = 60, 7
local function adapter_source(sb, hold, fail)
  return ([[
local nimbus = require("nimbus")
local CALLS, HOLD, FAIL, HOLD_SEQ, FAIL_SEQ = %q, %q, %q, %d, %d
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
  if event.seq == FAIL_SEQ and io.open(FAIL, "r") then error("seq " .. FAIL_SEQ .. " fails") end
  log("end", event, ctx)
end)
]]):format(sb.calls_path, hold or "", fail or "", HOLD_SEQ, FAIL_SEQ)
end

-- seq = 1..n round-robin over the sessions, each a `publish` over the broker.
local function publish_all(sb, n)
  local lines = { "set -e" }
  for seq = 1, n do
    lines[#lines + 1] = ([["$NH_BIN" publish Tick '{"seq":%d}' --session %s --store %s --transport %s >/dev/null]])
      :format(seq, session_of(seq), nh.q(sb.store), nh.q(sb.transport_url))
  end
  local script = nh.write(sb:path("publish.sh"), table.concat(lines, "\n") .. "\n")
  local r = nh.capture(("NH_BIN=%s sh %s"):format(nh.q(nh.bin()), nh.q(script)), sb.dir)
  assert.equal(0, r.code, r.err)
end

local function count(sb, where)
  return tonumber(pg.value(sb.store, "SELECT count(*) FROM audit" .. (where and (" WHERE " .. where) or "")))
end

local function calls(sb) return sb:sink_calls() end

-- One audit row and one Completed history row per event; nothing left in the outbox, the
-- delivery counts or the session locks.
local function assert_recorded_once(sb)
  assert.equal(N_EVENTS, count(sb, "status = 'Completed'"))
  assert.equal(N_EVENTS, count(sb))
  assert.equal("0", pg.value(sb.store, "SELECT count(*) FROM (SELECT event_id FROM history WHERE status = 'Completed'"
                                 .. " GROUP BY event_id HAVING count(*) <> 1) x"))
  nh.eventually(function() return pg.value(sb.store, "SELECT count(*) FROM amqp_outbox") == "0" end, nh.DEADLINE,
    "the outbox emptied")
  assert.equal("0", pg.value(sb.store, "SELECT count(*) FROM amqp_deliveries"))
  nh.eventually(function()
    return pg.value(sb.store, "SELECT count(*) FROM session_locks WHERE owner IS NOT NULL") == "0"
  end, nh.DEADLINE, "every session lock released")
end

describe("hosts with a broker beside a PostgreSQL store", function()
  local sb
  before_each(function()
    sb = nh.sandbox()
    assert(sb.pg_db and sb.transport == "amqp", "run with NH_STORE_BACKEND=postgres and NH_TRANSPORT (ctest functional_pg_amqp)")
  end)
  after_each(function()
    sb:cleanup()
    pg.cleanup()
  end)

  it("share one audit trail: each event once, a failing session blocked for both and resubmitted from the CLI", function()
    local fail = sb:touch("fail")
    local adapter = sb:adapter("sink.lua", adapter_source(sb, nil, fail))
    sb:spawn(adapter, { env = { NH_HOST_TAG = "A" } })
    sb:spawn(adapter, { env = { NH_HOST_TAG = "B" } })
    publish_all(sb, N_EVENTS)
    -- seq 7's session (s7) is blocked; its later events park, whichever host received them
    local blocked = session_of(FAIL_SEQ)
    local later = N_EVENTS / N_SESSIONS - 1
    nh.eventually(function() return count(sb, "status = 'Completed'") == N_EVENTS - 1 - later end, nh.DEADLINE,
      function() return ("%d completed"):format(count(sb, "status = 'Completed'")) end)
    nh.eventually(function() return count(sb, "status = 'Deferred'") == later end, nh.DEADLINE, "siblings parked")
    local failed = sb:events({ status = "Failed" })
    assert.equal(1, #failed)
    assert.equal(blocked, failed[1].session_id)
    assert.equal(failed[1].event_id, sb:session(blocked).blocked_by)
    os.remove(fail)
    sb:cli_ok({ "resubmit", failed[1].event_id })
    nh.eventually(function() return count(sb, "status = 'Completed'") == N_EVENTS end, nh.DEADLINE,
      function() return ("%d of %d completed"):format(count(sb, "status = 'Completed'"), N_EVENTS) end)
    assert_recorded_once(sb)
    assert.is_nil(sb:session(blocked))
    local rows = calls(sb)
    -- no handler ran twice but the failed one, run again by the resubmit
    assert.equal(N_EVENTS + 1, nh.count(rows, function(r) return r.phase == "start" end))
    assert.is_true(nh.count(rows, function(r) return r.tag == "A" end) > 0, "host A took no work")
    assert.is_true(nh.count(rows, function(r) return r.tag == "B" end) > 0, "host B took no work")
    -- the parked siblings replayed in order after the resubmitted head
    local order = {}
    for _, r in ipairs(rows) do
      if r.phase == "start" and r.session == blocked then order[#order + 1] = r.seq end
    end
    local want = { FAIL_SEQ, FAIL_SEQ }
    for k = 1, later do want[#want + 1] = FAIL_SEQ + k * N_SESSIONS end
    assert.same(want, order)
  end)

  it("lose nothing and record nothing twice when one is killed mid-stream and started again", function()
    local hold = sb:touch("hold")
    local adapter = sb:adapter("sink.lua", adapter_source(sb, hold))
    local a = sb:spawn(adapter, { env = { NH_HOST_TAG = "A" } })
    sb:spawn(adapter, { env = { NH_HOST_TAG = "B" } })
    publish_all(sb, N_EVENTS)
    nh.eventually(function() return (nh.read(sb.calls_path) or ""):find("start %S+ " .. HOLD_SEQ .. " ") end,
      nh.DEADLINE, "the held handler started")
    -- kill the host holding seq HOLD_SEQ: its session's lease and its unsettled deliveries with it
    local holder = calls(sb)
    local tag
    for _, r in ipairs(holder) do if r.seq == HOLD_SEQ then tag = r.tag end end
    local victim = tag == "A" and a or sb.hosts[2]
    victim:signal("KILL")
    victim:wait_exit(10)
    assert.is_true(count(sb, "status = 'Completed'") < N_EVENTS, "everything completed before the kill")
    os.remove(hold)
    -- started again on this machine, it frees the dead process's leases at once
    sb:spawn(adapter, { env = { NH_HOST_TAG = tag .. "2" } })
    nh.eventually(function() return count(sb, "status = 'Completed'") == N_EVENTS end, nh.DEADLINE,
      function() return ("%d of %d completed"):format(count(sb, "status = 'Completed'"), N_EVENTS) end)
    assert_recorded_once(sb)
    local ends = nh.count(calls(sb), function(r) return r.phase == "end" end)
    assert.is_true(ends >= N_EVENTS, "handlers ended " .. ends .. " times")
  end)
end)

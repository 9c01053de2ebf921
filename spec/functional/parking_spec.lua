-- docs/design.md section 6, rows 6-7 (an event in a blocked session; a redelivered blocker)
-- and the replay rules: parked messages run in park order before newer arrivals.
local nh = require("nh")

local function tags_of(calls)
  local out = {}
  for i, c in ipairs(calls) do out[i] = c.tag end
  return out
end

describe("a blocked session", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- Publishes a failing head and n siblings in session s1; returns the blocker row and
  -- the siblings' message ids once all siblings are Deferred.
  local function block_with_siblings(n, session)
    session = session or "s1"
    local head = sb:publish("Ok", { tag = "head", fail_times = 1 }, { session = session })
    local mids = {}
    for i = 1, n do mids[i] = sb:publish("Ok", { tag = "p" .. i }, { session = session }) end
    local blocker = sb:wait_message(head, "Failed")
    for i = 1, n do sb:wait_message(mids[i], "Deferred") end
    return blocker, mids
  end

  it("row 6: later events are parked as Deferred in order, not run; other sessions keep flowing", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "concurrency = 4" })
    local blocker, mids = block_with_siblings(3)
    local other = sb:publish("Ok", { tag = "other" }, { session = "s2" })
    sb:wait_message(other, "Completed")

    local rows = nh.where(sb:events({ session = "s1" }), "status", "Deferred")
    assert.equal(3, #rows)
    for i, r in ipairs(rows) do
      assert.equal(mids[i], r.message_id, "Deferred rows are in publish order")
      assert.equal("Session s1 is blocked by " .. blocker.event_id, r.error_text)
    end
    assert.same({ "head" }, sb:call_tags("s1"))
    assert.same({ "other" }, sb:call_tags("s2"))
    local st = sb:session("s1")
    assert.equal(blocker.event_id, st.blocked_by)
    assert.equal(3, st.parked)
    assert.is_false(st.draining)
    assert.is_nil(sb:session("s2"))
    local blocked = sb:sessions({ blocked = true })
    assert.equal(1, #blocked)
    assert.equal("s1", blocked[1].session_id)
  end)

  it("row 6: --status and --session filter the audit rows", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    block_with_siblings(2)
    local ok = sb:publish("Ok", { tag = "o" }, { session = "s2" })
    sb:wait_message(ok, "Completed")
    assert.equal(2, #sb:events({ status = "deferred" }))
    assert.equal(1, #sb:events({ status = "failed" }))
    assert.equal(1, #sb:events({ status = "completed" }))
    assert.equal(3, #sb:events({ session = "s1" }))
    assert.equal(0, #sb:events({ status = "skipped" }))
  end)

  it("FIFO replay: five parked siblings complete in original order after a resubmit, and newer arrivals do not overtake them", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "concurrency = 8" })
    local blocker, mids = block_with_siblings(5)

    sb:cli_ok({ "resubmit", blocker.event_id })
    local newer = {}
    for i = 1, 3 do newer[i] = sb:publish("Ok", { tag = "n" .. i }, { session = "s1" }) end

    for i = 1, 5 do sb:wait_message(mids[i], "Completed") end
    for i = 1, 3 do sb:wait_message(newer[i], "Completed") end
    sb:wait_event(blocker.event_id, "Completed")

    assert.same({ "head", "head", "p1", "p2", "p3", "p4", "p5", "n1", "n2", "n3" }, sb:call_tags("s1"))
    local calls = sb:calls_where("session", "s1")
    assert.equal("event", calls[1].kind)
    assert.equal("resubmit", calls[2].kind)
    for i = 3, 7 do assert.equal("replay", calls[i].kind, "parked sibling " .. calls[i].tag .. " ran as a replay") end
    for _, r in ipairs(sb:events({ session = "s1" })) do assert.equal("Completed", r.status) end
    assert.equal(9, #sb:events({ session = "s1" }))
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again after draining")
  end)

  it("replay: a parked event that fails re-blocks the session and the rest stay parked in order", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local head = sb:publish("Ok", { tag = "head", fail_times = 1 }, { session = "s1" })
    local p1 = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
    local p2 = sb:publish("Ok", { tag = "p2", fail_times = 1 }, { session = "s1" })
    local p3 = sb:publish("Ok", { tag = "p3" }, { session = "s1" })
    local p4 = sb:publish("Ok", { tag = "p4" }, { session = "s1" })
    local blocker = sb:wait_message(head, "Failed")
    sb:wait_message(p4, "Deferred")

    sb:cli_ok({ "resubmit", blocker.event_id })
    local r2 = sb:wait_message(p2, "Failed")
    sb:wait_message(p1, "Completed")
    local st = nh.eventually(function()
      local s = sb:session("s1")
      return s and s.blocked_by == r2.event_id and s
    end, nil, "session s1 re-blocked by p2")
    assert.equal(2, st.parked)
    -- Still Deferred (their rows were written when they were parked behind the head).
    sb:wait_message(p3, "Deferred")
    sb:wait_message(p4, "Deferred")
    assert.same({ "head", "head", "p1", "p2" }, sb:call_tags("s1"))

    sb:cli_ok({ "resubmit", r2.event_id })
    sb:wait_message(p3, "Completed")
    sb:wait_message(p4, "Completed")
    assert.same({ "head", "head", "p1", "p2", "p2", "p3", "p4" }, sb:call_tags("s1"))
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again")
  end)

  it("parking is per endpoint: a failure on one endpoint does not block the same session on another", function()
    local a = sb:recorder{ endpoint = "EpA", types = { "Ok" } }
    local b = sb:recorder{ endpoint = "EpB", types = { "Ok" } }
    sb:start({ a, b })
    -- EpA fails its copy of the first event (fail_times counts calls per tag over both endpoints,
    -- so use `fail`, and resubmit EpA's copy with a new body later).
    local m1 = sb:publish("Ok", { tag = "first", fail = true }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "second" }, { session = "s1" })
    local a1 = sb:wait_message(m1, "Failed", "EpA")
    local b1 = sb:wait_message(m1, "Failed", "EpB")
    sb:wait_message(m2, "Deferred", "EpA")
    sb:wait_message(m2, "Deferred", "EpB")
    -- Unblock EpB only: EpA's session stays blocked.
    sb:cli_ok({ "skip", b1.event_id })
    sb:wait_message(m2, "Completed", "EpB")
    assert.equal("Deferred", sb:wait_message(m2, nil, "EpA").status)
    assert.equal(a1.event_id, sb:session("s1", "EpA").blocked_by)
    assert.is_nil(sb:session("s1", "EpB"))
    local second = sb:calls_where("tag", "second")
    assert.equal(1, #second)
    assert.equal("EpB", second[1].endpoint)
  end)

  it("row 7: a redelivered blocker (simulated through the store) is settled without running the handler or being parked", function()
    local adapter = sb:recorder{ types = { "Ok" } }
    local host = sb:start(adapter)
    local head = sb:publish("Ok", { tag = "head", fail = true }, { session = "s1" })
    local p1 = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
    local blocker = sb:wait_message(head, "Failed")
    sb:wait_message(p1, "Deferred")
    assert.equal(0, host:stop())
    local before = sb:events()
    local shown_before = sb:show(blocker.event_id)

    local sql = ("INSERT INTO queue(endpoint, session_id, message_id, event_id, event_type, message_type, retry_count,"
      .. " enqueued_at, visible_at, body) VALUES ('Ep','s1','m-redeliver','%s','Ok','EventRequest',0,0,0,%s)")
      :format(blocker.event_id, "'" .. nh.encode({ tag = "head", fail = true }) .. "'")
    local r = nh.capture(("sqlite3 %s %s"):format(nh.q(sb.store), nh.q(sql)))
    assert.equal(0, r.code, r.err)

    -- A sentinel in another session, published after the redelivered copy, proves the
    -- restarted host has processed the queue past it.
    sb:start(adapter)
    local sentinel = sb:publish("Ok", { tag = "sentinel" }, { session = "s2" })
    sb:wait_message(sentinel, "Completed")
    nh.eventually(function()
      local q = nh.capture(("sqlite3 %s \"SELECT count(*) FROM queue WHERE message_id = 'm-redeliver'\""):format(nh.q(sb.store)))
      return q.code == 0 and tonumber(q.out:match("%d+")) == 0
    end, nil, "the redelivered copy was settled (removed from the queue)")

    assert.equal(1, sb:call_count("head"), "the handler must not run for the redelivered blocker")
    local after = sb:events()
    assert.equal(#before + 1, #after, "only the sentinel's row is new")
    for i, r0 in ipairs(before) do
      assert.equal(r0.event_id, after[i].event_id)
      assert.equal(r0.status, after[i].status)
      assert.equal(r0.updated_at, after[i].updated_at)
      assert.equal(r0.message_id, after[i].message_id)
    end
    assert.equal(1, #sb:events({ status = "deferred" }), "no new Deferred row")
    local st = sb:session("s1")
    assert.equal(blocker.event_id, st.blocked_by)
    assert.equal(1, st.parked, "the blocker is not parked behind itself")
    local shown = sb:show(blocker.event_id)
    assert.equal("Failed", shown.status)
    assert.equal(shown_before.error_text, shown.error_text)

    -- The session still unblocks normally afterwards, and the blocker replays only once.
    sb:cli_ok({ "resubmit", blocker.event_id, "--body", nh.encode({ tag = "head" }) })
    sb:wait_message(p1, "Completed")
    assert.same({ "head", "head", "p1" }, sb:call_tags("s1"))
  end)
end)

-- docs/design.md section 6, rows 11-13: settling a pending hand-off (complete / fail), and a
-- settlement for an event that is not Pending+Handoff.
local nh = require("nh")

describe("hand-off settlement", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- A handed-off head plus n parked siblings in session s1.
  local function handed_off(n)
    local head = sb:publish("Ok", { tag = "head", handoff = "Awaiting DMF import", job = "DMF-1", expected_by = 30 },
      { session = "s1" })
    local mids = {}
    for i = 1, n do mids[i] = sb:publish("Ok", { tag = "p" .. i }, { session = "s1" }) end
    local row = sb:wait_message(head, "Pending")
    for i = 1, n do sb:wait_message(mids[i], "Deferred") end
    assert.equal("Handoff", row.sub_status)
    return row, mids
  end

  local function sql(query)
    local r = nh.capture(("sqlite3 -cmd '.timeout 10000' %s %s"):format(nh.q(sb.store), nh.q(query)))
    assert.equal(0, r.code, r.err)
    return r.out
  end

  it("row 11: complete -> Completed with the result kept, the handler never re-runs, the session unblocks and replays", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local row, mids = handed_off(3)
    local result = { importedRecordId = "R-77", lines = 3 }
    sb:cli_ok({ "handoff", "complete", row.event_id, "--result", nh.encode(result) })
    local done = sb:wait_event(row.event_id, "Completed")
    for i = 1, 3 do sb:wait_message(mids[i], "Completed") end

    assert.is_nil(done.sub_status)
    assert.is_nil(done.error_text)
    local shown = sb:show(row.event_id)
    assert.same(result, nh.decode(shown.result))
    assert.equal(1, sb:call_count("head"), "a hand-off completion never runs the handler")
    assert.same({ "head", "p1", "p2", "p3" }, sb:call_tags("s1"))
    for i = 1, 3 do assert.equal("replay", sb:calls_where("tag", "p" .. i)[1].kind) end
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session free")
  end)

  it("row 11: complete without --result also completes and unblocks", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local row, mids = handed_off(1)
    sb:cli_ok({ "handoff", "complete", row.event_id })
    sb:wait_event(row.event_id, "Completed")
    sb:wait_message(mids[1], "Completed")
    assert.equal(1, sb:call_count("head"))
  end)

  it("row 11: a completion queued while the host is stopped is applied at the next start", function()
    local adapter = sb:recorder{ types = { "Ok" } }
    local host = sb:start(adapter)
    local row, mids = handed_off(2)
    assert.equal(0, host:stop())
    sb:cli_ok({ "handoff", "complete", row.event_id, "--result", nh.encode({ ok = true }) })
    local again = sb:cli({ "handoff", "fail", row.event_id, "--error", "too late" })
    assert.equal(2, again.code, "a second settlement is refused while the first is queued")
    assert.equal("Pending", sb:row(row.event_id).status)
    sb:start(adapter)
    sb:wait_event(row.event_id, "Completed")
    for i = 1, 2 do sb:wait_message(mids[i], "Completed") end
    assert.same({ ok = true }, nh.decode(sb:show(row.event_id).result))
    assert.same({ "head", "p1", "p2" }, sb:call_tags("s1"))
  end)

  it("row 12: fail -> Failed with the error text verbatim and the default type; the session stays blocked", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local row, mids = handed_off(2)
    local text = [[DMF rejected: invalid postal code "0150" (line 3) 100% sure; tab	and ünïcode]]
    sb:cli_ok({ "handoff", "fail", row.event_id, "--error", text })
    local failed = sb:wait_event(row.event_id, "Failed")

    assert.equal(text, failed.error_text)
    assert.equal("HandoffFailed", failed.error_type)
    assert.is_nil(failed.sub_status)
    local st = sb:session("s1")
    assert.equal(row.event_id, st.blocked_by)
    assert.equal(2, st.parked)
    assert.is_nil(st.retry_due)
    for i = 1, 2 do assert.equal("Deferred", sb:wait_message(mids[i]).status) end
    assert.equal(1, sb:call_count("head"), "a hand-off failure never runs the handler")

    -- The failed hand-off is an ordinary blocker now: a resubmit settles it and replays.
    sb:cli_ok({ "resubmit", row.event_id, "--body", nh.encode({ tag = "head" }) })
    sb:wait_event(row.event_id, "Completed")
    for i = 1, 2 do sb:wait_message(mids[i], "Completed") end
    assert.same({ "head", "head", "p1", "p2" }, sb:call_tags("s1"))
  end)

  it("row 12: fail --type records the given error type; a retry policy does not retry a failed hand-off", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = 'retry = { max_retries = 3, strategy = "fixed", base = 0.1 }' })
    local row = handed_off(0)
    sb:cli_ok({ "handoff", "fail", row.event_id, "--error", "rejected", "--type", "DmfValidationError" })
    local failed = sb:wait_event(row.event_id, "Failed")
    assert.equal("rejected", failed.error_text)
    assert.equal("DmfValidationError", failed.error_type)
    local st = sb:session("s1")
    assert.equal(row.event_id, st.blocked_by)
    assert.is_nil(st.retry_due, "a failed hand-off waits for the operator")
    assert.equal(1, sb:call_count("head"))
  end)

  describe("row 13: a settlement for an event that is not Pending+Handoff", function()
    it("is refused by the CLI with exit 2 for Completed, Failed and Deferred events, and nothing changes", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local c = sb:wait_message(sb:publish("Ok", { tag = "c" }, { session = "s0" }), "Completed")
      local f = sb:wait_message(sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" }), "Failed")
      local d = sb:wait_message(sb:publish("Ok", { tag = "d" }, { session = "s1" }), "Deferred")
      local before = sb:events()
      for _, ev in ipairs({ c, f, d }) do
        local r1 = sb:cli({ "handoff", "complete", ev.event_id, "--result", "{}" })
        assert.equal(2, r1.code)
        assert.matches("not Pending%+Handoff", r1.err)
        assert.equal("", r1.out)
        local r2 = sb:cli({ "handoff", "fail", ev.event_id, "--error", "nope" })
        assert.equal(2, r2.code)
        assert.matches("not Pending%+Handoff", r2.err)
      end
      -- Nothing was queued: a normal operator command for the same events is accepted.
      assert.same(before, sb:events())
      sb:cli_ok({ "skip", f.event_id })
      sb:wait_event(f.event_id, "Skipped")
      sb:wait_message(d.message_id, "Completed")
    end)

    it("arriving late at the host (simulated through the store) is rejected and never regresses the audit row", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local row = handed_off(1)
      sb:cli_ok({ "handoff", "complete", row.event_id, "--result", nh.encode({ first = true }) })
      local done = sb:wait_event(row.event_id, "Completed")
      sb:wait_applied(row.event_id)

      -- A duplicate hand-off failure for the now Completed event, as a late broker delivery.
      sql(("INSERT INTO queue(endpoint, session_id, message_id, event_id, event_type, message_type, retry_count,"
        .. " enqueued_at, visible_at, body, error_text, error_type) VALUES ('Ep','s1','m-late','%s','Ok',"
        .. "'HandoffFailedRequest',0,0,0,NULL,'late failure','Late')"):format(row.event_id))
      nh.eventually(function()
        return tonumber(sql("SELECT count(*) FROM queue WHERE message_id = 'm-late'"):match("%d+")) == 0
      end, nil, "the late settlement was consumed")

      local after = sb:row(row.event_id)
      assert.equal("Completed", after.status)
      assert.is_nil(after.error_text)
      assert.equal(done.updated_at, after.updated_at)
      local shown = sb:show(row.event_id)
      assert.same({ first = true }, nh.decode(shown.result))
      local last = shown.history[#shown.history]
      assert.equal("Rejected", last.status)
      assert.matches("not Pending%+Handoff", last.detail)
      assert.equal(1, sb:call_count("head"))
      assert.is_nil(sb:session("s1"))
    end)
  end)
end)

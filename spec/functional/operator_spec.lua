-- docs/design.md section 6, rows 9-10: operator resubmit and skip, with the running host and
-- with a stopped one (commands are queued and applied at the next start).
local nh = require("nh")

describe("operator commands", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- A failed head plus parked siblings in session s1; returns blocker row, sibling mids.
  local function blocked(n, head_payload)
    local head = sb:publish("Ok", head_payload or { tag = "head", fail = true }, { session = "s1" })
    local mids = {}
    for i = 1, n do mids[i] = sb:publish("Ok", { tag = "p" .. i }, { session = "s1" }) end
    local blocker = sb:wait_message(head, "Failed")
    for i = 1, n do sb:wait_message(mids[i], "Deferred") end
    return blocker, mids
  end

  describe("resubmit (row 9)", function()
    it("with a new body: the handler runs with it, the blocker Completes, the session unblocks and replays", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local blocker, mids = blocked(2)
      local out = sb:cli_ok({ "resubmit", blocker.event_id, "--body", nh.encode({ tag = "head", fixed = true }) })
      assert.matches(blocker.event_id, out, 1, true)
      sb:wait_event(blocker.event_id, "Completed")
      sb:wait_message(mids[1], "Completed")
      sb:wait_message(mids[2], "Completed")

      assert.same({ "head", "head", "p1", "p2" }, sb:call_tags("s1"))
      local re = sb:calls_where("tag", "head")[2]
      assert.equal("resubmit", re.kind)
      assert.equal(blocker.event_id, re.event_id, "a resubmit keeps the EventId")
      local shown = sb:show(blocker.event_id)
      assert.same({ tag = "head", fixed = true }, nh.decode(shown.payload))
      assert.is_nil(shown.error_text)
      nh.eventually(function() return sb:session("s1") == nil end, nil, "session free")
    end)

    it("without a body resends the stored payload", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local blocker = blocked(1, { tag = "head", fail_times = 1, extra = "kept" })
      sb:cli_ok({ "resubmit", blocker.event_id })
      sb:wait_event(blocker.event_id, "Completed")
      assert.same({ tag = "head", fail_times = 1, extra = "kept" }, nh.decode(sb:show(blocker.event_id).payload))
      assert.equal(2, sb:call_count("head"))
    end)

    it("that hands off leaves the session blocked by it: Pending+Handoff, siblings still parked", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local blocker, mids = blocked(2)
      sb:cli_ok({ "resubmit", blocker.event_id, "--body", nh.encode({ tag = "head", handoff = "sent to ERP", job = "J-9" }) })
      local row = sb:wait_event(blocker.event_id, "Pending", "Handoff")
      assert.equal("sent to ERP", row.handoff_reason)
      assert.equal("J-9", row.external_job_id)
      assert.is_nil(row.expected_by, "no expected_by given")
      assert.is_nil(row.error_text)
      local st = sb:session("s1")
      assert.equal(blocker.event_id, st.blocked_by)
      assert.equal(2, st.parked)
      for i = 1, 2 do assert.equal("Deferred", sb:wait_message(mids[i]).status) end
      assert.same({ "head", "head" }, sb:call_tags("s1"))
    end)

    it("of an event that is not the blocker (a dead-lettered one) runs it and leaves the session alone", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local m1 = sb:publish("Ok", { tag = "dl", permanent = "bad" }, { session = "s1" })
      local dl = sb:wait_message(m1, "DeadLettered")
      sb:cli_ok({ "resubmit", dl.event_id, "--body", nh.encode({ tag = "dl" }) })
      sb:wait_event(dl.event_id, "Completed")
      assert.equal(2, sb:call_count("dl"))
      assert.is_nil(sb:session("s1"))
    end)

    it("of an earlier event in a session blocked by another runs it; the block and the parked events stay", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local m0 = sb:publish("Ok", { tag = "dl", permanent = "bad" }, { session = "s1" })
      local dl = sb:wait_message(m0, "DeadLettered")
      local blocker, mids = blocked(1)
      sb:cli_ok({ "resubmit", dl.event_id, "--body", nh.encode({ tag = "dl" }) })
      sb:wait_event(dl.event_id, "Completed")
      local st = sb:session("s1")
      assert.equal(blocker.event_id, st.blocked_by)
      assert.equal(1, st.parked)
      assert.equal("Deferred", sb:wait_message(mids[1]).status)
      assert.equal("Failed", sb:row(blocker.event_id).status)
      assert.same({ "dl", "head", "dl" }, sb:call_tags("s1"))
    end)

    it("keeps every attempt: each failure's error and every body the event ran with, in show's history", function()
      sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" })
      local first = { tag = "r", fail = true, message = "first error: ERP 503" }
      local row = sb:wait_message(sb:publish("Ok", first, { session = "s1" }), "Failed")
      local second = nh.encode({ tag = "r", fail = true, message = "second error: bad postal code" })
      sb:cli_ok({ "resubmit", row.event_id, "--body", second })
      nh.eventually(function() return sb:call_count("r") == 2 and sb:row(row.event_id).status == "Failed" end, nil,
                    "the second attempt failed")
      sb:cli_ok({ "resubmit", row.event_id, "--body", nh.encode({ tag = "r" }) })
      sb:wait_event(row.event_id, "Completed")
      local shown = sb:show(row.event_id)
      local errors, replaced = {}, {}
      for _, h in ipairs(shown.history) do
        if h.error_text then errors[#errors + 1] = h.error_text:match("(%a+ error: .*)$") end
        if h.previous_payload then replaced[#replaced + 1] = nh.decode(h.previous_payload).message end
      end
      assert.same({ "first error: ERP 503", "second error: bad postal code" }, errors)
      assert.same({ "first error: ERP 503", "second error: bad postal code" }, replaced, "the original and the edit")
      assert.is_nil(shown.error_text, "the audit row shows the latest outcome")
      local text = sb:cli_ok({ "show", row.event_id })
      assert.matches("error: [^\n]*first error: ERP 503", text)
      assert.matches("replaced payload: [^\n]*first error", text)
    end)

    it("of a Completed event needs --force, then runs the handler again and records Completed", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local m1 = sb:publish("Ok", { tag = "c" }, { session = "s1" })
      local row = sb:wait_message(m1, "Completed")
      local r = sb:cli({ "resubmit", row.event_id })
      assert.equal(2, r.code)
      assert.matches("is Completed: resubmitting runs its handler again", r.err)
      assert.equal(1, sb:call_count("c"), "refused: nothing ran")
      sb:cli_ok({ "resubmit", row.event_id, "--force" })
      sb:wait_applied(row.event_id)
      assert.equal(2, sb:call_count("c"))
      assert.equal("Completed", sb:row(row.event_id).status)
      assert.equal(1, #sb:events(), "a resubmit does not create a second audit row")
    end)
  end)

  describe("skip (row 10)", function()
    it("of the failed blocker: Skipped without running the handler, the session unblocks and replays", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local blocker, mids = blocked(3)
      sb:cli_ok({ "skip", blocker.event_id })
      local row = sb:wait_event(blocker.event_id, "Skipped")
      for i = 1, 3 do sb:wait_message(mids[i], "Completed") end
      assert.is_nil(row.error_text)
      assert.same({ "head", "p1", "p2", "p3" }, sb:call_tags("s1"))
      nh.eventually(function() return sb:session("s1") == nil end, nil, "session free")
    end)

    it("of a parked event: Skipped, removed from the parked queue, never run; the others replay in order", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local blocker, mids = blocked(3)
      local p2 = sb:wait_message(mids[2], "Deferred")
      sb:cli_ok({ "skip", p2.event_id })
      sb:wait_event(p2.event_id, "Skipped")
      local st = nh.eventually(function()
        local s = sb:session("s1")
        return s and s.parked == 2 and s
      end, nil, "p2 left the parked queue")
      assert.equal(blocker.event_id, st.blocked_by, "skipping a parked event leaves the block in place")

      sb:cli_ok({ "resubmit", blocker.event_id, "--body", nh.encode({ tag = "head" }) })
      sb:wait_message(mids[1], "Completed")
      sb:wait_message(mids[3], "Completed")
      assert.same({ "head", "head", "p1", "p3" }, sb:call_tags("s1"))
      assert.equal("Skipped", sb:row(p2.event_id).status)
    end)

    it("of a Pending+Handoff blocker: Skipped, the session unblocks and replays", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local head = sb:publish("Ok", { tag = "head", handoff = "external", job = "J-1" }, { session = "s1" })
      local p1 = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
      local blocker = sb:wait_message(head, "Pending")
      sb:wait_message(p1, "Deferred")
      sb:cli_ok({ "skip", blocker.event_id, "--reason", "the import was cancelled in the ERP" })
      local row = sb:wait_event(blocker.event_id, "Skipped")
      sb:wait_message(p1, "Completed")
      assert.is_nil(row.sub_status)
      assert.truthy(sb:cli_ok({ "show", blocker.event_id }):find("the import was cancelled in the ERP", 1, true))
      assert.same({ "head", "p1" }, sb:call_tags("s1"))
      nh.eventually(function() return sb:session("s1") == nil end, nil, "session free")
      local hand = sb:cli({ "handoff", "complete", blocker.event_id })
      assert.equal(2, hand.code, "a skipped hand-off can no longer be settled")
    end)

    it("of a dead-lettered event: Skipped, nothing else changes", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local m1 = sb:publish("Ok", { tag = "dl", permanent = "bad" }, { session = "s1" })
      local dl = sb:wait_message(m1, "DeadLettered")
      sb:cli_ok({ "skip", dl.event_id })
      sb:wait_event(dl.event_id, "Skipped")
      assert.equal(1, sb:call_count("dl"))
      assert.is_nil(sb:session("s1"))
    end)
  end)

  describe("with the host stopped", function()
    it("a resubmit is queued, refused a second time while queued, and applied at the next start", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local host = sb:start(adapter)
      local blocker, mids = blocked(2)
      assert.equal(0, host:stop())

      sb:cli_ok({ "resubmit", blocker.event_id, "--body", nh.encode({ tag = "head" }) })
      local again = sb:cli({ "skip", blocker.event_id })
      assert.equal(2, again.code)
      assert.matches("already queued", again.err)
      assert.equal("", again.out)
      -- Newer arrivals queued behind the resubmit must still run after the parked ones.
      local newer = {}
      for i = 1, 3 do newer[i] = sb:publish("Ok", { tag = "n" .. i }, { session = "s1" }) end
      assert.equal("Failed", sb:row(blocker.event_id).status, "nothing is applied while the host is stopped")
      assert.equal(1, sb:call_count("head"))

      sb:start(adapter)
      sb:wait_event(blocker.event_id, "Completed")
      for i = 1, 2 do sb:wait_message(mids[i], "Completed") end
      for i = 1, 3 do sb:wait_message(newer[i], "Completed") end
      assert.same({ "head", "head", "p1", "p2", "n1", "n2", "n3" }, sb:call_tags("s1"))
      assert.equal(0, #sb:events({ status = "skipped" }), "the refused skip changed nothing")
    end)

    it("a skip is applied at the next start", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local host = sb:start(adapter)
      local blocker, mids = blocked(1)
      assert.equal(0, host:stop())
      sb:cli_ok({ "skip", blocker.event_id })
      sb:start(adapter)
      sb:wait_event(blocker.event_id, "Skipped")
      sb:wait_message(mids[1], "Completed")
      assert.same({ "head", "p1" }, sb:call_tags("s1"))
    end)
  end)
end)

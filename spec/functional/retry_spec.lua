-- docs/design.md section 6, row 8 (a scheduled retry of the session's blocker), the retry
-- policy selection (default, per type, rules) and transient failures.
local nh = require("nh")

local function kinds(calls)
  local out = {}
  for i, c in ipairs(calls) do out[i] = c.kind .. ":" .. tostring(c.retry_count) end
  return out
end

describe("retries", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("row 8: a failing retry schedules the next one until max_retries, then stays Failed and blocked", function()
    sb:start(sb:recorder{ types = { "Ok" },
      options = 'retry = { max_retries = 2, strategy = "fixed", base = 0.1, jitter = "none" }' })
    local head = sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" })
    local sib = sb:publish("Ok", { tag = "sib" }, { session = "s1" })

    local row = sb:wait_rows(function(rows)
      for _, r in ipairs(rows) do
        if r.message_id == head and r.status == "Failed" and r.retry_count == 2 then return true end
      end
    end, "head Failed after 2 retries")
    row = nh.where(row, "message_id", head)[1]
    -- Retries exhausted: nothing is scheduled any more, so the call count is final.
    local st = nh.eventually(function()
      local s = sb:session("s1")
      return s and s.retry_due == nil and s
    end, nil, "no retry scheduled after the last one")
    assert.equal(row.event_id, st.blocked_by)
    assert.equal(1, st.parked)
    assert.same({ "event:0", "retry:1", "retry:2" }, kinds(sb:calls_where("tag", "f")))
    assert.equal(2, sb:row(row.event_id).retry_count)
    assert.matches("boom: f", sb:row(row.event_id).error_text)
    assert.equal("Deferred", sb:wait_message(sib, "Deferred").status)
    assert.equal(0, sb:call_count("sib"))
    local retries = nh.count(sb:show(row.event_id).history, function(h) return h.message_type == "RetryRequest" end)
    assert.equal(2, retries, "each retry is in the event's history")
  end)

  it("row 8: a successful retry completes the blocker, unblocks the session and replays the parked siblings in order", function()
    sb:start(sb:recorder{ types = { "Ok" },
      options = 'retry = { max_retries = 3, strategy = "linear", base = 0.1, jitter = "full" }' })
    local head = sb:publish("Ok", { tag = "f", fail_times = 2 }, { session = "s1" })
    local s1 = sb:publish("Ok", { tag = "a" }, { session = "s1" })
    local s2 = sb:publish("Ok", { tag = "b" }, { session = "s1" })
    local row = sb:wait_message(head, "Completed")
    sb:wait_message(s1, "Completed")
    sb:wait_message(s2, "Completed")

    assert.equal(2, row.retry_count)
    assert.is_nil(row.error_text)
    assert.same({ "event:0", "retry:1", "retry:2" }, kinds(sb:calls_where("tag", "f")))
    assert.same({ "f", "f", "f", "a", "b" }, sb:call_tags("s1"))
    assert.equal("replay", sb:calls_where("tag", "a")[1].kind)
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again")
  end)

  it("row 8: a retry that dead-letters unblocks the session and replays the parked siblings", function()
    sb:start(sb:recorder{ types = { "Ok" },
      options = 'retry = { max_retries = 3, strategy = "fixed", base = 0.1 }' })
    local head = sb:publish("Ok", { tag = "f", fail_times = 1, permanent_from = 1 }, { session = "s1" })
    local sib = sb:publish("Ok", { tag = "sib" }, { session = "s1" })
    local row = sb:wait_message(head, "DeadLettered")
    sb:wait_message(sib, "Completed")
    assert.equal(1, row.retry_count)
    assert.matches("permanent: boom: f", row.error_text)
    assert.same({ "f", "f", "sib" }, sb:call_tags("s1"))
    assert.same({ "event:0", "retry:1" }, kinds(sb:calls_where("tag", "f")))
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again")
  end)

  it("row 8: while a retry is scheduled the session shows retry_due and stays blocked; skip cancels the retry", function()
    sb:start(sb:recorder{ types = { "Ok" },
      options = 'retry = { max_retries = 5, strategy = "exponential", base = 60, max_delay = 120 }' })
    local head = sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" })
    local sib = sb:publish("Ok", { tag = "sib" }, { session = "s1" })
    local row = sb:wait_message(head, "Failed")
    sb:wait_message(sib, "Deferred")
    local st = sb:session("s1")
    assert.equal(row.event_id, st.blocked_by)
    assert.is_string(st.retry_due, "a retry is scheduled")
    assert.equal(0, row.retry_count)

    sb:cli_ok({ "skip", row.event_id })
    sb:wait_event(row.event_id, "Skipped")
    sb:wait_message(sib, "Completed")
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free, retry cancelled")
    assert.equal(1, sb:call_count("f"))
  end)

  it("per-type policies apply to their event type only; no policy means no retry", function()
    sb:start(sb:recorder{ types = { "Ok", "Special" },
      options = 'retry = { base = 0.1, types = { Special = { max_retries = 1, base = 0.1 } } }' })
    local m1 = sb:publish("Special", { tag = "sp", fail = true }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "ok", fail = true }, { session = "s2" })
    sb:wait_rows(function(rows)
      local a = nh.where(rows, "message_id", m1)[1]
      return a and a.status == "Failed" and a.retry_count == 1
    end, "Special retried once")
    sb:wait_message(m2, "Failed")
    nh.eventually(function()
      local a, b = sb:session("s1"), sb:session("s2")
      return a and b and a.retry_due == nil and b.retry_due == nil
    end, nil, "no retry scheduled in either session")
    assert.equal(2, sb:call_count("sp"))
    assert.equal(1, sb:call_count("ok"))
  end)

  it("rules match the error text and choose their own max_retries", function()
    sb:start(sb:recorder{ types = { "Ok" },
      options = 'retry = { max_retries = 1, base = 0.1, rules = { { match = "timeout", max_retries = 3, base = 0.1 } } }' })
    local m1 = sb:publish("Ok", { tag = "t", fail = true, message = "ERP call: Timeout after 2 s" }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "o", fail = true, message = "ERP said no" }, { session = "s2" })
    local done = function(mid, n)
      return function(rows)
        local r = nh.where(rows, "message_id", mid)[1]
        return r and r.status == "Failed" and r.retry_count == n
      end
    end
    sb:wait_rows(done(m1, 3), "timeout error retried 3 times")
    sb:wait_rows(done(m2, 1), "other error retried once (default policy)")
    nh.eventually(function()
      local a, b = sb:session("s1"), sb:session("s2")
      return a and b and a.retry_due == nil and b.retry_due == nil
    end, nil, "retries exhausted")
    assert.equal(4, sb:call_count("t"))
    assert.equal(2, sb:call_count("o"))
  end)

  it("a resubmit that fails stays Failed with no automatic retry", function()
    sb:start(sb:recorder{ types = { "Ok" },
      options = 'retry = { max_retries = 1, strategy = "fixed", base = 0.1 }' })
    local head = sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" })
    local row = sb:wait_rows(function(rows)
      local r = nh.where(rows, "message_id", head)[1]
      return r and r.status == "Failed" and r.retry_count == 1
    end, "retries exhausted")
    row = nh.where(row, "message_id", head)[1]
    nh.eventually(function() local s = sb:session("s1") return s and s.retry_due == nil end)
    assert.equal(2, sb:call_count("f"))

    sb:cli_ok({ "resubmit", row.event_id })
    sb:wait_applied(row.event_id)
    nh.eventually(function() return sb:call_count("f") == 3 end, nil, "the resubmit ran the handler")
    local r = sb:wait_event(row.event_id, "Failed")
    assert.matches("boom: f", r.error_text)
    local st = sb:session("s1")
    assert.equal(row.event_id, st.blocked_by)
    assert.is_nil(st.retry_due, "no automatic retry after a failed resubmit")
    assert.equal("resubmit", sb:calls_where("tag", "f")[3].kind)
  end)

  it("nimbus.transient: Pending+Retrying with its attempt and next attempt shown, siblings park, all complete in order", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "transient = { base = 3 }" })
    local m1 = sb:publish("Ok", { tag = "t", transient_times = 1 }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "after" }, { session = "s1" })
    local r = sb:wait_message(m1, "Pending")
    assert.equal("Retrying", r.sub_status)
    assert.equal(1, r.attempts)
    assert.matches("busy", r.error_text)
    local shown = sb:show(r.event_id)
    assert.matches("^%d%d%d%d%-", shown.next_attempt_at, "show names the next attempt")
    local st = sb:session("s1")
    assert.equal(r.event_id, st.blocked_by)
    assert.equal(shown.next_attempt_at, st.retry_due)
    local text = sb:cli_ok({ "events" })
    assert.matches("Pending%+Retrying%s+attempt 1: [^\n]*busy", text)
    assert.matches("attempts   1 %(transient failures%), next attempt at ", sb:cli_ok({ "show", r.event_id }))

    local done = sb:wait_message(m1, "Completed")
    sb:wait_message(m2, "Completed")
    assert.same({ "t", "t", "after" }, sb:call_tags("s1"))
    assert.equal(0, done.retry_count, "a transient attempt is not a retry of a failure")
    assert.equal("replay", sb:calls_where("tag", "after")[1].kind, "the sibling was parked behind it, then replayed")
    local pend = nh.where(sb:show(r.event_id).history, "status", "Pending")
    assert.matches("transient failure %(attempt 1 of 20%); next attempt in", pend[1].detail)
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again")
  end)

  it("nimbus.transient: attempts used up end Failed and block; a resubmit counts afresh; a Retrying event can be skipped", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "transient = { max_attempts = 2, base = 0.05 }" })
    local m1 = sb:publish("Ok", { tag = "t", transient_times = 4 }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "after" }, { session = "s1" })
    local r = sb:wait_message(m1, "Failed")
    assert.equal(2, r.attempts)
    assert.matches("busy", r.error_text)
    local st = sb:session("s1")
    assert.equal(r.event_id, st.blocked_by)
    assert.is_nil(st.retry_due, "no attempt after the last")
    sb:wait_message(m2, "Deferred")
    assert.equal(2, sb:call_count("t"))

    -- the third run fails transiently again: a fresh count, Retrying, then Failed again
    sb:cli_ok({ "resubmit", r.event_id })
    nh.eventually(function()
      local row = sb:row(r.event_id)
      return sb:call_count("t") == 4 and row.status == "Failed" and row.attempts == 2
    end, nil, "two more attempts, then Failed again")

    sb:cli_ok({ "skip", r.event_id })
    sb:wait_event(r.event_id, "Skipped")
    sb:wait_message(m2, "Completed")
    assert.same({ "t", "t", "t", "t", "after" }, sb:call_tags("s1"))
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again")
  end)

  it("a Pending+Retrying event is skipped or resubmitted by an operator", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "transient = { base = 60 }" })
    local m1 = sb:publish("Ok", { tag = "t", transient_times = 1 }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "u", transient_times = 1 }, { session = "s2" })
    local r1 = sb:wait_message(m1, "Pending")
    local r2 = sb:wait_message(m2, "Pending")
    sb:cli_ok({ "skip", r1.event_id })
    sb:wait_event(r1.event_id, "Skipped")
    sb:cli_ok({ "resubmit", r2.event_id })   -- runs now, not in a minute
    sb:wait_event(r2.event_id, "Completed")
    assert.same({ "t" }, sb:call_tags("s1"))
    assert.same({ "u", "u" }, sb:call_tags("s2"))
    nh.eventually(function() return sb:session("s1") == nil and sb:session("s2") == nil end, nil, "sessions free")
  end)

  it("nimbus.transient during a replay: the parked event is redelivered later and the replay continues in order", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local head = sb:publish("Ok", { tag = "head", fail_times = 1 }, { session = "s1" })
    local p1 = sb:publish("Ok", { tag = "p1", transient_times = 1 }, { session = "s1" })
    local p2 = sb:publish("Ok", { tag = "p2" }, { session = "s1" })
    local blocker = sb:wait_message(head, "Failed")
    sb:wait_message(p2, "Deferred")
    sb:cli_ok({ "resubmit", blocker.event_id })
    sb:wait_message(p1, "Completed")
    sb:wait_message(p2, "Completed")
    assert.same({ "head", "head", "p1", "p1", "p2" }, sb:call_tags("s1"))
    nh.eventually(function() return sb:session("s1") == nil end, nil, "session s1 free again")
  end)
end)

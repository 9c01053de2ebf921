-- docs/design.md section 6, rows 1-5: an event arriving in a free session.
local nh = require("nh")

describe("an event in a free session", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("row 1: the handler returns -> Completed, the session stays free", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local mid = sb:publish("Ok", { tag = "a" }, { session = "s1", correlation_id = "corr-1" })
    local row = sb:wait_message(mid, "Completed")

    assert.equal("Ep", row.endpoint)
    assert.equal("s1", row.session_id)
    assert.equal("Ok", row.event_type)
    assert.is_nil(row.sub_status)
    assert.is_nil(row.error_text)
    assert.equal(0, row.retry_count)
    assert.equal(1, sb:call_count("a"))
    local call = sb:calls()[1]
    assert.equal(row.event_id, call.event_id)
    assert.equal(mid, call.message_id)
    assert.equal("s1", call.session)
    assert.equal("corr-1", call.correlation_id)
    assert.equal("event", call.kind)
    assert.is_nil(sb:session("s1"))

    local shown = sb:show(row.event_id)
    assert.equal("Completed", shown.status)
    assert.equal("corr-1", shown.correlation_id)
    assert.same({ tag = "a" }, nh.decode(shown.payload))
    assert.is_true(#shown.history >= 1)
    assert.equal("Completed", shown.history[#shown.history].status)
  end)

  it("row 1: fan-out gives every subscribed endpoint its own copy with its own EventId", function()
    local a1 = sb:recorder{ endpoint = "EpA", types = { "Ok" } }
    local a2 = sb:recorder{ endpoint = "EpB", types = { "Ok" } }
    sb:start({ a1, a2 })
    local mid = sb:publish("Ok", { tag = "fan" }, { session = "s1" })
    local ra = sb:wait_message(mid, "Completed", "EpA")
    local rb = sb:wait_message(mid, "Completed", "EpB")
    assert.are_not.equal(ra.event_id, rb.event_id)
    local calls = sb:calls_where("tag", "fan")
    assert.equal(2, #calls)
    local eps = { calls[1].endpoint, calls[2].endpoint }
    table.sort(eps)
    assert.same({ "EpA", "EpB" }, eps)

    -- --to addresses one endpoint only, even though both subscribe.
    local only = sb:publish("Ok", { tag = "only-b" }, { session = "s2", to = "EpB" })
    sb:wait_message(only, "Completed", "EpB")
    assert.equal(0, sb:queued(("message_id = '%s'"):format(only)), "no other copy is waiting in a queue")
    local copies = nh.where(sb:events(), "message_id", only)
    assert.equal(1, #copies)
    assert.equal("EpB", copies[1].endpoint)
    assert.equal(1, sb:call_count("only-b"))
  end)

  it("row 2: the handler errors (no retry policy) -> Failed, session blocked, no retry scheduled", function()
    local adapter = sb:recorder{ types = { "Ok" } }
    sb:start(adapter)
    local mid = sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" })
    local row = sb:wait_message(mid, "Failed")

    assert.matches("Ep%.lua:%d+: boom: f", row.error_text)
    assert.equal("LuaError", row.error_type)
    assert.equal(0, row.retry_count)
    assert.equal(1, sb:call_count("f"))
    local st = sb:session("s1")
    assert.is_table(st, "the failing head must block its session")
    assert.equal(row.event_id, st.blocked_by)
    assert.is_nil(st.retry_due)
    assert.equal(0, st.parked)
    local shown = sb:show(row.event_id)
    assert.matches("stack traceback", shown.error_stack)
  end)

  it("row 3: the handler marks a pending hand-off -> Pending+Handoff, session blocked", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local mid = sb:publish("Ok", { tag = "h", handoff = "Awaiting ERP import", job = "J-1", expected_by = 30 },
      { session = "s1" })
    local row = sb:wait_message(mid, "Pending")

    assert.equal("Handoff", row.sub_status)
    assert.equal("Awaiting ERP import", row.handoff_reason)
    assert.equal("J-1", row.external_job_id)
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d", row.expected_by)
    assert.matches("Z$", row.expected_by)
    assert.is_true(row.expected_by > row.updated_at, "expected_by is 30 s after the hand-off")
    assert.is_nil(row.error_text)
    assert.equal(1, sb:call_count("h"))
    local st = sb:session("s1")
    assert.is_table(st)
    assert.equal(row.event_id, st.blocked_by)
  end)

  it("row 4: the handler raises nimbus.permanent -> DeadLettered, session not blocked", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local m1 = sb:publish("Ok", { tag = "p", permanent = "bad payload: no AccountId" }, { session = "s1" })
    local m2 = sb:publish("Ok", { tag = "after" }, { session = "s1" })
    local r1 = sb:wait_message(m1, "DeadLettered")
    local r2 = sb:wait_message(m2, "Completed")

    assert.matches("bad payload: no AccountId", r1.error_text)
    assert.equal(1, sb:call_count("p"))
    assert.equal(1, sb:call_count("after"))
    assert.equal("event", sb:calls_where("tag", "after")[1].kind, "the next event ran directly, not as a replay")
    assert.are_not.equal(r1.event_id, r2.event_id)
    assert.is_nil(sb:session("s1"))
  end)

  it("row 5: no handler for the type (sent with --to) -> Unsupported, handler not run, session not blocked", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local m1 = sb:publish("Nope", { tag = "u" }, { session = "s1", to = "Ep" })
    local m2 = sb:publish("Ok", { tag = "after" }, { session = "s1" })
    local r1 = sb:wait_message(m1, "Unsupported")
    sb:wait_message(m2, "Completed")

    assert.equal("Nope", r1.event_type)
    assert.equal(0, sb:call_count("u"))
    assert.equal(1, sb:call_count("after"))
    assert.is_nil(sb:session("s1"))
  end)

  it("events, show and sessions print every documented key, null included", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local mid = sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" })
    local row = sb:wait_message(mid, "Failed")
    local raw_event = sb:cli_ok({ "events", "--json" }):match("[^\n]+")
    local event_keys = { "endpoint", "event_id", "session_id", "event_type", "status", "sub_status", "error_text",
      "error_type", "handoff_reason", "external_job_id", "expected_by", "message_id", "retry_count", "updated_at" }
    local decoded = require("cjson").decode(raw_event)
    for _, k in ipairs(event_keys) do assert.is_not_nil(decoded[k], "events --json lacks " .. k) end
    local shown = require("cjson").decode(sb:cli_ok({ "show", row.event_id, "--json" }))
    for _, k in ipairs(event_keys) do assert.is_not_nil(shown[k], "show --json lacks " .. k) end
    for _, k in ipairs({ "correlation_id", "error_stack", "payload", "result", "created_at", "history" }) do
      assert.is_not_nil(shown[k], "show --json lacks " .. k)
    end
    for _, h in ipairs(shown.history) do
      for _, k in ipairs({ "at", "message_id", "message_type", "status", "detail" }) do
        assert.is_not_nil(h[k], "history entry lacks " .. k)
      end
    end
    local sess = require("cjson").decode(sb:cli_ok({ "sessions", "--json" }):match("[^\n]+"))
    for _, k in ipairs({ "endpoint", "session_id", "blocked_by", "draining", "parked", "retry_due" }) do
      assert.is_not_nil(sess[k], "sessions --json lacks " .. k)
    end
  end)

  it("the handler gets integral numbers as integers, the context fields, and runs inside its middleware", function()
    local extra = [[
local probe = nimbus.endpoint("Probe", {})
local order = {}
probe:use(function(event, ctx, nxt) order[#order + 1] = "outer"; return nxt() end)
probe:use(function(event, ctx, nxt) order[#order + 1] = "inner"; return nxt() end)
probe:on("Probe", function(event, ctx)
  order[#order + 1] = "handler"
  local f = assert(io.open(CALLS, "a"))
  f:write(cjson.encode({ tag = "probe", n_type = math.type(event.n), f_type = math.type(event.f),
    nested_type = math.type(event.nested.k), n_str = "id-" .. event.n, order = table.concat(order, ">"),
    enq_type = math.type(ctx.enqueued_ms), ctx_type = ctx.event_type, ctx_session = ctx.session_id,
    has_ids = type(ctx.event_id) == "string" and type(ctx.message_id) == "string" }) .. "\n")
  f:close()
end)
probe:use(function(event, ctx, nxt)
  if event.veto then error(nimbus.permanent("vetoed by middleware")) end
  return nxt()
end)
]]
    sb:start(sb:recorder{ types = { "Ok" }, extra = extra })
    local m1 = sb:publish("Probe", '{"n": 42, "f": 1.5, "nested": {"k": 7}}', { session = "s1" })
    sb:wait_message(m1, "Completed")
    local c = sb:calls_where("tag", "probe")[1]
    assert.equal("integer", c.n_type)
    assert.equal("float", c.f_type)
    assert.equal("integer", c.nested_type)
    assert.equal("id-42", c.n_str)
    assert.equal("outer>inner>handler", c.order)
    assert.equal("integer", c.enq_type)
    assert.equal("Probe", c.ctx_type)
    assert.equal("s1", c.ctx_session)
    assert.is_true(c.has_ids)
    local m2 = sb:publish("Probe", { veto = true }, { session = "s2" })
    local r2 = sb:wait_message(m2, "DeadLettered")
    assert.matches("vetoed by middleware", r2.error_text)
    assert.equal(1, #sb:calls_where("tag", "probe"), "the vetoing middleware never called the handler")
  end)

  it("inbox = true: a duplicate delivery of a handled MessageId (simulated through the store) is Skipped without running the handler", function()
    local host = sb:start(sb:recorder{ types = { "Ok" }, options = "inbox = true" })
    local mid = sb:publish("Ok", { tag = "once" }, { session = "s1" })
    local first = sb:wait_message(mid, "Completed")
    assert.equal(0, host:stop())
    local sql = ("INSERT INTO queue(endpoint, session_id, message_id, event_id, event_type, message_type, retry_count,"
      .. " enqueued_at, visible_at, body) VALUES ('Ep','s1','%s','dup-event-0001','Ok','EventRequest',0,0,0,'%s')")
      :format(mid, nh.encode({ tag = "once" }))
    assert.equal(0, nh.capture(("sqlite3 %s %s"):format(nh.q(sb.store), nh.q(sql))).code)
    sb:start(sb:recorder{ types = { "Ok" }, options = "inbox = true" })
    local dup = sb:wait_event("dup-event-0001", "Skipped")
    assert.matches("Duplicate", dup.error_text)
    assert.equal(1, sb:call_count("once"))
    assert.equal("Completed", sb:row(first.event_id).status)
    assert.is_nil(sb:session("s1"))
  end)

  it("publish and resubmit read a payload from @file", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local pf = nh.write(sb:path("payload.json"), nh.encode({ tag = "file", fail = true }))
    local mid = sb:cli_ok({ "publish", "Ok", "@" .. pf, "--session", "s1" }):match("%S+")
    local row = sb:wait_message(mid, "Failed")
    local bf = nh.write(sb:path("body.json"), nh.encode({ tag = "file" }))
    sb:cli_ok({ "resubmit", row.event_id, "--body", "@" .. bf })
    sb:wait_event(row.event_id, "Completed")
    assert.equal(2, sb:call_count("file"))
    assert.same({ tag = "file" }, nh.decode(sb:show(row.event_id).payload))
  end)

  it("publishing a type nobody subscribes to is refused with exit 1", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    local r = sb:cli({ "publish", "Nope", "{}", "--session", "s1" })
    assert.equal(1, r.code)
    assert.equal("", r.out)
    assert.matches("Nope", r.err)
    assert.same({}, sb:events())
  end)

  describe("nimbus.publish inside a handler", function()
    local function queued_follow_ups() return sb:queued("event_type = 'Follow'") end

    it("is sent when the handler completes, and when it hands off", function()
      sb:start(sb:recorder{ types = { "Ok", "Follow" } })
      local m1 = sb:publish("Ok", { tag = "c", publish = { { type = "Follow", payload = { tag = "c-follow" }, session = "f1" } } },
        { session = "s1" })
      local m2 = sb:publish("Ok", { tag = "h", handoff = "external", publish = { { type = "Follow", payload = { tag = "h-follow" },
        session = "f2" } } }, { session = "s2" })
      sb:wait_message(m1, "Completed")
      sb:wait_message(m2, "Pending")
      sb:wait_rows(function(rows)
        return nh.count(rows, function(r) return r.event_type == "Follow" and r.status == "Completed" end) == 2
      end, "both follow-ups completed")
      assert.equal(1, sb:call_count("c-follow"))
      assert.equal(1, sb:call_count("h-follow"))
      assert.equal("f1", sb:calls_where("tag", "c-follow")[1].session)
      assert.equal("f2", sb:calls_where("tag", "h-follow")[1].session)
    end)

    it("is not sent when the handler fails or dead-letters", function()
      sb:start(sb:recorder{ types = { "Ok", "Follow" } })
      local m1 = sb:publish("Ok", { tag = "f", fail = true, publish = { { type = "Follow", payload = { tag = "f-follow" } } } },
        { session = "s1" })
      local m2 = sb:publish("Ok", { tag = "p", permanent = "no", publish = { { type = "Follow", payload = { tag = "p-follow" } } } },
        { session = "s2" })
      sb:wait_message(m1, "Failed")
      sb:wait_message(m2, "DeadLettered")
      -- The follow-up would have been queued in the same transaction as the outcome.
      assert.equal(0, queued_follow_ups())
      assert.equal(0, nh.count(sb:events(), function(r) return r.event_type == "Follow" end))
      assert.equal(0, sb:call_count("f-follow"))
      assert.equal(0, sb:call_count("p-follow"))
    end)
  end)
end)

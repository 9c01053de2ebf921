-- Service Bus sessions (docs/servicebus-amqp.md, "Sessions") against a FAKE Service Bus peer
-- (host/tests/fake_servicebus.c, with --sessions: exclusive session locks that expire, the next
-- available session, renew-session-lock). An endpoint with `sessions = N` consumes a
-- session-enabled subscription through N session receivers; the broker gives each session to
-- one receiver, on one host, at a time. What the fake checks is the wire contract of the docs,
-- not Service Bus itself. Runs as ctest functional_servicebus_sessions_fake.
local nh = require("nh")
local sbfake = require("sbfake")
sbfake.require_fake("servicebus_sessions_fake_spec.lua")
if nh.transport ~= "embedded" then
  error("servicebus_sessions_fake_spec.lua brings its own (fake) broker: unset NH_TRANSPORT")
end

local sub_address = sbfake.sub_address

local function has(s, needle) return s ~= nil and tostring(s):find(needle, 1, true) ~= nil end

-- A fake with session-enabled Ep and a first host (recorder, endpoint `options`) running e1 of
-- `session`, held until the sandbox file "go" exists. Returns the fake, the adapter, the host,
-- e1's MessageId and the fake's grant of the session.
local function first_host_holding(sb, options, session)
  local fake = sbfake.start(sb, { subs = { Ep = { "Ok" } }, sessions = { "Ep" }, session_wait_ms = 300 })
  local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" }, options = options }
  local a = sb:spawn(adapter, { transport = fake:url() })
  local m1 = sb:publish("Ok", { tag = "e1", hold = "go" }, { session = session, transport = fake:url() })
  nh.eventually(function() return sb:call_count("e1") == 1 end, 30, function() return "e1 never ran\n" .. a:log() end)
  local grant = fake:wait_event("session-accept", function(e) return e.session == session end, session .. " granted")
  return fake, adapter, a, m1, grant
end

describe("Service Bus sessions (fake Service Bus peer)", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sbfake.teardown(sb) end)

  it("two hosts share a session-enabled subscription: each session on one host at a time, its events in order, each once (fake Service Bus peer)", function()
    local fake = sbfake.start(sb, { subs = { Ep = { "Ok" } }, sessions = { "Ep" }, session_wait_ms = 300 })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" }, options = "sessions = 2, concurrency = 4" }
    local h1 = sb:spawn(adapter, { transport = fake:url() })
    local h2 = sb:spawn(adapter, { transport = fake:url() })
    -- the receivers ask for the next available session: the filter key with a null value (the
    -- only key of the filter map; JSON's null reads as nil)
    local asks = fake:events("attach")
    local sessionful = nh.count(asks, function(e)
      return e.address == sub_address("Ep") and type(e.filter) == "table" and next(e.filter) == nil
    end)
    assert.is_true(sessionful >= 4, "4 session receivers attached\n" .. fake:dump())
    local NS, NE = 8, 6
    for k = 1, NE do
      for s = 1, NS do
        sb:publish("Ok", { tag = ("s%d-%d"):format(s, k) }, { session = "S" .. s, transport = fake:url() })
      end
    end
    nh.eventually(function() return #sb:calls() >= NS * NE end, 60,
      function() return ("%d of %d handler calls\n%s\n%s"):format(#sb:calls(), NS * NE, h1:log(), h2:log()) end)
    for s = 1, NS do
      local want = {}
      for k = 1, NE do want[k] = ("s%d-%d"):format(s, k) end
      assert.are.same(want, sb:call_tags("S" .. s), "session S" .. s .. " ran in order, each event once")
      sb:wait_rows(function(rows)
        return nh.count(rows, function(r) return r.session_id == "S" .. s and r.status == "Completed" end) == NE
      end, "session S" .. s .. " Completed")
    end
    -- both hosts held sessions, and never one session at once: the fake grants a session to one
    -- receiver only (its log has no refusal of a session to a host)
    local conns = {}
    for _, e in ipairs(fake:events("session-accept")) do conns[e.conn] = true end
    local n = 0
    for _ in pairs(conns) do n = n + 1 end
    assert.is_true(n >= 2, "sessions were granted to both hosts' connections\n" .. fake:dump())
    -- every message accepted once, none dead-lettered or lost
    local accepted = nh.count(fake:events("disposition"), function(e) return e.outcome == "accepted" end)
    assert.are.equal(NS * NE, accepted, fake:dump())
    assert.are.equal(0, #fake:events("session-lock-lost"), fake:dump())
    -- and a host lets a session go once it is idle (1 s with nothing to do) by ending the
    -- receiver's AMQP session, so that a later event of it may go to any host: every grant is
    -- given back, "session ended", while both hosts run
    local granted, ended
    nh.eventually(function()
      granted = #fake:events("session-accept")
      ended = nh.count(fake:events("session-release"), function(e) return e.why == "session ended" end)
      return granted > 0 and ended == granted
    end, 30, function() return ("%d grants, %d given back idle\n%s"):format(granted, ended, fake:dump()) end)
    assert.is_true(h1:alive() and h2:alive())
  end)

  it("renews the session lock over $management while a handler runs past the lock duration (fake Service Bus peer)", function()
    local fake = sbfake.start(sb, { subs = { Slow = { "Long" } }, sessions = { "Slow" }, lock_ms = 1500 })
    local adapter = sbfake.slow_adapter(sb, "sessions = 1, lock = { duration = 2, renew_max = 30 }")
    sb:spawn(adapter, { transport = fake:url() })
    local mid = sb:publish("Long", { tag = "d1" }, { session = "S-d", transport = fake:url() })
    sb:wait_message(mid, "Completed")
    local renewals = {}
    for _, e in ipairs(fake:events("renew-session-lock")) do
      if e.session == "S-d" then renewals[#renewals + 1] = e end
    end
    assert.is_true(#renewals >= 2, "the session lock of S-d renewed through its 4 s handler\n" .. fake:dump())
    for _, e in ipairs(renewals) do
      assert.are.equal(200, e.status, nh.encode(e))
      assert.are.equal(sub_address("Slow") .. "/$management", e.address)
    end
    assert.are.equal(0, #fake:events("session-lock-lost"), fake:dump())
    assert.are.equal(1, nh.count(fake:events("deliver"), function(e) return e.message_id == mid end), fake:dump())
    assert.are.equal("d1\n", nh.read(sb.calls_path))
    -- the per-message renew-lock does not apply to session messages
    assert.are.equal(0, #fake:events("renew-lock"), fake:dump())
  end)

  it("a session taken back while its handler runs: that run settles nothing and its outcome is not kept; the event runs again on the session's next holder, then the next event (fake Service Bus peer)", function()
    local fake, adapter, a, m1, grant = first_host_holding(sb, "sessions = 1, lock = { duration = 2 }", "S")
    local b = sb:spawn(adapter, { transport = fake:url() })
    local m2 = sb:publish("Ok", { tag = "e2" }, { session = "S", transport = fake:url() })
    fake:signal("USR2")   -- every session lock expires: S is taken back from the link running e1
    fake:wait_event("session-lock-lost", function(e) return e.session == "S" and e.link == grant.link end,
      "the fake took S back", 30)
    a:wait_log("Service Bus took back session S", 30)
    -- e1 runs again on the session's next holder (either host), held like the first run
    nh.eventually(function() return sb:call_count("e1") == 2 end, 30,
      function() return "e1 never ran again\n" .. a:log() .. "\n" .. b:log() .. "\n" .. fake:dump() end)
    sb:touch("go")
    local row = sb:wait_message(m1, "Completed")
    sb:wait_message(m2, "Completed")
    assert.are.same({ "e1", "e1", "e2" }, sb:call_tags("S"), "S: e1, e1 again, then e2")
    local shown = sb:show(row.event_id)
    assert.are.equal(1, nh.count(shown.history, function(x) return x.status == "Completed" end), nh.encode(shown))
    -- one settlement of e1, accepted, and not on the link that lost the session
    local disp = {}
    for _, e in ipairs(fake:events("disposition")) do
      if e.message_id == m1 then disp[#disp + 1] = e end
    end
    assert.are.equal(1, #disp, fake:dump())
    assert.are.equal("accepted", disp[1].outcome)
    -- nothing at all settled on the link that lost S (not even a bare settle of e1 or e2)
    assert.are.equal(0, nh.count(fake:events("disposition"), function(e) return e.link == grant.link end),
      "a settlement on the link that lost S\n" .. fake:dump())
    assert.is_true(a:alive() and b:alive(), a:log())
  end)

  it("a stopping host takes no new session while it drains: another host gets it (fake Service Bus peer)", function()
    local fake, adapter, a, m1, grant = first_host_holding(sb, "sessions = 2", "S1")
    local conn_a = grant.conn
    local b = sb:spawn(adapter, { transport = fake:url() })
    a:signal("TERM")
    a:wait_log("SIGTERM received", 30)
    local m2 = sb:publish("Ok", { tag = "e2" }, { session = "S2", transport = fake:url() })
    sb:wait_message(m2, "Completed")
    local s2 = fake:wait_event("session-accept", function(e) return e.session == "S2" end, "S2 granted")
    assert.are_not.equal(conn_a, s2.conn, "the draining host took S2\n" .. fake:dump())
    sb:touch("go")
    assert.are.equal(0, a:wait_exit(30), a:log())
    sb:wait_message(m1, "Completed")
    assert.is_true(b:alive(), b:log())
  end)

  it("exits 1 saying the subscription is not session-enabled when an endpoint has sessions (fake Service Bus peer)", function()
    local fake = sbfake.start(sb, { subs = { Ep = { "Ok" } } })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" }, options = "sessions = 2" }
    local h = sb:spawn(adapter, { transport = fake:url(), wait = false })
    assert.are.equal(1, h:wait_exit(30), h:log())
    local log = h:log()
    assert.is_truthy(has(log, "not session-enabled"), log)
    assert.is_truthy(has(log, sub_address("Ep")), "names the subscription:\n" .. log)
    assert.is_falsy(has(log, "ready:"), log)
  end)

  it("exits 1 asking for sessions = N when the subscription requires sessions (fake Service Bus peer)", function()
    local fake = sbfake.start(sb, { subs = { Ep = { "Ok" } }, sessions = { "Ep" } })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" } }
    local h = sb:spawn(adapter, { transport = fake:url(), wait = false })
    assert.are.equal(1, h:wait_exit(30), h:log())
    local log = h:log()
    assert.is_truthy(has(log, "sessions = N"), log)
    assert.is_truthy(has(log, sub_address("Ep")), "names the subscription:\n" .. log)
  end)
end)

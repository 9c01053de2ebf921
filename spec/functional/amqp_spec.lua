-- The AMQP 1.0 transport against RabbitMQ 3.10: what only a real broker can show. Runs as
-- ctest functional_amqp_amqp (NH_TRANSPORT set, the broker started by the rabbitmq fixture);
-- the embedded functional_* entries leave this file out. Every sandbox has its own vhost
-- (spec/helpers/nh.lua).
local nh = require("nh")

if nh.transport ~= "amqp" then
  error("amqp_spec.lua tests the AMQP transport and needs NH_TRANSPORT=amqp://guest:guest@127.0.0.1:5672 "
    .. "(run it with `ctest -R functional_amqp_amqp`, which starts the broker; by hand: scripts/rabbitmq.sh start)")
end

local CFG = nh.transport_config

-- amqp://USER:PASSWORD@127.0.0.1:PORT/VHOST?management=MGMT, every part replaceable.
local function amqp_url(o)
  local user = o.user or CFG.user
  local password = o.password or CFG.password
  local hostport = o.hostport or nh.parse_url(CFG.base).hostport
  return ("amqp://%s:%s@%s/%s?management=%s"):format(nh.urlencode(user), nh.urlencode(password), hostport,
    nh.urlencode(o.vhost or ""), o.mgmt or CFG.mgmt)
end

local occurrences = nh.occurrences

-- Audit rows, or {} when the store was never created (a host that never got going).
local function rows_or_none(sb)
  if not nh.exists(sb.store) then return {} end
  return sb:events()
end

local queue_names = nh.rmq_queue_names

-- Puts one message straight onto an endpoint's queue, shaped as nimbus-host sends events
-- (group-id = session, subject = event type, MessageType/EventTypeId/EventId application
-- properties, the JSON payload in a data section), as the broker would deliver a duplicate
-- or a redelivery.
local function deliver(sb, m)
  sb:amqp_send("/amq/queue/" .. (m.endpoint or "Ep"), { {
    body = type(m.body) == "string" and m.body or nh.encode(m.body or {}),
    properties = { id = m.message_id, group_id = m.session, subject = m.event_type or "Ok",
                   content_type = "application/json" },
    application_properties = { MessageType = m.message_type or "EventRequest", EventTypeId = m.event_type or "Ok",
                               EventId = m.event_id },
  } })
end

-- Stops the host, then asserts nothing is left on the endpoint's queue: with the host's
-- connection gone, anything it had not settled would be back in the queue.
local function assert_queue_drained(sb, host, queue)
  assert.equal(0, host:stop())
  nh.eventually(function()
    local r = nh.rmq_api("GET", "/vhosts/" .. nh.urlencode(sb.vhost) .. "/connections")
    return #nh.decode(r.body) == 0
  end, nil, "the host's connection is gone from the broker")
  local left = nh.rmq_api("POST", "/queues/" .. nh.urlencode(sb.vhost) .. "/" .. nh.urlencode(queue or "Ep") .. "/get",
    { count = 10, ackmode = "reject_requeue_true", encoding = "auto" })
  assert.same({}, nh.decode(left.body), "messages left on queue " .. (queue or "Ep"))
end

describe("the AMQP transport", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  describe("connection failures", function()
    -- With the management API in use the host meets the wrong password there first (HTTP
    -- 401); with management=none only the AMQP SASL exchange can tell.
    for _, mgmt in ipairs({ "the management API", "none" }) do
      local function url(vhost)
        return amqp_url{ vhost = vhost, password = "wrong-password", mgmt = mgmt == "none" and "none" or nil }
      end

      it("wrong credentials (management: " .. mgmt .. "): the host exits 1 with 'authentication failed' and records nothing", function()
        local adapter = sb:recorder{ types = { "Ok" } }
        local h = sb:spawn(adapter, { wait = false, transport = url(sb.vhost) })
        assert.equal(1, h:wait_exit(60))
        local log = h:log()
        assert.truthy(log:find("authentication failed", 1, true), "no 'authentication failed' in:\n" .. log)
        assert.is_nil(log:find("ready:", 1, true), "ready: before a connection:\n" .. log)
        assert.same({}, rows_or_none(sb))
        assert.same({}, queue_names(sb.vhost), "nothing was declared on the broker")
      end)

      it("wrong credentials (management: " .. mgmt .. "): publish exits 1 with 'authentication failed'", function()
        local r = sb:cli({ "publish", "Ok", "{}", "--session", "s1" }, { transport = url(sb.vhost) })
        assert.equal(1, r.code, r.out .. r.err)
        assert.equal("", r.out, "no MessageId printed")
        assert.truthy((r.out .. r.err):find("authentication failed", 1, true), r.err)
      end)
    end

    -- amqps:// against the broker's TLS listener (scripts/rabbitmq.sh makes a CA and a
    -- certificate for localhost). The CA is read off the listener itself, so the case does not
    -- depend on which state dir the running broker was started from.
    local TLS_PORT = os.getenv("NH_RMQ_TLS_PORT") or "5671"
    local function broker_ca()
      local path = sb:path("ca.pem")
      local r = nh.capture(("openssl s_client -connect 127.0.0.1:%s -showcerts </dev/null 2>/dev/null"):format(TLS_PORT))
      local certs = {}
      for c in r.out:gmatch("%-%-%-%-%-BEGIN CERTIFICATE%-%-%-%-%-.-%-%-%-%-%-END CERTIFICATE%-%-%-%-%-") do
        certs[#certs + 1] = c
      end
      assert.is_true(#certs >= 1, "no certificate from the TLS listener on " .. TLS_PORT .. ":\n" .. r.out)
      nh.write(path, certs[#certs] .. "\n")   -- the last one of the chain: the CA
      return path
    end
    local function tls_url(query)
      return ("amqps://%s:%s@localhost:%s/%s?management=%s%s"):format(nh.urlencode(CFG.user), nh.urlencode(CFG.password),
        TLS_PORT, nh.urlencode(sb.vhost), CFG.mgmt, query)
    end

    it("amqps:// with the broker's CA: events flow over TLS", function()
      local ca = broker_ca()
      local adapter = sb:recorder{ types = { "Ok" } }
      local url = tls_url("&ca=" .. nh.urlencode(ca))
      sb:spawn(adapter, { transport = url })
      local r = sb:cli({ "publish", "Ok", '{"tag":"tls"}', "--session", "s1" }, { transport = url })
      assert.equal(0, r.code, r.err)
      sb:wait_message(r.out:match("%S+"), "Completed")
      assert.equal(1, sb:call_count("tls"))
    end)

    it("amqps:// without the CA: the host exits 1 saying TLS verification failed, and how to fix it", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local h = sb:spawn(adapter, { wait = false, transport = tls_url("") })
      assert.equal(1, h:wait_exit(60))
      local log = h:log()
      assert.truthy(log:find("TLS verification of localhost failed", 1, true), log)
      assert.truthy(log:find("?ca=FILE", 1, true), log)
      assert.is_nil(log:find("ready:", 1, true), log)
    end)

    it("connection refused: the host logs 'reconnecting in', keeps retrying without ready:, and SIGTERM exits 0", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local port = nh.free_port()
      local h = sb:spawn(adapter, { wait = false, transport = amqp_url{ vhost = sb.vhost, hostport = "127.0.0.1:" .. port } })
      -- two attempts logged: it retries instead of giving up after the first refusal
      nh.eventually(function() return occurrences(h:log(), "reconnecting in") >= 2 or h:exit_code() ~= nil end, 60,
        function() return "fewer than two 'reconnecting in' lines:\n" .. h:log() end)
      assert.is_true(h:alive(), "the host gave up:\n" .. h:log())
      assert.is_nil(h:log():find("ready:", 1, true), "ready: without a connection:\n" .. h:log())
      assert.equal(0, h:stop())
      assert.same({}, rows_or_none(sb))
    end)
  end)

  describe("malformed messages on the endpoint queue", function()
    it("are dead-lettered with the reason in the audit; the next good message of the queue is handled", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local host = sb:start(adapter)
      -- Straight onto the queue the host declared for endpoint Ep, in session s1, ahead of a good one.
      sb:amqp_send("/amq/queue/Ep", {
        { body = '{"tag": "bad", oops', -- not JSON
          properties = { id = "bad-json-1", group_id = "s1", content_type = "application/json" },
          application_properties = { MessageType = "EventRequest", EventTypeId = "Ok" } },
        { body = nh.encode({ tag = "no-props" }), -- no MessageType, no EventTypeId
          properties = { id = "no-props-1", group_id = "s1", content_type = "application/json" } },
      })
      local good = sb:publish("Ok", { tag = "good" }, { session = "s1" })

      local bad_json = sb:wait_message("bad-json-1", "DeadLettered")
      sb:wait_message(good, "Completed")
      assert.matches("malformed JSON", bad_json.error_text)
      -- found by its reason first, so that a missing message_id is reported as such below
      local function names_missing_property(r)
        local why = r.error_text or ""
        return r.status == "DeadLettered" and (why:find("MessageType", 1, true) or why:find("EventTypeId", 1, true))
      end
      local no_props
      for _, r in ipairs(sb:wait_rows(function(rows) return nh.count(rows, names_missing_property) == 1 end,
        "one DeadLettered row naming the missing MessageType/EventTypeId")) do
        if names_missing_property(r) then no_props = r end
      end
      for _, row in ipairs({ bad_json, no_props }) do
        local shown = sb:show(row.event_id)
        assert.equal("DeadLettered", shown.status)
        assert.equal(row.error_text, shown.error_text)
      end
      -- Neither ran the handler nor blocked the session: the good message ran as a plain event.
      assert.same({ "good" }, sb:call_tags("s1"))
      assert.equal("event", sb:calls()[1].kind)
      assert.is_nil(sb:session("s1"))
      assert.equal("no-props-1", no_props.message_id, "the audit row keeps the message-id of the malformed message")

      -- All three were settled on the broker.
      assert_queue_drained(sb, host)
    end)

    it("operator requests from the broker are dead-lettered: only the store's are obeyed", function()
      sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" })
      local blocker = sb:wait_message(sb:publish("Ok", { tag = "head", fail = true }, { session = "s1" }), "Failed")
      local parked = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
      sb:wait_message(parked, "Deferred")
      for i, mtype in ipairs({ "SkipRequest", "ResubmissionRequest", "HandoffCompletedRequest", "HandoffFailedRequest" }) do
        deliver(sb, { message_id = "forged-" .. i, session = "s1", message_type = mtype, event_id = blocker.event_id })
        local row = sb:wait_message("forged-" .. i, "DeadLettered")
        assert.matches(mtype .. " from the broker refused: operator requests are taken from the store only", row.error_text)
        assert.are_not.equal(blocker.event_id, row.event_id, "the forged request gets an audit row of its own")
      end
      -- the blocked event and its session are as they were
      assert.equal("Failed", sb:show(blocker.event_id).status)
      assert.equal(blocker.event_id, sb:session("s1").blocked_by)
      assert.same({ "head" }, sb:call_tags("s1"))
      -- the operator's own skip (through the store) still works
      sb:cli_ok({ "skip", blocker.event_id })
      sb:wait_message(parked, "Completed")
      assert.same({ "head", "p1" }, sb:call_tags("s1"))
    end)

    it("control=trusted in the transport URL obeys operator requests from the broker", function()
      local url = sb.transport_url .. (sb.transport_url:find("?", 1, true) and "&" or "?") .. "control=trusted"
      sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" }, { transport = url })
      local blocker = sb:wait_message(sb:publish("Ok", { tag = "head", fail = true }, { session = "s1" }), "Failed")
      deliver(sb, { message_id = "trusted-skip", session = "s1", message_type = "SkipRequest", event_id = blocker.event_id })
      sb:wait_event(blocker.event_id, "Skipped")
    end)
  end)

  describe("duplicates and redeliveries from the broker", function()
    it("inbox = true: a second delivery of a handled MessageId is Skipped without running the handler", function()
      local host = sb:start(sb:recorder{ types = { "Ok" }, options = "inbox = true" })
      local mid = sb:publish("Ok", { tag = "once" }, { session = "s1" })
      local first = sb:wait_message(mid, "Completed")
      deliver(sb, { message_id = mid, event_id = "dup-event-0001", session = "s1", body = { tag = "once" } })
      local dup = sb:wait_event("dup-event-0001", "Skipped")
      assert.matches("Duplicate", dup.error_text)
      assert.equal(1, sb:call_count("once"))
      assert.equal("Completed", sb:row(first.event_id).status)
      assert.is_nil(sb:session("s1"))
      assert_queue_drained(sb, host)
    end)

    it("row 7: a redelivered blocker is settled without running the handler or being parked behind itself", function()
      local host = sb:start(sb:recorder{ types = { "Ok" } })
      local head = sb:publish("Ok", { tag = "head", fail = true }, { session = "s1" })
      local p1 = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
      local blocker = sb:wait_message(head, "Failed")
      sb:wait_message(p1, "Deferred")
      local before = sb:events()
      local shown_before = sb:show(blocker.event_id)

      deliver(sb, { message_id = "m-redeliver", event_id = blocker.event_id, session = "s1",
                    body = { tag = "head", fail = true } })
      -- Behind it in the same session: once this one is parked, the copy has been routed.
      local sentinel = sb:publish("Ok", { tag = "sentinel" }, { session = "s1" })
      sb:wait_message(sentinel, "Deferred")

      assert.equal(1, sb:call_count("head"), "the handler must not run for the redelivered blocker")
      local after = sb:events()
      assert.equal(#before + 1, #after, "only the sentinel's row is new:\n" .. nh.describe_rows(after))
      for i, r0 in ipairs(before) do
        assert.equal(r0.event_id, after[i].event_id)
        assert.equal(r0.status, after[i].status)
        assert.equal(r0.updated_at, after[i].updated_at)
        assert.equal(r0.message_id, after[i].message_id)
      end
      local st = sb:session("s1")
      assert.equal(blocker.event_id, st.blocked_by)
      assert.equal(2, st.parked, "p1 and the sentinel are parked, the blocker is not parked behind itself")
      local shown = sb:show(blocker.event_id)
      assert.equal("Failed", shown.status)
      assert.equal(shown_before.error_text, shown.error_text)

      -- The session still unblocks normally, and the blocker runs only for the resubmit.
      sb:cli_ok({ "resubmit", blocker.event_id, "--body", nh.encode({ tag = "head" }) })
      sb:wait_message(sentinel, "Completed")
      assert.same({ "head", "head", "p1", "sentinel" }, sb:call_tags("s1"))
      assert_queue_drained(sb, host)
    end)
  end)

  describe("a broker restart mid-stream", function()
    local NSESSIONS, NEVENTS, HALF = 20, 200, 100
    local SLOW = { [41] = true, [42] = true, [43] = true, [44] = true }   -- held in the handler at the stop

    -- A broker of this test's own beside the suite's: own node name, state dir and ports.
    local function broker(dir) return nh.private_broker(dir, "nhrestart") end

    it("every event ends Completed exactly once and each session keeps its order", function()
      local b = broker(sb:path("rabbitmq"))
      finally(function() pcall(b.run, "stop") end)
      b.run("start")

      local adapter = sb:recorder{ types = { "Ev" }, options = "concurrency = 4", extra = [[
-- Slow: recorded, then waits (yielding to the loop, so the host sees the broker go away)
-- until the sandbox file named by event.gate exists.
ep:on("Slow", function(event, ctx)
  record(event, ctx, "Ep")
  while true do
    local f = io.open(DIR .. "/" .. event.gate, "r")
    if f then f:close() break end
    nimbus.sleep(0.02)
  end
end)
]] }
      local host = sb:start(adapter, { transport = b.url })

      local sessions, mids = {}, {}
      local function publish(i)
        local session = "s" .. ((i - 1) % NSESSIONS)
        local mid = sb:publish(SLOW[i] and "Slow" or "Ev", { tag = "e" .. i, gate = SLOW[i] and "go" or nil },
          { session = session, transport = b.url })
        mids[i] = mid
        sessions[session] = sessions[session] or {}
        table.insert(sessions[session], "e" .. i)
      end

      -- First half. The four Slow events take all four handler slots and keep them, so when
      -- they are all in their handlers the rest of the first half is still on the broker.
      for i = 1, HALF do publish(i) end
      nh.eventually(function()
        local n = 0
        for i in pairs(SLOW) do if sb:call_count("e" .. i) > 0 then n = n + 1 end end
        return n == 4
      end, 60, function() return "the Slow handlers are not all running; calls: " .. table.concat(sb:call_tags(), " ") end)

      local connected = occurrences(host:log(), "AMQP connected")
      local reconnecting = occurrences(host:log(), "reconnecting in")
      b.run("stop")
      nh.eventually(function() return occurrences(host:log(), "reconnecting in") > reconnecting end, 60,
        function() return "no 'reconnecting in' after the broker stopped:\n" .. host:log() end)
      assert.is_true(host:alive(), "the host died with the broker:\n" .. host:log())
      sb:touch("go")      -- the Slow handlers finish while the broker is down

      b.run("start")
      nh.eventually(function() return occurrences(host:log(), "AMQP connected") > connected end, 90,
        function() return "no 'AMQP connected' after the broker came back:\n" .. host:log() end)

      -- Second half, published after the restart.
      for i = HALF + 1, NEVENTS do publish(i) end

      local last
      nh.eventually(function()
        last = sb:events()
        local done = 0
        for _, r in ipairs(last) do if r.status == "Completed" then done = done + 1 end end
        return done >= NEVENTS
      end, 120, function()
        local by = {}
        for _, r in ipairs(last or {}) do by[r.status] = (by[r.status] or 0) + 1 end
        return ("not every event Completed: %s\nhost log tail:\n%s"):format(nh.encode(by), host:log():sub(-3000))
      end)

      -- Exactly one audit row per event, Completed; nothing else recorded.
      local rows = sb:events()
      assert.equal(NEVENTS, #rows, nh.describe_rows(rows))
      local by_mid = {}
      for _, r in ipairs(rows) do
        assert.is_nil(by_mid[r.message_id], "two rows for message " .. tostring(r.message_id))
        by_mid[r.message_id] = r
        assert.equal("Completed", r.status, nh.describe_rows({ r }))
      end
      for i = 1, NEVENTS do assert.truthy(by_mid[mids[i]], "no row for e" .. i) end

      -- The handler ran exactly once per event (the Slow ones too: their deliveries came back
      -- after the restart with the outcome already recorded), in each session's order.
      for i = 1, NEVENTS do assert.equal(1, sb:call_count("e" .. i), "handler calls for e" .. i) end
      for session, tags in pairs(sessions) do
        assert.same(tags, sb:call_tags(session), "order of session " .. session)
      end
      assert.is_true(host:alive())
      assert.equal(0, host:stop())
    end)

    it("/readyz answers 503 with the reason while the broker is down, 200 once it is back", function()
      local b = broker(sb:path("rabbitmq"))
      finally(function() pcall(b.run, "stop") end)
      b.run("start")
      local host = sb:start(sb:recorder{ types = { "Ev" } },
                            { transport = b.url, args = { "--admin", "127.0.0.1:0" } })
      local base = "http://127.0.0.1:" .. assert(host:admin_port(), host:log())
      local function ready() return nh.http_json(base .. "/readyz") end
      assert.equal(200, (ready()))
      b.run("stop")
      local body = nh.eventually(function()
        local status, b2 = ready()
        if status == 503 then return b2 end
      end, 60, function() return "/readyz stayed 200 with the broker down:\n" .. host:log() end)
      assert.equal("not_ready", body.status)
      assert.truthy(body.reason:find("transport amqp", 1, true), body.reason)
      local metrics = nh.capture("curl -sS " .. nh.q(base .. "/metrics")).out
      assert.truthy(metrics:find('nimbus_transport_connected{transport="amqp"} 0', 1, true), metrics)
      b.run("start")
      nh.eventually(function() return (ready()) == 200 end, 90,
        function() return "/readyz not back to 200 after the broker came back:\n" .. host:log() end)
      assert.equal(0, host:stop())
    end)
  end)
end)

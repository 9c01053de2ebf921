-- The Azure Service Bus profile (`--transport amqp://KEYNAME:KEY@HOST:PORT/?profile=servicebus`)
-- against a FAKE Service Bus peer: host/tests/fake_servicebus.c, an in-memory topic with its
-- subscriptions, $cbs (put-token, SAS verification) and $management (renew-lock), on proton's
-- server-mode connection driver. No real namespace is reachable from the test machines; what
-- the fake checks is the wire contract of docs/servicebus-amqp.md, not Service Bus itself.
-- Runs as ctest functional_servicebus_fake (NH_FAKE_SERVICEBUS = the fake's binary); the
-- generic functional_* entries leave this file out.
local nh = require("nh")

local sbfake = require("sbfake")
sbfake.require_fake("servicebus_fake_spec.lua")
if nh.transport ~= "embedded" then
  error("servicebus_fake_spec.lua brings its own (fake) broker: unset NH_TRANSPORT")
end

local TOPIC = sbfake.TOPIC
local sub_address, start_fake, teardown = sbfake.sub_address, sbfake.start, sbfake.teardown

---------------------------------------------------------------------------- helpers

local function has(s, needle) return s ~= nil and tostring(s):find(needle, 1, true) ~= nil end

local function entity_of(address)
  return (address:gsub("/%$management$", ""):gsub("/%$DeadLetterQueue$", ""))
end

-- Every attach of a client link to an entity (not $cbs) must come after a valid put-token on
-- the same connection whose audience covers that entity (the entity, its $management node or
-- the namespace). Returns a list of complaints.
local function unauthorized_attaches(fake)
  local bad, tokens = {}, {}
  for _, e in ipairs(fake:events()) do
    if e.ev == "put-token" and e.valid then
      tokens[e.conn] = tokens[e.conn] or {}
      tokens[e.conn][(e.audience or ""):lower()] = true
    elseif e.ev == "attach" and e.address and e.address ~= "$cbs" then
      local t = tokens[e.conn] or {}
      local host = "sb://127.0.0.1"
      for _, o in ipairs(fake:events("open")) do
        if o.conn == e.conn and o.hostname then host = "sb://" .. o.hostname end
      end
      host = host:lower()
      local ent = entity_of(e.address):lower()
      if not (t[host .. "/" .. ent] or t[host .. "/" .. e.address:lower()] or t[host .. "/"] or t[host]) then
        bad[#bad + 1] = ("conn %s attached %s (%s) without a valid token for %s/%s"):format(e.conn, e.address,
          e.role, host, ent)
      end
    end
  end
  return bad
end

local function refusals(fake, condition)
  local out = {}
  for _, e in ipairs(fake:events("detach")) do
    if e.by == "fake" and (not condition or e.condition == condition) then out[#out + 1] = e end
  end
  return out
end

-- The RFC 4122 text of a lock token from its delivery tag (hex): .NET Guid byte order,
-- bytes 0-3, 4-5 and 6-7 reversed (docs/servicebus-amqp.md section 4).
local function uuid_from_tag(hex)
  local b = {}
  for i = 1, 32, 2 do b[#b + 1] = hex:sub(i, i + 1) end
  local order = { 4, 3, 2, 1, 6, 5, 8, 7, 9, 10, 11, 12, 13, 14, 15, 16 }
  local s = {}
  for i, k in ipairs(order) do s[i] = b[k] end
  local u = table.concat(s)
  return ("%s-%s-%s-%s-%s"):format(u:sub(1, 8), u:sub(9, 12), u:sub(13, 16), u:sub(17, 20), u:sub(21, 32))
end

local function contains(list, x)
  for _, v in ipairs(list or {}) do if v == x then return true end end
  return false
end

---------------------------------------------------------------------------- specs

describe("the Service Bus profile (fake Service Bus peer)", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() teardown(sb) end)

  it("puts a valid SAS token over $cbs for the topic and each subscription before attaching to them (fake Service Bus peer)", function()
    local fake = start_fake(sb, { subs = { Ep = { "Ok" }, Other = { "Other" } } })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" } }
    local h = sb:spawn(adapter, { transport = fake:url() })
    local open = fake:wait_event("open", nil, "the host never opened a connection")
    assert.are.equal("ANONYMOUS", open.sasl, "SASL mechanism (CBS needs ANONYMOUS)")
    -- the subscription receiver is attached by the time the host is ready
    local attach = fake:wait_event("attach", function(e) return e.address == sub_address("Ep") end,
      "no receiver attached to " .. sub_address("Ep"))
    assert.are.equal("receiver", attach.role)
    assert.are.equal(1, attach.rcv_settle_mode, "peek-lock receivers use rcv-settle-mode second")
    local host = "sb://" .. (open.hostname or "127.0.0.1")
    local sub_token = fake:wait_event("put-token", function(e)
      return e.valid and e.audience == host .. "/" .. sub_address("Ep")
    end, "no valid put-token for " .. host .. "/" .. sub_address("Ep"))
    assert.are.equal("servicebus.windows.net:sastoken", sub_token.token_type)
    assert.are.equal(200, sub_token.status)
    -- the topic: the host's own sender (if it attaches one), or the publish command's
    sb:publish("Ok", { tag = "a1" }, { session = "a", transport = fake:url() })
    fake:wait_event("put-token", function(e) return e.valid and e.audience == host .. "/" .. TOPIC end,
      "no valid put-token for the topic " .. host .. "/" .. TOPIC)
    fake:wait_event("transfer", function(e) return e.address == TOPIC end, "the publish never reached the topic")
    assert.are.same({}, unauthorized_attaches(fake), fake:dump())
    assert.are.same({}, refusals(fake), "links the fake refused")
    -- no put-token was refused, and no attach to an entity the fake does not know
    assert.are.equal(0, nh.count(fake:events("put-token"), function(e) return not e.valid end), fake:dump())
    assert.is_true(h:alive(), h:log())
  end)

  it("exits 1 naming the SAS token when the fake Service Bus peer refuses it (wrong key) (fake Service Bus peer)", function()
    local fake = start_fake(sb, { subs = { Ep = { "Ok" } } })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" } }
    local h = sb:spawn(adapter, { transport = fake:url("d3JvbmcgJiBrZXk="), wait = false })
    local refused = fake:wait_event("put-token", function(e) return e.valid == false end,
      "the fake never saw a put-token")
    assert.are.equal(401, refused.status)
    assert.are.equal(1, h:wait_exit(30), h:log())
    assert.is_truthy(has(h:log(), "SAS token"), "the host's log names the SAS token:\n" .. h:log())
    assert.are.same({}, unauthorized_attaches(fake), "links attached although the token was refused")
  end)

  it("publishes to the topic with group-id, subject and the NimBus properties; the handler completes and the message is accepted (fake Service Bus peer)", function()
    local fake = start_fake(sb, { subs = { Ep = { "Ok" } } })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" } }
    sb:spawn(adapter, { transport = fake:url() })
    local r = sb:cli({ "publish", "Ok", nh.encode({ tag = "b1" }), "--session", "S-b", "--transport", fake:url() })
    assert.are.equal(0, r.code, "publish: " .. r.out .. r.err .. "\n" .. fake:dump())
    local mid = r.out:match("^%s*(%S+)")
    assert.is_truthy(mid, "publish printed no MessageId")
    local t = fake:wait_event("transfer", function(e) return e.message_id == mid end,
      "no transfer of " .. mid .. " to the topic")
    assert.are.equal(TOPIC, t.address)
    assert.are.equal("S-b", t.group_id)
    assert.are.equal("Ok", t.subject)
    assert.are.same({ "Ep" }, t.routed)
    local app = t.app or {}
    assert.are.equal("EventRequest", app.MessageType)
    assert.are.equal("Ok", app.EventTypeId)
    assert.is_truthy(app.OriginatingMessageId, "OriginatingMessageId")
    assert.is_truthy(app.ParentMessageId, "ParentMessageId")
    assert.are.equal(0, app.RetryCount)
    -- the endpoint's handler runs, the subscription sees an accepted disposition
    nh.eventually(function() return sb:call_count("b1") == 1 end, nil, function() return "the handler never ran\n" .. fake:dump() end)
    local d = fake:wait_event("disposition", function(e)
      return e.message_id == mid and e.address == sub_address("Ep")
    end, "no disposition for " .. mid)
    assert.are.equal("accepted", d.outcome, fake:dump())
    assert.is_false(d.lock_lost)
    local row = sb:wait_message(mid, "Completed")
    assert.are.equal("S-b", row.session_id)
    -- one disposition for it, and no unauthorized attach anywhere
    assert.are.equal(1, nh.count(fake:events("disposition"), function(e) return e.message_id == mid end), fake:dump())
    assert.are.same({}, unauthorized_attaches(fake), fake:dump())
  end)

  it("dead-letters a permanent failure with com.microsoft:dead-letter and DeadLetterReason (fake Service Bus peer)", function()
    local fake = start_fake(sb, { subs = { Ep = { "Ok" } } })
    local adapter = sb:recorder{ endpoint = "Ep", types = { "Ok" } }
    local h = sb:spawn(adapter, { transport = fake:url() })
    local mid = sb:publish("Ok", { tag = "c1", permanent = "bad data" }, { session = "S-c", transport = fake:url() })
    local d = fake:wait_event("disposition", function(e) return e.message_id == mid end, "no disposition for " .. mid)
    assert.are.equal("rejected", d.outcome, fake:dump())
    assert.are.equal("com.microsoft:dead-letter", d.condition)
    assert.is_truthy(has((d.info or {}).DeadLetterReason, "bad data"),
      "DeadLetterReason in the error info: " .. nh.encode(d.info or {}))
    sb:wait_message(mid, "DeadLettered")
    assert.are.equal(1, sb:call_count("c1"))
    -- the peer answered (settled) with the same outcome, rejected + com.microsoft:dead-letter, which
    -- in rcv-settle-mode second means "done": not a refused settlement, and nothing comes back
    -- (stopping the host first: it reads the peer's answer before the answer to its close)
    assert.are.equal(0, h:stop())
    assert.are.equal(1, nh.count(fake:events("deliver"), function(e) return e.message_id == mid end), fake:dump())
    assert.is_falsy(has(h:log(), "refused a settlement"),
      "the dead-letter answer (same outcome, settled) is not a refusal:\n" .. h:log())
  end)

  it("renews the message lock over the subscription's $management node while a long handler runs (fake Service Bus peer)", function()
    local fake = start_fake(sb, { subs = { Slow = { "Long" } }, lock = 3 })
    local adapter = sbfake.slow_adapter(sb, "lock = { duration = 3, renew_max = 30 }")
    sb:spawn(adapter, { transport = fake:url() })
    local mid = sb:publish("Long", { tag = "d1" }, { session = "S-d", transport = fake:url() })
    local row = sb:wait_message(mid, "Completed")
    local deliveries = {}
    for _, e in ipairs(fake:events("deliver")) do
      if e.message_id == mid then deliveries[#deliveries + 1] = e end
    end
    assert.are.equal(1, #deliveries, "delivered once (no lock ran out)\n" .. fake:dump())
    local token = uuid_from_tag(deliveries[1].delivery_tag)
    assert.are.equal(deliveries[1].lock_token, token)
    local mgmt = sub_address("Slow") .. "/$management"
    local renewals = {}
    for _, e in ipairs(fake:events("renew-lock")) do
      if e.address == mgmt and contains(e.lock_tokens, token) then renewals[#renewals + 1] = e end
    end
    assert.is_true(#renewals >= 1, "a renew-lock on " .. mgmt .. " carrying " .. token .. "\n" .. fake:dump())
    for _, e in ipairs(renewals) do assert.are.equal(200, e.status, nh.encode(e)) end
    -- completed once: one handler run, one accepted disposition, no lost lock
    assert.are.same({ "d1" }, (function()
      local out = {}
      for l in (nh.read(sb.calls_path) or ""):gmatch("[^\n]+") do out[#out + 1] = l end
      return out
    end)())
    local disp = {}
    for _, e in ipairs(fake:events("disposition")) do
      if e.message_id == mid or e.lock_token == token then disp[#disp + 1] = e end
    end
    assert.are.equal(1, #disp, fake:dump())
    assert.are.equal("accepted", disp[1].outcome)
    assert.is_false(disp[1].lock_lost)
    assert.are.equal(0, #fake:events("lock-expired"), fake:dump())
    local shown = sb:show(row.event_id)
    assert.are.equal(1, nh.count(shown.history, function(h) return h.status == "Completed" end))
  end)

  it("exits 1 naming a subscription that does not exist on the fake Service Bus peer (fake Service Bus peer)", function()
    local fake = start_fake(sb, { subs = { Ep = { "Ok" } }, missing = { "Gone" } })
    local adapter = sb:recorder{ endpoint = "Gone", types = { "Ok" } }
    local h = sb:spawn(adapter, { transport = fake:url(), wait = false })
    assert.are.equal(1, h:wait_exit(30), h:log())
    local log = h:log()
    assert.is_truthy(has(log, "does not exist"), "the log says the subscription does not exist:\n" .. log)
    assert.is_truthy(has(log, sub_address("Gone")), "the log names " .. sub_address("Gone") .. ":\n" .. log)
    assert.is_true(#refusals(fake, "amqp:not-found") >= 1, fake:dump())
    assert.is_falsy(has(log, "ready:"), "never ready:\n" .. log)
  end)
end)

-- The operator HTTP API (issue 13, first part): `--admin ADDR` serves /api/v1 from the
-- host's store: endpoints with their counts, events with filters and a cursor that pages
-- without gaps or repeats, one event with its history, failure groups; errors name the
-- parameter at fault. Real host, real HTTP (curl).
local nh = require("nh")
local cjson = require("cjson")

local get = nh.http_json

-- How many events the store holds, through the API's counts.
local function count_all(base)
  local status, body = get(base .. "/endpoints")
  if status ~= 200 or #body.endpoints == 0 then return 0 end
  local n = 0
  for _, ep in ipairs(body.endpoints) do
    for _, c in pairs(ep.counts) do n = n + c end
  end
  return n
end

describe("admin API", function()
  local sb, base

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- A host with the API on a free port; returns its base URL.
  local function start(opts)
    local h = sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" },
                       { args = { "--admin", "127.0.0.1:0" } })
    local port = h:admin_port()
    assert(port, "no admin line in the log:\n" .. h:log())
    base = "http://127.0.0.1:" .. port .. "/api/v1"
    return h, opts
  end

  it("lists endpoints with their counts per status and the live hosts", function()
    start()
    local ok = sb:publish("Ok", { tag = "a" }, { session = "s1" })
    local bad = sb:publish("Ok", { tag = "b", fail = true }, { session = "s2" })
    sb:wait_message(ok, "Completed")
    sb:wait_message(bad, "Failed")
    local status, body = get(base .. "/endpoints")
    assert.equal(200, status)
    assert.equal(1, #body.endpoints)
    local ep = body.endpoints[1]
    local rows = sb:events()
    assert.equal(rows[1].endpoint, ep.endpoint)
    assert.equal(1, ep.counts.Completed)
    assert.equal(1, ep.counts.Failed)
    assert.equal(0, ep.counts.Deferred)
    assert.equal(1, ep.live_hosts)
  end)

  it("pages through events in insert order without gaps or repeats, and filters them", function()
    start()
    local mids = {}
    for i = 1, 25 do mids[i] = sb:publish("Ok", { tag = "e" .. i, fail = (i % 5 == 0) }, { session = "s" .. i }) end
    for i = 1, 25 do sb:wait_message(mids[i], i % 5 == 0 and "Failed" or "Completed") end
    local seen, pages, url = {}, 0, base .. "/events?limit=7"
    while url do
      local status, body = get(url)
      assert.equal(200, status)
      pages = pages + 1
      for _, ev in ipairs(body.events) do
        assert.is_nil(seen[ev.event_id], "repeated " .. ev.event_id)
        seen[ev.event_id] = ev
      end
      url = body.next ~= cjson.null and (base .. "/events?limit=7&after=" .. body.next) or nil
    end
    assert.equal(4, pages)
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.equal(25, n)
    -- the CLI's rows, all of them, are the API's
    for _, row in ipairs(sb:events()) do assert.equal(row.status, seen[row.event_id].status) end

    local status, failed = get(base .. "/events?status=failed&endpoint=" .. nh.urlencode(sb:events()[1].endpoint))
    assert.equal(200, status)
    assert.equal(5, #failed.events)
    for _, ev in ipairs(failed.events) do assert.equal("Failed", ev.status) end
    local _, one = get(base .. "/events?session=s3")
    assert.equal(1, #one.events)
    assert.equal("s3", one.events[1].session_id)
  end)

  it("shows one event with its payload and history, by id or prefix", function()
    start()
    local mid = sb:publish("Ok", { tag = "x", fail = true }, { session = "s1" })
    local row = sb:wait_message(mid, "Failed")
    local status, ev = get(base .. "/events/" .. row.event_id)
    assert.equal(200, status)
    assert.equal(row.event_id, ev.event_id)
    assert.equal("x", ev.payload.tag)
    assert.truthy(#ev.history >= 1)
    assert.equal("Failed", ev.history[#ev.history].status)
    local _, by_prefix = get(base .. "/events/" .. row.event_id:sub(1, 13))
    assert.equal(row.event_id, by_prefix.event_id)
  end)

  it("pages through 10,000 events both ways without gaps or repeats, and filters by every field", function()
    local adapter = sb:adapter("seeder.lua", [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Pager", { concurrency = 64, retry = { max_retries = 0 } })
ep:on("Seed", function(ev)
  for i = 1, ev.n do
    nimbus.publish(i % 10 == 0 and "Odd" or "Item", { i = i, note = "item-" .. i }, { session = "p" .. (i % 499) })
  end
end)
ep:on("Item", function() end)
ep:on("Odd", function(ev) if ev.i % 1000 == 0 then error("refused item " .. ev.i) end end)
]])
    local h = sb:start(adapter, { args = { "--admin", "127.0.0.1:0" } })
    base = "http://127.0.0.1:" .. h:admin_port() .. "/api/v1"
    local seed = sb:publish("Seed", { n = 10000 }, { session = "seed" })
    sb:wait_message(seed, "Completed")
    nh.eventually(function() return count_all(base) == 10001 end, 120, "all 10,001 events stored")
    local settled = function()
      local _, eps = get(base .. "/endpoints")
      local c = eps.endpoints[1].counts
      return c.Completed + c.Failed + c.Deferred == 10001 and c.Pending == 0
    end
    nh.eventually(settled, 120, "every event settled")
    for _, order in ipairs({ "oldest", "newest" }) do
      local seen, n, url, last = {}, 0, base .. "/events?limit=1000&order=" .. order, nil
      while url do
        local status, body = get(url)
        assert.equal(200, status)
        for _, ev in ipairs(body.events) do
          assert.is_nil(seen[ev.event_id], "repeated " .. ev.event_id)
          seen[ev.event_id] = true
          n = n + 1
        end
        last = body.next
        url = body.next ~= cjson.null and (base .. "/events?limit=1000&order=" .. order .. "&after=" .. body.next) or nil
      end
      assert.equal(10001, n, order)
      assert.equal(cjson.null, last)
    end
    -- filters: status lists, type lists, payload and error substrings, one event id, a time range
    local _, failed = get(base .. "/events?status=Failed,DeadLettered&limit=1000")
    assert.equal(10, #failed.events)
    local _, odd = get(base .. "/events?type=Odd&status=Completed,Deferred&limit=1000")
    assert.equal(990, #odd.events)
    local _, by_payload = get(base .. "/events?payload=" .. nh.urlencode('"item-4242"'))
    assert.equal(1, #by_payload.events)
    local _, by_error = get(base .. "/events?error=" .. nh.urlencode("REFUSED ITEM 7000"))
    assert.equal(1, #by_error.events)
    assert.equal("Failed", by_error.events[1].status)
    local _, by_id = get(base .. "/events?event_id=" .. by_error.events[1].event_id)
    assert.equal(1, #by_id.events)
    local _, future = get(base .. "/events?since=2100-01-01T00:00:00Z")
    assert.equal(0, #future.events)
    local _, recent = get(base .. "/events?since=1h&type=Seed")
    assert.equal(1, #recent.events)
    local status, body = get(base .. "/events?since=yesterday")
    assert.equal(400, status)
    assert.equal("since", body.field)
    status, body = get(base .. "/events?order=sideways")
    assert.equal(400, status)
    assert.equal("order", body.field)
  end)

  it("lists failure groups", function()
    start()
    local a = sb:publish("Ok", { tag = "f1", fail = true }, { session = "s1" })
    local b = sb:publish("Ok", { tag = "f2", fail = true }, { session = "s2" })
    sb:wait_message(a, "Failed")
    sb:wait_message(b, "Failed")
    local status, body = get(base .. "/failures")
    assert.equal(200, status)
    local total = 0
    for _, g in ipairs(body.groups) do total = total + g.count end
    assert.equal(2, total)
    local cli = {}
    for _, g in ipairs(nh.json_lines(sb:cli_ok({ "failures", "--json" }))) do cli[g.group] = g.count end
    for _, g in ipairs(body.groups) do assert.equal(cli[g.group], g.count) end
  end)

  it("answers bad requests with the field at fault, unknown ids with 404, other methods with 405", function()
    start()
    local status, body = get(base .. "/events?status=bogus")
    assert.equal(400, status)
    assert.equal("status", body.field)
    assert.truthy(body.error:find("Completed", 1, true))
    status, body = get(base .. "/events?limit=0")
    assert.equal(400, status)
    assert.equal("limit", body.field)
    status, body = get(base .. "/events?colour=red")
    assert.equal(400, status)
    assert.equal("colour", body.field)
    status, body = get(base .. "/events?endpoint=NoSuchEndpoint")
    assert.equal(400, status)
    assert.equal("endpoint", body.field)
    status = get(base .. "/events/00000000-0000-0000-0000-000000000000")
    assert.equal(404, status)
    status = get(base .. "/nothing")
    assert.equal(404, status)
    status = get(base .. "/events", "DELETE")
    assert.equal(405, status)
  end)

  it("resubmits with an edited body and skips, as the CLI does; 409 says what the event is now", function()
    start()
    local a = sb:publish("Ok", { tag = "r1", fail = true }, { session = "s1" })
    local b = sb:publish("Ok", { tag = "k1", fail = true }, { session = "s2" })
    local ra, rb = sb:wait_message(a, "Failed"), sb:wait_message(b, "Failed")
    local status, body = get(base .. "/events/" .. ra.event_id .. "/resubmit", "POST", '{"body": {"tag": "r1-fixed"}}')
    assert.equal(202, status)
    assert.equal("resubmit", body.queued)
    assert.equal(ra.event_id, body.event.event_id)
    -- a second one while the first waits, or once it is Completed: 409 with the event as it is
    status, body = get(base .. "/events/" .. ra.event_id .. "/resubmit", "POST", "{}")
    assert.equal(409, status)
    assert.equal(ra.event_id, body.event.event_id)
    sb:wait_event(ra.event_id, "Completed")
    status, body = get(base .. "/events/" .. ra.event_id .. "/resubmit", "POST", "{}")
    assert.equal(409, status)
    assert.equal("Completed", body.event.status)
    local _, shown = get(base .. "/events/" .. ra.event_id)
    assert.equal("r1-fixed", shown.payload.tag)
    assert.equal(1, sb:call_count("r1-fixed"))

    status = get(base .. "/events/" .. rb.event_id .. "/skip", "POST", "{}")
    assert.equal(202, status)
    sb:wait_event(rb.event_id, "Skipped")
    assert.equal(1, sb:call_count("k1"))   -- skipping never runs the handler
  end)

  it("takes actions only as JSON from its own origin, and says what is wrong with one", function()
    start()
    local a = sb:publish("Ok", { tag = "g1", fail = true }, { session = "s1" })
    local ra = sb:wait_message(a, "Failed")
    local url = base .. "/events/" .. ra.event_id .. "/resubmit"
    assert.equal(415, (get(url, "POST", "{}", { "Content-Type: text/plain" })))
    -- without logins only this machine's names: a rebinding page sends its own Host (and a matching Origin)
    assert.equal(403, (get(url, "POST", "{}", { "Content-Type: application/json", "Host: evil.example",
                                                "Origin: http://evil.example" })))
    assert.equal(403, (get(base .. "/events", "GET", nil, { "Host: evil.example" })))
    assert.equal(200, (get(base .. "/events", "GET", nil, { "Host: localhost" })))
    assert.equal(403, (get(url, "POST", "{}", { "Content-Type: application/json", "Origin: http://evil.example" })))
    local status, body = get(url, "POST", '{"colour": 1}')
    assert.equal(400, status)
    assert.equal("colour", body.field)
    status, body = get(url, "POST", '{"body": "not an object"}')
    assert.equal(400, status)
    assert.equal("body", body.field)
    assert.equal(400, (get(url, "POST", "{not json")))
    assert.equal(404, (get(base .. "/events/00000000-0000-0000-0000-000000000000/skip", "POST", "{}")))
    assert.equal(405, (get(url)))
    assert.equal("Failed", sb:row(ra.event_id).status)   -- none of these did anything
  end)

  it("refuses a bad --admin, a non-loopback address without logins, and a port in use at start", function()
    local adapter = sb:recorder{ types = { "Ok" } }
    local r = sb:cli({ "run", adapter, "--admin", "banana" })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("--admin banana", 1, true), r.err)
    r = sb:cli({ "run", adapter, "--admin", "0.0.0.0:0" })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("--admin-token-file", 1, true), r.err)
    r = sb:cli({ "run", adapter, "--admin-token-file", sb:path("missing.txt") })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("missing.txt", 1, true), r.err)
    local h = start()
    local port = h:admin_port()
    local second = sb:spawn(sb:recorder{ types = { "Ok" } }, { args = { "--admin", "127.0.0.1:" .. port }, wait = false })
    nh.eventually(function() return second:exit_code() ~= nil end, nh.DEADLINE, "the second host to exit")
    assert.equal(2, second:exit_code())
    assert.truthy(second:log():find("--admin 127.0.0.1:" .. port, 1, true), second:log())
    assert.truthy(second:log():find("--admin off", 1, true), second:log())
  end)

  it("lists blocked sessions with their blocker and parked count, and endpoint figures", function()
    start()
    local head = sb:publish("Ok", { tag = "h", fail = true }, { session = "blk" })
    sb:wait_message(head, "Failed")
    local p1 = sb:publish("Ok", { tag = "p1" }, { session = "blk" })
    local p2 = sb:publish("Ok", { tag = "p2" }, { session = "blk" })
    sb:wait_message(p1, "Deferred")
    sb:wait_message(p2, "Deferred")
    local status, body = get(base .. "/sessions")
    assert.equal(200, status)
    assert.equal(1, #body.sessions)
    local s = body.sessions[1]
    assert.equal("blk", s.session_id)
    assert.equal(sb:wait_message(head, "Failed").event_id, s.blocked_by)
    assert.equal("Failed", s.status)
    assert.equal(2, s.parked)
    assert.truthy(s.reason:find("boom", 1, true), s.reason)
    assert.equal(cjson.null, body.next)
    local _, eps = get(base .. "/endpoints")
    assert.equal(1, eps.endpoints[1].blocked_sessions)
    assert.equal(2, eps.endpoints[1].counts.Deferred)
    -- the blocker, by the id the session names
    local _, ev = get(base .. "/events/" .. s.blocked_by)
    assert.equal("h", ev.payload.tag)
  end)

  it("pages blocked sessions whose ids are longer than any fixed buffer", function()
    start()
    local long = { ("a"):rep(600) .. "-1", ("a"):rep(600) .. "-2", ("a"):rep(600) .. "-3" }
    for _, id in ipairs(long) do sb:wait_message(sb:publish("Ok", { fail = true }, { session = id }), "Failed") end
    local seen, after = {}, nil
    for _ = 1, 5 do
      local status, page = get(base .. "/sessions?limit=1" .. (after and ("&after=" .. nh.urlencode(after)) or ""))
      assert.equal(200, status)
      for _, row in ipairs(page.sessions) do seen[#seen + 1] = row.session_id end
      if page.next == cjson.null then break end
      after = page.next
    end
    -- every one once, in order: the cursor kept the whole id (compared by their last characters,
    -- so that a failure prints readable lists)
    local function tails(l)
      local out = {}
      for i, id in ipairs(l) do out[i] = #id .. ":" .. id:sub(-3) end
      return out
    end
    assert.same(tails(long), tails(seen))
  end)

  it("completes and fails hand-offs from the API; a failed one needs an error and a reason", function()
    start()
    local a = sb:publish("Ok", { tag = "ho1", handoff = "erp import", job = "J1" }, { session = "h1" })
    local b = sb:publish("Ok", { tag = "ho2", handoff = "erp import", job = "J2" }, { session = "h2" })
    local ra, rb = sb:wait_message(a, "Pending"), sb:wait_message(b, "Pending")
    local _, eps = get(base .. "/endpoints")
    assert.equal(2, eps.endpoints[1].handoffs_pending)
    local status, body = get(base .. "/events/" .. ra.event_id .. "/handoff/complete", "POST", '{"result": {"n": 1}}')
    assert.equal(202, status, cjson.encode(body))
    assert.equal("handoff complete", body.queued)
    sb:wait_event(ra.event_id, "Completed")
    status, body = get(base .. "/events/" .. rb.event_id .. "/handoff/fail", "POST", '{"error": "import rejected"}')
    assert.equal(400, status)
    assert.equal("reason", body.field)
    status, body = get(base .. "/events/" .. rb.event_id .. "/handoff/fail", "POST",
                       '{"error": "import rejected", "reason": "ERP says the tax id is wrong"}')
    assert.equal(202, status, cjson.encode(body))
    sb:wait_event(rb.event_id, "Failed")
    -- a settled hand-off cannot be settled again
    status, body = get(base .. "/events/" .. ra.event_id .. "/handoff/complete", "POST", "{}")
    assert.equal(409, status)
    assert.equal("Completed", body.event.status)
    local _, shown = get(base .. "/events/" .. rb.event_id)
    local logged = false
    for _, l in ipairs(shown.operator_log) do
      logged = logged or (l.actor == "local" and l.detail:find("tax id", 1, true) ~= nil)
    end
    assert.is_true(logged, cjson.encode(shown.operator_log))
  end)

  it("skips with a reason, kept in the operator log with who did it", function()
    start()
    local a = sb:publish("Ok", { tag = "sk", fail = true }, { session = "s1" })
    local ra = sb:wait_message(a, "Failed")
    local status = get(base .. "/events/" .. ra.event_id .. "/skip", "POST", '{"reason": "duplicate of INC-7"}')
    assert.equal(202, status)
    sb:wait_event(ra.event_id, "Skipped")
    local _, ev = get(base .. "/events/" .. ra.event_id)
    assert.equal(1, #ev.operator_log)
    assert.equal("local", ev.operator_log[1].actor)
    assert.equal("skip", ev.operator_log[1].action)
    assert.truthy(ev.operator_log[1].detail:find("duplicate of INC-7", 1, true))
    assert.is_false(ev.request_waiting)
    assert.equal(400, (get(base .. "/events/" .. ra.event_id .. "/skip", "POST", '{"reason": 5}')))
  end)

  it("bulk-resubmits a failure group after a dry run that counts it, and refuses an unbounded filter", function()
    start()
    local mids = {}
    for i = 1, 12 do mids[i] = sb:publish("Ok", { tag = "b" .. i, fail_times = 1 }, { session = "bs" .. i }) end
    local ids = {}
    for i = 1, 12 do ids[i] = sb:wait_message(mids[i], "Failed").event_id end
    local _, groups = get(base .. "/failures")
    assert.equal(1, #groups.groups)
    local g = groups.groups[1].group
    local status, body = get(base .. "/bulk/resubmit", "POST", cjson.encode{ filter = {}, dry_run = true })
    assert.equal(400, status)
    assert.equal("filter", body.field)
    -- a member given as null bounds nothing
    status, body = get(base .. "/bulk/resubmit", "POST", '{"filter": {"endpoint": null}, "dry_run": true}')
    assert.equal(400, status)
    assert.equal("filter", body.field)
    status, body = get(base .. "/bulk/resubmit", "POST", cjson.encode{ filter = { group = g }, dry_run = true })
    assert.equal(200, status, cjson.encode(body))
    assert.equal(12, body.matched)
    assert.equal(10, #body.sample)
    assert.equal(1, sb:call_count("b1"))   -- the dry run queued nothing: one call, the failed one
    status, body = get(base .. "/bulk/resubmit", "POST", cjson.encode{ filter = { group = g } })
    assert.equal(200, status, cjson.encode(body))
    assert.equal(12, body.queued)
    assert.equal(0, body.refused)
    assert.equal(1, body.endpoints[1].live_hosts)
    for i = 1, 12 do sb:wait_event(ids[i], "Completed") end
    for i = 1, 12 do assert.equal(2, sb:call_count("b" .. i)) end
  end)

  it("bulk-skips by status with a reason, parked events first", function()
    start()
    local head = sb:publish("Ok", { tag = "bh", fail = true }, { session = "q" })
    local hid = sb:wait_message(head, "Failed").event_id
    local tail = sb:publish("Ok", { tag = "bt" }, { session = "q" })
    local tid = sb:wait_message(tail, "Deferred").event_id
    local ep = sb:events()[1].endpoint
    local status, body = get(base .. "/bulk/skip", "POST",
                             cjson.encode{ filter = { endpoint = ep }, reason = "bad batch from the CRM" })
    assert.equal(200, status, cjson.encode(body))
    assert.equal(2, body.queued)
    sb:wait_event(hid, "Skipped")
    sb:wait_event(tid, "Skipped")
    assert.equal(0, sb:call_count("bt"))
  end)

  it("with --admin-token-file asks for a token: readers read, operators act, others get 401", function()
    local tokens = sb:path("tokens.txt")
    nh.write(tokens, "# who may use the console\nreader-token-0123456789 reader alice\n" ..
                     "operator-token-0123456789 operator bob\n")
    local bad = sb:path("bad-tokens.txt")
    nh.write(bad, "short reader carol\n")
    local r = sb:cli({ "run", sb:recorder{ types = { "Ok" } }, "--admin", "127.0.0.1:0", "--admin-token-file", bad })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("bad-tokens.txt:1", 1, true), r.err)
    local h = sb:start(sb:recorder{ types = { "Ok" } }, { args = { "--admin", "127.0.0.1:0", "--admin-token-file",
                                                                    tokens } })
    base = "http://127.0.0.1:" .. h:admin_port() .. "/api/v1"
    local a = sb:publish("Ok", { tag = "t1", fail = true }, { session = "s1" })
    local ra = sb:wait_message(a, "Failed")
    assert.equal(401, (get(base .. "/endpoints")))
    assert.equal(401, (get(base .. "/endpoints", "GET", nil, { "Authorization: Bearer nope-nope-nope-nope" })))
    local reader = { "Authorization: Bearer reader-token-0123456789", "Content-Type: application/json" }
    local op = { "Authorization: Bearer operator-token-0123456789", "Content-Type: application/json" }
    local status, who = get(base .. "/whoami", "GET", nil, reader)
    assert.equal(200, status)
    assert.same({ "alice", "reader", true }, { who.name, who.role, who.login_required })
    assert.equal(200, (get(base .. "/events", "GET", nil, reader)))
    assert.equal(403, (get(base .. "/events/" .. ra.event_id .. "/skip", "POST", "{}", reader)))
    assert.equal(202, (get(base .. "/events/" .. ra.event_id .. "/skip", "POST", "{}", op)))
    sb:wait_event(ra.event_id, "Skipped")
    local _, ev = get(base .. "/events/" .. ra.event_id, "GET", nil, op)
    assert.equal("bob", ev.operator_log[1].actor)
    -- health and the page need no token
    assert.equal(200, (get(base:gsub("/api/v1$", "") .. "/healthz")))
  end)

  it("serves health, readiness, the page's redirect, and 413 for a body over 10 MB", function()
    start()
    local root = base:gsub("/api/v1$", "")
    local _, health = get(root .. "/healthz")
    assert.equal("ok", health.status)
    local status, ready = get(root .. "/readyz")
    assert.equal(200, status)
    assert.equal("ready", ready.status)
    local r = nh.capture(("curl -sS -o /dev/null -w '%%{http_code} %%{redirect_url}' %s"):format(nh.q(root .. "/")))
    assert.equal("302 " .. root .. "/console/", r.out)
    local big = sb:path("big.json")
    local f = assert(io.open(big, "w"))
    f:write('{"body": {"x": "', string.rep("a", 11 * 1024 * 1024), '"}}')
    f:close()
    r = nh.capture(("curl -sS -o /dev/null -w '%%{http_code}' -H 'Content-Type: application/json' --data-binary @%s %s")
                   :format(nh.q(big), nh.q(base .. "/events/x/resubmit")))
    assert.equal("413", r.out)
  end)

  it("`nimbus-host console` serves a store without adapters; actions wait for a host", function()
    local h = start()
    local a = sb:publish("Ok", { tag = "c1", fail = true }, { session = "s1" })
    local ra = sb:wait_message(a, "Failed")
    h:stop()
    local console = sb:spawn({ "console" }, { transport = false, args = { "--admin", "127.0.0.1:0" }, wait = false })
    local port = nh.eventually(function() return console:admin_port() end,
                               nh.DEADLINE, "the console's listener")
    local cbase = "http://127.0.0.1:" .. port .. "/api/v1"
    local status, body = get(cbase .. "/events/" .. ra.event_id .. "/resubmit", "POST", "{}")
    assert.equal(202, status)
    assert.equal(0, body.live_hosts)   -- no host serves the endpoint now: the request waits
    local _, who = get(cbase .. "/whoami")
    assert.is_true(who.console_only)
    assert.equal(0, console:stop())
    sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" })
    sb:wait_event(ra.event_id, "Failed")   -- fail = true fails again, but it ran: two calls
    nh.eventually(function() return sb:call_count("c1") == 2 end, nh.DEADLINE, "the resubmit to run")
  end)
end)

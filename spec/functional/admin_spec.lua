-- The operator HTTP API (issue 13, first part): `--admin ADDR` serves /api/v1 from the
-- host's store: endpoints with their counts, events with filters and a cursor that pages
-- without gaps or repeats, one event with its history, failure groups; errors name the
-- parameter at fault. Real host, real HTTP (curl).
local nh = require("nh")
local cjson = require("cjson")

-- GET url (or another method, with a JSON body and headers): status code and decoded JSON body.
local function get(url, method, body, headers)
  local extra = ""
  for _, h in ipairs(headers or (body and { "Content-Type: application/json" }) or {}) do
    extra = extra .. " -H " .. nh.q(h)
  end
  if body then extra = extra .. " --data-binary " .. nh.q(body) end
  local r = nh.capture(("curl -sS --max-time 30 -X %s%s -w '\\n%%{http_code}' %s"):format(method or "GET", extra,
                       nh.q(url)))
  assert(r.code == 0, "curl failed: " .. r.err)
  local body, status = r.out:match("^(.*)\n(%d+)$")
  local ok, decoded = pcall(cjson.decode, body)
  assert(ok, "not JSON: " .. tostring(body))
  return tonumber(status), decoded
end

describe("admin API", function()
  local sb, base

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- A host with the API on a free port; returns its base URL.
  local function start(opts)
    local h = sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" },
                       { args = { "--admin", "127.0.0.1:0" } })
    local port = h:log():match("operator API on http://127%.0%.0%.1:(%d+)/api/v1/")
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

  it("refuses a bad --admin and a port in use at start, with the reason", function()
    local r = sb:cli({ "run", "x.lua", "--admin", "banana" })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("--admin banana", 1, true), r.err)
    r = sb:cli({ "run", "x.lua", "--admin", "0.0.0.0:7070" })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("loopback", 1, true), r.err)
    local h = start()
    local port = h:log():match("operator API on http://127%.0%.0%.1:(%d+)/")
    local second = sb:spawn(sb:recorder{ types = { "Ok" } }, { args = { "--admin", "127.0.0.1:" .. port }, wait = false })
    nh.eventually(function() return second:exit_code() ~= nil end, nh.DEADLINE, "the second host to exit")
    assert.equal(2, second:exit_code())
    assert.truthy(second:log():find("--admin 127.0.0.1:" .. port, 1, true), second:log())
  end)
end)

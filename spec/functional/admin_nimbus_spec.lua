-- The NimBus-compatible routes of the operator API (docs/admin-api.md, "NimBus-compatible
-- routes"): scripts written against NimBus's operator API (header api-version: 2, NimBus's
-- paths and field names) count statuses per endpoint, page through an endpoint's events
-- with a continuationToken, and resubmit or skip an event named with its latest message,
-- refused (409) once the event has moved on. Real host, real HTTP (curl).
local nh = require("nh")
local cjson = require("cjson")

-- One request: status code and decoded JSON body. headers default to NimBus's
-- (JSON, api-version: 2); body is a string or a table (encoded).
local function call(url, method, body, headers)
  if type(body) == "table" then body = cjson.encode(body) end
  return nh.http_json(url, method, body, headers or { "Content-Type: application/json", "api-version: 2" })
end

local function post(url, body, headers) return call(url, "POST", body, headers) end

local function null_or_empty(v) return v == nil or v == cjson.null or v == "" end

describe("NimBus-compatible admin routes", function()
  local sb, root, endpoint

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- A host with the API on a free port; root is http://127.0.0.1:PORT.
  local function start()
    local h = sb:start(sb:recorder{ endpoint = "Crm", types = { "Ok", "Other" }, options = "retry = { max_retries = 0 }" },
                       { args = { "--admin", "127.0.0.1:0" } })
    local port = h:admin_port()
    assert(port, "no admin line in the log:\n" .. h:log())
    root = "http://127.0.0.1:" .. port
    endpoint = "Crm"
    return h
  end

  local function filter_url() return root .. "/api/event/" .. endpoint .. "/getByFilter" end

  -- Every event getByFilter gives for `filter`, page by page; returns them and the page count.
  local function all_pages(filter, max)
    local seen, events, pages, token = {}, {}, 0, ""
    repeat
      local status, body = post(filter_url(), { continuationToken = token, eventFilter = filter or {},
                                                maxSearchItemsCount = max or 100 })
      assert.equal(200, status, cjson.encode(body))
      pages = pages + 1
      for _, ev in ipairs(body.events) do
        assert.is_nil(seen[ev.eventId], "repeated " .. ev.eventId)
        seen[ev.eventId] = true
        events[#events + 1] = ev
      end
      assert.truthy(pages < 100, "the pages never end")
      token = body.continuationToken
    until null_or_empty(token)
    return events, pages
  end

  it("counts each endpoint's events per status, in NimBus's names", function()
    start()
    local a = sb:publish("Ok", { tag = "a" }, { session = "s1" })
    local b = sb:publish("Ok", { tag = "b" }, { session = "s2" })
    local c = sb:publish("Ok", { tag = "c", fail = true }, { session = "s3" })
    local d = sb:publish("Ok", { tag = "d" }, { session = "s3" })   -- parked behind c
    sb:wait_message(a, "Completed")
    sb:wait_message(b, "Completed")
    sb:wait_message(c, "Failed")
    sb:wait_message(d, "Deferred")
    local status, body = post(root .. "/api/endpoint/status/count", { endpoint, "NotYetSeen" })
    assert.equal(200, status)
    assert.equal(2, #body)
    assert.same({ endpointId = endpoint, failedCount = 1, deferredCount = 1, pendingCount = 0, unsupportedCount = 0,
                  deadletterCount = 0, completedCount = 2, skippedCount = 0 }, body[1])
    -- an endpoint without events yet counts zero, as in NimBus (where it exists before them)
    assert.same({ endpointId = "NotYetSeen", failedCount = 0, deferredCount = 0, pendingCount = 0,
                  unsupportedCount = 0, deadletterCount = 0, completedCount = 0, skippedCount = 0 }, body[2])
    -- the same counts as /api/v1/endpoints
    local _, v1 = call(root .. "/api/v1/endpoints", "GET", nil, {})
    assert.equal(v1.endpoints[1].counts.Failed, body[1].failedCount)
    assert.equal(v1.endpoints[1].counts.Completed, body[1].completedCount)
    status, body = post(root .. "/api/endpoint/status/count", "[]")
    assert.equal(200, status)
    assert.is_nil(next(body))
  end)

  it("pages an endpoint's events with the continuationToken, without gaps or repeats", function()
    start()
    local mids = {}
    for i = 1, 23 do
      mids[i] = sb:publish(i % 4 == 0 and "Other" or "Ok", { tag = "e" .. i, fail = (i % 5 == 0) },
                           { session = "s" .. i })
    end
    for i = 1, 23 do sb:wait_message(mids[i], i % 5 == 0 and "Failed" or "Completed") end
    local events, pages = all_pages(nil, 5)
    assert.equal(23, #events)
    assert.equal(5, pages)   -- 5+5+5+5+3: the last page says it is the last
    -- in insert order, each as the CLI sees it
    local rows = sb:events()
    for i, row in ipairs(rows) do
      local ev = events[i]
      assert.equal(row.event_id, ev.eventId)
      assert.equal(row.session_id, ev.sessionId)
      assert.equal(row.event_type, ev.eventTypeId)
      assert.equal(row.status, ev.resolutionStatus)
      assert.equal(row.message_id, ev.lastMessageId)
      assert.equal(cjson.null, ev.pendingSubStatus)
      assert.equal(cjson.null, ev.expectedBy)
      if row.status == "Failed" then
        assert.truthy(ev.messageContent.errorContent.errorText:find("boom: " .. row.session_id:gsub("s", "e"), 1, true))
      else
        assert.equal(cjson.null, ev.messageContent.errorContent.errorText)
      end
    end
    -- a page exactly full at the end: no token to an empty page
    local _, exact = all_pages(nil, 23)
    assert.equal(1, exact)
    -- a token of a page read before new events arrived still pages on: they come after
    local _, first = post(filter_url(), { continuationToken = "", eventFilter = {}, maxSearchItemsCount = 20 })
    local late = sb:publish("Ok", { tag = "late" }, { session = "late" })
    sb:wait_message(late, "Completed")
    local _, rest = post(filter_url(), { continuationToken = first.continuationToken, maxSearchItemsCount = 20 })
    assert.equal(4, #rest.events)
    assert.equal("late", rest.events[4].sessionId)
    assert.is_true(null_or_empty(rest.continuationToken))
  end)

  it("filters on resolutionStatus, eventTypeId, sessionId, eventId and payload; unset members filter nothing", function()
    start()
    local mids = {}
    for i = 1, 12 do
      mids[i] = sb:publish(i % 3 == 0 and "Other" or "Ok", { tag = "f" .. i, fail = (i % 4 == 0) },
                           { session = "s" .. i })
    end
    for i = 1, 12 do sb:wait_message(mids[i], i % 4 == 0 and "Failed" or "Completed") end
    local failed = all_pages({ resolutionStatus = { "Failed" } }, 2)
    assert.equal(3, #failed)
    for _, ev in ipairs(failed) do assert.equal("Failed", ev.resolutionStatus) end
    assert.equal(4, #all_pages({ eventTypeId = { "Other" } }))
    assert.equal(1, #all_pages({ eventTypeId = { "Other" }, resolutionStatus = { "Failed", "Deferred" } }))   -- f12
    assert.equal(12, #all_pages({ resolutionStatus = { "failed", "completed" } }))   -- any case, as NimBus's enum
    local s7 = all_pages({ sessionId = "s7" })
    assert.equal(1, #s7)
    local by_id = all_pages({ eventId = s7[1].eventId })
    assert.equal("s7", by_id[1].sessionId)
    local by_payload = all_pages({ payload = '"tag":"f11"' })
    assert.equal(1, #by_payload)
    assert.equal("s11", by_payload[1].sessionId)
    -- a NimBus client sends every member of its filter class, the unset ones empty or null
    local status, body = post(filter_url(), '{"continuationToken": null, "maxSearchItemsCount": 100, "eventFilter": ' ..
      '{"sessionId": "", "eventId": null, "resolutionStatus": [], "eventTypeId": null, "payload": "", ' ..
      '"updatedAtFrom": null}}')
    assert.equal(200, status, cjson.encode(body))
    assert.equal(12, #body.events)
  end)

  it("shows a hand-off's sub-status, reason, job and deadline", function()
    start()
    local mid = sb:publish("Ok", { tag = "h", handoff = "Awaiting DMF import", job = "DMF-7", expected_by = 600 },
                           { session = "h1" })
    sb:wait_message(mid, "Pending")
    local events = all_pages({ resolutionStatus = { "Pending" } })
    assert.equal(1, #events)
    local ev = events[1]
    assert.equal("Handoff", ev.pendingSubStatus)
    assert.equal("Awaiting DMF import", ev.handoffReason)
    assert.equal("DMF-7", ev.externalJobId)
    assert.truthy(tostring(ev.expectedBy):match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d"), tostring(ev.expectedBy))
    local _, counts = post(root .. "/api/endpoint/status/count", { endpoint })
    assert.equal(1, counts[1].pendingCount)
  end)

  it("resubmits and skips an event named with its latest message; 409 once it moved on", function()
    start()
    local a = sb:publish("Ok", { tag = "r1", fail_times = 2 }, { session = "s1" })
    local b = sb:publish("Ok", { tag = "k1", fail = true }, { session = "s2" })
    local ra, rb = sb:wait_message(a, "Failed"), sb:wait_message(b, "Failed")
    local first_mid = ra.message_id

    local status, body = post(root .. "/api/event/resubmit/" .. ra.event_id .. "/" .. first_mid, "")
    assert.equal(202, status, cjson.encode(body))
    assert.equal("resubmit", body.queued)
    assert.equal(ra.event_id, body.event.event_id)
    -- it runs again and fails again: its latest message is now the resubmission
    nh.eventually(function() return sb:call_count("r1") == 2 and sb:row(ra.event_id).status == "Failed" end,
                  nh.DEADLINE, "the resubmission to fail")
    sb:wait_applied(ra.event_id)
    local now = sb:row(ra.event_id)
    assert.are_not.equal(first_mid, now.message_id)
    -- the script's view is stale: refused with the event as it is now, nothing queued
    status, body = post(root .. "/api/event/skip/" .. ra.event_id .. "/" .. first_mid, "{}")
    assert.equal(409, status)
    assert.truthy(body.error:find("moved on", 1, true), body.error)
    assert.equal(now.message_id, body.event.message_id)
    assert.equal("Failed", body.event.status)
    status, body = post(root .. "/api/event/resubmit/" .. ra.event_id .. "/" .. first_mid, "{}")
    assert.equal(409, status)
    assert.equal("Failed", sb:row(ra.event_id).status)
    -- read afresh, the resubmit goes through and completes it
    local fresh = all_pages({ eventId = ra.event_id })[1]
    assert.equal(now.message_id, fresh.lastMessageId)
    status = post(root .. "/api/event/resubmit/" .. ra.event_id .. "/" .. fresh.lastMessageId, "{}")
    assert.equal(202, status)
    sb:wait_event(ra.event_id, "Completed")
    assert.equal(3, sb:call_count("r1"))

    status, body = post(root .. "/api/event/skip/" .. rb.event_id .. "/" .. rb.message_id, "")
    assert.equal(202, status, cjson.encode(body))
    assert.equal("skip", body.queued)
    sb:wait_event(rb.event_id, "Skipped")
    assert.equal(1, sb:call_count("k1"))   -- skipping never runs the handler
    -- in the operator log like every action, with who did it
    local _, shown = call(root .. "/api/v1/events/" .. rb.event_id, "GET", nil, {})
    assert.equal(1, #shown.operator_log)
    assert.equal("skip", shown.operator_log[1].action)
    assert.equal("local", shown.operator_log[1].actor)
  end)

  it("answers bad requests with the field at fault, unknown events and endpoints with 404", function()
    start()
    local a = sb:publish("Ok", { tag = "x", fail = true }, { session = "s1" })
    local ra = sb:wait_message(a, "Failed")
    local count_url = root .. "/api/endpoint/status/count"
    -- the header: missing, or another version
    local status, body = post(count_url, { endpoint }, { "Content-Type: application/json" })
    assert.equal(400, status)
    assert.equal("api-version", body.field)
    assert.truthy(body.error:find("api-version: 2", 1, true), body.error)
    status, body = post(filter_url(), "{}", { "Content-Type: application/json", "api-version: 1" })
    assert.equal(400, status)
    assert.equal("api-version", body.field)
    status, body = post(root .. "/api/event/skip/" .. ra.event_id .. "/" .. ra.message_id, "{}",
                        { "Content-Type: application/json" })
    assert.equal(400, status)
    assert.equal("api-version", body.field)
    -- status/count: a JSON array of names
    status, body = post(count_url, { endpoints = { endpoint } })
    assert.equal(400, status)
    status, body = post(count_url, '["Crm", 7]')
    assert.equal(400, status)
    assert.equal("[1]", body.field)
    status = post(count_url, "[not json")
    assert.equal(400, status)
    -- getByFilter: its members, NimBus-named
    local function filter_error(req, field)
      local st, b = post(filter_url(), req)
      assert.equal(400, st, cjson.encode(b))
      assert.equal(field, b.field)
    end
    filter_error({ maxSearchItemsCount = 0 }, "maxSearchItemsCount")
    filter_error({ maxSearchItemsCount = 1001 }, "maxSearchItemsCount")
    filter_error({ maxSearchItemsCount = "ten" }, "maxSearchItemsCount")
    filter_error({ continuationToken = "not-a-token" }, "continuationToken")
    filter_error({ eventFilter = { resolutionStatus = { "Bogus" } } }, "eventFilter.resolutionStatus")
    filter_error({ eventFilter = { resolutionStatus = "Failed,Bogus" } }, "eventFilter.resolutionStatus")
    filter_error({ eventFilter = { eventTypeId = { 1 } } }, "eventFilter.eventTypeId")
    filter_error({ eventFilter = { sessionId = 5 } }, "eventFilter.sessionId")
    filter_error({ eventFilter = { colour = "red" } }, "eventFilter.colour")
    filter_error({ eventFilter = "Failed" }, "eventFilter")
    filter_error({ colour = "red" }, "colour")
    assert.equal(400, (post(filter_url(), "[]")))
    -- unknown endpoint, unknown event
    status = post(root .. "/api/event/NoSuchEndpoint/getByFilter", "{}")
    assert.equal(404, status)
    status = post(root .. "/api/event/resubmit/00000000-0000-0000-0000-000000000000/" .. ra.message_id, "{}")
    assert.equal(404, status)
    status = post(root .. "/api/event/skip/00000000-0000-0000-0000-000000000000/" .. ra.message_id, "{}")
    assert.equal(404, status)
    -- an action takes no body members
    status, body = post(root .. "/api/event/skip/" .. ra.event_id .. "/" .. ra.message_id, { reason = "x" })
    assert.equal(400, status)
    assert.equal("reason", body.field)
    -- as every POST of the API: JSON from this origin, POST only
    assert.equal(415, (post(count_url, "[]", { "Content-Type: text/plain", "api-version: 2" })))
    assert.equal(403, (post(count_url, "[]", { "Content-Type: application/json", "api-version: 2",
                                               "Origin: http://evil.example" })))
    assert.equal(405, (call(count_url, "GET", nil, { "api-version: 2" })))
    assert.equal("Failed", sb:row(ra.event_id).status)   -- none of these did anything
    assert.equal(1, sb:call_count("x"))
  end)
end)

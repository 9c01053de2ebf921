-- Specs for lua/nimbus/testing.lua, the adapter unit-test kit. They run under stock lua5.4
-- (spec_lua) and also inside the host (nimbus-host -l busted), where the real nimbus
-- modules must survive them.
local testing = require("nimbus.testing")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local ERP_ADAPTER = here .. "/fixtures/erp_adapter.lua"
local LOOKUP_ADAPTER = here .. "/fixtures/lookup_adapter.lua"

local ERP = "http://erp.test"

-- the ERP answering every call well
local function happy_erp()
  return {
    ["PUT " .. ERP .. "/customers/A1"] = { status = 200, json = { id = 17 } },
    ["POST " .. ERP .. "/dmf/jobs"] = { status = 202, json = { jobId = "DMF-1" } },
    ["DELETE " .. ERP .. "/customers/A1"] = { status = 204 },
  }
end

local function load_erp(http, now) return testing.load(ERP_ADAPTER, { http = http or happy_erp(), now = now }) end

describe("nimbus.testing: outcomes", function()
  it("reports a completed handler with what it published and the HTTP calls it made", function()
    local app = load_erp()
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1", Name = "Ada", Tenant = "t1" },
                         { session_id = "A1" })
    testing.assert_completed(out)
    assert.are.equal(1, #out.http)
    local call = out.http[1]
    assert.are.same({ "PUT", ERP .. "/customers/A1", "t1", { name = "Ada" }, 5 },
                    { call.method, call.url, call.headers["X-Tenant"], call.json, call.timeout })
    assert.are.equal("application/json", call.headers["Content-Type"])
    assert.are.equal(1, #out.published)
    assert.are.same({ type = "ErpCustomerCreated", payload = { AccountId = "A1", ErpId = 17 } },
                    { type = out.published[1].type, payload = out.published[1].payload })
    assert.are.equal("A1", out.published[1].opts.session)
    assert.are.equal("A1", out.ctx.session_id)
  end)

  it("reports a failed handler with the text the host would record, and a traceback", function()
    local app = load_erp({ ["PUT " .. ERP .. "/customers/A1"] = { status = 500, body = "db down" } })
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    testing.assert_failed(out, "ERP answered 500: db down")
    assert.are.equal("LuaError", out.error_type)
    assert.matches("erp_adapter.lua:%d+: ERP answered 500: db down", out.error_text)
    assert.matches("traceback", out.error_stack)
    assert.are.same({}, out.published)
  end)

  it("reports nimbus.permanent as a dead-letter with its type", function()
    local out = load_erp():send("ErpEndpoint", "CrmAccountCreated", { Name = "no id" })
    testing.assert_dead_lettered(out, "^AccountId is missing$")
    assert.are.equal("ValidationError", out.error_type)
    assert.are.same({}, out.http)
  end)

  it("reports nimbus.transient (here: a simulated timeout of the fake ERP)", function()
    local app = load_erp({ ["PUT " .. ERP .. "/customers/A1"] = { status = 200, json = { id = 1 }, delay = 10 } })
    local t0 = app.clock
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    testing.assert_transient(out, "^ERP timed out")
    assert.are.equal("TransientFailure", out.error_type)
    assert.are.equal(t0 + 5, app.clock)   -- the request's own timeout passed on the fake clock
  end)

  it("reports a pending hand-off with reason, external job id and expected_by", function()
    local out = load_erp():send("ErpEndpoint", "CrmAccountImported", { AccountId = "A1" })
    testing.assert_handoff(out, { reason = "Awaiting ERP DMF import job", external_job_id = "DMF-1" })
    assert.are.same({ reason = "Awaiting ERP DMF import job", external_job_id = "DMF-1", expected_by = 30 },
                    out.handoff)
    assert.are.equal(1, #out.published)   -- a hand-off commits its publishes, like completed
  end)

  it("reports an event type without a handler as unsupported", function()
    local out = load_erp():send("ErpEndpoint", "CrmAccountMerged", { AccountId = "A1" })
    testing.assert_unsupported(out)
    assert.matches("no handler for event type CrmAccountMerged", out.error_text)
  end)

  it("sends a raw string as is: malformed JSON is dead-lettered before the handler", function()
    local app = load_erp()
    local out = app:send("ErpEndpoint", "CrmAccountCreated", '{"AccountId": "A1",')
    testing.assert_dead_lettered(out, "^malformed JSON payload")
    assert.are.equal("MalformedPayload", out.error_type)
    assert.are.same({}, out.http)
    testing.assert_dead_lettered(app:send("ErpEndpoint", "CrmAccountCreated", "[1, 2]"), "must be a JSON object")
  end)

  it("runs the middleware around the handler", function()
    local app = load_erp()
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1", Tenant = "blocked" })
    testing.assert_dead_lettered(out, "tenant is blocked")
    assert.are.equal("TenantBlocked", out.error_type)
    assert.are.same({}, out.http)             -- the handler never ran
    out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    assert.are.equal("default", out.http[1].headers["X-Tenant"])   -- set by the middleware
  end)

  it("gives the handler the default context and the fields the test sets", function()
    local seen
    local app = testing.load(function()
      local ep = require("nimbus").endpoint("Ctx")
      ep:on("T", function(_, ctx) seen = { ctx.event_id, ctx.session_id, ctx.retry_count, ctx.kind, ctx.enqueued_at } end)
    end, { now = 1764680000 })
    testing.assert_completed(app:send("Ctx", "T", {}, { retry_count = 2, kind = "retry" }))
    assert.are.same({ "test-event-1", "test-session", 2, "retry", "2025-12-02T12:53:20.000Z" }, seen)
  end)
end)

describe("nimbus.testing: fake http", function()
  it("passes the request to a function and returns its response", function()
    local seen
    local app = load_erp(function(req)
      seen = req
      return { status = 200, headers = { ETag = "v1" }, json = { id = 99 } }
    end)
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1", Name = "Ada" })
    testing.assert_completed(out)
    assert.are.equal("PUT", seen.method)
    assert.are.same({ name = "Ada" }, seen.json)
    assert.are.equal(99, out.published[1].payload.ErpId)
  end)

  it("lets a fake fail like the real client: nil, message, code", function()
    local app = load_erp(function() return nil, "Could not resolve host: erp.test", "ENOTFOUND" end)
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    testing.assert_failed(out, "ERP unreachable: Could not resolve host: erp.test %(ENOTFOUND%)")
  end)

  it("answers an unconfigured URL with ECONNREFUSED", function()
    local app = load_erp({})
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    testing.assert_failed(out, "ERP unreachable: no fake response for PUT http://erp.test/customers/A1 %(ECONNREFUSED%)")
    assert.are.equal(1, #out.http)   -- the attempt is still recorded
  end)

  it("can be replaced between sends", function()
    local app = load_erp({})
    testing.assert_failed(app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" }))
    app:set_http(happy_erp())
    testing.assert_completed(app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" }))
  end)

  it("raises in the test (not in the handler) when the fake itself is broken", function()
    local app = load_erp(function() error("oops in the fake") end)
    local ok, err = pcall(app.send, app, "ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    assert.is_false(ok)
    assert.matches("^nimbus.testing: the fake http response for PUT http://erp.test/customers/A1 raised: "
                   .. ".*testing_spec.lua:%d+: oops in the fake$", err)
  end)
end)

describe("nimbus.testing: sleep, publish, spawn", function()
  it("records nimbus.sleep and moves the fake clock instead of waiting", function()
    local calls = 0
    local app = load_erp(function()
      calls = calls + 1
      if calls == 1 then return { status = 503, headers = { ["Retry-After"] = "120" } } end
      return { status = 200, json = { id = 5 } }
    end, 1000)
    local started = os.time()
    local out = app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    testing.assert_completed(out)
    assert.are.equal(120, out.slept)
    assert.are.same({ 120 }, out.sleeps)
    assert.are.equal(1120, app.clock)
    assert.are.equal(2, #out.http)
    assert.is_true(os.time() - started < 5)
  end)

  it("makes waiting calls fail where the host makes them fail", function()
    local app = testing.load(function()
      local nimbus = require("nimbus")
      local ep = nimbus.endpoint("W")
      ep:on("InSort", function() table.sort({ 3, 1, 2 }, function(a, b) nimbus.sleep(0); return a < b end) end)
      ep:on("InCoroutine", function() coroutine.wrap(function() nimbus.sleep(1) end)() end)
    end)
    testing.assert_failed(app:send("W", "InSort", {}), "cannot wait here")
    testing.assert_failed(app:send("W", "InCoroutine", {}), "not from a coroutine created inside one")
    assert.has_error(function()
      testing.load(function() require("nimbus").sleep(1) end)
    end)
  end)

  it("discards the publishes of a handler that fails, like the host", function()
    local app = load_erp({ ["POST " .. ERP .. "/dmf/jobs"] = { status = 202, json = { queued = true } } })
    local out = app:send("ErpEndpoint", "CrmAccountImported", { AccountId = "A1" })
    testing.assert_failed(out, "ERP returned no job id")
    assert.are.same({}, out.published)
    assert.are.equal(1, #out.discarded)
    assert.are.equal("ErpImportRequested", out.discarded[1].type)
  end)

  it("runs spawned tasks after the handler; their publishes are sent at once", function()
    local app = load_erp()
    local out = app:send("ErpEndpoint", "CrmAccountDeleted", { AccountId = "A1" })
    testing.assert_completed(out)
    assert.are.equal("DELETE", out.http[1].method)
    assert.are.equal("ErpCustomerArchived", out.published[1].type)
    assert.are.same({}, out.spawn_errors)

    app:set_http({})
    out = app:send("ErpEndpoint", "CrmAccountDeleted", { AccountId = "A1" })
    testing.assert_completed(out)             -- the event does not wait for the spawned task
    assert.are.equal(1, #out.spawn_errors)
    assert.matches("archive failed: no fake response", out.spawn_errors[1])
    assert.are.same({}, out.published)
  end)

  it("records log lines with the endpoint and event prefix", function()
    local out = load_erp():send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" }, { event_id = "e-42" })
    assert.are.same({ { level = "info", message = "[ErpEndpoint e-42] customer created account=A1 count=1" } }, out.logs)
  end)
end)

describe("nimbus.testing: status checkers", function()
  local function pending()
    return {
      { event_id = "e1", session_id = "A1", message_id = "m1", external_job_id = "DMF-1", payload = { AccountId = "A1" } },
      { event_id = "e2", session_id = "A2", message_id = "m2", external_job_id = "DMF-2", payload = { AccountId = "A2" } },
      { event_id = "e3", session_id = "A3", message_id = "m3", external_job_id = "DMF-3", payload = { AccountId = "A3" } },
    }
  end
  local jobs = {
    ["GET " .. ERP .. "/dmf/jobs/DMF-1"] = { json = { state = "Succeeded", recordId = 4711 } },
    ["GET " .. ERP .. "/dmf/jobs/DMF-2"] = { json = { state = "Failed", reason = "invalid postal code" } },
    ["GET " .. ERP .. "/dmf/jobs/DMF-3"] = { json = { state = "Running" } },
  }

  it("records the hand-offs a checker completes and fails", function()
    local app = load_erp(jobs)
    local run = app:run_checker("ErpEndpoint", "dmf-jobs", { pending = pending() })
    assert.is_nil(run.error)
    assert.are.equal(1, #run.completed)
    assert.are.equal("e1", run.completed[1].h.event_id)
    assert.are.same({ importedRecordId = 4711, account = "A1" }, run.completed[1].result)
    assert.are.equal(1, #run.failed)
    assert.are.same({ "e2", "DMF rejected: invalid postal code", "DmfValidationError" },
                    { run.failed[1].h.event_id, run.failed[1].text, run.failed[1].type })
    assert.are.equal(3, #run.http)            -- e3 was asked about and left pending
  end)

  it("reports a checker that raises, with what it did before", function()
    local app = load_erp({ ["GET " .. ERP .. "/dmf/jobs/DMF-1"] = jobs["GET " .. ERP .. "/dmf/jobs/DMF-1"] })
    local run = app:run_checker("ErpEndpoint", "dmf-jobs", { pending = pending() })
    assert.matches("DMF status unavailable: no fake response for GET http://erp.test/dmf/jobs/DMF%-2", run.error)
    assert.matches("traceback", run.error_stack)
    assert.are.equal(1, #run.completed)
    assert.matches("checker ErpEndpoint/dmf%-jobs failed", run.logs[#run.logs].message)
  end)

  it("settles a hand-off once: a second settle returns nil, message, ESTATE", function()
    local results
    local app = testing.load(function()
      local ep = require("nimbus").endpoint("Twice")
      ep:checker("c", { every = 1 }, function(chk)
        local h = chk:pending_handoffs()[1]
        results = { pack = table.pack(chk:complete(h, { n = 1 })), again = table.pack(chk:fail(h, "late")),
                    unknown = table.pack(chk:complete({ event_id = "nope" })), left = #chk:pending_handoffs() }
      end)
    end)
    local run = app:run_checker("Twice", "c", { pending = { { event_id = "e1", session_id = "s" } } })
    assert.is_nil(run.error)
    assert.is_true(results.pack[1])
    assert.are.same({ nil, "ESTATE" }, { results.again[1], results.again[3] })
    assert.are.same({ nil, "ENOTFOUND" }, { results.unknown[1], results.unknown[3] })
    assert.are.equal(0, results.left)
    assert.are.equal(1, #run.completed)
    assert.are.same({}, run.failed)
  end)

  it("names the checkers there are when asked for an unknown one", function()
    assert.has_error(function() load_erp():run_checker("ErpEndpoint", "nope") end,
      'app:run_checker: endpoint ErpEndpoint has no checker "nope" (it has: dmf-jobs)')
  end)
end)

describe("nimbus.testing: isolation", function()
  it("gives every load its own nimbus: endpoints and adapter state are not shared", function()
    local a, b = load_erp(), load_erp()      -- the same file twice: no "already defined"
    a:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    local out = b:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    assert.matches("count=1", out.logs[1].message)  -- b's counter did not see a's send
    assert.are_not.equal(a.nimbus, b.nimbus)

    local lookup = testing.load(LOOKUP_ADAPTER)
    assert.is_nil(lookup.endpoints.ErpEndpoint)
    assert.has_error(function() lookup:send("ErpEndpoint", "CrmAccountCreated", {}) end,
      'app:send: the adapter declares no endpoint "ErpEndpoint" (it declares: LookupEndpoint)')
  end)

  it("loads an adapter that registers lifecycle hooks (nimbus.on) and counts them in app.hooks", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write([[
local nimbus = require("nimbus")
nimbus.endpoint("Ep", {}):on("T", function() end)
nimbus.on("event_failed", function() end)
nimbus.on("event_failed", function() end)
nimbus.on("session_blocked", function() end)
]])
    f:close()
    local app = testing.load(path)
    os.remove(path)
    assert.are.same({ event_failed = 2, session_blocked = 1 }, app.hooks)
  end)

  it("leaves package.loaded and package.preload as they were (the host's real modules)", function()
    -- stand-ins for the real modules a spec running inside nimbus-host has loaded
    local names = { "nimbus", "nimbus.http", "nimbus.core", "nimbus.extra" }
    local real, stand_in = {}, {}
    for _, n in ipairs(names) do
      real[n] = package.loaded[n]
      stand_in[n] = { stand_in_for = n }
      package.loaded[n] = stand_in[n]
    end
    local preload = package.preload["nimbus.core"]
    local ok, err = pcall(function()
      local app = load_erp()
      assert.are_not.equal(stand_in.nimbus, app.nimbus)           -- the adapter got a fresh nimbus
      testing.assert_completed(app:send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" }))
      app:run_checker("ErpEndpoint", "dmf-jobs", {})
      for _, n in ipairs(names) do assert.are.equal(stand_in[n], package.loaded[n], n) end
      assert.are.equal(preload, package.preload["nimbus.core"])
      assert.is_nil(package.loaded["nimbus.errors"])               -- loaded by the kit, not left behind
    end)
    for _, n in ipairs(names) do package.loaded[n] = real[n] end
    assert(ok, err)
  end)

  it("reports an adapter that fails to load", function()
    assert.has_error(function() testing.load(here .. "/fixtures/does_not_exist.lua") end)
    local ok, err = pcall(testing.load, function() error("bad config") end)
    assert.is_false(ok)
    assert.matches("the adapter raised an error: .*bad config", err)
  end)

  it("nimbus.sqlite: the real one inside the host, a clear error under plain lua5.4", function()
    local adapter = function() assert(require("nimbus").sqlite.open(":memory:")) end
    if package.preload["nimbus.sqlite.core"] then
      assert.has_no.errors(function() testing.load(adapter) end)
    else
      local ok, err = pcall(testing.load, adapter)
      assert.is_false(ok)
      assert.matches("run this spec inside the host: nimbus%-host %-l", err)
    end
  end)

  it("nimbus.crypto: the real one inside the host, a clear error under plain lua5.4", function()
    local digest
    local adapter = function() digest = require("nimbus").crypto.hex(require("nimbus").crypto.sha256("abc")) end
    if package.preload["nimbus.crypto.core"] then
      testing.load(adapter)
      assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", digest)
    else
      local ok, err = pcall(testing.load, adapter)
      assert.is_false(ok)
      assert.matches("nimbus.crypto is implemented in C by nimbus-host", err, 1, true)
      assert.matches("testing_spec.lua:%d+: nimbus.crypto", err)   -- at the adapter's line
    end
  end)
end)

describe("nimbus.testing: HTTP routes", function()
  it("drives the routes of nimbus.http.serve without a socket", function()
    local app = testing.load(LOOKUP_ADAPTER)
    local res = app:serve_request("GET", "/customers/c1")
    assert.are.same({ 404, { error = "unknown customer c1" } }, { res.status, res.json })

    res = app:serve_request("POST", "/customers", { json = { id = "c1", name = "Ada" } })
    assert.are.equal(201, res.status)
    assert.are.equal("CustomerSeen", res.published[1].type)   -- a route's publish is sent at once

    res = app:serve_request("GET", "/customers/c1?full=1")
    assert.are.same({ id = "c1", name = "Ada", full = true }, res.json)
    assert.are.equal("application/json", res.headers["Content-Type"])
    assert.are.equal(405, app:serve_request("DELETE", "/customers/c1").status)
  end)

  it("stops a background task that never ends instead of hanging", function()
    local app = testing.load(LOOKUP_ADAPTER)
    assert.are.equal(1, #app.startup.stopped)
    assert.are.same({}, app.startup.spawn_errors)
  end)
end)

describe("nimbus.testing: assertion helpers", function()
  it("fail with the outcome, its error and logs in the message", function()
    local out = load_erp({}):send("ErpEndpoint", "CrmAccountCreated", { AccountId = "A1" })
    local ok, err = pcall(testing.assert_completed, out)
    assert.is_false(ok)
    assert.matches("expected a completed outcome, got status failed: .*ERP unreachable", err)
    ok, err = pcall(testing.assert_failed, out, "something else")
    assert.is_false(ok)
    assert.matches('matching "something else"', err)
    ok, err = pcall(testing.assert_handoff, load_erp():send("ErpEndpoint", "CrmAccountImported", { AccountId = "A1" }),
                    { external_job_id = "DMF-2" })
    assert.is_false(ok)
    assert.matches("external_job_id = DMF%-2, got external_job_id = DMF%-1", err)
  end)
end)

describe("nimbus.testing: publish as the host does", function()
  -- An adapter whose handler publishes what the event says: { type, payload, mid, fail }.
  local function publisher()
    local results = {}
    local app = testing.load(function()
      local nimbus = require("nimbus")
      nimbus.endpoint("Pub"):on("Go", function(ev)
        local id, dup = nimbus.publish("Done", ev.raw or { n = ev.n }, { message_id = ev.mid })
        results[#results + 1] = { id, dup }
        if ev.fail then error("boom") end
      end)
    end)
    return app, results
  end

  it("records the message_id given in opts, returns it, and publishes an id once (a failed handler claims none)",
     function()
    local app, results = publisher()
    local out = testing.assert_completed(app:send("Pub", "Go", { n = 1, mid = "m-1" }))
    assert.are.same({ "m-1", false }, results[1])
    assert.are.equal("m-1", out.published[1].message_id)
    assert.are.equal("m-1", out.published[1].opts.message_id)

    out = testing.assert_completed(app:send("Pub", "Go", { n = 2, mid = "m-1" }))
    assert.are.same({ "m-1", true }, results[2])     -- a duplicate: nothing published
    assert.are.same({}, out.published)

    out = app:send("Pub", "Go", { n = 3, mid = "m-2", fail = true })
    assert.are.equal("failed", out.status)
    assert.are.equal("m-2", out.discarded[1].opts.message_id)
    out = testing.assert_completed(app:send("Pub", "Go", { n = 4, mid = "m-2" }))
    assert.are.same({ "m-2", false }, results[4])    -- the failed run did not claim m-2
    assert.are.equal(4, out.published[1].payload.n)

    out = testing.assert_completed(app:send("Pub", "Go", { n = 5 }))
    assert.matches("^test%-published%-%d+$", results[5][1])
    assert.is_nil(out.published[1].opts.message_id)
  end)

  it("claims a message_id at once outside a handler", function()
    local got = {}
    local app = testing.load(function()
      local nimbus = require("nimbus")
      got[1] = { nimbus.publish("Started", { n = 1 }, { message_id = "boot" }) }
      got[2] = { nimbus.publish("Started", { n = 2 }, { message_id = "boot" }) }
    end)
    assert.are.same({ { "boot", false }, { "boot", true } }, got)
    assert.are.equal(1, #app.startup.published)
    assert.are.equal(1, app.startup.published[1].payload.n)
  end)

  it("sends a payload given as JSON text byte for byte", function()
    local app = publisher()
    local raw = ' {"id":12345678901234567890,"tags":[],"o":{"x":-0.5e-7}} '
    local out = testing.assert_completed(app:send("Pub", "Go", { raw = raw }))
    assert.are.equal(raw, out.published[1].body)
  end)

  it("refuses JSON text that is not an object, at the handler's line", function()
    local app = publisher()
    for _, case in ipairs({
      { "[1,2]", 'a payload given as a string must be the JSON text of an object %({...}%), got "%[1,2%]"' },
      { "", 'a payload given as a string must be the JSON text of an object' },
      { '{"a":1', "the payload string is not valid JSON %(.+%): \"{\\\"a\\\":1\"" },
      { '{"a":1} x', "the payload string is not valid JSON" },
    }) do
      local out = app:send("Pub", "Go", { raw = case[1] })
      testing.assert_failed(out, "nimbus.publish: " .. case[2])
      assert.matches("testing_spec.lua:%d+: nimbus.publish", out.error_text)
      assert.are.same({}, out.discarded)
    end
  end)
end)

describe("nimbus.testing: transient errors with retry_after", function()
  local function raising(make)
    return testing.load(function()
      local nimbus = require("nimbus")
      nimbus.endpoint("E"):on("T", function() error(make(nimbus)) end)
    end)
  end

  it("report the least wait an error asks for, with its type", function()
    local out = raising(function(n) return n.transient("throttled", { type = "Throttled", retry_after = 30 }) end)
      :send("E", "T", {})
    testing.assert_transient(out, "^throttled$")
    assert.are.same({ "Throttled", 30 }, { out.error_type, out.retry_after })

    out = raising(function(n) return n.transient("busy", "Busy") end):send("E", "T", {})   -- as before
    assert.are.same({ "transient", "Busy" }, { out.status, out.error_type })
    assert.is_nil(out.retry_after)

    out = raising(function(n)   -- set on the error value: taken when it is seconds
      local e = n.transient("late")
      e.retry_after = 2.5
      return e
    end):send("E", "T", {})
    assert.are.equal(2.5, out.retry_after)
    out = raising(function(n)
      local e = n.transient("late")
      e.retry_after = "soon"
      return e
    end):send("E", "T", {})
    assert.are.same({ "transient", nil }, { out.status, out.retry_after })
    out = raising(function(n) return n.transient("x", { retry_after = 0 }) end):send("E", "T", {})
    assert.are.equal(0, out.retry_after)
  end)

  it("refuse bad options at the caller's line", function()
    for _, case in ipairs({
      { function(n) return n.transient("x", { retry_after = -1 }) end, "`retry_after` must be a number of seconds >= 0, got %-1" },
      { function(n) return n.transient("x", { retry_after = "30" }) end, "`retry_after` must be a number of seconds >= 0, got 30" },
      { function(n) return n.transient("x", { after = 1 }) end, "unknown option after %(options: { type = error_type, retry_after = seconds }%)" },
      { function(n) return n.transient("x", { type = 7 }) end, "`type` must be a string naming the failure, got number" },
      { function(n) return n.permanent("x", { retry_after = 1 }) end, "nimbus.permanent: the error type %(argument 2%) must be a string" },
    }) do
      local out = raising(case[1]):send("E", "T", {})
      testing.assert_failed(out, case[2])
      assert.matches("testing_spec.lua:%d+: nimbus%.", out.error_text)
    end
  end)
end)

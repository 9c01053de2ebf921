-- samples/crm-erp/erp_adapter.lua under nimbus.testing: the ErpEndpoint handlers, the
-- service-mode / processing-delay middleware, the error-mode guard, the hand-off branch,
-- the credit check reply, the credit-hold command and the DMF job poller, against a
-- fake ERP API (canned HTTP answers; nothing listens). The settlement itself (the roll, the
-- import) is the fake ERP API's: spec/host/erp_api_spec.lua.
local testing = require("nimbus.testing")
local cjson = require("cjson")

local here = debug.getinfo(1, "S").source:match("^@(.-)/?spec/host/[^/]*$")
if here == nil or here == "" then here = "." end
local SAMPLE = here .. "/samples/crm-erp"

local NULL = cjson.null
local ERP = "http://erp.test"
local NOW = 1764680000
local EP = "ErpEndpoint"
local A1 = "6f1c2d3e-0000-4000-8000-000000000a01"
local ERROR_MODE = "ERP is in error mode — handlers are configured to throw for every inbound message."

-- A fake ERP API: the knobs (all off by default), and whatever routes a test adds, keyed
-- "METHOD /path" (a response table, a status number, or a function(req)).
local function fake_erp(state)
  state.knobs = state.knobs or {}
  state.routes = state.routes or {}
  return function(req)
    local path = req.url:sub(#ERP + 1)
    local key = req.method .. " " .. path
    local r = state.routes[key]
    if r ~= nil then
      if type(r) == "function" then return r(req) end
      return r
    end
    local knob = path:match("^/api/admin/([%w%-]+)$")
    if req.method == "GET" and knob then
      if state.knobs[knob] == "down" then return nil, "connection refused", "ECONNREFUSED" end
      return { json = state.knobs[knob] or { enabled = false } }
    end
    return nil, "no fake ERP route for " .. key, "ECONNREFUSED"
  end
end

-- Loads the adapter through a function that puts the sample on package.path and calls
-- setup; an innermost middleware keeps what each handler returned (the reply tables).
local function load(state, roll)
  local replies, info = {}, {}
  local app = testing.load(function()
    package.path = SAMPLE .. "/?.lua;" .. SAMPLE .. "/?/init.lua;" .. package.path
    local mod = require("erp_adapter")
    local ep = mod.setup{ erp_url = ERP, checker_every = 1 }
    ep:use(function(_, ctx, next)
      local r = next()
      replies[ctx.event_id] = r
      return r
    end)
  end, { now = NOW, http = fake_erp(state) })
  return app, replies, info
end

local function calls(out, method, path)
  local list = {}
  for _, r in ipairs(out.http) do
    if r.method == method and r.url == ERP .. path then list[#list + 1] = r end
  end
  return list
end

local function urls(out)
  local list = {}
  for i, r in ipairs(out.http) do list[i] = r.method .. " " .. r.url:sub(#ERP + 1) end
  return list
end

local function account(over)
  local a = { AccountId = A1, LegalName = "Ada Ltd", TaxId = "DK123", CountryCode = "DK",
              CreatedAt = "2025-12-02T10:00:00.000Z" }
  for k, v in pairs(over or {}) do a[k] = v end
  return a
end

describe("ERP adapter: CrmAccountCreated", function()
  local state, app, roll
  before_each(function()
    state, roll = {}, { value = 0.5 }
    app = load(state, roll)
  end)

  it("upserts the customer by CRM account id with the event's fields (knobs read with a 2 s timeout)", function()
    state.routes["PUT /api/customers/by-crm/" .. A1] = { json = { id = "c1", customerNumber = "C-1" } }
    local out = app:send(EP, "CrmAccountCreated", account(), { session_id = A1 })
    testing.assert_completed(out)
    assert.same({ "GET /api/admin/service-mode", "GET /api/admin/processing-delay", "GET /api/admin/handoff-mode",
                  "GET /api/admin/error-mode", "PUT /api/customers/by-crm/" .. A1 }, urls(out))
    for i = 1, 4 do assert.equal(2, out.http[i].timeout) end
    local put = calls(out, "PUT", "/api/customers/by-crm/" .. A1)[1]
    assert.equal(NULL, put.json.erpCustomerId)
    assert.equal("Ada Ltd", put.json.legalName)
    assert.equal("DK123", put.json.taxId)
    assert.equal("DK", put.json.countryCode)
    assert.equal(0, out.slept)
  end)

  it("sends a null taxId when the event has none", function()
    state.routes["PUT /api/customers/by-crm/" .. A1] = { json = {} }
    local a = account()
    a.TaxId = nil
    testing.assert_completed(app:send(EP, "CrmAccountCreated", a))
    local out = app:send(EP, "CrmAccountCreated", a)
    assert.equal(NULL, calls(out, "PUT", "/api/customers/by-crm/" .. A1)[1].json.taxId)
  end)

  it("fails with the exact error-mode text and calls nothing else in error mode", function()
    state.knobs["error-mode"] = { enabled = true }
    local out = testing.assert_failed(app:send(EP, "CrmAccountCreated", account()))
    assert.equal(ERROR_MODE, out.error_text)
    assert.same({}, calls(out, "PUT", "/api/customers/by-crm/" .. A1))
  end)

  it("dead-letters every message in service mode (the session is not blocked)", function()
    state.knobs["service-mode"] = { enabled = true }
    local out = testing.assert_dead_lettered(app:send(EP, "CrmAccountCreated", account()),
                                             "^ERP is in service mode %(maintenance%)")
    assert.same({ "GET /api/admin/service-mode" }, urls(out))
    testing.assert_dead_lettered(app:send(EP, "ErpCreditCheckRequested", { AccountId = A1 }), "service mode")
    testing.assert_dead_lettered(app:send(EP, "PlaceCustomerOnCreditHold", { AccountId = A1 }), "service mode")
    testing.assert_dead_lettered(app:send(EP, "CrmContactDeleted", { ContactId = "k1" }), "service mode")
  end)

  it("sleeps the processing delay before the handler", function()
    state.knobs["processing-delay"] = { enabled = true, delayMs = 2500 }
    state.routes["PUT /api/customers/by-crm/" .. A1] = { json = {} }
    local out = testing.assert_completed(app:send(EP, "CrmAccountCreated", account()))
    assert.equal(2.5, out.slept)
    state.knobs["processing-delay"] = { enabled = false, delayMs = 2500 }
    assert.equal(0, app:send(EP, "CrmAccountCreated", account()).slept)
  end)

  it("counts a knob that cannot be read (down, timing out, non-2xx) as off", function()
    state.knobs["service-mode"] = "down"
    state.routes["GET /api/admin/error-mode"] = { delay = 5, json = { enabled = true } }   -- > 2 s timeout
    state.routes["GET /api/admin/handoff-mode"] = { status = 500, json = { enabled = true } }
    state.routes["GET /api/admin/processing-delay"] = { body = "not json" }
    state.routes["PUT /api/customers/by-crm/" .. A1] = { json = {} }
    testing.assert_completed(app:send(EP, "CrmAccountCreated", account()))
  end)

  it("dead-letters an event without LegalName before any API call (validation)", function()
    local a = account()
    a.LegalName = nil
    local out = testing.assert_dead_lettered(app:send(EP, "CrmAccountCreated", a))
    assert.equal("Validation failed: CrmAccountCreated.LegalName is required", out.error_text)
    assert.same({}, out.http)
  end)

  it("fails with the section 3 message on a non-2xx answer, the body cut at 500 characters", function()
    state.routes["PUT /api/customers/by-crm/" .. A1] = { status = 500, body = ("é"):rep(600) }
    local out = testing.assert_failed(app:send(EP, "CrmAccountCreated", account()))
    assert.equal("UpsertCustomerByCrmAccount failed: ERP API PUT /api/customers/by-crm/" .. A1
                 .. " → 500 Internal Server Error. Body: " .. ("é"):rep(500), out.error_text)
    state.routes["PUT /api/customers/by-crm/" .. A1] = { status = 400, json = { error = "legalName is required" } }
    out = testing.assert_failed(app:send(EP, "CrmAccountCreated", account()))
    assert.equal("UpsertCustomerByCrmAccount failed: ERP API PUT /api/customers/by-crm/" .. A1
                 .. ' → 400 Bad Request. Body: {"error":"legalName is required"}', out.error_text)
  end)

  it("fails with 'unreachable' when the ERP API cannot be reached", function()
    local out = testing.assert_failed(app:send(EP, "CrmAccountCreated", account()))
    assert.equal("UpsertCustomerByCrmAccount failed: ERP API PUT /api/customers/by-crm/" .. A1
                 .. " unreachable: no fake ERP route for PUT /api/customers/by-crm/" .. A1, out.error_text)
  end)

  describe("in hand-off mode", function()
    before_each(function()
      state.knobs["handoff-mode"] = { enabled = true, durationSeconds = 7, failureRate = 0.25 }
      state.routes["POST /api/internal/handoff-jobs"] = function(req) return { status = 201, json = req.json } end
    end)

    it("registers a DMF job and hands the event off (error mode ignored, no upsert)", function()
      state.knobs["error-mode"] = { enabled = true }
      local out = app:send(EP, "CrmAccountCreated", account(),
                           { event_id = "ev-1", message_id = "m-1", session_id = A1, correlation_id = "corr-1" })
      testing.assert_handoff(out, { reason = "Awaiting ERP DMF import job (demo)", expected_by = 7 })
      local id = out.handoff.external_job_id
      assert.equal(16, #id)
      assert.truthy(id:match("^DMF%-%x%x%x%x%x%x%x%x%x%x%x%x$"), id)
      assert.same({ "GET /api/admin/service-mode", "GET /api/admin/processing-delay", "GET /api/admin/handoff-mode",
                    "POST /api/internal/handoff-jobs" }, urls(out))
      local job = calls(out, "POST", "/api/internal/handoff-jobs")[1].json
      assert.equal("ev-1", job.eventId)
      assert.equal(A1, job.sessionId)
      assert.equal("m-1", job.messageId)
      assert.equal("m-1", job.originatingMessageId)
      assert.equal("CrmAccountCreated", job.eventTypeId)
      assert.equal("corr-1", job.correlationId)
      assert.equal(id, job.externalJobId)
      assert.equal(7, job.durationSeconds)
      assert.equal(os.date("!%Y-%m-%dT%H:%M:%S", NOW + 7) .. ".000Z", job.dueAt)
      assert.same(account(), cjson.decode(job.payloadJson))
    end)

    it("keeps the originating message id of a replayed or resubmitted event", function()
      local out = app:send(EP, "CrmAccountCreated", account(),
                           { message_id = "m-2", originating_message_id = "m-orig", kind = "resubmit" })
      testing.assert_handoff(out)
      assert.equal("m-orig", calls(out, "POST", "/api/internal/handoff-jobs")[1].json.originatingMessageId)
    end)

    it("gives a fresh job id each time", function()
      local a = app:send(EP, "CrmAccountCreated", account()).handoff.external_job_id
      local b = app:send(EP, "CrmAccountCreated", account()).handoff.external_job_id
      assert.are_not.equal(a, b)
    end)

    it("fails (does not hand off) when the job cannot be registered", function()
      state.routes["POST /api/internal/handoff-jobs"] = { status = 400, json = { error = "eventId is required" } }
      local out = testing.assert_failed(app:send(EP, "CrmAccountCreated", account()))
      assert.equal('RegisterHandoffJob failed: ERP API POST /api/internal/handoff-jobs → 400 Bad Request. Body: '
                   .. '{"error":"eventId is required"}', out.error_text)
      assert.is_nil(out.handoff)
    end)
  end)
end)

describe("ERP adapter: the other event handlers", function()
  local state, app
  before_each(function()
    state = {}
    app = load(state, { value = 0.5 })
  end)

  it("CrmAccountUpdated upserts with the event's ErpCustomerId", function()
    state.routes["PUT /api/customers/by-crm/" .. A1] = { json = {} }
    local out = testing.assert_completed(app:send(EP, "CrmAccountUpdated",
      { AccountId = A1, ErpCustomerId = "e-1", LegalName = "Ada 2", TaxId = NULL, CountryCode = "SE" }))
    local put = calls(out, "PUT", "/api/customers/by-crm/" .. A1)[1].json
    assert.same({ erpCustomerId = "e-1", legalName = "Ada 2", taxId = NULL, countryCode = "SE" }, put)
    out = testing.assert_completed(app:send(EP, "CrmAccountUpdated",
      { AccountId = A1, LegalName = "Ada 2", CountryCode = "SE" }))
    assert.equal(NULL, calls(out, "PUT", "/api/customers/by-crm/" .. A1)[1].json.erpCustomerId)
  end)

  it("CrmAccountDeleted soft-deletes by CRM account id", function()
    state.routes["POST /api/customers/by-crm/" .. A1 .. "/deleted"] = { json = { deleted = false } }
    local out = testing.assert_completed(app:send(EP, "CrmAccountDeleted", { AccountId = A1 }))
    assert.equal(1, #calls(out, "POST", "/api/customers/by-crm/" .. A1 .. "/deleted"))
  end)

  it("CrmContactCreated / Updated upsert the contact with the CRM account id", function()
    state.routes["PUT /api/contacts/upsert/k1"] = { json = {} }
    for _, t in ipairs({ "CrmContactCreated", "CrmContactUpdated" }) do
      local out = testing.assert_completed(app:send(EP, t,
        { ContactId = "k1", AccountId = A1, FirstName = "Ada", LastName = "Lovelace", Email = "ada@x.io" }))
      assert.same({ crmAccountId = A1, firstName = "Ada", lastName = "Lovelace", email = "ada@x.io", phone = NULL },
                  calls(out, "PUT", "/api/contacts/upsert/k1")[1].json)
    end
  end)

  it("CrmContactDeleted soft-deletes the contact", function()
    state.routes["POST /api/contacts/k1/deleted"] = { json = {} }
    local out = testing.assert_completed(app:send(EP, "CrmContactDeleted", { ContactId = "k1" }))
    assert.equal(1, #calls(out, "POST", "/api/contacts/k1/deleted"))
  end)

  it("every event handler and the command obey the error-mode guard", function()
    state.knobs["error-mode"] = { enabled = true }
    local cases = {
      CrmAccountUpdated = { AccountId = A1, LegalName = "Ada", CountryCode = "DK" },
      CrmAccountDeleted = { AccountId = A1 },
      CrmContactCreated = { ContactId = "k1", FirstName = "A", LastName = "B" },
      CrmContactUpdated = { ContactId = "k1", FirstName = "A", LastName = "B" },
      CrmContactDeleted = { ContactId = "k1" },
      PlaceCustomerOnCreditHold = { AccountId = A1, Reason = "late" },
    }
    for t, p in pairs(cases) do
      local out = testing.assert_failed(app:send(EP, t, p))
      assert.equal(ERROR_MODE, out.error_text, t)
      assert.equal(3, #out.http, t)   -- service mode, delay, error mode: nothing else
    end
  end)

  it("a contact upsert that the API refuses fails with its status", function()
    state.routes["PUT /api/contacts/upsert/k1"] = { status = 404, body = "" }
    local out = testing.assert_failed(app:send(EP, "CrmContactCreated", { ContactId = "k1", FirstName = "A", LastName = "B" }))
    assert.equal("UpsertContact failed: ERP API PUT /api/contacts/upsert/k1 → 404 Not Found. Body: ", out.error_text)
  end)
end)

describe("ERP adapter: PlaceCustomerOnCreditHold (command)", function()
  local state, app
  before_each(function()
    state = {}
    app = load(state, { value = 0.5 })
  end)

  it("places the hold with the reason", function()
    state.routes["PUT /api/customers/credit-hold/by-crm/" .. A1] = { json = { creditHold = true } }
    local out = testing.assert_completed(app:send(EP, "PlaceCustomerOnCreditHold",
      { AccountId = A1, Reason = "Requested from CRM", RequestedAt = "2025-12-02T10:00:00Z" }))
    assert.same({ reason = "Requested from CRM" }, calls(out, "PUT", "/api/customers/credit-hold/by-crm/" .. A1)[1].json)
    assert.same({}, out.published)
  end)

  it("completes with a warning when no customer is linked (404)", function()
    state.routes["PUT /api/customers/credit-hold/by-crm/" .. A1] = { status = 404, json = { error = "customer not found" } }
    local out = testing.assert_completed(app:send(EP, "PlaceCustomerOnCreditHold", { AccountId = A1 }))
    local warned = false
    for _, l in ipairs(out.logs) do
      if l.level == "warn" and l.message:find("credit hold not placed", 1, true) then warned = true end
    end
    assert.is_true(warned)
  end)

  it("fails on another non-2xx", function()
    state.routes["PUT /api/customers/credit-hold/by-crm/" .. A1] = { status = 503, body = "busy" }
    local out = testing.assert_failed(app:send(EP, "PlaceCustomerOnCreditHold", { AccountId = A1 }))
    assert.equal("PlaceCreditHold failed: ERP API PUT /api/customers/credit-hold/by-crm/" .. A1
                 .. " → 503 Service Unavailable. Body: busy", out.error_text)
  end)
end)

describe("ERP adapter: ErpCreditCheckRequested (request handler)", function()
  local state, app, replies
  before_each(function()
    state = {}
    app, replies = load(state, { value = 0.5 })
  end)

  local function check(customer, status)
    local route = "GET /api/customers/by-crm/" .. A1
    state.routes[route] = customer and { status = status or 200, json = customer } or { status = 404, json = { error = "customer not found" } }
    local out = testing.assert_completed(app:send(EP, "ErpCreditCheckRequested",
      { AccountId = A1, RequestedBy = "crm-web", RequestedAt = "2025-12-02T10:00:00Z" }))
    local reply = type(out.reply) == "table" and out.reply or replies[out.ctx.event_id]
    assert.is_table(reply)
    return reply, out
  end

  it("replies Active and approved for a customer in good standing", function()
    local r = check({ id = "c1", customerNumber = "C-251202-12345", isDeleted = false, creditHold = false })
    assert.equal(A1, r.AccountId)
    assert.is_true(r.Approved)
    assert.equal("Active", r.Status)
    assert.equal("C-251202-12345", r.CustomerNumber)
    assert.equal(os.date("!%Y-%m-%dT%H:%M:%S", NOW) .. ".000Z", r.CheckedAt)
  end)

  it("replies OnHold for a customer on credit hold", function()
    local r = check({ id = "c1", customerNumber = "C-1", isDeleted = false, creditHold = true })
    assert.equal("OnHold", r.Status)
    assert.is_false(r.Approved)
    assert.equal("C-1", r.CustomerNumber)
  end)

  it("replies Deleted for a soft-deleted customer (even on hold)", function()
    local r = check({ id = "c1", customerNumber = "C-1", isDeleted = true, creditHold = true })
    assert.equal("Deleted", r.Status)
    assert.is_false(r.Approved)
  end)

  it("replies NotFound without a customer number when there is no customer (404)", function()
    local r = check(nil)
    assert.equal("NotFound", r.Status)
    assert.is_false(r.Approved)
    assert.equal(NULL, r.CustomerNumber)
  end)

  it("has no error-mode guard", function()
    state.knobs["error-mode"] = { enabled = true }
    local r, out = check({ id = "c1", customerNumber = "C-1", isDeleted = false, creditHold = false })
    assert.equal("Active", r.Status)
    assert.same({}, calls(out, "GET", "/api/admin/error-mode"))
  end)

  it("fails (an error reply) on another non-2xx", function()
    state.routes["GET /api/customers/by-crm/" .. A1] = { status = 500, body = "db down" }
    local out = testing.assert_failed(app:send(EP, "ErpCreditCheckRequested", { AccountId = A1 }))
    assert.equal("GetCustomerByCrmAccount failed: ERP API GET /api/customers/by-crm/" .. A1
                 .. " → 500 Internal Server Error. Body: db down", out.error_text)
  end)
end)

describe("ERP adapter: the dmf-jobs status checker (adapters.job_poller)", function()
  local state, app
  local JOB = "DMF-0123456789ab"
  local JOB_PATH = "/api/internal/handoff-jobs/" .. JOB

  before_each(function()
    state = {}
    app = load(state, { value = 0.5 })
  end)

  local function row(id, event)
    return { event_id = event or "ev-1", session_id = A1, message_id = "m-1", event_type = "CrmAccountCreated",
             external_job_id = id or JOB, reason = "Awaiting ERP DMF import job (demo)", payload = account() }
  end

  local function job(st, over)
    local j = { eventId = "ev-1", externalJobId = JOB, state = st, dueAtMs = NOW * 1000 }
    for k, v in pairs(over or {}) do j[k] = v end
    return { json = j }
  end

  it("leaves a pending job pending, reading only its status", function()
    state.routes["GET " .. JOB_PATH] = job("pending")
    local run = app:run_checker(EP, "dmf-jobs", { pending = { row() } })
    assert.is_nil(run.error)
    assert.same({}, run.completed)
    assert.same({}, run.failed)
    assert.same({ "GET " .. JOB_PATH }, urls(run))
  end)

  it("completes a completed job with { importedRecordId = the job id }", function()
    state.routes["GET " .. JOB_PATH] = job("completed")
    local run = app:run_checker(EP, "dmf-jobs", { pending = { row() } })
    assert.same({}, run.failed)
    assert.equal(1, #run.completed)
    assert.equal("ev-1", run.completed[1].h.event_id)
    assert.same({ importedRecordId = JOB }, run.completed[1].result)
  end)

  it("fails a failed job with exactly its errorText, type DmfValidationError", function()
    for _, text in ipairs({ "DMF rejected: invalid postal code", "Erp upsert failed: LegalName is missing" }) do
      state.routes["GET " .. JOB_PATH] = job("failed", { errorText = text })
      local run = app:run_checker(EP, "dmf-jobs", { pending = { row() } })
      assert.same({}, run.completed)
      assert.equal(1, #run.failed)
      assert.equal(text, run.failed[1].text)
      assert.equal("DmfValidationError", run.failed[1].type)
    end
  end)

  it("fails a job the ERP API does not know (404)", function()
    state.routes["GET " .. JOB_PATH] = { status = 404, json = { error = "handoff job not found" } }
    local run = app:run_checker(EP, "dmf-jobs", { pending = { row() } })
    assert.equal(1, #run.failed)
    assert.equal("DMF job " .. JOB .. " is unknown to the ERP API", run.failed[1].text)
    assert.equal("DmfValidationError", run.failed[1].type)
    assert.same({ "GET " .. JOB_PATH }, urls(run))
  end)

  it("percent-encodes the job id in the status URL, and leaves a row without one alone", function()
    state.routes["GET /api/internal/handoff-jobs/DMF%201"] = job("completed")
    local nojob = row(nil, "ev-3")
    nojob.external_job_id = nil
    local run = app:run_checker(EP, "dmf-jobs", { pending = { row("DMF 1"), nojob } })
    assert.equal(1, #run.completed)
    assert.same({}, run.failed)
    assert.same({ "GET /api/internal/handoff-jobs/DMF%201" }, urls(run))
  end)

  it("leaves a row pending when the ERP API is down or answers garbage, and still checks the others", function()
    local other, odd = "DMF-ffffffffffff", "DMF-eeeeeeeeeeee"
    state.routes["GET /api/internal/handoff-jobs/" .. other] = { status = 404, json = {} }
    state.routes["GET /api/internal/handoff-jobs/" .. odd] = { status = 200, body = "<html>" }
    local run = app:run_checker(EP, "dmf-jobs", { pending = { row(), row(other, "ev-2"), row(odd, "ev-4") } })
    assert.is_nil(run.error)
    assert.same({}, run.completed)
    assert.equal(1, #run.failed)
    assert.equal("ev-2", run.failed[1].h.event_id)
    local warned = {}
    for _, l in ipairs(run.logs) do
      if l.level == "warn" then warned[#warned + 1] = l.message end
    end
    assert.equal(2, #warned)
  end)
end)

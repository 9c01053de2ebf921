-- The CRM, DataPlatform and AgentZone adapters of the CrmErpDemo sample
-- (samples/crm-erp/{crm_adapter,dataplatform,agentzone}.lua; docs/crm-erp-demo.md 3.2, 3.3, 7/07)
-- under nimbus.testing: the Crm.Api calls each handler makes, the failure texts, the
-- validation dead-letters, the DataPlatform sink, the AgentZone park and the enrichment
-- checker with its deterministic classifier.
local testing = require("nimbus.testing")
local cjson = require("cjson")

local src = debug.getinfo(1, "S").source:gsub("^@", "")
local here = src:match("^(.*)/[^/]*$") or "."
local sample = here .. "/../../samples/crm-erp"

local NULL = cjson.null
local CRM = "http://crm.test"
local ACC = "11111111-1111-4111-8111-111111111111"
local ERP = "22222222-2222-4222-8222-222222222222"
local CON = "33333333-3333-4333-8333-333333333333"

-- Loads one adapter module of the sample with setup(conf); returns the app and the module
-- (the app's own copy: module-level state such as crm_adapter.calls is fresh per app).
local function load(module, conf, opts)
  local mod
  local app = testing.load(function()
    package.path = sample .. "/?.lua;" .. package.path
    mod = require(module)
    mod.setup(conf)
  end, opts)
  return app, mod
end

local function ok_routes(extra)
  return function(req)
    if extra then
      local r = extra(req)
      if r ~= nil then return r end
    end
    return { status = 200, json = { ok = true } }
  end
end

local function customer_created(origin, over)
  local p = { Origin = origin, AccountId = ACC, ErpCustomerId = ERP, CustomerNumber = "C-1001",
              LegalName = "Acme Robotics", TaxId = "TAX-1", CountryCode = "US" }
  for k, v in pairs(over or {}) do p[k] = v end
  return p
end

local function find_log(out, pattern)
  for _, l in ipairs(out.logs) do
    if l.message:find(pattern) then return l end
  end
  return nil
end

describe("CrmEndpoint (crm_adapter)", function()
  local app, mod
  before_each(function()
    app, mod = load("crm_adapter", { crm_url = CRM .. "/" }, { http = ok_routes() })
  end)

  it("declares CrmEndpoint with the inbox on and 32 sessions", function()
    local ep = app.endpoints.CrmEndpoint
    assert.is_truthy(ep)
    assert.are.equal(true, ep.opts.inbox)
    assert.are.equal(32, ep.opts.concurrency)
    for _, t in ipairs({ "ErpCustomerCreated", "ErpCustomerUpdated", "ErpCustomerDeleted", "ErpContactCreated",
                         "ErpContactUpdated", "ErpContactDeleted", "PartnerLeadSubmitted" }) do
      assert.is_function(ep.handlers[t], t)
    end
  end)

  for _, origin in ipairs({ "Crm", 1, "crm", "1" }) do
    it("links the CRM account on ErpCustomerCreated with Origin " .. tostring(origin), function()
      local out = app:send("CrmEndpoint", "ErpCustomerCreated", customer_created(origin), { session_id = ACC })
      testing.assert_completed(out)
      assert.are.equal(1, #out.http)
      local req = out.http[1]
      assert.are.equal("POST", req.method)
      assert.are.equal(CRM .. "/api/accounts/" .. ACC .. "/link-erp", req.url)
      assert.are.same({ erpCustomerId = ERP, customerNumber = "C-1001" }, req.json)
      assert.matches("application/json", req.headers["Content-Type"], 1, true)
      assert.are.equal(1, mod.calls.total)
      assert.are.equal(1, mod.calls.LinkAccountToErp)
    end)
  end

  for _, origin in ipairs({ "Erp", 0, "erp" }) do
    it("upserts an Erp-origin account on ErpCustomerCreated with Origin " .. tostring(origin), function()
      local out = app:send("CrmEndpoint", "ErpCustomerCreated", customer_created(origin))
      testing.assert_completed(out)
      assert.are.equal(1, #out.http)
      local req = out.http[1]
      assert.are.equal("PUT", req.method)
      assert.are.equal(CRM .. "/api/accounts/external/" .. ERP, req.url)
      assert.are.same({ crmAccountId = NULL, legalName = "Acme Robotics", taxId = "TAX-1", countryCode = "US",
                        customerNumber = "C-1001" }, req.json)
      assert.are.equal(1, mod.calls.UpsertAccountFromErp)
    end)
  end

  it("sends taxId null when the event has none", function()
    local p = customer_created("Erp")
    p.TaxId = nil
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpCustomerCreated", p))
    assert.are.equal(NULL, out.http[1].json.taxId)
  end)

  it("dead-letters an Origin that is neither Crm nor Erp, without calling the API", function()
    local out = app:send("CrmEndpoint", "ErpCustomerCreated", customer_created("Partner"))
    testing.assert_dead_lettered(out, "ErpCustomerCreated%.Origin must be Crm")
    assert.are.equal(0, #out.http)
    assert.are.equal(0, mod.calls.total)
  end)

  it("fails (and so blocks the session) when link-erp answers 404", function()
    local path = "/api/accounts/" .. ACC .. "/link-erp"
    app:set_http({ ["POST " .. CRM .. path] = { status = 404, json = { error = "account not found" } } })
    local out = app:send("CrmEndpoint", "ErpCustomerCreated", customer_created("Crm"), { session_id = ACC })
    testing.assert_failed(out)
    assert.are.equal("LinkAccountToErp failed: CRM API POST " .. path
                     .. ' → 404 Not Found. Body: {"error":"account not found"}', out.error_text)
    assert.are.equal(1, mod.calls.total)
  end)

  it("keeps only the first 500 characters of an error body", function()
    app:set_http(function() return { status = 500, body = ("x"):rep(499) .. "yz" .. ("w"):rep(100) } end)
    local out = testing.assert_failed(app:send("CrmEndpoint", "ErpCustomerDeleted",
                                               { AccountId = ACC, ErpCustomerId = ERP, DeletedAt = "2025-01-01T00:00:00Z" }))
    assert.are.equal("DeleteAccountFromErp failed: CRM API POST /api/accounts/external/" .. ERP
                     .. "/deleted → 500 Internal Server Error. Body: " .. ("x"):rep(499) .. "y", out.error_text)
  end)

  it("names a status it has no reason phrase for", function()
    app:set_http(function() return { status = 418, body = "teapot" } end)
    local out = testing.assert_failed(app:send("CrmEndpoint", "ErpContactDeleted", { ContactId = CON }))
    assert.matches("→ 418 Unknown. Body: teapot$", out.error_text)
  end)

  it("fails with 'unreachable' when the API cannot be reached", function()
    app:set_http(function() return nil, "Connection refused", "ECONNREFUSED" end)
    local out = testing.assert_failed(app:send("CrmEndpoint", "ErpContactDeleted", { ContactId = CON }))
    assert.are.equal("DeleteContactFromErp failed: CRM API POST /api/contacts/" .. CON
                     .. "/deleted unreachable: Connection refused", out.error_text)
  end)

  it("fails with 'unreachable' on a timeout", function()
    app:set_http(function() return { status = 200, delay = 60 } end)
    local out = testing.assert_failed(app:send("CrmEndpoint", "ErpContactDeleted", { ContactId = CON }))
    assert.matches("unreachable: Timeout", out.error_text, 1, true)
  end)

  it("upserts the account with CrmAccountId on ErpCustomerUpdated", function()
    local other = "44444444-4444-4444-8444-444444444444"
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpCustomerUpdated",
      { AccountId = ACC, CrmAccountId = other, ErpCustomerId = ERP, CustomerNumber = "C-1001",
        LegalName = "Acme 2", TaxId = "TAX-2", CountryCode = "DK" }))
    local req = out.http[1]
    assert.are.equal("PUT", req.method)
    assert.are.equal(CRM .. "/api/accounts/external/" .. ERP, req.url)
    assert.are.same({ crmAccountId = other, legalName = "Acme 2", taxId = "TAX-2", countryCode = "DK",
                      customerNumber = "C-1001" }, req.json)
  end)

  it("falls back to AccountId when CrmAccountId is null or absent", function()
    for _, crm_id in ipairs({ NULL, "" }) do
      local out = testing.assert_completed(app:send("CrmEndpoint", "ErpCustomerUpdated",
        { AccountId = ERP, CrmAccountId = crm_id, ErpCustomerId = ERP, CustomerNumber = "C-7",
          LegalName = "Globex", CountryCode = "DK" }))
      assert.are.equal(ERP, out.http[1].json.crmAccountId)
      assert.are.equal(NULL, out.http[1].json.taxId)
    end
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpCustomerUpdated",
      { AccountId = ERP, ErpCustomerId = ERP, CustomerNumber = "C-7", LegalName = "Globex", CountryCode = "DK" }))
    assert.are.equal(ERP, out.http[1].json.crmAccountId)
  end)

  it("soft-deletes the account by ERP id on ErpCustomerDeleted", function()
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpCustomerDeleted",
      { AccountId = ACC, ErpCustomerId = ERP, DeletedAt = "2025-01-01T00:00:00Z" }))
    assert.are.equal(1, #out.http)
    assert.are.equal("POST", out.http[1].method)
    assert.are.equal(CRM .. "/api/accounts/external/" .. ERP .. "/deleted", out.http[1].url)
    assert.is_nil(out.http[1].body)
  end)

  for _, t in ipairs({ "ErpContactCreated", "ErpContactUpdated" }) do
    it("upserts the contact with origin Erp on " .. t, function()
      local out = testing.assert_completed(app:send("CrmEndpoint", t,
        { ContactId = CON, CustomerId = ERP, FirstName = "Ada", LastName = "Lovelace", Email = "ada@example.com",
          Phone = "+45 1234" }))
      local req = out.http[1]
      assert.are.equal("PUT", req.method)
      assert.are.equal(CRM .. "/api/contacts/upsert/" .. CON, req.url)
      assert.are.same({ id = CON, erpCustomerId = ERP, firstName = "Ada", lastName = "Lovelace",
                        email = "ada@example.com", phone = "+45 1234", origin = "Erp" }, req.json)
    end)
  end

  it("sends nulls for a contact without customer, email or phone", function()
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpContactCreated",
      { ContactId = CON, FirstName = "Ada", LastName = "Lovelace" }))
    assert.are.same({ id = CON, erpCustomerId = NULL, firstName = "Ada", lastName = "Lovelace", email = NULL,
                      phone = NULL, origin = "Erp" }, out.http[1].json)
  end)

  it("soft-deletes the contact on ErpContactDeleted", function()
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpContactDeleted",
      { ContactId = CON, DeletedAt = "2025-01-01T00:00:00Z" }))
    assert.are.equal("POST", out.http[1].method)
    assert.are.equal(CRM .. "/api/contacts/" .. CON .. "/deleted", out.http[1].url)
    assert.are.equal(1, mod.calls.DeleteContactFromErp)
  end)

  it("upserts a Partner contact on PartnerLeadSubmitted and drops CompanyName", function()
    local lead = "55555555-5555-4555-8555-555555555555"
    local out = testing.assert_completed(app:send("CrmEndpoint", "PartnerLeadSubmitted",
      { LeadId = lead, FirstName = "Grace", LastName = "Hopper", Email = "grace@partner.example",
        CompanyName = "Navy" }, { message_id = "ce-42", session_id = lead }))
    local req = out.http[1]
    assert.are.equal("PUT", req.method)
    assert.are.equal(CRM .. "/api/contacts/upsert/" .. lead, req.url)
    assert.are.same({ id = lead, erpCustomerId = NULL, firstName = "Grace", lastName = "Hopper",
                      email = "grace@partner.example", phone = NULL, origin = "Partner" }, req.json)
    assert.is_truthy(find_log(out, "partner lead received.*id=ce%-42.*type=PartnerLeadSubmitted"))
  end)

  it("percent-encodes odd characters in path ids", function()
    local out = testing.assert_completed(app:send("CrmEndpoint", "ErpContactDeleted", { ContactId = "a b/c" }))
    assert.are.equal(CRM .. "/api/contacts/a%20b%2Fc/deleted", out.http[1].url)
  end)

  describe("validation", function()
    local cases = {
      { "ErpCustomerCreated", customer_created("Crm", { CustomerNumber = "" }), "ErpCustomerCreated.CustomerNumber" },
      { "ErpCustomerCreated", { AccountId = ACC, ErpCustomerId = ERP, CustomerNumber = "C", LegalName = "L",
                                CountryCode = "US" }, "ErpCustomerCreated.Origin" },
      { "ErpCustomerUpdated", { AccountId = ACC, CustomerNumber = "C", LegalName = "L", CountryCode = "US" },
        "ErpCustomerUpdated.ErpCustomerId" },
      { "ErpCustomerDeleted", { AccountId = ACC }, "ErpCustomerDeleted.ErpCustomerId" },
      { "ErpContactCreated", { ContactId = CON, FirstName = "Ada" }, "ErpContactCreated.LastName" },
      { "ErpContactUpdated", { FirstName = "Ada", LastName = "L" }, "ErpContactUpdated.ContactId" },
      { "ErpContactDeleted", {}, "ErpContactDeleted.ContactId" },
      { "PartnerLeadSubmitted", { LeadId = "L1", LastName = "H" }, "PartnerLeadSubmitted.FirstName" },
    }
    for _, c in ipairs(cases) do
      it("dead-letters " .. c[3] .. " missing, without calling the API", function()
        local out = app:send("CrmEndpoint", c[1], c[2])
        testing.assert_dead_lettered(out, "^Validation failed: " .. c[3]:gsub("%.", "%%.") .. " is required$")
        assert.are.equal("ValidationError", out.error_type)
        assert.are.equal(0, #out.http)
        assert.are.equal(0, mod.calls.total)
      end)
    end
  end)

  it("counts every API call per operation (a re-run shows up in the counter)", function()
    app:send("CrmEndpoint", "ErpCustomerCreated", customer_created("Erp"))
    app:send("CrmEndpoint", "ErpCustomerCreated", customer_created("Erp"))
    app:send("CrmEndpoint", "ErpContactDeleted", { ContactId = CON })
    assert.are.equal(3, mod.calls.total)
    assert.are.equal(2, mod.calls.UpsertAccountFromErp)
    assert.are.equal(1, mod.calls.DeleteContactFromErp)
    mod.reset_calls()
    assert.are.same({ total = 0 }, mod.calls)
  end)

  it("starts every app with a fresh counter", function()
    assert.are.same({ total = 0 }, mod.calls)
  end)
end)

describe("DataPlatformEndpoint (dataplatform)", function()
  it("declares one session at a time", function()
    local app = load("dataplatform", { delay = 0 })
    assert.are.equal(1, app.endpoints.DataPlatformEndpoint.opts.concurrency)
  end)

  it("logs ErpCustomerCreated after the configured delay", function()
    local app = load("dataplatform", { delay = 10 })
    local out = testing.assert_completed(app:send("DataPlatformEndpoint", "ErpCustomerCreated",
                                                  customer_created(1), { session_id = ACC }))
    assert.are.equal(10, out.slept)
    assert.is_truthy(find_log(out, "ErpCustomerCreated.*accountId=" .. ACC:gsub("%-", "%%-")))
    assert.are.equal(0, #out.http)
  end)

  it("does not sleep with delay 0", function()
    local app = load("dataplatform", { delay = 0 })
    local out = testing.assert_completed(app:send("DataPlatformEndpoint", "ErpCustomerCreated", customer_created(0)))
    assert.are.equal(0, out.slept)
    assert.are.equal(0, #out.sleeps)
  end)

  it("defaults to a 10 s delay", function()
    local app = load("dataplatform", {})
    local out = testing.assert_completed(app:send("DataPlatformEndpoint", "ErpCustomerCreated", customer_created(0)))
    assert.are.equal(10, out.slept)
  end)

  it("logs an enriched contact", function()
    local app = load("dataplatform", { delay = 0 })
    local out = testing.assert_completed(app:send("DataPlatformEndpoint", "crm.contact.enriched.v1",
      { contactId = CON, industry = "Technology", leadScore = 42, rationale = "Deterministic classification." },
      { session_id = CON }))
    local l = find_log(out, "enriched contact")
    assert.is_truthy(l)
    assert.matches("contactId=" .. CON, l.message, 1, true)
    assert.matches("industry=Technology", l.message, 1, true)
    assert.matches("leadScore=42", l.message, 1, true)
    assert.matches("rationale=Deterministic classification.", l.message, 1, true)
  end)

  it("dead-letters an enriched contact without contactId or industry", function()
    local app = load("dataplatform", { delay = 0 })
    testing.assert_dead_lettered(app:send("DataPlatformEndpoint", "crm.contact.enriched.v1",
      { industry = "Retail", leadScore = 1 }), "crm%.contact%.enriched%.v1%.contactId is required")
    testing.assert_dead_lettered(app:send("DataPlatformEndpoint", "crm.contact.enriched.v1",
      { contactId = CON, leadScore = 1 }), "crm%.contact%.enriched%.v1%.industry is required")
    testing.assert_dead_lettered(app:send("DataPlatformEndpoint", "crm.contact.enriched.v1", "not json"))
  end)

  it("dead-letters an ErpCustomerCreated with a missing field", function()
    local app = load("dataplatform", { delay = 10 })
    local out = app:send("DataPlatformEndpoint", "ErpCustomerCreated", customer_created(0, { LegalName = "" }))
    testing.assert_dead_lettered(out, "ErpCustomerCreated%.LegalName is required")
    assert.are.equal(0, out.slept)
  end)
end)

describe("AgentZoneEndpoint (agentzone)", function()
  local app, mod
  before_each(function() app, mod = load("agentzone", { every = 1 }) end)

  local function contact(over)
    local p = { ContactId = CON, AccountId = NULL, FirstName = "Ada", LastName = "Agent-1764680000",
                Email = "ada.1764680000@techcorp.com", Phone = "+1-555-0142" }
    for k, v in pairs(over or {}) do p[k] = v end
    return p
  end

  it("parks CrmContactCreated as a hand-off awaiting agent pickup (no job id, no expectedBy)", function()
    local out = app:send("AgentZoneEndpoint", "CrmContactCreated", contact(), { session_id = CON })
    testing.assert_handoff(out, { reason = "Awaiting agent pickup" })
    assert.is_nil(out.handoff.external_job_id)
    assert.is_nil(out.handoff.expected_by)
    assert.are.equal(0, #out.published)
    assert.are.equal(0, #out.http)
  end)

  it("dead-letters a CrmContactCreated without ContactId", function()
    testing.assert_dead_lettered(app:send("AgentZoneEndpoint", "CrmContactCreated", contact({ ContactId = "" })),
                                 "CrmContactCreated%.ContactId is required")
  end)

  it("declares the enrichment checker with the configured interval", function()
    local ep = app.endpoints.AgentZoneEndpoint
    assert.are.equal(1, ep.checkers.enrichment.every)
    local app2 = load("agentzone", { every = 5 })
    assert.are.equal(5, app2.endpoints.AgentZoneEndpoint.checkers.enrichment.every)
  end)

  describe("classify", function()
    it("finds Technology in a techcorp email (scenario 07)", function()
      local r = mod.classify(contact())
      assert.are.equal("Technology", r.industry)
      assert.are.equal(CON, r.contactId)
      assert.are.equal("Deterministic classification for contact " .. CON .. ".", r.rationale)
    end)

    it("finds Financial Services in a bank email", function()
      assert.are.equal("Financial Services",
                       mod.classify(contact({ Email = "j.doe@bigbank.example", LastName = "Doe" })).industry)
    end)

    it("looks at the names too, case-insensitively", function()
      assert.are.equal("Healthcare", mod.classify(contact({ Email = NULL, FirstName = "Pat",
                                                            LastName = "MEDICAL-Supplies" })).industry)
      assert.are.equal("Media & Entertainment", mod.classify(contact({ Email = "x@Studio9.example",
                                                                       LastName = "Y" })).industry)
    end)

    it("takes the first hit of the ordered table", function()
      -- "shop" (Retail) and "cloud" (Technology): Technology comes first in the table
      assert.are.equal("Technology", mod.classify(contact({ Email = "shop@cloudy.example", LastName = "Z" })).industry)
    end)

    it("gives General Business without a keyword", function()
      assert.are.equal("General Business",
                       mod.classify({ ContactId = CON, FirstName = "Bob", LastName = "Smith",
                                      Email = "bob@example.com" }).industry)
      assert.are.equal("General Business", mod.classify({ ContactId = CON, FirstName = "Bob", LastName = "Smith" }).industry)
    end)

    it("scores with the 32-bit rolling hash mod 101", function()
      -- expected values computed independently (python: h = (h*31 + b) & 0xffffffff; h % 101)
      assert.are.equal(97, mod.classify({ ContactId = "a" }).leadScore)
      assert.are.equal(75, mod.classify({ ContactId = "ab" }).leadScore)
      assert.are.equal(32, mod.classify({ ContactId = "3f2504e0-4f89-11d3-9a0c-0305e82c3301" }).leadScore)
      assert.are.equal(28, mod.classify({ ContactId = "c0ffee00-0000-4000-8000-000000000001" }).leadScore)
    end)

    it("is deterministic and stays within 0..100", function()
      for i = 1, 200 do
        local id = ("%08x-0000-4000-8000-%012d"):format(i * 2654435761 % 0x100000000, i)
        local a, b = mod.classify({ ContactId = id }), mod.classify({ ContactId = id, FirstName = "other" })
        assert.are.equal(a.leadScore, b.leadScore)
        assert.is_true(math.type(a.leadScore) == "integer" and a.leadScore >= 0 and a.leadScore <= 100)
      end
    end)
  end)

  describe("enrichment checker", function()
    local function row(id, payload, over)
      local r = { event_id = "ev-" .. id, session_id = id, message_id = "msg-" .. id, event_type = "CrmContactCreated",
                  reason = "Awaiting agent pickup", payload = payload }
      for k, v in pairs(over or {}) do r[k] = v end
      return r
    end

    it("publishes crm.contact.enriched.v1 on the hand-off's session, then completes it", function()
      local other = "66666666-6666-4666-8666-666666666666"
      local run = app:run_checker("AgentZoneEndpoint", "enrichment", { pending = {
        row(CON, contact()),
        row(other, { ContactId = other, FirstName = "Jo", LastName = "Bank", Email = "jo@example.com" }),
      } })
      assert.is_nil(run.error)
      assert.are.equal(2, #run.published)
      local p = run.published[1]
      assert.are.equal("crm.contact.enriched.v1", p.type)
      assert.are.equal(CON, p.opts.session)
      assert.are.same({ contactId = CON, industry = "Technology", leadScore = mod.lead_score(CON),
                        rationale = "Deterministic classification for contact " .. CON .. "." }, p.payload)
      assert.are.equal(other, run.published[2].opts.session)
      assert.are.equal("Financial Services", run.published[2].payload.industry)

      assert.are.equal(2, #run.completed)
      assert.are.equal("ev-" .. CON, run.completed[1].h.event_id)
      assert.are.same({ industry = "Technology" }, run.completed[1].result)
      assert.are.same({ industry = "Financial Services" }, run.completed[2].result)
      assert.are.equal(0, #run.failed)
    end)

    it("uses the session as the contact id when the payload has none", function()
      local run = app:run_checker("AgentZoneEndpoint", "enrichment", { pending = {
        row(CON, { FirstName = "A", LastName = "B" }) } })
      assert.are.equal(CON, run.published[1].payload.contactId)
      assert.are.equal(1, #run.completed)
    end)

    it("leaves hand-offs of other event types alone", function()
      local run = app:run_checker("AgentZoneEndpoint", "enrichment", { pending = {
        row(CON, contact(), { event_type = "CrmContactUpdated" }) } })
      assert.are.equal(0, #run.published)
      assert.are.equal(0, #run.completed)
    end)

    it("fails a hand-off whose payload is not an object", function()
      local run = app:run_checker("AgentZoneEndpoint", "enrichment", { pending = { row(CON, "not json") } })
      assert.is_nil(run.error)
      assert.are.equal(0, #run.published)
      assert.are.equal(1, #run.failed)
      assert.are.equal("EnrichmentError", run.failed[1].type)
    end)

    it("does nothing without pending hand-offs", function()
      local run = app:run_checker("AgentZoneEndpoint", "enrichment", { pending = {} })
      assert.is_nil(run.error)
      assert.are.equal(0, #run.published)
    end)

    it("feeds a DataPlatform that accepts what it publishes", function()
      local run = app:run_checker("AgentZoneEndpoint", "enrichment", { pending = { row(CON, contact()) } })
      local dp = load("dataplatform", { delay = 0 })
      local p = run.published[1]
      testing.assert_completed(dp:send("DataPlatformEndpoint", p.type, p.payload, { session_id = p.opts.session }))
    end)
  end)
end)

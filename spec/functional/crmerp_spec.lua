-- The CrmErpDemo's ten end-to-end scenarios (docs/crm-erp-demo.md section 7), driven over the
-- fake APIs' REST routes and the nimbus-host CLI, as a user would.
local nh = require("nh")
local cjson = require("cjson")

local SRC = os.getenv("NIMBUS_SOURCE_DIR") or "."
local DEMO = SRC .. "/samples/crm-erp/demo.lua"
local WAIT = 30   -- seconds; the embedded transport needs far less than the original's 60

local sb, host, crm, erp, dbg

local function http(method, url, body)
  local bodyfile = sb:path("req.json")
  local outfile = sb:path("res.json")
  if body ~= nil then nh.write(bodyfile, cjson.encode(body)) end
  local cmd = ("curl -s -m 20 -o %s -w '%%{http_code}' -X %s -H 'content-type: application/json' %s %s"):format(
    nh.q(outfile), method, body ~= nil and ("--data-binary @" .. nh.q(bodyfile)) or "", nh.q(url))
  local p = io.popen(cmd)
  local code = tonumber(p:read("a"))
  p:close()
  local text = nh.read(outfile) or ""
  os.remove(outfile)
  local ok, decoded = pcall(cjson.decode, text)
  return code, ok and decoded or text
end

local function ok(method, url, body)
  local code, res = http(method, url, body)
  assert(code and code >= 200 and code < 300, ("%s %s -> %s %s"):format(method, url, tostring(code),
    type(res) == "table" and cjson.encode(res) or tostring(res)))
  return res
end

local function customer_for(account_id)
  local code, c = http("GET", erp .. "/api/customers/by-crm/" .. account_id)
  if code == 200 and not c.isDeleted then return c end
end

local function events(filters) return sb:events(filters) end
local function one(filters, status)
  for _, r in ipairs(events(filters)) do if not status or r.status == status then return r end end
end
local function wait(what, fn) return nh.eventually(fn, WAIT, what) end

local function reset()
  ok("PUT", erp .. "/api/admin/error-mode", { enabled = false })
  ok("PUT", erp .. "/api/admin/service-mode", { enabled = false })
  ok("PUT", erp .. "/api/admin/handoff-mode", { enabled = false, durationSeconds = 10, failureRate = 0 })
end

local function new_account(name, country)
  local a = ok("POST", crm .. "/api/accounts", { legalName = name, countryCode = country, taxId = "TAX-" .. name })
  assert.is_truthy(a.id)
  return a
end

setup(function()
  sb = nh.sandbox()
  host = sb:spawn(DEMO, { args = { "--no-reload" }, env = {
    CRM_API_PORT = "0", ERP_API_PORT = "0", DEMO_DEBUG_PORT = "0", DEMO_QUIET = "1", DATAPLATFORM_DELAY = "0",
    CHECKER_EVERY = "0.2", DEMO_DATA_DIR = sb.dir } })
  local log = host:log()
  crm, erp = log:match("CRM API (http://[%d%.:]+), ERP API (http://[%d%.:]+)")
  dbg = log:match("debug routes on (http://[%d%.:]+)")
  assert(crm and erp and dbg, "the demo did not log its URLs:\n" .. log)
end)

teardown(function() sb:cleanup() end)

before_each(function() reset() end)

describe("CrmErpDemo", function()
  it("01a: a CRM account reaches the ERP and is linked back", function()
    local a = new_account("Acme Robotics " .. os.time(), "US")
    local c = wait("the ERP customer", function() return customer_for(a.id) end)
    assert.are.equal(a.legalName, c.legalName)
    assert.are.equal(a.id, c.crmAccountId)
    local linked = wait("the CRM link", function()
      local acc = ok("GET", crm .. "/api/accounts/" .. a.id)
      return acc.erpCustomerId ~= cjson.null and acc.erpCustomerId and acc
    end)
    assert.are.equal(c.id, linked.erpCustomerId)
    assert.is_truthy(linked.erpCustomerNumber)
  end)

  it("01b: an ERP customer reaches the CRM", function()
    local c = ok("POST", erp .. "/api/customers", { legalName = "Globex Ltd " .. os.time(), countryCode = "DK" })
    assert.is_truthy(c.customerNumber)
    local acc = wait("the CRM account", function()
      for _, x in ipairs(ok("GET", crm .. "/api/accounts")) do
        if x.erpCustomerId == c.id and not x.isDeleted then return x end
      end
    end)
    assert.are.equal(c.legalName, acc.legalName)
    assert.are.equal("Erp", acc.origin)
    assert.are.equal(c.customerNumber, acc.erpCustomerNumber)
  end)

  it("02a: error mode fails and blocks; a resubmit recovers", function()
    ok("PUT", erp .. "/api/admin/error-mode", { enabled = true })
    local a = new_account("BadFlow Inc " .. os.time(), "GB")
    local failed = wait("the Failed event", function()
      return one({ endpoint = "ErpEndpoint", session = a.id }, "Failed")
    end)
    assert.matches("error mode", failed.error_text)
    assert.is_nil(customer_for(a.id))
    ok("PUT", erp .. "/api/admin/error-mode", { enabled = false })
    sb:cli_ok({ "resubmit", failed.event_id })
    local c = wait("the ERP customer", function() return customer_for(a.id) end)
    assert.are.equal(a.legalName, c.legalName)
    sb:wait_event(failed.event_id, "Completed")
  end)

  it("02b: service mode dead-letters without blocking; a resubmit recovers", function()
    ok("PUT", erp .. "/api/admin/service-mode", { enabled = true })
    local a = new_account("Quiet Drop Co " .. os.time(), "DE")
    local dead = wait("the DeadLettered event", function()
      return one({ endpoint = "ErpEndpoint", session = a.id }, "DeadLettered")
    end)
    assert.is_nil(customer_for(a.id))
    assert.is_nil(sb:session(a.id, "ErpEndpoint"), "the session is not blocked")
    ok("PUT", erp .. "/api/admin/service-mode", { enabled = false })
    sb:cli_ok({ "resubmit", dead.event_id })
    local c = wait("the ERP customer", function() return customer_for(a.id) end)
    assert.are.equal(a.legalName, c.legalName)
  end)

  it("03: a blocked session drains in order after the head is resubmitted", function()
    local name = "BatchCo-" .. os.time()
    local a = new_account(name, "SE")
    wait("the ERP customer", function() return customer_for(a.id) end)
    ok("PUT", erp .. "/api/admin/error-mode", { enabled = true })
    for i = 1, 3 do
      ok("PUT", crm .. "/api/accounts/" .. a.id, { legalName = name .. "-rev" .. i, countryCode = "SE" })
    end
    local head = wait("the Failed head", function() return one({ endpoint = "ErpEndpoint", session = a.id }, "Failed") end)
    wait("two Deferred siblings", function()
      return #nh.where(events({ endpoint = "ErpEndpoint", session = a.id }), "status", "Deferred") == 2
    end)
    ok("PUT", erp .. "/api/admin/error-mode", { enabled = false })
    sb:cli_ok({ "resubmit", head.event_id })
    wait("the last revision in the ERP", function()
      local c = customer_for(a.id)
      return c and c.legalName == name .. "-rev3"
    end)
    wait("nothing left Failed, Deferred or DeadLettered", function()
      for _, r in ipairs(events({ endpoint = "ErpEndpoint", session = a.id })) do
        if r.status ~= "Completed" then return false end
      end
      return true
    end)
    assert.are.equal(0, #events({ status = "unsupported" }))
  end)

  it("04: a pending hand-off parks the session and settles; the updates replay in order", function()
    ok("PUT", erp .. "/api/admin/handoff-mode", { enabled = true, durationSeconds = 3, failureRate = 0 })
    local name = "Handoff-Success-" .. os.time()
    local a = new_account(name, "US")
    local pending = wait("the Pending+Handoff event", function()
      local r = one({ endpoint = "ErpEndpoint", session = a.id }, "Pending")
      return r and r.sub_status == "Handoff" and r
    end)
    assert.is_truthy(pending.handoff_reason)
    assert.matches("^DMF%-%x+$", pending.external_job_id)
    assert.is_truthy(pending.expected_by)
    assert.is_nil(customer_for(a.id))
    ok("PUT", crm .. "/api/accounts/" .. a.id, { legalName = name .. "-rev1", countryCode = "US" })
    ok("PUT", crm .. "/api/accounts/" .. a.id, { legalName = name .. "-rev2", countryCode = "US" })
    wait("the customer with the last revision", function()
      local c = customer_for(a.id)
      return c and c.legalName == name .. "-rev2"
    end)
    wait("all Completed", function()
      local rows = events({ endpoint = "ErpEndpoint", session = a.id })
      if #rows < 3 then return false end
      for _, r in ipairs(rows) do if r.status ~= "Completed" then return false end end
      return true
    end)
  end)

  it("05: a failed hand-off is Failed with the DMF text; a skip unblocks", function()
    ok("PUT", erp .. "/api/admin/handoff-mode", { enabled = true, durationSeconds = 1, failureRate = 1.0 })
    local a = new_account("Handoff-Fail-" .. os.time(), "GB")
    local failed = wait("the Failed hand-off", function()
      return one({ endpoint = "ErpEndpoint", session = a.id }, "Failed")
    end)
    assert.matches("^DMF rejected:", failed.error_text)
    assert.is_nil(customer_for(a.id))
    sb:cli_ok({ "skip", failed.event_id })
    sb:wait_event(failed.event_id, "Skipped")
  end)

  it("06: a failed hand-off resubmitted with hand-off mode off imports the customer", function()
    ok("PUT", erp .. "/api/admin/handoff-mode", { enabled = true, durationSeconds = 1, failureRate = 1.0 })
    local a = new_account("Handoff-Resubmit-" .. os.time(), "FR")
    local failed = wait("the Failed hand-off", function()
      return one({ endpoint = "ErpEndpoint", session = a.id }, "Failed")
    end)
    assert.matches("^DMF rejected:", failed.error_text)
    ok("PUT", erp .. "/api/admin/handoff-mode", { enabled = false, durationSeconds = 3, failureRate = 0 })
    sb:cli_ok({ "resubmit", failed.event_id })
    local c = wait("the ERP customer", function() return customer_for(a.id) end)
    assert.are.equal(a.legalName, c.legalName)
    sb:wait_event(failed.event_id, "Completed")
  end)

  it("07: a new contact is parked for the agent, enriched and completed", function()
    local t = os.time()
    local contact = ok("POST", crm .. "/api/contacts", { firstName = "Ada", lastName = "Agent-" .. t,
      email = ("ada.%d@techcorp.com"):format(t), phone = "+1-555-0142" })
    wait("the enriched event on DataPlatform", function()
      local r = one({ endpoint = "DataPlatformEndpoint", session = contact.id }, "Completed")
      return r and r.event_type == "crm.contact.enriched.v1"
    end)
    wait("the AgentZone hand-off completed", function()
      return one({ endpoint = "AgentZoneEndpoint", session = contact.id }, "Completed")
    end)
    for _, r in ipairs(events({ endpoint = "AgentZoneEndpoint", session = contact.id })) do
      assert.are.equal("Completed", r.status)
    end
  end)

  it("08: a resubmit of a completed inbox event is Skipped/DuplicateDetected and calls no API", function()
    local c = ok("POST", erp .. "/api/customers", { legalName = "Dedup GmbH " .. os.time(), countryCode = "DE" })
    local row = wait("the completed CRM event", function()
      for _, r in ipairs(events({ endpoint = "CrmEndpoint", status = "completed" })) do
        if r.event_type == "ErpCustomerCreated" then
          local shown = sb:show(r.event_id)
          if shown.payload and shown.payload:find(c.id, 1, true) then return r end
        end
      end
    end)
    local acc = wait("the CRM account", function()
      for _, x in ipairs(ok("GET", crm .. "/api/accounts")) do if x.erpCustomerId == c.id then return x end end
    end)
    local audits = #ok("GET", crm .. "/api/audit/Account/" .. acc.id)
    local calls = ok("GET", dbg .. "/calls").total
    local refused = sb:cli({ "resubmit", row.event_id })
    assert.are.equal(2, refused.code, "a Completed event is resubmitted only with --force")
    assert.matches("add %-%-force", refused.err)
    sb:cli_ok({ "resubmit", row.event_id, "--force" })
    local skipped = sb:wait_event(row.event_id, "Skipped")
    assert.are.equal("DuplicateDetected", skipped.error_text)
    assert.are.equal(audits, #ok("GET", crm .. "/api/audit/Account/" .. acc.id))
    assert.are.equal(calls, ok("GET", dbg .. "/calls").total, "the CRM handler made no API call")
  end)

  it("09: request/reply credit checks: synced, unsynced, and a time-out in service mode", function()
    local a = new_account("CreditCheck Co " .. os.time(), "US")
    wait("the ERP customer", function() return customer_for(a.id) end)
    local code, r = http("POST", crm .. "/api/accounts/" .. a.id .. "/credit-check")
    assert.are.equal(200, code)
    assert.is_true(r.approved)
    assert.are.equal("Active", r.status)
    assert.is_truthy(r.customerNumber)

    local b = new_account("CreditCheck Unsynced " .. os.time(), "US")
    code, r = http("POST", crm .. "/api/accounts/" .. b.id .. "/credit-check")
    assert.are.equal(200, code)
    assert.is_truthy(r.status == "NotFound" or r.status == "Active", r.status)

    ok("PUT", erp .. "/api/admin/service-mode", { enabled = true })
    code = http("POST", crm .. "/api/accounts/" .. a.id .. "/credit-check")
    ok("PUT", erp .. "/api/admin/service-mode", { enabled = false })
    assert.are.equal(504, code)
  end)

  it("10: the credit-hold command puts the customer on hold", function()
    local a = new_account("HoldMe Ltd " .. os.time(), "GB")
    wait("the ERP customer", function() return customer_for(a.id) end)
    local _, r = http("POST", crm .. "/api/accounts/" .. a.id .. "/credit-check")
    assert.is_true(r.approved)
    local code = http("POST", crm .. "/api/accounts/" .. a.id .. "/credit-hold", { reason = "e2e credit hold" })
    assert.are.equal(202, code)
    wait("the credit hold", function() local c = customer_for(a.id) return c and c.creditHold == true end)
    local _, r2 = http("POST", crm .. "/api/accounts/" .. a.id .. "/credit-check")
    assert.is_false(r2.approved)
    assert.are.equal("OnHold", r2.status)
  end)
end)

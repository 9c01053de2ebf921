-- samples/crm-erp/fake/erp_api.lua inside the host: routes over real HTTP, the
-- transactional outbox, the knobs, alerts and the sqlite-persisted hand-off jobs.
local nimbus = require("nimbus")
local cjson = require("cjson")

local here = debug.getinfo(1, "S").source:match("^@(.-)/?spec/host/[^/]*$")
if here == nil or here == "" then here = "." end
package.path = here .. "/samples/crm-erp/?.lua;" .. package.path
local erp = require("fake.erp_api")

local NULL = cjson.null
local now = nimbus.now or require("nimbus.core").now

local function tmpdb()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".erp.db"
end

local function rmdb(p)
  for _, s in ipairs({ "", "-wal", "-shm" }) do os.remove(p .. s) end
end

-- Starts the API on a free port; fn(api, call, published) runs in a task. The outbox relay
-- publishes with nimbus.publish, and a spec has no store to publish to: nimbus.publish is
-- a recorder meanwhile (or extra.publish(type, payload, session), which may raise).
local function with_api(fn, extra)
  local path = extra and extra.db or tmpdb()
  local published = {}
  local record = extra and extra.publish
                 or function(t, p, s) published[#published + 1] = { type = t, payload = p, session = s } end
  local real_publish = nimbus.publish
  nimbus.publish = function(t, p, o)
    if type(p) == "string" then p = nimbus.json.decode(p) end   -- the relay publishes the row's JSON text
    record(t, p, o and o.session)
    assert(o and type(o.message_id) == "string", "the relay publishes with the row's message id")
    return o.message_id
  end
  local ok, err = pcall(nimbus.run, function()
    local o = { port = 0, db = path, outbox_every = 3600 }
    for k, v in pairs(extra or {}) do if k ~= "publish" then o[k] = v end end
    local api = assert(erp.start(o))
    local base = ("http://127.0.0.1:%d"):format(api.port)
    local function call(method, path_, body, raw)
      local res, e = nimbus.http.request{ method = method, url = base .. path_, timeout = 5,
        json = (not raw) and body or nil, body = raw and body or nil,
        headers = raw and { ["Content-Type"] = "application/json" } or nil }
      assert(res, e)
      return res.status, (res.body ~= "" and res:json() or nil), res
    end
    local fok, ferr = pcall(fn, api, call, published)
    api.close()
    if not fok then error(ferr, 0) end
  end)
  nimbus.publish = real_publish
  if not (extra and extra.keep) then rmdb(path) end
  if not ok then error(err, 0) end
end

local function outbox(db)
  return assert(db:rows("SELECT * FROM outbox_messages ORDER BY id"))
end

local function count(db, sql, ...)
  return assert(db:first("SELECT count(*) AS n FROM " .. sql, ...)).n
end

describe("fake ERP API: customers", function()
  it("creates, lists newest first, gets, updates and deletes customers, each event through the outbox", function()
    with_api(function(api, call, published)
      local st, a = call("POST", "/api/customers", { legalName = "Ada Ltd", taxId = "DK1", countryCode = "DK" })
      assert.are.equal(201, st)
      assert.matches("^C%-%d%d%d%d%d%d%-%d%d%d%d%d$", a.customerNumber)
      assert.are.equal(os.date("!%y%m%d"), a.customerNumber:sub(3, 8))
      assert.are.equal("Erp", a.origin)
      assert.are.equal(NULL, a.crmAccountId)
      assert.are.equal(NULL, a.updatedAt)
      assert.is_false(a.isDeleted)
      assert.is_false(a.creditHold)
      assert.matches("^%x+%-%x+%-4%x+%-[89ab]%x+%-%x+$", a.id)

      local _, b = call("POST", "/api/customers", { legalName = "Bob AS", countryCode = "NO",
                                                   customerNumber = "C-FIXED-1", id = "b-1" })
      assert.are.equal("C-FIXED-1", b.customerNumber)
      assert.are.equal("b-1", b.id)

      local st2, list = call("GET", "/api/customers")
      assert.are.equal(200, st2)
      assert.are.same({ "b-1", a.id }, { list[1].id, list[2].id })
      local st3, one = call("GET", "/api/customers/" .. a.id)
      assert.are.equal(200, st3)
      assert.are.same(a, one)
      assert.are.equal(404, (call("GET", "/api/customers/nope")))

      -- nothing is published before the dispatcher runs; the rows are pending
      assert.are.equal(0, #published)
      assert.are.equal(2, count(api.db, "outbox_messages WHERE dispatched_at IS NULL"))

      local st4, u = call("PUT", "/api/customers/" .. a.id, { legalName = "Ada Limited", taxId = "DK1",
                                                              countryCode = "DK" })
      assert.are.equal(200, st4)
      assert.are.equal("Ada Limited", u.legalName)
      assert.is_string(u.updatedAt)
      assert.are.equal(404, (call("PUT", "/api/customers/nope", { legalName = "x", countryCode = "DK" })))
      local st5, d = call("DELETE", "/api/customers/" .. a.id)
      assert.are.equal(200, st5)
      assert.is_true(d.isDeleted)
      assert.are.equal(404, (call("DELETE", "/api/customers/nope")))
      assert.are.equal(200, (call("DELETE", "/api/customers/" .. a.id)))   -- already deleted: no new event

      assert.are.equal(4, api.dispatch_outbox())
      assert.are.equal(0, api.dispatch_outbox())
      assert.are.same({ "ErpCustomerCreated", "ErpCustomerCreated", "ErpCustomerUpdated", "ErpCustomerDeleted" },
        { published[1].type, published[2].type, published[3].type, published[4].type })
      assert.are.same({ Origin = "Erp", AccountId = a.id, ErpCustomerId = a.id, CustomerNumber = a.customerNumber,
                        LegalName = "Ada Ltd", TaxId = "DK1", CountryCode = "DK" }, published[1].payload)
      assert.are.equal(a.id, published[1].session)
      assert.are.equal(NULL, published[2].payload.TaxId)
      assert.are.same({ AccountId = a.id, CrmAccountId = NULL, ErpCustomerId = a.id,
                        CustomerNumber = a.customerNumber, LegalName = "Ada Limited", TaxId = "DK1",
                        CountryCode = "DK" }, published[3].payload)
      assert.are.same({ AccountId = a.id, ErpCustomerId = a.id, DeletedAt = d.updatedAt }, published[4].payload)
      assert.are.equal(a.id, published[4].session)
      local rows = outbox(api.db)
      assert.are.equal(4, #rows)
      for _, r in ipairs(rows) do
        assert.is_string(r.dispatched_at)
        assert.is_string(r.message_id)
        assert.is_string(r.created_at)
      end

      -- audit: Created snapshot, one Updated row per changed field, Deleted; newest first
      local st6, au = call("GET", "/api/audit/Customer/" .. a.id)
      assert.are.equal(200, st6)
      assert.are.same({ "Deleted", "Updated", "Created" }, { au[1].action, au[2].action, au[3].action })
      assert.are.equal(3, #au)
      assert.are.same({ "legalName", "Ada Ltd", "Ada Limited" }, { au[2].fieldName, au[2].oldValue, au[2].newValue })
      local snap = cjson.decode(au[3].newValue)
      assert.are.equal("Ada Ltd", snap.legalName)
      assert.are.equal(a.customerNumber, snap.customerNumber)
      local _, none = call("GET", "/api/audit/Customer/nope")
      assert.are.same({}, none)
    end)
  end)

  it("keeps generated customer numbers unique and refuses a taken one with 409", function()
    local seq, i = { 12345, 12345, 12345, 23456 }, 0
    with_api(function(api, call)
      local _, a = call("POST", "/api/customers", { legalName = "A", countryCode = "DK" })
      local _, b = call("POST", "/api/customers", { legalName = "B", countryCode = "DK" })
      assert.are.equal("C-" .. os.date("!%y%m%d") .. "-12345", a.customerNumber)
      assert.are.equal("C-" .. os.date("!%y%m%d") .. "-23456", b.customerNumber)
      local st, e = call("POST", "/api/customers", { legalName = "C", countryCode = "DK",
                                                    customerNumber = a.customerNumber })
      assert.are.equal(409, st)
      assert.are.equal("customerNumber", e.field)
      assert.are.equal(2, count(api.db, "customers"))
      assert.are.equal(2, count(api.db, "outbox_messages"))
    end, { rand = function() i = i + 1 return seq[i] end })
  end)

  it("writes the entity and its outbox row in one transaction: a failing outbox insert leaves neither", function()
    with_api(function(api, call, published)
      assert(api.db:exec("CREATE TRIGGER boom BEFORE INSERT ON outbox_messages BEGIN SELECT RAISE(ABORT, 'boom'); END"))
      local st, e = call("POST", "/api/customers", { id = "c-tx", legalName = "Tx", countryCode = "DK" })
      assert.are.equal(500, st)
      assert.matches("boom", e.error)
      local _, c = call("POST", "/api/customers", { legalName = "Ok", countryCode = "DK" })   -- still 500
      assert.is_nil(c.id)
      assert.are.equal(0, count(api.db, "customers"))
      assert.are.equal(0, count(api.db, "audits"))
      assert.are.equal(0, count(api.db, "outbox_messages"))
      assert.are.equal(404, (call("GET", "/api/customers/c-tx")))

      assert(api.db:exec("DROP TRIGGER boom"))
      assert.are.equal(201, (call("POST", "/api/customers", { id = "c-tx", legalName = "Tx", countryCode = "DK" })))
      assert(api.db:exec("CREATE TRIGGER boom BEFORE INSERT ON outbox_messages BEGIN SELECT RAISE(ABORT, 'boom'); END"))
      assert.are.equal(500, (call("PUT", "/api/customers/c-tx", { legalName = "Changed", countryCode = "DK" })))
      local _, still = call("GET", "/api/customers/c-tx")
      assert.are.equal("Tx", still.legalName)
      assert.are.equal(1, count(api.db, "audits"))
      api.dispatch_outbox()
      assert.are.equal(1, #published)
    end)
  end)

  it("answers 400 with the field for invalid JSON and missing required fields", function()
    with_api(function(api, call)
      local st, e = call("POST", "/api/customers", "{oops", true)
      assert.are.equal(400, st)
      assert.matches("JSON", e.error)
      st, e = call("POST", "/api/customers", { countryCode = "DK" })
      assert.are.same({ 400, "legalName" }, { st, e.field })
      st, e = call("POST", "/api/customers", { legalName = "  ", countryCode = "DK" })
      assert.are.same({ 400, "legalName" }, { st, e.field })
      st, e = call("POST", "/api/customers", { legalName = "A" })
      assert.are.same({ 400, "countryCode" }, { st, e.field })
      st, e = call("PUT", "/api/customers/by-crm/x", { legalName = "A" })
      assert.are.same({ 400, "countryCode" }, { st, e.field })
      st, e = call("POST", "/api/contacts", { firstName = "Ada" })
      assert.are.same({ 400, "lastName" }, { st, e.field })
      st, e = call("PUT", "/api/contacts/upsert/x", { lastName = "L" })
      assert.are.same({ 400, "firstName" }, { st, e.field })
      st = call("POST", "/api/contacts", "[1,2]", true)
      assert.are.equal(400, st)
      assert.are.equal(0, count(api.db, "customers"))
      assert.are.equal(0, count(api.db, "contacts"))
    end)
  end)
end)

describe("fake ERP API: by-crm routes", function()
  it("upserts by CRM account id: the insert publishes ErpCustomerCreated (Origin Crm), the update nothing", function()
    with_api(function(api, call, published)
      local st, c = call("PUT", "/api/customers/by-crm/crm-1", { legalName = "Ada", taxId = "T1", countryCode = "DK" })
      assert.are.equal(200, st)
      assert.are.equal("crm-1", c.crmAccountId)
      assert.are.equal("Crm", c.origin)
      assert.matches("^C%-%d+%-%d%d%d%d%d$", c.customerNumber)
      local st2, c2 = call("PUT", "/api/customers/by-crm/crm-1", { legalName = "Ada 2", countryCode = "SE" })
      assert.are.equal(200, st2)
      assert.are.same({ c.id, "Ada 2", NULL, "SE", c.customerNumber },
        { c2.id, c2.legalName, c2.taxId, c2.countryCode, c2.customerNumber })
      -- found by erpCustomerId when no customer has the crm id yet: links it
      local _, e = call("POST", "/api/customers", { id = "erp-9", legalName = "Eve", countryCode = "DK" })
      local _, linked = call("PUT", "/api/customers/by-crm/crm-9", { erpCustomerId = "erp-9", legalName = "Eve",
                                                                    countryCode = "DK" })
      assert.are.same({ "erp-9", "crm-9", "Erp" }, { linked.id, linked.crmAccountId, linked.origin })

      assert.are.equal(2, api.dispatch_outbox())
      assert.are.equal(2, #published)
      assert.are.equal("ErpCustomerCreated", published[1].type)
      assert.are.same({ Origin = "Crm", AccountId = "crm-1", ErpCustomerId = c.id, CustomerNumber = c.customerNumber,
                        LegalName = "Ada", TaxId = "T1", CountryCode = "DK" }, published[1].payload)
      assert.are.equal("crm-1", published[1].session)
      assert.are.equal(e.id, published[2].payload.ErpCustomerId)

      local st3, got = call("GET", "/api/customers/by-crm/crm-1")
      assert.are.equal(200, st3)
      assert.are.equal(c.id, got.id)
      assert.are.equal(404, (call("GET", "/api/customers/by-crm/none")))
      local _, au = call("GET", "/api/audit/Customer/" .. c.id)
      assert.are.equal(4, #au)   -- Created + legalName, taxId, countryCode
    end)
  end)

  it("puts a customer on credit hold without an event, and soft-deletes by CRM id without one", function()
    with_api(function(api, call, published)
      local _, c = call("PUT", "/api/customers/by-crm/crm-2", { legalName = "Hold", countryCode = "DK" })
      local st, h = call("PUT", "/api/customers/credit-hold/by-crm/crm-2", { reason = "late payer" })
      assert.are.equal(200, st)
      assert.is_true(h.creditHold)
      assert.is_string(h.updatedAt)
      local st2, h2 = call("PUT", "/api/customers/credit-hold/by-crm/crm-2", {})
      assert.are.equal(200, st2)
      assert.are.equal(h.updatedAt, h2.updatedAt)   -- already on hold: no change
      assert.are.equal(404, (call("PUT", "/api/customers/credit-hold/by-crm/none", {})))
      local _, au = call("GET", "/api/audit/Customer/" .. c.id)
      assert.are.same({ "Updated", "creditHold", "false", "true" },
        { au[1].action, au[1].fieldName, au[1].oldValue, au[1].newValue })

      assert.are.equal(200, (call("POST", "/api/customers/by-crm/none/deleted")))
      local st3, d = call("POST", "/api/customers/by-crm/crm-2/deleted")
      assert.are.equal(200, st3)
      assert.is_true(d.isDeleted)
      assert.are.equal(1, count(api.db, "outbox_messages"))   -- only the by-crm insert
      api.dispatch_outbox()
      assert.are.same({ "ErpCustomerCreated" }, { published[1].type, published[2] })
    end)
  end)
end)

describe("fake ERP API: contacts", function()
  it("creates, updates and deletes contacts with ErpContact* events keyed by ContactId", function()
    with_api(function(api, call, published)
      local st, c = call("POST", "/api/contacts", { customerId = "cu-1", firstName = "Ada", lastName = "Lovelace",
                                                   email = "ada@example.com" })
      assert.are.equal(201, st)
      assert.are.same({ "Erp", "cu-1", NULL, false }, { c.origin, c.customerId, c.phone, c.isDeleted })
      local _, c2 = call("POST", "/api/contacts", { id = "k-2", firstName = "Bob", lastName = "B" })
      local _, list = call("GET", "/api/contacts")
      assert.are.same({ "k-2", c.id }, { list[1].id, list[2].id })
      assert.are.equal(200, (call("GET", "/api/contacts/" .. c.id)))
      assert.are.equal(404, (call("GET", "/api/contacts/none")))
      local st2, u = call("PUT", "/api/contacts/" .. c.id, { customerId = "cu-1", firstName = "Ada", lastName = "King",
                                                             email = "ada@example.com", phone = "+45 1" })
      assert.are.equal(200, st2)
      assert.are.same({ "King", "+45 1" }, { u.lastName, u.phone })
      assert.are.equal(404, (call("PUT", "/api/contacts/none", { firstName = "a", lastName = "b" })))
      local st3, d = call("DELETE", "/api/contacts/" .. c2.id)
      assert.are.equal(200, st3)
      assert.is_true(d.isDeleted)
      assert.are.equal(404, (call("DELETE", "/api/contacts/none")))

      assert.are.equal(4, api.dispatch_outbox())
      assert.are.same({ "ErpContactCreated", "ErpContactCreated", "ErpContactUpdated", "ErpContactDeleted" },
        { published[1].type, published[2].type, published[3].type, published[4].type })
      assert.are.same({ ContactId = c.id, CustomerId = "cu-1", FirstName = "Ada", LastName = "Lovelace",
                        Email = "ada@example.com", Phone = NULL }, published[1].payload)
      assert.are.equal(c.id, published[1].session)
      assert.are.equal("King", published[3].payload.LastName)
      assert.are.same({ ContactId = "k-2", DeletedAt = d.updatedAt }, published[4].payload)
      assert.are.equal("k-2", published[4].session)

      local _, au = call("GET", "/api/audit/ErpContact/" .. c.id)
      assert.are.same({ "Updated", "Updated", "Created" }, { au[1].action, au[2].action, au[3].action })
      assert.are.equal(3, #au)
    end)
  end)

  it("upserts a contact mapping crmAccountId to the local customer, without an event", function()
    with_api(function(api, call, published)
      local _, cust = call("PUT", "/api/customers/by-crm/crm-7", { legalName = "Owner", countryCode = "DK" })
      local st, c = call("PUT", "/api/contacts/upsert/k-7", { crmAccountId = "crm-7", firstName = "Cy", lastName = "D" })
      assert.are.equal(200, st)
      assert.are.same({ "k-7", cust.id, "Crm" }, { c.id, c.customerId, c.origin })
      local _, c2 = call("PUT", "/api/contacts/upsert/k-7", { crmAccountId = "crm-unknown", firstName = "Cy",
                                                             lastName = "E" })
      assert.are.same({ NULL, "E", "Crm" }, { c2.customerId, c2.lastName, c2.origin })
      assert.are.equal(200, (call("POST", "/api/contacts/none/deleted")))
      local _, d = call("POST", "/api/contacts/k-7/deleted")
      assert.is_true(d.isDeleted)
      api.dispatch_outbox()
      assert.are.equal(1, #published)   -- the by-crm customer insert only
      assert.are.equal("ErpCustomerCreated", published[1].type)
      local _, au = call("GET", "/api/audit/ErpContact/k-7")
      assert.are.same({ "Deleted", "Created" }, { au[1].action, au[#au].action })
    end)
  end)
end)

describe("fake ERP API: outbox dispatcher", function()
  it("publishes pending rows in order from its own task and marks them dispatched", function()
    with_api(function(api, call, published)
      for i = 1, 3 do call("POST", "/api/customers", { id = "o-" .. i, legalName = "N" .. i, countryCode = "DK" }) end
      local deadline = now() + 10
      while #published < 3 and now() < deadline do nimbus.sleep(0.02) end
      assert.are.same({ "o-1", "o-2", "o-3" },
        { published[1].session, published[2].session, published[3].session })
      while count(api.db, "outbox_messages WHERE dispatched_at IS NULL") > 0 and now() < deadline do
        nimbus.sleep(0.02)
      end
      assert.are.equal(0, count(api.db, "outbox_messages WHERE dispatched_at IS NULL"))
    end, { outbox_every = 0.05 })
  end)

  it("keeps a row pending when publish fails and sends it, still in order, on the next pass", function()
    local fail = true
    local got = {}
    with_api(function(api, call)
      call("POST", "/api/customers", { id = "p-1", legalName = "A", countryCode = "DK" })
      call("POST", "/api/customers", { id = "p-2", legalName = "B", countryCode = "DK" })
      assert.are.equal(0, api.dispatch_outbox())
      assert.are.equal(2, count(api.db, "outbox_messages WHERE dispatched_at IS NULL"))
      fail = false
      assert.are.equal(2, api.dispatch_outbox())
      assert.are.same({ "p-1", "p-2" }, got)
    end, { publish = function(_, p, s)
      if fail then error("broker down") end
      got[#got + 1] = s
    end })
  end)
end)

describe("fake ERP API: knobs and alerts", function()
  it("has the section 4 defaults and validates every knob", function()
    with_api(function(_, call)
      local _, sm = call("GET", "/api/admin/service-mode")
      assert.is_false(sm.enabled)
      assert.is_string(sm.changedAt)
      local _, em = call("GET", "/api/admin/error-mode")
      assert.is_false(em.enabled)
      local _, pd = call("GET", "/api/admin/processing-delay")
      assert.are.same({ false, 2000 }, { pd.enabled, pd.delayMs })
      local _, hm = call("GET", "/api/admin/handoff-mode")
      assert.are.same({ false, 5, 0 }, { hm.enabled, hm.durationSeconds, hm.failureRate })

      local st, s2 = call("PUT", "/api/admin/service-mode", { enabled = true })
      assert.are.same({ 200, true }, { st, s2.enabled })
      assert.is_string(s2.changedAt)
      assert.is_true(select(2, call("GET", "/api/admin/service-mode")).enabled)
      assert.is_true(select(2, call("PUT", "/api/admin/error-mode", { enabled = true })).enabled)
      assert.is_true(select(2, call("GET", "/api/admin/error-mode")).enabled)

      for _, d in ipairs({ 99, 100001, "x" }) do
        local s, e = call("PUT", "/api/admin/processing-delay", { enabled = true, delayMs = d })
        assert.are.same({ 400, "delayMs" }, { s, e.field })
      end
      local s3, p3 = call("PUT", "/api/admin/processing-delay", { enabled = true, delayMs = 100 })
      assert.are.same({ 200, true, 100 }, { s3, p3.enabled, p3.delayMs })
      assert.are.equal(100000, select(2, call("PUT", "/api/admin/processing-delay", { delayMs = 100000 })).delayMs)

      for _, bad in ipairs({ { durationSeconds = 0, failureRate = 0 }, { durationSeconds = 601, failureRate = 0 },
                             { failureRate = 0.5 } }) do
        local s, e = call("PUT", "/api/admin/handoff-mode", bad)
        assert.are.same({ 400, "durationSeconds" }, { s, e.field })
      end
      for _, r in ipairs({ -0.1, 1.5 }) do
        local s, e = call("PUT", "/api/admin/handoff-mode", { durationSeconds = 3, failureRate = r })
        assert.are.same({ 400, "failureRate" }, { s, e.field })
      end
      local s4, h4 = call("PUT", "/api/admin/handoff-mode", { enabled = true, durationSeconds = 600, failureRate = 1 })
      assert.are.same({ 200, true, 600, 1 }, { s4, h4.enabled, h4.durationSeconds, h4.failureRate })
      assert.is_string(h4.changedAt)
      local _, h5 = call("GET", "/api/admin/handoff-mode")
      assert.are.same({ true, 600, 1 }, { h5.enabled, h5.durationSeconds, h5.failureRate })
      local s6 = call("PUT", "/api/admin/handoff-mode", { enabled = false, durationSeconds = 1, failureRate = 0.25 })
      assert.are.equal(200, s6)
      assert.are.equal(400, (call("PUT", "/api/admin/service-mode", "nope", true)))
    end)
  end)

  it("collects webhook alerts newest first, keeps 50 and clears them with 204", function()
    with_api(function(_, call)
      local _, empty = call("GET", "/api/admin/alerts")
      assert.are.same({}, empty)
      local st = call("POST", "/api/webhooks/notifications", { severity = "Error", title = "Message failed",
        message = "m", eventId = "e1", eventTypeId = "CrmAccountCreated", messageId = "m1", correlationId = "c1",
        errorDetails = "boom" })
      assert.are.equal(202, st)
      for i = 2, 55 do call("POST", "/api/webhooks/notifications", { severity = "Critical", title = "t" .. i }) end
      local _, list = call("GET", "/api/admin/alerts")
      assert.are.equal(50, #list)
      assert.are.equal("t55", list[1].title)
      assert.are.equal("t6", list[50].title)
      assert.is_string(list[1].receivedAt)
      local st2, body = call("DELETE", "/api/admin/alerts")
      assert.are.equal(204, st2)
      assert.is_nil(body)
      assert.are.same({}, select(2, call("GET", "/api/admin/alerts")))
    end)
  end)
end)

describe("fake ERP API: hand-off jobs", function()
  local function job(over)
    local j = { eventId = "ev-1", sessionId = "crm-h", messageId = "msg-1", eventTypeId = "CrmAccountCreated",
                correlationId = "corr-1", externalJobId = "DMF-1", durationSeconds = 3,
                payloadJson = cjson.encode({ AccountId = "crm-h", LegalName = "Handoff Ltd", TaxId = "T9",
                                             CountryCode = "DK", CreatedAt = "2025-12-02T10:00:00Z" }) }
    for k, v in pairs(over or {}) do j[k] = v end
    for k, v in pairs(j) do if v == NULL then j[k] = nil end end   -- NULL: leave the field out
    return j
  end

  it("exports the five DMF rejection texts", function()
    assert.are.equal(5, #erp.DMF_REJECTIONS)
    for _, t in ipairs(erp.DMF_REJECTIONS) do assert.matches("^DMF rejected: ", t) end
    assert.are.equal("DmfValidationError", erp.DMF_ERROR_TYPE)
  end)

  it("registers, replaces by eventId, lists pending jobs and keeps them across a restart", function()
    local path = tmpdb()
    with_api(function(_, call)
      local t0 = now()
      local st, j = call("POST", "/api/internal/handoff-jobs", job())
      assert.are.equal(201, st)
      assert.are.same({ "ev-1", "DMF-1", "pending", "msg-1", "crm-h", NULL },
        { j.eventId, j.externalJobId, j.state, j.originatingMessageId, j.sessionId, j.errorText })
      assert.is_true(math.abs(j.dueAtMs - (t0 + 3) * 1000) < 2000)
      assert.is_string(j.registeredAt)
      -- a resubmit registers the same eventId again: the job is replaced
      local _, j2 = call("POST", "/api/internal/handoff-jobs",
        job({ externalJobId = "DMF-2", durationSeconds = NULL, dueAt = "2000-01-01T00:00:00Z",
              originatingMessageId = "orig-1" }))
      assert.are.same({ "DMF-2", 946684800000, "2000-01-01T00:00:00.000Z", "orig-1" },
        { j2.externalJobId, j2.dueAtMs, j2.dueAt, j2.originatingMessageId })
      call("POST", "/api/internal/handoff-jobs", job({ eventId = "ev-2", externalJobId = "DMF-3",
                                                      dueAt = "2999-01-01T01:00:00+01:00", durationSeconds = NULL }))
      local _, list = call("GET", "/api/internal/handoff-jobs")
      assert.are.same({ "DMF-2", "DMF-3" }, { list[1].externalJobId, list[2].externalJobId, list[3] })
      local _, due = call("GET", "/api/internal/handoff-jobs?due=true")
      assert.are.same({ "DMF-2" }, { due[1].externalJobId, due[2] })
      assert.are.equal(404, (call("GET", "/api/internal/handoff-jobs/DMF-1")))
      local s, e = call("POST", "/api/internal/handoff-jobs", job({ durationSeconds = NULL }))
      assert.are.same({ 400, "dueAt" }, { s, e.field })
      s, e = call("POST", "/api/internal/handoff-jobs", job({ eventId = NULL }))
      assert.are.same({ 400, "eventId" }, { s, e.field })
    end, { db = path, keep = true })

    with_api(function(api, call)
      local st, j = call("GET", "/api/internal/handoff-jobs/DMF-3")
      assert.are.equal(200, st)
      assert.are.same({ "ev-2", "pending", 32472144000000 }, { j.eventId, j.state, j.dueAtMs })
      local _, list = call("GET", "/api/internal/handoff-jobs")
      assert.are.equal(2, #list)
      assert.are.equal(2, count(api.db, "handoff_jobs"))
    end, { db = path })
  end)

  it("applies a job: inserts the customer (Origin Crm) with its outbox row, completes the job", function()
    with_api(function(api, call, published)
      call("POST", "/api/internal/handoff-jobs", job())
      local st, r = call("POST", "/api/internal/handoff-jobs/DMF-1/apply")
      assert.are.equal(200, st)
      assert.are.equal("DMF-1", r.importedRecordId)
      local _, c = call("GET", "/api/customers/by-crm/crm-h")
      assert.are.same({ r.customerId, "Crm", "Handoff Ltd", "T9", "DK" },
        { c.id, c.origin, c.legalName, c.taxId, c.countryCode })
      local _, j = call("GET", "/api/internal/handoff-jobs/DMF-1")
      assert.are.equal("completed", j.state)
      assert.are.same({}, select(2, call("GET", "/api/internal/handoff-jobs")))
      assert.are.equal(1, api.dispatch_outbox())
      assert.are.same({ Origin = "Crm", AccountId = "crm-h", ErpCustomerId = c.id, CustomerNumber = c.customerNumber,
                        LegalName = "Handoff Ltd", TaxId = "T9", CountryCode = "DK" }, published[1].payload)
      assert.are.equal("crm-h", published[1].session)
      -- applying again (a checker that crashed before settling) is idempotent: same customer, no event
      local st2, r2 = call("POST", "/api/internal/handoff-jobs/DMF-1/apply")
      assert.are.same({ 200, c.id }, { st2, r2.customerId })
      assert.are.equal(1, count(api.db, "outbox_messages"))
      assert.are.equal(409, (call("POST", "/api/internal/handoff-jobs/DMF-1/fail", { errorText = "x" })))
      assert.are.equal(404, (call("POST", "/api/internal/handoff-jobs/none/apply")))
    end)
  end)

  it("applies a job to an existing customer by updating the three fields, without an event", function()
    with_api(function(api, call)
      local _, c = call("PUT", "/api/customers/by-crm/crm-h", { legalName = "Old", countryCode = "SE" })
      call("POST", "/api/internal/handoff-jobs", job())
      local st, r = call("POST", "/api/internal/handoff-jobs/DMF-1/apply")
      assert.are.same({ 200, c.id }, { st, r.customerId })
      local _, c2 = call("GET", "/api/customers/" .. c.id)
      assert.are.same({ "Handoff Ltd", "T9", "DK", c.customerNumber },
        { c2.legalName, c2.taxId, c2.countryCode, c2.customerNumber })
      assert.are.equal(1, count(api.db, "outbox_messages"))   -- the by-crm insert only
    end)
  end)

  it("fails a job with its error text, refuses to apply it, and reports a bad payload as an upsert failure", function()
    with_api(function(api, call)
      call("POST", "/api/internal/handoff-jobs", job())
      local st, j = call("POST", "/api/internal/handoff-jobs/DMF-1/fail", { errorText = erp.DMF_REJECTIONS[2] })
      assert.are.equal(200, st)
      assert.are.same({ "failed", "DMF rejected: duplicate customer number" }, { j.state, j.errorText })
      local _, g = call("GET", "/api/internal/handoff-jobs/DMF-1")
      assert.are.equal("failed", g.state)
      assert.are.same({}, select(2, call("GET", "/api/internal/handoff-jobs")))
      assert.are.equal(409, (call("POST", "/api/internal/handoff-jobs/DMF-1/apply")))
      assert.are.equal(0, count(api.db, "customers"))
      assert.are.equal(404, (call("POST", "/api/internal/handoff-jobs/none/fail", { errorText = "x" })))

      -- a resubmit re-registers the same eventId: pending again
      call("POST", "/api/internal/handoff-jobs", job({ externalJobId = "DMF-9", payloadJson = '{"LegalName":"x"}' }))
      local st2, e = call("POST", "/api/internal/handoff-jobs/DMF-9/apply")
      assert.are.equal(422, st2)
      assert.matches("^Erp upsert failed: AccountId", e.error)
      assert.are.equal("pending", select(2, call("GET", "/api/internal/handoff-jobs/DMF-9")).state)
      assert.are.equal(0, count(api.db, "customers"))
    end)
  end)
  it("settles a due job when it is read: the roll under the CURRENT failure rate fails it with a DMF text", function()
    local r = 0.59
    with_api(function(api, call)
      assert.are.equal(200, (call("PUT", "/api/admin/handoff-mode", { enabled = true, durationSeconds = 1,
                                                                     failureRate = 0.1 })))
      call("POST", "/api/internal/handoff-jobs", job({ durationSeconds = NULL, dueAt = "2999-01-01T00:00:00Z" }))
      assert.are.equal("pending", select(2, call("GET", "/api/internal/handoff-jobs/DMF-1")).state)   -- not due
      call("POST", "/api/internal/handoff-jobs", job({ durationSeconds = NULL, dueAt = "2000-01-01T00:00:00Z" }))
      -- the rate changed after the registration: the one at settlement counts
      call("PUT", "/api/admin/handoff-mode", { enabled = false, durationSeconds = 1, failureRate = 0.6 })
      local st, j = call("GET", "/api/internal/handoff-jobs/DMF-1")
      assert.are.same({ 200, "failed" }, { st, j.state })
      local known = false
      for _, t in ipairs(erp.DMF_REJECTIONS) do known = known or t == j.errorText end
      assert.is_true(known, j.errorText)
      assert.are.equal(0, count(api.db, "customers"))
      -- settled once: reading again does not roll again
      r = 0.99
      assert.are.same({ "failed", j.errorText }, { select(2, call("GET", "/api/internal/handoff-jobs/DMF-1")).state,
                                                   select(2, call("GET", "/api/internal/handoff-jobs/DMF-1")).errorText })
    end, { roll = function() return r end })
  end)

  it("settles a due job when it is read: a roll at or over the rate imports the customer and completes", function()
    with_api(function(api, call, published)
      call("PUT", "/api/admin/handoff-mode", { enabled = true, durationSeconds = 1, failureRate = 0.25 })
      call("POST", "/api/internal/handoff-jobs", job({ durationSeconds = NULL, dueAt = "2000-01-01T00:00:00Z" }))
      local _, j = call("GET", "/api/internal/handoff-jobs/DMF-1")
      assert.are.same({ "completed", NULL }, { j.state, j.errorText })
      local _, c = call("GET", "/api/customers/by-crm/crm-h")
      assert.are.same({ "Crm", "Handoff Ltd" }, { c.origin, c.legalName })
      assert.are.equal(1, api.dispatch_outbox())
      assert.are.same({ "ErpCustomerCreated", "crm-h" }, { published[1].type, published[1].session })

      -- an import that cannot run fails the job with "Erp upsert failed: ..."
      call("POST", "/api/internal/handoff-jobs", job({ eventId = "ev-2", externalJobId = "DMF-2", durationSeconds = NULL,
                                                      dueAt = "2000-01-01T00:00:00Z", payloadJson = '{"LegalName":"x"}' }))
      local _, j2 = call("GET", "/api/internal/handoff-jobs/DMF-2")
      assert.are.same({ "failed", "Erp upsert failed: AccountId is missing from the payload" }, { j2.state, j2.errorText })
    end, { roll = function() return 0.25 end })
  end)
end)

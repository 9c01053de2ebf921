-- The fake Crm.Api of the CrmErpDemo sample (samples/crm-erp/fake/crm_api.lua) over real
-- HTTP inside the host: each test starts the API on a free port with a fresh sqlite file,
-- a recording publish function and (for the credit check) a fake request function.
local nimbus = require("nimbus")
local cjson = require("cjson")

local src = debug.getinfo(1, "S").source:gsub("^@", "")
local here = src:match("^(.*)/[^/]*$") or "."
local repo = here .. "/../.."
package.path = repo .. "/samples/crm-erp/?.lua;" .. package.path
local crm = require("fake.crm_api")

local NULL = cjson.null
local GUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

local tmp = os.tmpname()
os.remove(tmp)
local seq = 0

-- Runs fn(t) inside the loop with a started API. t.call(method, path, body) -> status,
-- decoded body (or the raw string), response; t.published: the recorded publishes.
local function with_api(opts, fn)
  if fn == nil then fn, opts = opts, {} end
  seq = seq + 1
  local db = ("%s-crm-%d.db"):format(tmp, seq)
  local t = { published = {} }
  local api
  local function publish(event_type, payload, session)
    if opts.publish_error then error(opts.publish_error) end
    if opts.publish_returns then return nil, opts.publish_returns end
    -- published after the commit: the row is already visible to a reader
    local id = payload.ContactId or payload.AccountId
    local tbl = payload.ContactId and "contacts" or "accounts"
    t.published[#t.published + 1] = { type = event_type, payload = payload, session = session,
      committed = api.db:first("SELECT id FROM " .. tbl .. " WHERE id = ?", id) ~= nil }
  end
  local request = opts.request
  if opts.no_request then request = nil end
  local ok, err = pcall(nimbus.run, function()
    api = assert(crm.start{ port = 0, db = db, publish = publish, request = request })
    t.api = api
    local base = ("http://127.0.0.1:%d"):format(api.port)
    function t.call(method, path, body, raw)
      local res = assert(nimbus.http.request{ method = method, url = base .. path, json = body, body = raw,
        headers = raw and { ["Content-Type"] = "application/json" } or nil, timeout = 10 })
      local decoded = res.body ~= "" and res:json() or nil
      return res.status, decoded == nil and res.body or decoded, res
    end
    function t.audit(etype, id)
      local st, rows = t.call("GET", ("/api/audit/%s/%s"):format(etype, id))
      assert.are.equal(200, st)
      return rows
    end
    local fok, ferr = pcall(fn, t)
    api.close()
    if not fok then error(ferr, 0) end
  end)
  for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. suffix) end
  if not ok then error(err, 0) end
end

local function new_account(t, body)
  local st, a = t.call("POST", "/api/accounts", body or { legalName = "Contoso Ltd", taxId = "DK123", countryCode = "DK" })
  assert.are.equal(201, st)
  return a
end

local function count(list, pred)
  local n = 0
  for _, x in ipairs(list) do if pred(x) then n = n + 1 end end
  return n
end

describe("fake crm_api", function()
  describe("accounts", function()
    it("POST creates (201, origin Crm, new lowercase GUID), stores, audits and publishes CrmAccountCreated", function()
      with_api(function(t)
        local st, a = t.call("POST", "/api/accounts", { legalName = "Contoso Ltd", taxId = "DK123", countryCode = "DK" })
        assert.are.equal(201, st)
        assert.matches(GUID, a.id)
        assert.are.same({ id = a.id, legalName = "Contoso Ltd", taxId = "DK123", countryCode = "DK",
                          erpCustomerId = NULL, erpCustomerNumber = NULL, createdAt = a.createdAt, updatedAt = NULL,
                          origin = "Crm", isDeleted = false }, a)
        assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ$", a.createdAt)

        assert.are.equal(1, #t.published)
        local p = t.published[1]
        assert.are.equal("CrmAccountCreated", p.type)
        assert.are.equal(a.id, p.session)
        assert.is_true(p.committed)
        assert.are.same({ AccountId = a.id, LegalName = "Contoso Ltd", TaxId = "DK123", CountryCode = "DK",
                          CreatedAt = a.createdAt }, p.payload)

        local gst, got = t.call("GET", "/api/accounts/" .. a.id)
        assert.are.equal(200, gst)
        assert.are.same(a, got)

        local rows = t.audit("Account", a.id)
        assert.are.equal(1, #rows)
        assert.are.equal("Created", rows[1].action)
        assert.are.equal("Account", rows[1].entityType)
        assert.are.equal(NULL, rows[1].fieldName)
        assert.are.same({ legalName = "Contoso Ltd", taxId = "DK123", countryCode = "DK", origin = "Crm" },
                        cjson.decode(rows[1].newValue))
      end)
    end)

    it("POST uses a given id (lowercased), answers 409 for a duplicate, and omits a nil taxId from the event", function()
      with_api(function(t)
        local id = "3F2504E0-4F89-41D3-9A0C-0305E82C3301"
        local st, a = t.call("POST", "/api/accounts", { id = id, legalName = "Given Id", countryCode = "US" })
        assert.are.equal(201, st)
        assert.are.equal(id:lower(), a.id)
        assert.are.equal(NULL, a.taxId)
        assert.is_nil(t.published[1].payload.TaxId)
        local st2, e = t.call("POST", "/api/accounts", { id = id:lower(), legalName = "Again", countryCode = "US" })
        assert.are.equal(409, st2)
        assert.are.equal("id", e.field)
        assert.are.equal(1, #t.published)
        assert.are.equal(200, (t.call("GET", "/api/accounts/" .. id)))   -- path ids are case-insensitive
      end)
    end)

    it("GET lists every account newest first, soft-deleted ones included; [] when empty", function()
      with_api(function(t)
        local st0, empty, res0 = t.call("GET", "/api/accounts")
        assert.are.equal(200, st0)
        assert.are.equal("[]", res0.body)
        assert.matches("application/json", res0.headers["content-type"])
        assert.are.same({}, empty)
        local a1 = new_account(t, { legalName = "First", countryCode = "DK" })
        local a2 = new_account(t, { legalName = "Second", countryCode = "SE" })
        local a3 = new_account(t, { legalName = "Third", countryCode = "NO" })
        assert.are.equal(200, (t.call("DELETE", "/api/accounts/" .. a2.id)))
        local st, list = t.call("GET", "/api/accounts")
        assert.are.equal(200, st)
        assert.are.same({ a3.id, a2.id, a1.id }, { list[1].id, list[2].id, list[3].id })
        assert.is_true(list[2].isDeleted)
      end)
    end)

    it("answers 400 with the field for bad bodies and stores and publishes nothing", function()
      with_api(function(t)
        local cases = {
          { nil, "{oops", "body" },
          { nil, "[1, 2]", "body" },
          { {}, nil, "legalName" },
          { { legalName = "  ", countryCode = "DK" }, nil, "legalName" },
          { { legalName = 42, countryCode = "DK" }, nil, "legalName" },
          { { legalName = ("x"):rep(201), countryCode = "DK" }, nil, "legalName" },
          { { legalName = "No Country" }, nil, "countryCode" },
          { { legalName = "Bad Country", countryCode = "USA" }, nil, "countryCode" },
          { { legalName = "Bad Country", countryCode = "1A" }, nil, "countryCode" },
          { { legalName = "Long Tax", taxId = ("9"):rep(41), countryCode = "DK" }, nil, "taxId" },
          { { id = "not-a-guid", legalName = "Bad Id", countryCode = "DK" }, nil, "id" },
        }
        for _, c in ipairs(cases) do
          local st, e = t.call("POST", "/api/accounts", c[1], c[2])
          assert.are.equal(400, st, c[3])
          assert.are.equal(c[3], e.field)
          assert.is_string(e.error)
        end
        local st, e = t.call("POST", "/api/contacts", { lastName = "Lovelace" })
        assert.are.equal(400, st)
        assert.are.equal("firstName", e.field)
        st, e = t.call("POST", "/api/contacts", { firstName = "Ada" })
        assert.are.equal(400, st)
        assert.are.equal("lastName", e.field)
        local a = new_account(t)
        st, e = t.call("PUT", "/api/accounts/" .. a.id, { legalName = "X", countryCode = "Denmark" })
        assert.are.equal(400, st)
        assert.are.equal("countryCode", e.field)
        st, e = t.call("POST", "/api/accounts/" .. a.id .. "/link-erp", { customerNumber = "C-1" })
        assert.are.equal(400, st)
        assert.are.equal("erpCustomerId", e.field)
        st, e = t.call("PUT", "/api/accounts/external/" .. crm._guid(), { legalName = "X" })
        assert.are.equal(400, st)
        assert.are.equal("countryCode", e.field)
        st, e = t.call("PUT", "/api/contacts/upsert/" .. crm._guid(), { firstName = "Ada" })
        assert.are.equal(400, st)
        assert.are.equal("lastName", e.field)

        local _, list = t.call("GET", "/api/accounts")
        assert.are.equal(1, #list)
        local _, contacts = t.call("GET", "/api/contacts")
        assert.are.equal(0, #contacts)
        assert.are.equal(1, #t.published)   -- only new_account's CrmAccountCreated
      end)
    end)

    it("answers 404 for unknown accounts, contacts and routes", function()
      with_api({ request = function() error("must not be called") end }, function(t)
        local id = crm._guid()
        local cases = {
          { "GET", "/api/accounts/" .. id },
          { "PUT", "/api/accounts/" .. id, { legalName = "X", countryCode = "DK" } },
          { "DELETE", "/api/accounts/" .. id },
          { "POST", "/api/accounts/" .. id .. "/link-erp", { erpCustomerId = crm._guid(), customerNumber = "C-1" } },
          { "POST", "/api/accounts/" .. id .. "/credit-check" },
          { "POST", "/api/accounts/" .. id .. "/credit-hold", { reason = "x" } },
          { "GET", "/api/contacts/" .. id },
          { "PUT", "/api/contacts/" .. id, { firstName = "A", lastName = "B" } },
          { "DELETE", "/api/contacts/" .. id },
          { "GET", "/api/nothing" },
        }
        for _, c in ipairs(cases) do
          local st, e = t.call(c[1], c[2], c[3])
          assert.are.equal(404, st, c[1] .. " " .. c[2])
          assert.is_string(e.error)
        end
        assert.are.equal(0, #t.published)
      end)
    end)

    it("PUT copies the 3 fields, sets updatedAt, audits changed fields only and publishes CrmAccountUpdated", function()
      with_api(function(t)
        local a = new_account(t)
        local erp = crm._guid()
        assert.are.equal(200, (t.call("POST", "/api/accounts/" .. a.id .. "/link-erp",
          { erpCustomerId = erp, customerNumber = "C-250101-12345" })))
        local st, u = t.call("PUT", "/api/accounts/" .. a.id, { legalName = "Contoso A/S", taxId = "DK123", countryCode = "DK" })
        assert.are.equal(200, st)
        assert.are.equal("Contoso A/S", u.legalName)
        assert.are.equal(erp, u.erpCustomerId)
        assert.are.equal("Crm", u.origin)
        assert.are.equal(a.createdAt, u.createdAt)
        assert.is_string(u.updatedAt)

        assert.are.equal(2, #t.published)
        local p = t.published[2]
        assert.are.equal("CrmAccountUpdated", p.type)
        assert.are.equal(a.id, p.session)
        assert.are.same({ AccountId = a.id, ErpCustomerId = erp, LegalName = "Contoso A/S", TaxId = "DK123",
                          CountryCode = "DK", UpdatedAt = u.updatedAt }, p.payload)

        local rows = t.audit("Account", a.id)
        local legal = {}
        for _, r in ipairs(rows) do if r.fieldName == "legalName" then legal[#legal + 1] = r end end
        assert.are.equal(1, #legal)
        assert.are.equal("Updated", legal[1].action)
        assert.are.equal("Contoso Ltd", legal[1].oldValue)
        assert.are.equal("Contoso A/S", legal[1].newValue)
        assert.are.equal(0, count(rows, function(r) return r.fieldName == "taxId" or r.fieldName == "updatedAt" end))

        -- identical values: still 200 and published, but no audit rows
        local before = #rows
        local st2 = t.call("PUT", "/api/accounts/" .. a.id, { legalName = "Contoso A/S", taxId = "DK123", countryCode = "DK" })
        assert.are.equal(200, st2)
        assert.are.equal(3, #t.published)
        assert.are.equal(before, #t.audit("Account", a.id))
      end)
    end)

    it("link-erp sets the ERP ids without publishing, and is idempotent (200, no write) for the same id", function()
      with_api(function(t)
        local a = new_account(t)
        local erp = crm._guid()
        local st, l = t.call("POST", "/api/accounts/" .. a.id .. "/link-erp", { erpCustomerId = erp:upper(), customerNumber = "C-1" })
        assert.are.equal(200, st)
        assert.are.equal(erp, l.erpCustomerId)
        assert.are.equal("C-1", l.erpCustomerNumber)
        assert.is_string(l.updatedAt)
        local rows = t.audit("Account", a.id)
        assert.are.equal(3, #rows)   -- Created + erpCustomerId + erpCustomerNumber
        assert.are.equal(2, count(rows, function(r) return r.action == "Updated" end))

        local st2, l2 = t.call("POST", "/api/accounts/" .. a.id .. "/link-erp", { erpCustomerId = erp, customerNumber = "C-OTHER" })
        assert.are.equal(200, st2)
        assert.are.same(l, l2)       -- no write: same number, same updatedAt
        assert.are.equal(3, #t.audit("Account", a.id))

        local erp2 = crm._guid()
        local _, l3 = t.call("POST", "/api/accounts/" .. a.id .. "/link-erp", { erpCustomerId = erp2, customerNumber = "C-2" })
        assert.are.equal(erp2, l3.erpCustomerId)
        assert.are.equal(5, #t.audit("Account", a.id))
        assert.are.equal(1, #t.published)   -- only CrmAccountCreated
      end)
    end)

    it("DELETE soft-deletes once (CrmAccountDeleted, Deleted audit row); a second DELETE changes nothing", function()
      with_api(function(t)
        local a = new_account(t)
        local erp = crm._guid()
        t.call("POST", "/api/accounts/" .. a.id .. "/link-erp", { erpCustomerId = erp, customerNumber = "C-1" })
        local st, d = t.call("DELETE", "/api/accounts/" .. a.id)
        assert.are.equal(200, st)
        assert.is_true(d.isDeleted)
        assert.are.equal(2, #t.published)
        local p = t.published[2]
        assert.are.equal("CrmAccountDeleted", p.type)
        assert.are.equal(a.id, p.session)
        assert.are.same({ AccountId = a.id, ErpCustomerId = erp, DeletedAt = d.updatedAt }, p.payload)
        local rows = t.audit("Account", a.id)
        assert.are.equal("Deleted", rows[1].action)
        local n = #rows

        local st2, d2 = t.call("DELETE", "/api/accounts/" .. a.id)
        assert.are.equal(200, st2)
        assert.are.same(d, d2)
        assert.are.equal(2, #t.published)
        assert.are.equal(n, #t.audit("Account", a.id))
        local _, got = t.call("GET", "/api/accounts/" .. a.id)
        assert.is_true(got.isDeleted)
      end)
    end)
  end)

  describe("external (ERP-driven) account routes", function()
    it("PUT external inserts an Erp-origin account, then updates it in place; no publishes", function()
      with_api(function(t)
        local erp = crm._guid()
        local st, a = t.call("PUT", "/api/accounts/external/" .. erp,
          { crmAccountId = NULL, legalName = "Fabrikam", taxId = "SE9", countryCode = "SE", customerNumber = "C-7" })
        assert.are.equal(200, st)
        assert.matches(GUID, a.id)
        assert.are.equal("Erp", a.origin)
        assert.are.equal(erp, a.erpCustomerId)
        assert.are.equal("C-7", a.erpCustomerNumber)
        assert.are.equal(NULL, a.updatedAt)

        local st2, u = t.call("PUT", "/api/accounts/external/" .. erp,
          { legalName = "Fabrikam AB", countryCode = "SE", customerNumber = "C-7" })
        assert.are.equal(200, st2)
        assert.are.equal(a.id, u.id)
        assert.are.equal("Fabrikam AB", u.legalName)
        assert.are.equal(NULL, u.taxId)        -- overwritten with the body's (absent) value
        assert.are.equal("Erp", u.origin)
        assert.is_string(u.updatedAt)
        local _, list = t.call("GET", "/api/accounts")
        assert.are.equal(1, #list)
        assert.are.equal(0, #t.published)

        local rows = t.audit("Account", a.id)
        assert.are.equal(3, #rows)             -- Created, legalName, taxId
        local n = #rows
        t.call("PUT", "/api/accounts/external/" .. erp, { legalName = "Fabrikam AB", countryCode = "SE", customerNumber = "C-7" })
        assert.are.equal(n, #t.audit("Account", a.id))   -- identical write: no audit rows
      end)
    end)

    it("PUT external finds an unlinked account by crmAccountId, links it and keeps its origin", function()
      with_api(function(t)
        local a = new_account(t)
        local erp = crm._guid()
        local st, u = t.call("PUT", "/api/accounts/external/" .. erp,
          { crmAccountId = a.id, legalName = "Contoso Ltd", taxId = "DK123", countryCode = "DK", customerNumber = "C-9" })
        assert.are.equal(200, st)
        assert.are.equal(a.id, u.id)
        assert.are.equal("Crm", u.origin)
        assert.are.equal(erp, u.erpCustomerId)
        assert.are.equal("C-9", u.erpCustomerNumber)
        -- an insert with a crmAccountId that does not exist uses it as the id
        local want = crm._guid()
        local _, b = t.call("PUT", "/api/accounts/external/" .. crm._guid(),
          { crmAccountId = want, legalName = "New", countryCode = "FI" })
        assert.are.equal(want, b.id)
        assert.are.equal("Erp", b.origin)
        assert.are.equal(1, #t.published)
      end)
    end)

    it("POST external/{erpId}/deleted soft-deletes by erpCustomerId without publishing; 200 when unknown", function()
      with_api(function(t)
        local erp = crm._guid()
        local _, a = t.call("PUT", "/api/accounts/external/" .. erp, { legalName = "Gone Inc", countryCode = "US" })
        local st, d = t.call("POST", "/api/accounts/external/" .. erp .. "/deleted")
        assert.are.equal(200, st)
        assert.are.equal(a.id, d.id)
        assert.is_true(d.isDeleted)
        assert.are.equal("Deleted", t.audit("Account", a.id)[1].action)
        assert.are.equal(200, (t.call("POST", "/api/accounts/external/" .. crm._guid() .. "/deleted")))
        assert.are.equal(0, #t.published)
      end)
    end)
  end)

  describe("credit check and credit hold", function()
    local function checker(result)
      local calls = {}
      return calls, function(type_, payload, opts)
        calls[#calls + 1] = { type = type_, payload = payload, opts = opts }
        return result(payload)
      end
    end

    it("credit-check sends ErpCreditCheckRequested with a 10 s timeout and answers the reply camelCased", function()
      local calls, request = checker(function(p)
        return { AccountId = p.AccountId, Approved = true, Status = "Active", CustomerNumber = "C-1", CheckedAt = "now" }
      end)
      with_api({ request = request }, function(t)
        local a = new_account(t)
        local st, r = t.call("POST", "/api/accounts/" .. a.id .. "/credit-check")
        assert.are.equal(200, st)
        assert.are.same({ accountId = a.id, approved = true, status = "Active", customerNumber = "C-1", checkedAt = "now" }, r)
        assert.are.equal(1, #calls)
        assert.are.equal("ErpCreditCheckRequested", calls[1].type)
        assert.are.equal(a.id, calls[1].payload.AccountId)
        assert.are.equal("crm-web", calls[1].payload.RequestedBy)
        assert.matches("^%d%d%d%d%-%d%d%-%d%dT", calls[1].payload.RequestedAt)
        assert.are.same({ timeout = 10 }, calls[1].opts)
        assert.are.equal(1, #t.published)   -- the request is not published through `publish`
      end)
    end)

    it("credit-check maps ETIMEDOUT to 504, EREPLY to 502 and any other failure to 503", function()
      for code, want in pairs({ ETIMEDOUT = 504, EREPLY = 502, ECONNREFUSED = 503, [false] = 503 }) do
        local _, request = checker(function() return nil, "it went wrong", code or nil end)
        with_api({ request = request }, function(t)
          local a = new_account(t)
          local st, e = t.call("POST", "/api/accounts/" .. a.id .. "/credit-check")
          assert.are.equal(want, st, tostring(code))
          assert.is_string(e.error)
        end)
      end
      local _, raising = checker(function() error("boom") end)
      with_api({ request = raising }, function(t)
        local a = new_account(t)
        assert.are.equal(503, (t.call("POST", "/api/accounts/" .. a.id .. "/credit-check")))
      end)
      with_api({ no_request = true }, function(t)
        local a = new_account(t)
        local st, e = t.call("POST", "/api/accounts/" .. a.id .. "/credit-check")
        assert.are.equal(503, st)
        assert.is_string(e.error)
      end)
    end)

    it("credit-check waits for a slow responder without blocking other requests", function()
      local release = false
      local _, request = checker(function(p)
        while not release do nimbus.sleep(0.01) end   -- answers only when the test says so
        return { AccountId = p.AccountId, Approved = false, Status = "OnHold" }
      end)
      with_api({ request = request }, function(t)
        local a = new_account(t)
        local done, res = false, nil
        nimbus.spawn(function()
          res = { pcall(t.call, "POST", "/api/accounts/" .. a.id .. "/credit-check") }
          done = true
        end)
        assert.are.equal(200, (t.call("GET", "/api/accounts/" .. a.id)))
        assert.is_false(done)   -- the GET was answered while the check was still waiting
        release = true
        while not done do nimbus.sleep(0.01) end
        assert.is_true(res[1], tostring(res[2]))
        assert.are.equal(200, res[2])
        assert.are.equal("OnHold", res[3].status)
      end)
    end)

    it("credit-hold publishes PlaceCustomerOnCreditHold on the account's session and answers 202", function()
      with_api(function(t)
        local a = new_account(t)
        local st, r = t.call("POST", "/api/accounts/" .. a.id .. "/credit-hold", { reason = "e2e credit hold" })
        assert.are.equal(202, st)
        assert.are.same({ accepted = true }, r)
        local p = t.published[2]
        assert.are.equal("PlaceCustomerOnCreditHold", p.type)
        assert.are.equal(a.id, p.session)
        assert.are.equal(a.id, p.payload.AccountId)
        assert.are.equal("e2e credit hold", p.payload.Reason)
        assert.matches("^%d%d%d%d%-%d%d%-%d%dT", p.payload.RequestedAt)

        assert.are.equal(202, (t.call("POST", "/api/accounts/" .. a.id .. "/credit-hold")))   -- no body
        assert.are.equal("Requested from CRM", t.published[3].payload.Reason)
        assert.are.equal(202, (t.call("POST", "/api/accounts/" .. a.id .. "/credit-hold", { reason = "  " })))
        assert.are.equal("Requested from CRM", t.published[4].payload.Reason)
        assert.are.equal(1, #t.audit("Account", a.id))   -- nothing written
      end)
    end)
  end)

  describe("contacts", function()
    it("POST, GET, PUT and DELETE with CrmContact* publishes on the contact's session", function()
      with_api(function(t)
        local a = new_account(t)
        local st, c = t.call("POST", "/api/contacts",
          { accountId = a.id, firstName = "Ada", lastName = "Agent", email = "ada@techcorp.com", phone = "+1-555-0142" })
        assert.are.equal(201, st)
        assert.matches(GUID, c.id)
        assert.are.same({ id = c.id, accountId = a.id, firstName = "Ada", lastName = "Agent", email = "ada@techcorp.com",
                          phone = "+1-555-0142", createdAt = c.createdAt, updatedAt = NULL, origin = "Crm",
                          isDeleted = false }, c)
        local p = t.published[2]
        assert.are.equal("CrmContactCreated", p.type)
        assert.are.equal(c.id, p.session)
        assert.is_true(p.committed)
        assert.are.same({ ContactId = c.id, AccountId = a.id, FirstName = "Ada", LastName = "Agent",
                          Email = "ada@techcorp.com", Phone = "+1-555-0142" }, p.payload)
        local gst, got = t.call("GET", "/api/contacts/" .. c.id)
        assert.are.equal(200, gst)
        assert.are.same(c, got)

        local ust, u = t.call("PUT", "/api/contacts/" .. c.id, { firstName = "Ada", lastName = "Lovelace" })
        assert.are.equal(200, ust)
        assert.are.equal(NULL, u.accountId)   -- all 5 fields are overwritten
        assert.are.equal(NULL, u.email)
        assert.are.equal("Crm", u.origin)
        p = t.published[3]
        assert.are.equal("CrmContactUpdated", p.type)
        assert.are.equal(c.id, p.session)
        assert.are.same({ ContactId = c.id, FirstName = "Ada", LastName = "Lovelace" }, p.payload)
        local rows = t.audit("Contact", c.id)
        assert.are.equal(5, #rows)   -- Created + accountId, lastName, email, phone
        assert.are.equal(0, count(rows, function(r) return r.fieldName == "firstName" end))

        local dst, d = t.call("DELETE", "/api/contacts/" .. c.id)
        assert.are.equal(200, dst)
        assert.is_true(d.isDeleted)
        p = t.published[4]
        assert.are.equal("CrmContactDeleted", p.type)
        assert.are.equal(c.id, p.session)
        assert.are.same({ ContactId = c.id, DeletedAt = d.updatedAt }, p.payload)
        assert.are.equal(200, (t.call("DELETE", "/api/contacts/" .. c.id)))
        assert.are.equal(4, #t.published)     -- already deleted: no second publish

        local c2 = select(2, t.call("POST", "/api/contacts", { firstName = "Bob", lastName = "Builder" }))
        local _, list = t.call("GET", "/api/contacts")
        assert.are.same({ c2.id, c.id }, { list[1].id, list[2].id })   -- newest first, deleted included
      end)
    end)

    it("PUT upsert maps erpCustomerId to the account, inserts with the body's origin or Erp, keeps origin on update", function()
      with_api(function(t)
        local erp = crm._guid()
        local _, a = t.call("PUT", "/api/accounts/external/" .. erp, { legalName = "Fabrikam", countryCode = "SE" })
        local id = crm._guid()
        local st, c = t.call("PUT", "/api/contacts/upsert/" .. id,
          { id = id, erpCustomerId = erp, firstName = "Eve", lastName = "Erp", email = "eve@fabrikam.se", origin = "Erp" })
        assert.are.equal(200, st)
        assert.are.equal(id, c.id)
        assert.are.equal(a.id, c.accountId)
        assert.are.equal("Erp", c.origin)

        local st2, u = t.call("PUT", "/api/contacts/upsert/" .. id,
          { erpCustomerId = crm._guid(), firstName = "Eve", lastName = "Erp", email = "eve@fabrikam.se", origin = "Partner" })
        assert.are.equal(200, st2)
        assert.are.equal(NULL, u.accountId)   -- no account for that ERP id
        assert.are.equal("Erp", u.origin)     -- origin is left alone
        assert.is_string(u.updatedAt)

        local lead = crm._guid()
        local _, pc = t.call("PUT", "/api/contacts/upsert/" .. lead, { firstName = "Pat", lastName = "Partner", origin = "Partner" })
        assert.are.equal("Partner", pc.origin)
        local other = crm._guid()
        local _, dc = t.call("PUT", "/api/contacts/upsert/" .. other, { firstName = "Dee", lastName = "Default" })
        assert.are.equal("Erp", dc.origin)

        local n = #t.audit("Contact", id)
        t.call("PUT", "/api/contacts/upsert/" .. id, { firstName = "Eve", lastName = "Erp", email = "eve@fabrikam.se" })
        assert.are.equal(n, #t.audit("Contact", id))   -- identical write: no audit rows
        assert.are.equal(0, #t.published)
      end)
    end)

    it("POST {id}/deleted soft-deletes without publishing, and answers 200 for an unknown contact", function()
      with_api(function(t)
        local id = crm._guid()
        t.call("PUT", "/api/contacts/upsert/" .. id, { firstName = "Gone", lastName = "Soon" })
        local st, d = t.call("POST", "/api/contacts/" .. id .. "/deleted")
        assert.are.equal(200, st)
        assert.is_true(d.isDeleted)
        assert.are.equal("Deleted", t.audit("Contact", id)[1].action)
        assert.are.equal(200, (t.call("POST", "/api/contacts/" .. crm._guid() .. "/deleted")))
        assert.are.equal(0, #t.published)
      end)
    end)
  end)

  describe("audit", function()
    it("lists an entity's rows newest first (timestamp, then id, descending), and [] for none", function()
      with_api(function(t)
        local a = new_account(t)
        t.call("PUT", "/api/accounts/" .. a.id, { legalName = "Step 1", taxId = "DK123", countryCode = "DK" })
        t.call("PUT", "/api/accounts/" .. a.id, { legalName = "Step 2", taxId = "DK123", countryCode = "DK" })
        t.call("DELETE", "/api/accounts/" .. a.id)
        local rows = t.audit("Account", a.id)
        assert.are.equal(4, #rows)
        assert.are.same({ "Deleted", "Updated", "Updated", "Created" },
                        { rows[1].action, rows[2].action, rows[3].action, rows[4].action })
        assert.are.same({ "Step 1", "Step 2" }, { rows[2].oldValue, rows[2].newValue })
        for i = 2, #rows do
          assert.is_true(rows[i - 1].timestamp > rows[i].timestamp
            or (rows[i - 1].timestamp == rows[i].timestamp and rows[i - 1].id > rows[i].id))
        end
        for _, r in ipairs(rows) do
          assert.are.equal("Account", r.entityType)
          assert.are.equal(a.id, r.entityId)
          assert.are.equal("Crm", r.origin)
        end
        local st, _, res = t.call("GET", "/api/audit/Contact/" .. a.id)
        assert.are.equal(200, st)
        assert.are.equal("[]", res.body)
      end)
    end)
  end)

  it("a failing publish answers 500 but keeps the committed write", function()
    with_api({ publish_error = "bus down" }, function(t)
      local st, e = t.call("POST", "/api/accounts", { legalName = "Kept", countryCode = "DK" })
      assert.are.equal(500, st)
      assert.matches("bus down", e.error)
      local _, list = t.call("GET", "/api/accounts")
      assert.are.equal(1, #list)
      assert.are.equal("Kept", list[1].legalName)
    end)
  end)

  it("a publish returning nil, err also answers 500", function()
    with_api({ publish_returns = "no broker" }, function(t)
      local st, e = t.call("POST", "/api/contacts", { firstName = "Ada", lastName = "Lovelace" })
      assert.are.equal(500, st)
      assert.matches("no broker", e.error)
      local _, list = t.call("GET", "/api/contacts")
      assert.are.equal(1, #list)
    end)
  end)

  it("close() stops the server and can be called twice", function()
    local port
    nimbus.run(function()
      local db = tmp .. "-close.db"
      local api = assert(crm.start{ port = 0, db = db, publish = function() end })
      port = api.port
      api.close()
      api.close()
      local res, _, code = nimbus.http.request{ url = ("http://127.0.0.1:%d/api/accounts"):format(port), timeout = 2 }
      assert.is_nil(res)
      assert.are.equal("ECONNREFUSED", code)
      for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. suffix) end
    end)
  end)
end)

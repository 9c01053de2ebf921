-- The fake Crm.Api of the CrmErpDemo sample (docs/crm-erp-demo.md sections 1.2, 2 and 8.2): an
-- HTTP server on the host's loop with sqlite tables accounts, contacts and audits.
--
--   local crm = require("fake.crm_api")       -- samples/crm-erp on package.path
--   local api = assert(crm.start{ host = "127.0.0.1", port = 5080, db = "crm.db",
--     publish = function(event_type, payload, session_id) ... end,  -- after each commit
--     request = function(type, payload, opts) ... end })            -- credit check (optional)
--   api.port ; api.db ; api.close()
--
-- All JSON is camelCase (nulls included, isDeleted a boolean). Published payloads use the
-- PascalCase fields of the contracts table; a nil optional field is left out of the
-- payload. The session is AccountId for account events and commands, ContactId for
-- contact events. Ids are lowercase GUID strings. Bad input answers 400 {error, field}.
local nimbus = require("nimbus")
local cjson = require("cjson")
local audit = require("fake.audit")

local M = {}

local NULL = cjson.null
local now_iso = audit.now_iso

local ACCOUNT_FIELDS = { "id", "legalName", "taxId", "countryCode", "erpCustomerId", "erpCustomerNumber",
                         "createdAt", "updatedAt", "origin", "isDeleted" }
local CONTACT_FIELDS = { "id", "accountId", "firstName", "lastName", "email", "phone",
                         "createdAt", "updatedAt", "origin", "isDeleted" }

---------------------------------------------------------------------------- ids
local contracts = require("contracts")
local guid, ms_of_iso, iso_of_ms = contracts.guid, contracts.ms_of_iso, contracts.iso_of_ms
M._guid = guid

local GUID_PAT = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"
local function is_guid(s) return type(s) == "string" and s:match(GUID_PAT) ~= nil end

-- GUIDs compare case-insensitively (as in .NET); anything else is kept as given.
local function norm_id(s)
  if is_guid(s) then return s:lower() end
  return s
end

---------------------------------------------------------------------------- input
local function bad(field, msg) return { field = field, error = msg } end

local function nn(v) if v == NULL then return nil end return v end

-- Reads the JSON object body. Empty bodies give {} when `optional`.
local function body_of(req, optional)
  if optional and (req.body == nil or req.body:match("^%s*$")) then return {} end
  local b, err = req:json()
  if b == nil then return nil, bad("body", err) end
  if type(b) ~= "table" or b[1] ~= nil then return nil, bad("body", "the request body must be a JSON object") end
  return b
end

local function opt_string(b, name, max)
  local v = nn(b[name])
  if v == nil then return nil end
  if type(v) ~= "string" then return nil, bad(name, name .. " must be a string") end
  if max and #v > max then return nil, bad(name, ("%s is longer than %d characters"):format(name, max)) end
  return v
end

local function req_string(b, name, max)
  local v, e = opt_string(b, name, max)
  if e then return nil, e end
  if v == nil or v:match("^%s*$") then return nil, bad(name, name .. " is required") end
  return v
end

-- An optional GUID; "" counts as absent.
local function opt_guid(b, name)
  local v = nn(b[name])
  if v == nil or v == "" then return nil end
  if not is_guid(v) then return nil, bad(name, name .. " must be a GUID") end
  return v:lower()
end

local function country(b)
  local v, e = req_string(b, "countryCode")
  if e then return nil, e end
  if not v:match("^%a%a$") then return nil, bad("countryCode", "countryCode must be 2 letters (ISO 3166-1 alpha-2)") end
  return v
end

-- legalName, taxId?, countryCode
local function account_fields(b)
  local legal, e = req_string(b, "legalName", 200)
  if e then return nil, e end
  local tax; tax, e = opt_string(b, "taxId", 40)
  if e then return nil, e end
  local cc; cc, e = country(b)
  if e then return nil, e end
  return { legalName = legal, taxId = tax, countryCode = cc }
end

-- firstName, lastName, email?, phone?
local function contact_fields(b)
  local out, e = {}, nil
  out.firstName, e = req_string(b, "firstName", 100)
  if e then return nil, e end
  out.lastName, e = req_string(b, "lastName", 100)
  if e then return nil, e end
  out.email, e = opt_string(b, "email", 200)
  if e then return nil, e end
  out.phone, e = opt_string(b, "phone", 40)
  if e then return nil, e end
  return out
end

---------------------------------------------------------------------------- rows
local function account_of(r)
  if not r then return nil end
  return { id = r.id, legalName = r.legal_name, taxId = r.tax_id, countryCode = r.country_code,
           erpCustomerId = r.erp_customer_id, erpCustomerNumber = r.erp_customer_number,
           createdAt = r.created_at, updatedAt = r.updated_at, origin = r.origin or "", isDeleted = r.is_deleted == 1 }
end

local function contact_of(r)
  if not r then return nil end
  return { id = r.id, accountId = r.account_id, firstName = r.first_name, lastName = r.last_name,
           email = r.email, phone = r.phone, createdAt = r.created_at, updatedAt = r.updated_at,
           origin = r.origin or "", isDeleted = r.is_deleted == 1 }
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- camelCase JSON object with explicit nulls
local function json_of(e, fields)
  local out = {}
  for _, f in ipairs(fields) do
    local v = e[f]
    if v == nil then v = NULL end
    out[f] = v
  end
  return out
end
local function account_json(a) return json_of(a, ACCOUNT_FIELDS) end
local function contact_json(c) return json_of(c, CONTACT_FIELDS) end

local JSON_HEADERS = { ["Content-Type"] = "application/json" }

-- A list body (this cjson has no array metatable: an empty table would encode as {}).
local function list_response(items)
  if #items == 0 then return 200, "[]", JSON_HEADERS end
  return 200, items
end

local function not_found(what) return 404, { error = what .. " not found" } end

local function schema(db)
  assert(db:exec([[CREATE TABLE IF NOT EXISTS accounts (
    id TEXT PRIMARY KEY, legal_name TEXT NOT NULL, tax_id TEXT, country_code TEXT NOT NULL,
    erp_customer_id TEXT, erp_customer_number TEXT, created_at TEXT NOT NULL, updated_at TEXT,
    origin TEXT NOT NULL DEFAULT '', is_deleted INTEGER NOT NULL DEFAULT 0)]]))
  assert(db:exec("CREATE INDEX IF NOT EXISTS accounts_erp ON accounts(erp_customer_id)"))
  assert(db:exec([[CREATE TABLE IF NOT EXISTS contacts (
    id TEXT PRIMARY KEY, account_id TEXT, first_name TEXT NOT NULL, last_name TEXT NOT NULL,
    email TEXT, phone TEXT, created_at TEXT NOT NULL, updated_at TEXT,
    origin TEXT NOT NULL DEFAULT '', is_deleted INTEGER NOT NULL DEFAULT 0)]]))
  assert(db:exec("CREATE INDEX IF NOT EXISTS contacts_account ON contacts(account_id)"))
  audit.schema(db)
end

-- sqlite calls inside db:tx: raise on failure so the transaction rolls back
local function must(v, err) if v == nil then error(err, 0) end return v end

local ACC_COLS = "id, legal_name, tax_id, country_code, erp_customer_id, erp_customer_number, created_at,"
  .. " updated_at, origin, is_deleted"
local CON_COLS = "id, account_id, first_name, last_name, email, phone, created_at, updated_at, origin, is_deleted"

local function get_account(db, id)
  return account_of(db:first("SELECT " .. ACC_COLS .. " FROM accounts WHERE id = ?", id))
end
local function get_account_by_erp(db, erp_id)
  return account_of(db:first("SELECT " .. ACC_COLS .. " FROM accounts WHERE erp_customer_id = ?"
    .. " ORDER BY created_at, rowid LIMIT 1", erp_id))
end
local function get_contact(db, id)
  return contact_of(db:first("SELECT " .. CON_COLS .. " FROM contacts WHERE id = ?", id))
end

local function insert_account(db, a)
  must(db:exec("INSERT INTO accounts(" .. ACC_COLS .. ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", a.id, a.legalName,
    a.taxId, a.countryCode, a.erpCustomerId, a.erpCustomerNumber, a.createdAt, a.updatedAt, a.origin, a.isDeleted))
  audit.created(db, "Account", a, ACCOUNT_FIELDS, a.origin)
end

local function update_account(db, old, a)
  must(db:exec("UPDATE accounts SET legal_name = ?, tax_id = ?, country_code = ?, erp_customer_id = ?,"
    .. " erp_customer_number = ?, updated_at = ?, origin = ?, is_deleted = ? WHERE id = ?", a.legalName, a.taxId,
    a.countryCode, a.erpCustomerId, a.erpCustomerNumber, a.updatedAt, a.origin, a.isDeleted, a.id))
  audit.updated(db, "Account", old, a, ACCOUNT_FIELDS, a.origin)
end

local function insert_contact(db, c)
  must(db:exec("INSERT INTO contacts(" .. CON_COLS .. ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", c.id, c.accountId,
    c.firstName, c.lastName, c.email, c.phone, c.createdAt, c.updatedAt, c.origin, c.isDeleted))
  audit.created(db, "Contact", c, CONTACT_FIELDS, c.origin)
end

local function update_contact(db, old, c)
  must(db:exec("UPDATE contacts SET account_id = ?, first_name = ?, last_name = ?, email = ?, phone = ?,"
    .. " updated_at = ?, origin = ?, is_deleted = ? WHERE id = ?", c.accountId, c.firstName, c.lastName, c.email,
    c.phone, c.updatedAt, c.origin, c.isDeleted, c.id))
  audit.updated(db, "Contact", old, c, CONTACT_FIELDS, c.origin)
end

-- Runs fn inside one transaction; returns fn's results, or nil, message when it raised.
local function in_tx(db, fn)
  local ok, a, b, c = pcall(db.tx, db, fn)
  if not ok then return nil, tostring(a) end
  if a == nil then return nil, tostring(b) end   -- BEGIN/COMMIT failed (SQLITE_BUSY...)
  return b, c
end

---------------------------------------------------------------------------- events
local function account_created(a)
  return { AccountId = a.id, LegalName = a.legalName, TaxId = a.taxId, CountryCode = a.countryCode,
           CreatedAt = a.createdAt }
end
local function account_updated(a)
  return { AccountId = a.id, ErpCustomerId = a.erpCustomerId, LegalName = a.legalName, TaxId = a.taxId,
           CountryCode = a.countryCode, UpdatedAt = a.updatedAt or now_iso() }
end
local function account_deleted(a)
  return { AccountId = a.id, ErpCustomerId = a.erpCustomerId, DeletedAt = a.updatedAt or now_iso() }
end
local function contact_payload(c)
  return { ContactId = c.id, AccountId = c.accountId, FirstName = c.firstName, LastName = c.lastName,
           Email = c.email, Phone = c.phone }
end
local function contact_deleted(c)
  return { ContactId = c.id, DeletedAt = c.updatedAt or now_iso() }
end

-- "AccountId" -> "accountId", recursively, for the reply of the credit check
local function camel(v, depth)
  if type(v) ~= "table" or (depth or 0) > 16 then return v end
  local out = {}
  for k, x in pairs(v) do
    if type(k) == "string" then k = k:sub(1, 1):lower() .. k:sub(2) end
    out[k] = camel(x, (depth or 0) + 1)
  end
  return out
end
M._camel = camel

---------------------------------------------------------------------------- routes
local function routes(db, publish, request)
  -- publishes after the commit; a publish that raises or returns nil, err answers 500
  -- (the write is kept, as in the original where SaveChanges ran first)
  local function emit(status, body, event_type, payload, session)
    local ok, r, perr = pcall(publish, event_type, payload, session)
    if not ok or (r == nil and perr ~= nil) then
      return 500, { error = ("saved, but publishing %s failed: %s"):format(event_type, tostring(ok and perr or r)) }
    end
    return status, body
  end

  local r = {}

  -------------------------------------------------------------- accounts
  r["GET /api/accounts"] = function()
    local out = {}
    for i, row in ipairs(assert(db:rows("SELECT " .. ACC_COLS .. " FROM accounts ORDER BY created_at DESC, rowid DESC"))) do
      out[i] = account_json(account_of(row))
    end
    return list_response(out)
  end

  r["GET /api/accounts/{id}"] = function(req)
    local a = get_account(db, norm_id(req.params.id))
    if not a then return not_found("account") end
    return 200, account_json(a)
  end

  r["POST /api/accounts"] = function(req)
    local b, e = body_of(req)
    if not b then return 400, e end
    local f; f, e = account_fields(b)
    if not f then return 400, e end
    local id; id, e = opt_guid(b, "id")
    if e then return 400, e end
    local a = { id = id or guid(), legalName = f.legalName, taxId = f.taxId, countryCode = f.countryCode,
                createdAt = now_iso(), origin = "Crm", isDeleted = false }
    local res, err = in_tx(db, function(tx)
      if get_account(tx, a.id) then return "exists" end
      insert_account(tx, a)
      return "ok"
    end)
    if not res then return 500, { error = err } end
    if res == "exists" then return 409, { error = "an account with this id already exists", field = "id" } end
    return emit(201, account_json(a), "CrmAccountCreated", account_created(a), a.id)
  end

  r["PUT /api/accounts/{id}"] = function(req)
    local id = norm_id(req.params.id)
    if not get_account(db, id) then return not_found("account") end
    local b, e = body_of(req)
    if not b then return 400, e end
    local f; f, e = account_fields(b)
    if not f then return 400, e end
    local a, err = in_tx(db, function(tx)
      local old = get_account(tx, id)
      if not old then return false end
      local new = copy(old)
      new.legalName, new.taxId, new.countryCode, new.updatedAt = f.legalName, f.taxId, f.countryCode, now_iso()
      update_account(tx, old, new)
      return new
    end)
    if a == nil then return 500, { error = err } end
    if a == false then return not_found("account") end
    return emit(200, account_json(a), "CrmAccountUpdated", account_updated(a), a.id)
  end

  r["POST /api/accounts/{id}/link-erp"] = function(req)
    local id = norm_id(req.params.id)
    if not get_account(db, id) then return not_found("account") end
    local b, e = body_of(req)
    if not b then return 400, e end
    local erp_id; erp_id, e = opt_guid(b, "erpCustomerId")
    if e then return 400, e end
    if not erp_id then return 400, bad("erpCustomerId", "erpCustomerId is required") end
    local number; number, e = opt_string(b, "customerNumber", 40)
    if e then return 400, e end
    local a, err = in_tx(db, function(tx)
      local old = get_account(tx, id)
      if not old then return false end
      if old.erpCustomerId == erp_id then return old end   -- already linked: no write
      local new = copy(old)
      new.erpCustomerId, new.erpCustomerNumber, new.updatedAt = erp_id, number, now_iso()
      update_account(tx, old, new)
      return new
    end)
    if a == nil then return 500, { error = err } end
    if a == false then return not_found("account") end
    return 200, account_json(a)
  end

  r["DELETE /api/accounts/{id}"] = function(req)
    local id = norm_id(req.params.id)
    local a, changed = in_tx(db, function(tx)
      local old = get_account(tx, id)
      if not old then return false end
      if old.isDeleted then return old, false end
      local new = copy(old)
      new.isDeleted, new.updatedAt = true, now_iso()
      update_account(tx, old, new)
      return new, true
    end)
    if a == nil then return 500, { error = changed } end
    if a == false then return not_found("account") end
    if not changed then return 200, account_json(a) end   -- already deleted: no change, no publish
    return emit(200, account_json(a), "CrmAccountDeleted", account_deleted(a), a.id)
  end

  r["POST /api/accounts/external/{erpId}/deleted"] = function(req)
    local erp_id = norm_id(req.params.erpId)
    local a, err = in_tx(db, function(tx)
      local old = get_account_by_erp(tx, erp_id)
      if not old then return false end
      if old.isDeleted then return old end
      local new = copy(old)
      new.isDeleted, new.updatedAt = true, now_iso()
      update_account(tx, old, new)
      return new
    end)
    if a == nil then return 500, { error = err } end
    if a == false then return 200, {} end
    return 200, account_json(a)
  end

  r["PUT /api/accounts/external/{erpId}"] = function(req)
    local erp_id = norm_id(req.params.erpId)
    local b, e = body_of(req)
    if not b then return 400, e end
    local f; f, e = account_fields(b)
    if not f then return 400, e end
    local crm_id; crm_id, e = opt_guid(b, "crmAccountId")
    if e then return 400, e end
    local number; number, e = opt_string(b, "customerNumber", 40)
    if e then return 400, e end
    local a, err = in_tx(db, function(tx)
      local old = get_account_by_erp(tx, erp_id)
      if not old and crm_id then old = get_account(tx, crm_id) end
      if not old then
        local new = { id = crm_id or guid(), legalName = f.legalName, taxId = f.taxId, countryCode = f.countryCode,
                      erpCustomerId = erp_id, erpCustomerNumber = number, createdAt = now_iso(), origin = "Erp",
                      isDeleted = false }
        insert_account(tx, new)
        return new
      end
      local new = copy(old)   -- origin is left alone
      new.legalName, new.taxId, new.countryCode = f.legalName, f.taxId, f.countryCode
      new.erpCustomerId, new.erpCustomerNumber, new.updatedAt = erp_id, number, now_iso()
      update_account(tx, old, new)
      return new
    end)
    if not a then return 500, { error = err } end
    return 200, account_json(a)
  end

  r["POST /api/accounts/{id}/credit-check"] = function(req)
    local id = norm_id(req.params.id)
    if not get_account(db, id) then return not_found("account") end
    if type(request) ~= "function" then
      return 503, { error = "the service bus is not available for request/reply" }
    end
    local ok, reply, err, code = pcall(request, "ErpCreditCheckRequested",
      { AccountId = id, RequestedBy = "crm-web", RequestedAt = now_iso() }, { timeout = 10 })
    if not ok then return 503, { error = "credit check request failed: " .. tostring(reply) } end
    if reply == nil then
      if code == "ETIMEDOUT" then
        return 504, { error = "the credit check timed out: " .. tostring(err or "no reply within 10 s") }
      elseif code == "EREPLY" then
        return 502, { error = "the credit check failed: " .. tostring(err or "error reply") }
      end
      return 503, { error = "the credit check could not be sent: " .. tostring(err or "unavailable") }
    end
    if type(reply) ~= "table" then return 502, { error = "the credit check reply is not an object" } end
    return 200, camel(reply)
  end

  r["POST /api/accounts/{id}/credit-hold"] = function(req)
    local id = norm_id(req.params.id)
    if not get_account(db, id) then return not_found("account") end
    local b, e = body_of(req, true)
    if not b then return 400, e end
    local reason; reason, e = opt_string(b, "reason")
    if e then return 400, e end
    if reason == nil or reason:match("^%s*$") then reason = "Requested from CRM" end
    return emit(202, { accepted = true }, "PlaceCustomerOnCreditHold",
      { AccountId = id, Reason = reason, RequestedAt = now_iso() }, id)
  end

  -------------------------------------------------------------- contacts
  r["GET /api/contacts"] = function()
    local out = {}
    for i, row in ipairs(assert(db:rows("SELECT " .. CON_COLS .. " FROM contacts ORDER BY created_at DESC, rowid DESC"))) do
      out[i] = contact_json(contact_of(row))
    end
    return list_response(out)
  end

  r["GET /api/contacts/{id}"] = function(req)
    local c = get_contact(db, norm_id(req.params.id))
    if not c then return not_found("contact") end
    return 200, contact_json(c)
  end

  r["POST /api/contacts"] = function(req)
    local b, e = body_of(req)
    if not b then return 400, e end
    local f; f, e = contact_fields(b)
    if not f then return 400, e end
    local account_id; account_id, e = opt_guid(b, "accountId")
    if e then return 400, e end
    local id; id, e = opt_guid(b, "id")
    if e then return 400, e end
    local c = { id = id or guid(), accountId = account_id, firstName = f.firstName, lastName = f.lastName,
                email = f.email, phone = f.phone, createdAt = now_iso(), origin = "Crm", isDeleted = false }
    local res, err = in_tx(db, function(tx)
      if get_contact(tx, c.id) then return "exists" end
      insert_contact(tx, c)
      return "ok"
    end)
    if not res then return 500, { error = err } end
    if res == "exists" then return 409, { error = "a contact with this id already exists", field = "id" } end
    return emit(201, contact_json(c), "CrmContactCreated", contact_payload(c), c.id)
  end

  r["PUT /api/contacts/{id}"] = function(req)
    local id = norm_id(req.params.id)
    if not get_contact(db, id) then return not_found("contact") end
    local b, e = body_of(req)
    if not b then return 400, e end
    local f; f, e = contact_fields(b)
    if not f then return 400, e end
    local account_id; account_id, e = opt_guid(b, "accountId")
    if e then return 400, e end
    local c, err = in_tx(db, function(tx)
      local old = get_contact(tx, id)
      if not old then return false end
      local new = copy(old)
      new.accountId, new.firstName, new.lastName, new.email, new.phone = account_id, f.firstName, f.lastName,
        f.email, f.phone
      new.updatedAt = now_iso()
      update_contact(tx, old, new)
      return new
    end)
    if c == nil then return 500, { error = err } end
    if c == false then return not_found("contact") end
    return emit(200, contact_json(c), "CrmContactUpdated", contact_payload(c), c.id)
  end

  r["PUT /api/contacts/upsert/{id}"] = function(req)
    local id = norm_id(req.params.id)
    local b, e = body_of(req)
    if not b then return 400, e end
    local f; f, e = contact_fields(b)
    if not f then return 400, e end
    local erp_id; erp_id, e = opt_guid(b, "erpCustomerId")
    if e then return 400, e end
    local origin; origin, e = opt_string(b, "origin", 20)
    if e then return 400, e end
    local c, err = in_tx(db, function(tx)
      local account_id
      if erp_id then
        local acc = get_account_by_erp(tx, erp_id)
        account_id = acc and acc.id
      end
      local old = get_contact(tx, id)
      if not old then
        local new = { id = id, accountId = account_id, firstName = f.firstName, lastName = f.lastName, email = f.email,
                      phone = f.phone, createdAt = now_iso(), origin = (origin and origin ~= "") and origin or "Erp",
                      isDeleted = false }
        insert_contact(tx, new)
        return new
      end
      local new = copy(old)   -- origin is left alone
      new.accountId, new.firstName, new.lastName, new.email, new.phone = account_id, f.firstName, f.lastName,
        f.email, f.phone
      new.updatedAt = now_iso()
      update_contact(tx, old, new)
      return new
    end)
    if not c then return 500, { error = err } end
    return 200, contact_json(c)
  end

  -- soft delete; `announce` publishes CrmContactDeleted and answers 404 for a missing contact
  local function delete_contact(req, announce)
    local id = norm_id(req.params.id)
    local c, changed = in_tx(db, function(tx)
      local old = get_contact(tx, id)
      if not old then return false end
      if old.isDeleted then return old, false end
      local new = copy(old)
      new.isDeleted, new.updatedAt = true, now_iso()
      update_contact(tx, old, new)
      return new, true
    end)
    if c == nil then return 500, { error = changed } end
    if c == false then
      if announce then return not_found("contact") end
      return 200, {}
    end
    if announce and changed then
      return emit(200, contact_json(c), "CrmContactDeleted", contact_deleted(c), c.id)
    end
    return 200, contact_json(c)
  end
  r["DELETE /api/contacts/{id}"] = function(req) return delete_contact(req, true) end
  r["POST /api/contacts/{id}/deleted"] = function(req) return delete_contact(req, false) end

  -------------------------------------------------------------- audit
  r["GET /api/audit/{entityType}/{entityId}"] = function(req)
    return list_response(audit.list(db, req.params.entityType, norm_id(req.params.entityId)))
  end

  return r
end

---------------------------------------------------------------------------- start
function M.start(opts)
  if type(opts) ~= "table" then error("crm_api.start expects a table { port, db, publish, request }", 2) end
  if type(opts.publish) ~= "function" then error("crm_api.start: `publish` must be a function", 2) end
  if opts.request ~= nil and type(opts.request) ~= "function" then
    error("crm_api.start: `request` must be a function", 2)
  end
  if type(opts.db) ~= "string" or opts.db == "" then error("crm_api.start: `db` must be a path", 2) end
  local db, err = nimbus.sqlite.open(opts.db)
  if not db then return nil, err end
  local ok, serr = pcall(schema, db)
  if not ok then
    db:close()
    return nil, "crm_api: schema: " .. tostring(serr)
  end
  local srv, herr = nimbus.http.serve{ host = opts.host or "127.0.0.1", port = opts.port or 5080,
                                       routes = routes(db, opts.publish, opts.request) }
  if not srv then
    db:close()
    return nil, herr
  end
  local closed = false
  return {
    port = srv.port,
    db = db,
    close = function()
      if closed then return end
      closed = true
      srv:close()
      db:close()
    end,
  }
end

return M

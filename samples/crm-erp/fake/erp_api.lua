-- Fake Erp.Api of the CrmErpDemo sample (docs/crm-erp-demo.md sections 1.3, 2, 4, 5, 8.2, 8.3):
-- an HTTP server on the host's loop over one sqlite file holding customers, contacts,
-- field-level audits (fake/audit.lua), the transactional outbox and the hand-off jobs.
--
--   package.path = "samples/crm-erp/?.lua;" .. package.path
--   local erp = require("fake.erp_api")
--   local api = assert(erp.start{ host = "127.0.0.1", port = 5090, db = "erp.db", outbox_every = 1 })
--   api.port ; api.db ; api.dispatch_outbox() ; api.close()
--
-- Outbox: every entity write that raises an Erp* event inserts its outbox_messages row in
-- the same db:tx. An adapters.outbox_relay publishes pending rows in id order every
-- `outbox_every` seconds (nimbus.publish with the row's session and message id) and sets
-- dispatched_at; api.dispatch_outbox() runs one pass now and returns how many it published.
-- A publish that fails stops the pass; the row stays pending and is sent at the next pass,
-- so delivery is at least once, in order.
--
-- Knobs, alerts: memory only (as in the original). Hand-off jobs: sqlite (section 8.2),
-- so they survive a restart. Hand-off job routes (the ERP adapter's job poller reads them):
--   POST /api/internal/handoff-jobs                      register or replace (by eventId) -> 201
--   GET  /api/internal/handoff-jobs[?due=true]           pending jobs (only due ones with ?due), oldest due first
--   GET  /api/internal/handoff-jobs/{externalJobId}      one job with state / errorText, or 404. A pending
--        job past its due time is settled first (section 5.3): roll() (opts.roll, default
--        math.random) under the CURRENT failureRate fails it with one of DMF_REJECTIONS;
--        otherwise the import runs as /apply does (an upsert that cannot run fails the job
--        with "Erp upsert failed: ...")
-- and to settle a job by hand (tests, an operator):
--   POST /api/internal/handoff-jobs/{externalJobId}/apply   success path of section 5.3 -> 200
--        { importedRecordId, customerId }; a completed job re-applies idempotently (update path,
--        no new event); a failed one -> 409; an upsert that cannot run -> 422
--        { error = "Erp upsert failed: ..." } and the job stays pending (the checker then calls /fail)
--   POST /api/internal/handoff-jobs/{externalJobId}/fail { errorText } -> 200; a completed job -> 409
local cjson = require("cjson")
local nimbus = require("nimbus")
local outbox = require("adapters.outbox_relay")
local audit = require("fake.audit")

local NULL = cjson.null
local M = {}

-- The five canned settlement failures of section 5.3 (errorType "DmfValidationError").
M.DMF_REJECTIONS = {
  "DMF rejected: invalid postal code",
  "DMF rejected: duplicate customer number",
  "DMF rejected: tax ID validation failed",
  "DMF rejected: missing mandatory address line",
  "DMF rejected: country code not configured in legal entity",
}
M.DMF_ERROR_TYPE = "DmfValidationError"

local CUSTOMER_FIELDS = { "customerNumber", "legalName", "taxId", "countryCode", "crmAccountId", "origin", "creditHold" }
local CONTACT_FIELDS = { "customerId", "firstName", "lastName", "email", "phone", "origin" }

---------------------------------------------------------------------------- helpers
local now_iso = audit.now_iso
local contracts = require("contracts")
local guid, ms_of_iso, iso_of_ms = contracts.guid, contracts.ms_of_iso, contracts.iso_of_ms
local function now_ms() return math.floor(nimbus.now() * 1000) end


-- "2025-12-02T10:00:00Z", "...T10:00:00.123+00:00", "...T12:00:00+02:00" -> ms epoch, or nil
M._ms_of_iso = ms_of_iso


local function blank(v) return v == nil or v == NULL or (type(v) == "string" and v:match("^%s*$") ~= nil) end
local function opt(v) if blank(v) then return nil end return v end   -- "" / null -> nil
local function optstr(v) v = opt(v); if v ~= nil then return tostring(v) end end

-- Raises on a sqlite failure so db:tx rolls back.
local function x(db, sql, ...)
  local n, rowid_or_err, code = db:exec(sql, ...)
  if n == nil then error({ sqlite = rowid_or_err, code = code }, 0) end
  return n, rowid_or_err
end

local JSON_HDR = { ["Content-Type"] = "application/json" }
-- cjson 2.1 encodes an empty table as {}; a list route must answer []
local function list_body(list)
  if #list == 0 then return "[]", JSON_HDR end
  return list
end

local function bad(msg, field) return 400, { error = msg, field = field } end

-- Decodes the body as a JSON object, or returns nil, status, body.
local function body_object(req)
  local v, err = req:json()
  if type(v) ~= "table" or v[1] ~= nil then
    return nil, 400, { error = v == nil and err or "request body must be a JSON object" }
  end
  return v
end

local function require_fields(b, fields)
  for _, f in ipairs(fields) do
    if blank(b[f]) then return f end
  end
end

local function n2j(v) if v == nil then return NULL end return v end

---------------------------------------------------------------------------- schema
local function schema(db)
  local stmts = {
    [[CREATE TABLE IF NOT EXISTS customers (
      id TEXT PRIMARY KEY, customer_number TEXT NOT NULL UNIQUE, legal_name TEXT NOT NULL, tax_id TEXT,
      country_code TEXT NOT NULL, crm_account_id TEXT, created_at TEXT NOT NULL, updated_at TEXT,
      origin TEXT NOT NULL, is_deleted INTEGER NOT NULL DEFAULT 0, credit_hold INTEGER NOT NULL DEFAULT 0)]],
    "CREATE INDEX IF NOT EXISTS customers_crm ON customers(crm_account_id)",
    [[CREATE TABLE IF NOT EXISTS contacts (
      id TEXT PRIMARY KEY, customer_id TEXT, first_name TEXT NOT NULL, last_name TEXT NOT NULL, email TEXT,
      phone TEXT, created_at TEXT NOT NULL, updated_at TEXT, origin TEXT NOT NULL,
      is_deleted INTEGER NOT NULL DEFAULT 0)]],
    "CREATE INDEX IF NOT EXISTS contacts_customer ON contacts(customer_id)",
    [[CREATE TABLE IF NOT EXISTS outbox_messages (
      id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, event_type TEXT NOT NULL, session_id TEXT,
      payload_json TEXT NOT NULL, created_at TEXT NOT NULL, dispatched_at TEXT)]],
    "CREATE INDEX IF NOT EXISTS outbox_pending ON outbox_messages(id) WHERE dispatched_at IS NULL",
    [[CREATE TABLE IF NOT EXISTS handoff_jobs (
      event_id TEXT PRIMARY KEY, session_id TEXT, message_id TEXT, originating_message_id TEXT,
      event_type_id TEXT, correlation_id TEXT, external_job_id TEXT NOT NULL, due_at INTEGER NOT NULL,
      payload_json TEXT, registered_at TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending', error_text TEXT)]],
    "CREATE INDEX IF NOT EXISTS handoff_jobs_ext ON handoff_jobs(external_job_id)",
    "CREATE INDEX IF NOT EXISTS handoff_jobs_due ON handoff_jobs(state, due_at)",
  }
  for _, s in ipairs(stmts) do
    local ok, err = db:exec(s)
    if not ok then return nil, err end
  end
  local ok, err = pcall(audit.schema, db)
  if not ok then return nil, tostring(err) end
  return true
end

---------------------------------------------------------------------------- mapping
-- db row -> Lua entity (camelCase; absent = nil)
local function customer_of(r)
  if not r then return nil end
  return { id = r.id, customerNumber = r.customer_number, legalName = r.legal_name, taxId = r.tax_id,
           countryCode = r.country_code, crmAccountId = r.crm_account_id, createdAt = r.created_at,
           updatedAt = r.updated_at, origin = r.origin, isDeleted = r.is_deleted == 1,
           creditHold = r.credit_hold == 1 }
end

local function contact_of(r)
  if not r then return nil end
  return { id = r.id, customerId = r.customer_id, firstName = r.first_name, lastName = r.last_name,
           email = r.email, phone = r.phone, createdAt = r.created_at, updatedAt = r.updated_at,
           origin = r.origin, isDeleted = r.is_deleted == 1 }
end

local function customer_json(c)
  return { id = c.id, customerNumber = c.customerNumber, legalName = c.legalName, taxId = n2j(c.taxId),
           countryCode = c.countryCode, crmAccountId = n2j(c.crmAccountId), createdAt = c.createdAt,
           updatedAt = n2j(c.updatedAt), origin = c.origin, isDeleted = c.isDeleted, creditHold = c.creditHold }
end

local function contact_json(c)
  return { id = c.id, customerId = n2j(c.customerId), firstName = c.firstName, lastName = c.lastName,
           email = n2j(c.email), phone = n2j(c.phone), createdAt = c.createdAt, updatedAt = n2j(c.updatedAt),
           origin = c.origin, isDeleted = c.isDeleted }
end

local function account_id(c) return c.crmAccountId or c.id end

local function customer_created_event(c)
  return { Origin = c.crmAccountId and "Crm" or "Erp", AccountId = account_id(c), ErpCustomerId = c.id,
           CustomerNumber = c.customerNumber, LegalName = c.legalName, TaxId = n2j(c.taxId),
           CountryCode = c.countryCode }
end

local function customer_updated_event(c)
  return { AccountId = account_id(c), CrmAccountId = n2j(c.crmAccountId), ErpCustomerId = c.id,
           CustomerNumber = c.customerNumber, LegalName = c.legalName, TaxId = n2j(c.taxId),
           CountryCode = c.countryCode }
end

local function contact_event(c)
  return { ContactId = c.id, CustomerId = n2j(c.customerId), FirstName = c.firstName, LastName = c.lastName,
           Email = n2j(c.email), Phone = n2j(c.phone) }
end

---------------------------------------------------------------------------- the API
function M.start(opts)
  opts = opts or {}
  local rand = opts.rand or math.random   -- rand(lo, hi): customer number suffix (specs inject one)
  local roll = opts.roll or math.random   -- roll() in [0, 1): the hand-off settlement (specs pin it)
  local every = opts.outbox_every or 1

  local db, err = nimbus.sqlite.open(opts.db or ":memory:")
  if not db then return nil, err end
  local ok, serr = schema(db)
  if not ok then db:close(); return nil, serr end

  local started = now_iso()
  local knobs = {
    service = { enabled = false, changedAt = started },
    error = { enabled = false, changedAt = started },
    delay = { enabled = false, delayMs = 2000, changedAt = started },
    handoff = { enabled = false, durationSeconds = 5, failureRate = 0.0, changedAt = started },
  }
  local alerts = {}
  local closed = false

  -------------------------------------------------------------- outbox
  local function stage(tx, event_type, payload, session_id)
    x(tx, "INSERT INTO outbox_messages(message_id, event_type, session_id, payload_json, created_at)"
      .. " VALUES (?, ?, ?, ?, ?)", guid(), event_type, session_id, cjson.encode(payload), now_iso())
  end

  -------------------------------------------------------------- customers
  local function get_customer(id)
    return customer_of(db:first("SELECT * FROM customers WHERE id = ?", id))
  end
  local function by_crm(crm_id)
    return customer_of(db:first("SELECT * FROM customers WHERE crm_account_id = ?"
      .. " ORDER BY is_deleted, created_at DESC, rowid DESC LIMIT 1", crm_id))
  end

  local function new_number(tx)
    local day = os.date("!%y%m%d", math.floor(nimbus.now()))
    for _ = 1, 100 do
      local n = ("C-%s-%05d"):format(day, rand(10000, 99999))
      if not tx:first("SELECT 1 AS x FROM customers WHERE customer_number = ?", n) then return n end
    end
    error({ sqlite = "could not generate a unique customer number" }, 0)
  end

  local function insert_customer(tx, c)
    c.customerNumber = c.customerNumber or new_number(tx)
    x(tx, "INSERT INTO customers(id, customer_number, legal_name, tax_id, country_code, crm_account_id,"
      .. " created_at, updated_at, origin, is_deleted, credit_hold) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, 0, 0)",
      c.id, c.customerNumber, c.legalName, c.taxId, c.countryCode, c.crmAccountId, c.createdAt, c.origin)
    audit.created(tx, "Customer", c, CUSTOMER_FIELDS, c.origin)
    stage(tx, "ErpCustomerCreated", customer_created_event(c), account_id(c))
  end

  local function save_customer(tx, old, c)
    x(tx, "UPDATE customers SET legal_name = ?, tax_id = ?, country_code = ?, crm_account_id = ?, updated_at = ?,"
      .. " is_deleted = ?, credit_hold = ? WHERE id = ?", c.legalName, c.taxId, c.countryCode, c.crmAccountId,
      c.updatedAt, c.isDeleted, c.creditHold, c.id)
    audit.updated(tx, "Customer", old, c, CUSTOMER_FIELDS, c.origin)
  end

  local function copy(t) local o = {} for k, v in pairs(t) do o[k] = v end return o end

  -- Runs fn inside db:tx; a sqlite failure answers 409 (customer number taken) or 500.
  local function in_tx(fn)
    local ok2, a, b = pcall(db.tx, db, fn)
    if ok2 then return true, a, b end
    local e = a
    if type(e) == "table" and e.sqlite then
      if tostring(e.sqlite):find("customers.customer_number", 1, true) then
        return false, 409, { error = "customer number already exists", field = "customerNumber" }
      end
      return false, 500, { error = tostring(e.sqlite) }
    end
    error(e, 0)
  end

  -- Success path of section 5.3 and the body of PUT /api/customers/by-crm/{id}'s insert branch.
  -- Returns customer, created (boolean).
  local function upsert_by_crm(tx, crm_id, fields, erp_id)
    local cur = customer_of(tx:first("SELECT * FROM customers WHERE crm_account_id = ?"
      .. " ORDER BY is_deleted, created_at DESC, rowid DESC LIMIT 1", crm_id))
    if not cur and erp_id then cur = customer_of(tx:first("SELECT * FROM customers WHERE id = ?", erp_id)) end
    if not cur then
      local c = { id = guid(), crmAccountId = crm_id, legalName = fields.legalName, taxId = fields.taxId,
                  countryCode = fields.countryCode, createdAt = now_iso(), origin = "Crm",
                  isDeleted = false, creditHold = false }
      insert_customer(tx, c)
      return c, true
    end
    local c = copy(cur)
    c.crmAccountId, c.legalName, c.taxId, c.countryCode = crm_id, fields.legalName, fields.taxId, fields.countryCode
    c.updatedAt = now_iso()
    save_customer(tx, cur, c)
    return c, false
  end

  local function customer_fields(b)
    local miss = require_fields(b, { "legalName", "countryCode" })
    if miss then return nil, miss end
    return { legalName = tostring(b.legalName), taxId = optstr(b.taxId), countryCode = tostring(b.countryCode) }
  end

  local routes = {}

  routes["GET /api/customers"] = function()
    local out = {}
    for i, r in ipairs(assert(db:rows("SELECT * FROM customers ORDER BY created_at DESC, rowid DESC"))) do
      out[i] = customer_json(customer_of(r))
    end
    return 200, list_body(out)
  end

  routes["GET /api/customers/{id}"] = function(req)
    local c = get_customer(req.params.id)
    if not c then return 404, { error = "customer not found" } end
    return 200, customer_json(c)
  end

  routes["POST /api/customers"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local f, miss = customer_fields(b)
    if not f then return bad(miss .. " is required", miss) end
    local c = { id = optstr(b.id) or guid(), customerNumber = optstr(b.customerNumber), legalName = f.legalName,
                taxId = f.taxId, countryCode = f.countryCode, createdAt = now_iso(), origin = "Erp",
                isDeleted = false, creditHold = false }
    if get_customer(c.id) then return 409, { error = "customer already exists", field = "id" } end
    local ok2, s2, b2 = in_tx(function(tx) insert_customer(tx, c) end)
    if not ok2 then return s2, b2 end
    return 201, customer_json(c)
  end

  routes["GET /api/customers/by-crm/{crmAccountId}"] = function(req)
    local c = by_crm(req.params.crmAccountId)
    if not c then return 404, { error = "customer not found" } end
    return 200, customer_json(c)
  end

  routes["PUT /api/customers/credit-hold/by-crm/{crmAccountId}"] = function(req)
    local cur = by_crm(req.params.crmAccountId)
    if not cur then return 404, { error = "customer not found" } end
    if cur.creditHold then return 200, customer_json(cur) end
    local c = copy(cur)
    c.creditHold, c.updatedAt = true, now_iso()
    local ok2, s2, b2 = in_tx(function(tx) save_customer(tx, cur, c) end)   -- no event, reason not stored
    if not ok2 then return s2, b2 end
    return 200, customer_json(c)
  end

  routes["PUT /api/customers/by-crm/{crmAccountId}"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local f, miss = customer_fields(b)
    if not f then return bad(miss .. " is required", miss) end
    local c
    local ok2, s2, b2 = in_tx(function(tx) c = upsert_by_crm(tx, req.params.crmAccountId, f, optstr(b.erpCustomerId)) end)
    if not ok2 then return s2, b2 end
    return 200, customer_json(c)
  end

  routes["PUT /api/customers/{id}"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local f, miss = customer_fields(b)
    if not f then return bad(miss .. " is required", miss) end
    local cur = get_customer(req.params.id)
    if not cur then return 404, { error = "customer not found" } end
    local c = copy(cur)
    c.legalName, c.taxId, c.countryCode, c.updatedAt = f.legalName, f.taxId, f.countryCode, now_iso()
    local ok2, s2, b2 = in_tx(function(tx)
      save_customer(tx, cur, c)
      stage(tx, "ErpCustomerUpdated", customer_updated_event(c), account_id(c))
    end)
    if not ok2 then return s2, b2 end
    return 200, customer_json(c)
  end

  routes["DELETE /api/customers/{id}"] = function(req)
    local cur = get_customer(req.params.id)
    if not cur then return 404, { error = "customer not found" } end
    if cur.isDeleted then return 200, customer_json(cur) end
    local c = copy(cur)
    c.isDeleted, c.updatedAt = true, now_iso()
    local ok2, s2, b2 = in_tx(function(tx)
      save_customer(tx, cur, c)
      stage(tx, "ErpCustomerDeleted", { AccountId = account_id(c), ErpCustomerId = c.id, DeletedAt = c.updatedAt },
        account_id(c))
    end)
    if not ok2 then return s2, b2 end
    return 200, customer_json(c)
  end

  routes["POST /api/customers/by-crm/{crmAccountId}/deleted"] = function(req)
    local cur = by_crm(req.params.crmAccountId)
    if not cur or cur.isDeleted then return 200, cur and customer_json(cur) or { deleted = false } end
    local c = copy(cur)
    c.isDeleted, c.updatedAt = true, now_iso()
    local ok2, s2, b2 = in_tx(function(tx) save_customer(tx, cur, c) end)
    if not ok2 then return s2, b2 end
    return 200, customer_json(c)
  end

  -------------------------------------------------------------- contacts
  local function get_contact(id) return contact_of(db:first("SELECT * FROM contacts WHERE id = ?", id)) end

  local function insert_contact(tx, c)
    x(tx, "INSERT INTO contacts(id, customer_id, first_name, last_name, email, phone, created_at, origin, is_deleted)"
      .. " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)", c.id, c.customerId, c.firstName, c.lastName, c.email, c.phone,
      c.createdAt, c.origin)
    audit.created(tx, "ErpContact", c, CONTACT_FIELDS, c.origin)
  end

  local function save_contact(tx, old, c)
    x(tx, "UPDATE contacts SET customer_id = ?, first_name = ?, last_name = ?, email = ?, phone = ?, updated_at = ?,"
      .. " is_deleted = ? WHERE id = ?", c.customerId, c.firstName, c.lastName, c.email, c.phone, c.updatedAt,
      c.isDeleted, c.id)
    audit.updated(tx, "ErpContact", old, c, CONTACT_FIELDS, c.origin)
  end

  local function contact_fields(b)
    local miss = require_fields(b, { "firstName", "lastName" })
    if miss then return nil, miss end
    return { firstName = tostring(b.firstName), lastName = tostring(b.lastName), email = optstr(b.email),
             phone = optstr(b.phone) }
  end

  routes["GET /api/contacts"] = function()
    local out = {}
    for i, r in ipairs(assert(db:rows("SELECT * FROM contacts ORDER BY created_at DESC, rowid DESC"))) do
      out[i] = contact_json(contact_of(r))
    end
    return 200, list_body(out)
  end

  routes["GET /api/contacts/{id}"] = function(req)
    local c = get_contact(req.params.id)
    if not c then return 404, { error = "contact not found" } end
    return 200, contact_json(c)
  end

  routes["POST /api/contacts"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local f, miss = contact_fields(b)
    if not f then return bad(miss .. " is required", miss) end
    local c = { id = optstr(b.id) or guid(), customerId = optstr(b.customerId), firstName = f.firstName,
                lastName = f.lastName, email = f.email, phone = f.phone, createdAt = now_iso(), origin = "Erp",
                isDeleted = false }
    if get_contact(c.id) then return 409, { error = "contact already exists", field = "id" } end
    local ok2, s2, b2 = in_tx(function(tx)
      insert_contact(tx, c)
      stage(tx, "ErpContactCreated", contact_event(c), c.id)
    end)
    if not ok2 then return s2, b2 end
    return 201, contact_json(c)
  end

  routes["PUT /api/contacts/upsert/{id}"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local f, miss = contact_fields(b)
    if not f then return bad(miss .. " is required", miss) end
    local crm = optstr(b.crmAccountId)
    local owner = crm and by_crm(crm)
    local customer_id = owner and owner.id or nil
    local cur = get_contact(req.params.id)
    local c
    local ok2, s2, b2 = in_tx(function(tx)
      if not cur then
        c = { id = req.params.id, customerId = customer_id, firstName = f.firstName, lastName = f.lastName,
              email = f.email, phone = f.phone, createdAt = now_iso(), origin = "Crm", isDeleted = false }
        insert_contact(tx, c)
      else
        c = copy(cur)
        c.customerId, c.firstName, c.lastName, c.email, c.phone = customer_id, f.firstName, f.lastName, f.email, f.phone
        c.updatedAt = now_iso()
        save_contact(tx, cur, c)
      end
    end)   -- no publish
    if not ok2 then return s2, b2 end
    return 200, contact_json(c)
  end

  routes["PUT /api/contacts/{id}"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local f, miss = contact_fields(b)
    if not f then return bad(miss .. " is required", miss) end
    local cur = get_contact(req.params.id)
    if not cur then return 404, { error = "contact not found" } end
    local c = copy(cur)
    c.customerId, c.firstName, c.lastName, c.email, c.phone = optstr(b.customerId), f.firstName, f.lastName, f.email,
      f.phone
    c.updatedAt = now_iso()
    local ok2, s2, b2 = in_tx(function(tx)
      save_contact(tx, cur, c)
      stage(tx, "ErpContactUpdated", contact_event(c), c.id)
    end)
    if not ok2 then return s2, b2 end
    return 200, contact_json(c)
  end

  routes["DELETE /api/contacts/{id}"] = function(req)
    local cur = get_contact(req.params.id)
    if not cur then return 404, { error = "contact not found" } end
    if cur.isDeleted then return 200, contact_json(cur) end
    local c = copy(cur)
    c.isDeleted, c.updatedAt = true, now_iso()
    local ok2, s2, b2 = in_tx(function(tx)
      save_contact(tx, cur, c)
      stage(tx, "ErpContactDeleted", { ContactId = c.id, DeletedAt = c.updatedAt }, c.id)
    end)
    if not ok2 then return s2, b2 end
    return 200, contact_json(c)
  end

  routes["POST /api/contacts/{id}/deleted"] = function(req)
    local cur = get_contact(req.params.id)
    if not cur or cur.isDeleted then return 200, cur and contact_json(cur) or { deleted = false } end
    local c = copy(cur)
    c.isDeleted, c.updatedAt = true, now_iso()
    local ok2, s2, b2 = in_tx(function(tx) save_contact(tx, cur, c) end)
    if not ok2 then return s2, b2 end
    return 200, contact_json(c)
  end

  -------------------------------------------------------------- audit
  routes["GET /api/audit/{entityType}/{entityId}"] = function(req)
    return 200, list_body(audit.list(db, req.params.entityType, req.params.entityId))
  end

  -------------------------------------------------------------- knobs
  local function bool_knob(name, path)
    routes["GET " .. path] = function() return 200, knobs[name] end
    routes["PUT " .. path] = function(req)
      local b, st, eb = body_object(req)
      if not b then return st, eb end
      knobs[name] = { enabled = b.enabled == true, changedAt = now_iso() }
      return 200, knobs[name]
    end
  end
  bool_knob("service", "/api/admin/service-mode")
  bool_knob("error", "/api/admin/error-mode")

  routes["GET /api/admin/processing-delay"] = function() return 200, knobs.delay end
  routes["PUT /api/admin/processing-delay"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local d = b.delayMs
    if type(d) ~= "number" or d < 100 or d > 100000 then
      return bad("delayMs must be between 100 and 100000", "delayMs")
    end
    knobs.delay = { enabled = b.enabled == true, delayMs = math.tointeger(d) or d, changedAt = now_iso() }
    return 200, knobs.delay
  end

  routes["GET /api/admin/handoff-mode"] = function() return 200, knobs.handoff end
  routes["PUT /api/admin/handoff-mode"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local d, r = b.durationSeconds, b.failureRate
    if type(d) ~= "number" or d < 1 or d > 600 then
      return bad("durationSeconds must be between 1 and 600", "durationSeconds")
    end
    if type(r) ~= "number" or r < 0 or r > 1 then return bad("failureRate must be between 0.0 and 1.0", "failureRate") end
    knobs.handoff = { enabled = b.enabled == true, durationSeconds = math.tointeger(d) or d, failureRate = r + 0.0,
                      changedAt = now_iso() }
    return 200, knobs.handoff
  end

  -------------------------------------------------------------- alerts
  local ALERT_FIELDS = { "severity", "title", "message", "eventId", "eventTypeId", "messageId", "correlationId",
                         "errorDetails" }
  local alert_seq = 0
  routes["POST /api/webhooks/notifications"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    alert_seq = alert_seq + 1
    local a = { id = alert_seq, receivedAt = now_iso() }
    for _, f in ipairs(ALERT_FIELDS) do a[f] = n2j(b[f]) end
    table.insert(alerts, 1, a)
    while #alerts > 50 do alerts[#alerts] = nil end
    return 202, { accepted = true }
  end
  routes["GET /api/admin/alerts"] = function() return 200, list_body(alerts) end
  routes["DELETE /api/admin/alerts"] = function()
    alerts = {}
    return 204
  end

  -------------------------------------------------------------- hand-off jobs
  local function job_json(r)
    return { eventId = r.event_id, sessionId = n2j(r.session_id), messageId = n2j(r.message_id),
             originatingMessageId = n2j(r.originating_message_id), eventTypeId = n2j(r.event_type_id),
             correlationId = n2j(r.correlation_id), externalJobId = r.external_job_id, dueAt = iso_of_ms(r.due_at),
             dueAtMs = r.due_at, payloadJson = n2j(r.payload_json), registeredAt = r.registered_at,
             state = r.state, errorText = n2j(r.error_text) }
  end
  local function get_job(ext)
    return db:first("SELECT * FROM handoff_jobs WHERE external_job_id = ? ORDER BY registered_at DESC, rowid DESC"
      .. " LIMIT 1", ext)
  end

  local function fail_job(job, text)
    assert(db:exec("UPDATE handoff_jobs SET state = 'failed', error_text = ? WHERE event_id = ?", text, job.event_id))
  end

  -- The import the handler never ran (section 5.3): the by-crm upsert and the job's state in
  -- one transaction. Returns 200, result or 422, { error = "Erp upsert failed: ..." }.
  local function apply_job(job)
    local p = job.payload_json and nimbus.json.decode(job.payload_json)
    local function upsert_failed(msg) return 422, { error = "Erp upsert failed: " .. msg } end
    if type(p) ~= "table" then return upsert_failed("payload is not a JSON object") end
    local function pf(a, b2) local v = p[a]; if blank(v) then v = p[b2] end; return opt(v) end
    local crm_id = pf("AccountId", "accountId")
    local fields = { legalName = pf("LegalName", "legalName"), taxId = pf("TaxId", "taxId"),
                     countryCode = pf("CountryCode", "countryCode") }
    if crm_id == nil then return upsert_failed("AccountId is missing from the payload") end
    if fields.legalName == nil then return upsert_failed("LegalName is missing from the payload") end
    if fields.countryCode == nil then return upsert_failed("CountryCode is missing from the payload") end
    crm_id = tostring(crm_id)
    fields.legalName, fields.countryCode = tostring(fields.legalName), tostring(fields.countryCode)
    if fields.taxId ~= nil then fields.taxId = tostring(fields.taxId) end
    local c
    local ok2, _, b2 = in_tx(function(tx)
      c = upsert_by_crm(tx, crm_id, fields)
      x(tx, "UPDATE handoff_jobs SET state = 'completed', error_text = NULL WHERE event_id = ?", job.event_id)
    end)
    if not ok2 then return upsert_failed(b2.error) end
    return 200, { importedRecordId = job.external_job_id, customerId = c.id, customerNumber = c.customerNumber }
  end

  -- A pending job past its due time settles when read (the original's 1 s loop would have
  -- settled it by then): the failure rate is the one of now, not of the registration.
  local function settle_if_due(job)
    if job.state ~= "pending" or now_ms() < job.due_at then return job end
    if roll() < (tonumber(knobs.handoff.failureRate) or 0) then
      fail_job(job, M.DMF_REJECTIONS[math.random(#M.DMF_REJECTIONS)])
    else
      local st, r = apply_job(job)
      if st ~= 200 then fail_job(job, r.error) end
    end
    return get_job(job.external_job_id)
  end

  routes["POST /api/internal/handoff-jobs"] = function(req)
    local b, st, eb = body_object(req)
    if not b then return st, eb end
    local miss = require_fields(b, { "eventId", "externalJobId" })
    if miss then return bad(miss .. " is required", miss) end
    local due
    if not blank(b.dueAt) then
      due = ms_of_iso(b.dueAt)
      if not due then return bad("dueAt must be an ISO-8601 date-time", "dueAt") end
    elseif type(b.durationSeconds) == "number" then
      due = now_ms() + math.floor(b.durationSeconds * 1000)
    else
      return bad("dueAt or durationSeconds is required", "dueAt")
    end
    local payload = b.payloadJson
    if type(payload) == "table" then payload = cjson.encode(payload) end
    local ok2, s2, b2 = in_tx(function(tx)
      x(tx, "INSERT OR REPLACE INTO handoff_jobs(event_id, session_id, message_id, originating_message_id,"
        .. " event_type_id, correlation_id, external_job_id, due_at, payload_json, registered_at, state, error_text)"
        .. " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL)", tostring(b.eventId), optstr(b.sessionId),
        optstr(b.messageId), optstr(b.originatingMessageId) or optstr(b.messageId), optstr(b.eventTypeId),
        optstr(b.correlationId), tostring(b.externalJobId), due, optstr(payload), now_iso())
    end)
    if not ok2 then return s2, b2 end
    return 201, job_json(db:first("SELECT * FROM handoff_jobs WHERE event_id = ?", tostring(b.eventId)))
  end

  routes["GET /api/internal/handoff-jobs"] = function(req)
    local rows
    local due = req.query.due
    if due == "true" or due == "1" then
      rows = db:rows("SELECT * FROM handoff_jobs WHERE state = 'pending' AND due_at <= ? ORDER BY due_at, rowid",
        now_ms())
    else
      rows = db:rows("SELECT * FROM handoff_jobs WHERE state = 'pending' ORDER BY due_at, rowid")
    end
    local out = {}
    for i, r in ipairs(assert(rows)) do out[i] = job_json(r) end
    return 200, list_body(out)
  end

  routes["GET /api/internal/handoff-jobs/{externalJobId}"] = function(req)
    local r = get_job(req.params.externalJobId)
    if not r then return 404, { error = "handoff job not found" } end
    return 200, job_json(settle_if_due(r))
  end

  routes["POST /api/internal/handoff-jobs/{externalJobId}/apply"] = function(req)
    local job = get_job(req.params.externalJobId)
    if not job then return 404, { error = "handoff job not found" } end
    if job.state == "failed" then return 409, { error = "handoff job already failed", state = job.state } end
    return apply_job(job)
  end

  routes["POST /api/internal/handoff-jobs/{externalJobId}/fail"] = function(req)
    local job = get_job(req.params.externalJobId)
    if not job then return 404, { error = "handoff job not found" } end
    if job.state == "completed" then return 409, { error = "handoff job already completed", state = job.state } end
    local text = "DMF rejected"
    if req.body ~= "" then
      local b, st, eb = body_object(req)
      if not b then return st, eb end
      if not blank(b.errorText) then text = tostring(b.errorText) end
    end
    fail_job(job, text)
    return 200, job_json(db:first("SELECT * FROM handoff_jobs WHERE event_id = ?", job.event_id))
  end

  -------------------------------------------------------------- serve
  local srv, serr2 = nimbus.http.serve{ host = opts.host or "127.0.0.1", port = opts.port or 5090, routes = routes }
  if not srv then db:close(); return nil, serr2 end

  -- The transactional outbox's relay: rows in id order, each with its session and message id.
  local relay = outbox.start{
    source = outbox.sqlite{ db = db, table = "outbox_messages" },
    columns = { id = "id", type = "event_type", session = "session_id", payload = "payload_json",
                sent = "dispatched_at", message_id = "message_id" },
    every = every, name = "erp_api outbox",
  }

  local api = { port = srv.port, db = db, knobs = function() return knobs end }
  function api.dispatch_outbox() return relay:poll() end
  function api.close()
    if closed then return end
    closed = true
    relay:stop()
    srv:close()
    db:close()
  end
  return api
end

return M

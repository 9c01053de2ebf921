-- The CRM adapter of the CrmErpDemo sample (docs/crm-erp-demo.md section 3.2): endpoint
-- `CrmEndpoint` subscribes to the ERP events (and the partner portal's leads) and writes
-- them into Crm.Api over HTTP, each handler one adapters.http_forward call (contracts.api).
--
--   package.path = "samples/crm-erp/?.lua;" .. package.path
--   local crm = require("crm_adapter")
--   crm.setup{ crm_url = "http://127.0.0.1:5080", timeout = 30, concurrency = 32 }
--   -- crm.calls.total, crm.calls.LinkAccountToErp ... ; crm.reset_calls()
--
-- Pipeline: contracts.validation (a missing required field dead-letters), then the
-- handler. The inbox is on (a MessageId already handled is skipped as DuplicateDetected).
-- Every non-2xx answer of Crm.Api fails the event (and so blocks its session):
--   "<operation> failed: CRM API <METHOD> <path> → <status> <reason>. Body: <first 500 chars>"
-- and a transport failure:
--   "<operation> failed: CRM API <METHOD> <path> unreachable: <msg>"
-- M.calls counts the Crm.Api calls the handlers made (calls.total and calls[<operation>]),
-- so a scenario can prove a handler did not run again (inbox dedup).
local nimbus = require("nimbus")
local cjson = require("cjson")
local contracts = require("contracts")

local M = {}

local NULL = cjson.null
local seg = contracts.seg

M.calls = { total = 0 }

function M.reset_calls()
  for k in pairs(M.calls) do M.calls[k] = nil end
  M.calls.total = 0
end

local function count(operation)
  local calls = M.calls
  calls.total = calls.total + 1
  calls[operation] = (calls[operation] or 0) + 1
end

-- JSON null and "" count as absent.
local function val(v)
  if v == NULL or v == "" then return nil end
  return v
end

-- An optional field as the .NET client serialises it: null when absent.
local function orNull(v)
  v = val(v)
  if v == nil then return NULL end
  return v
end

-- Origin is an enum (Erp = 0, Crm = 1) that may arrive as its integer or its name.
function M.origin_of(v)
  if v == 1 or v == "1" then return "Crm" end
  if v == 0 or v == "0" then return "Erp" end
  if type(v) == "string" then
    local l = v:lower()
    if l == "crm" then return "Crm" end
    if l == "erp" then return "Erp" end
  end
  return nil
end

local function handlers(call)
  local h = {}

  h.link_account = call("LinkAccountToErp", "POST", function(e)
    return "/api/accounts/" .. seg(e.AccountId) .. "/link-erp"
  end, { json = function(e) return { erpCustomerId = e.ErpCustomerId, customerNumber = e.CustomerNumber } end })

  -- ErpCustomerCreated (Origin Erp) has no CRM account yet; ErpCustomerUpdated names it.
  h.upsert_account = call("UpsertAccountFromErp", "PUT", function(e)
    return "/api/accounts/external/" .. seg(e.ErpCustomerId)
  end, { json = function(e)
    return { crmAccountId = e.crm_account_id or NULL, legalName = e.LegalName, taxId = orNull(e.TaxId),
             countryCode = e.CountryCode, customerNumber = e.CustomerNumber }
  end })

  h.delete_account = call("DeleteAccountFromErp", "POST", function(e)
    return "/api/accounts/external/" .. seg(e.ErpCustomerId) .. "/deleted"
  end)

  h.upsert_contact = call("UpsertContactFromErp", "PUT", function(e)
    return "/api/contacts/upsert/" .. seg(e.ContactId)
  end, { json = function(e)
    return { id = e.ContactId, erpCustomerId = orNull(e.CustomerId), firstName = e.FirstName, lastName = e.LastName,
             email = orNull(e.Email), phone = orNull(e.Phone), origin = "Erp" }
  end })

  h.delete_contact = call("DeleteContactFromErp", "POST", function(e)
    return "/api/contacts/" .. seg(e.ContactId) .. "/deleted"
  end)

  -- CompanyName is dropped.
  h.upsert_lead = call("UpsertContactFromPartner", "PUT", function(e)
    return "/api/contacts/upsert/" .. seg(e.LeadId)
  end, { json = function(e)
    return { id = e.LeadId, erpCustomerId = NULL, firstName = e.FirstName, lastName = e.LastName,
             email = orNull(e.Email), phone = orNull(e.Phone), origin = "Partner" }
  end })
  return h
end

-- A shallow copy of the event with the CRM account id the upsert should carry.
local function with_account(e, crm_account_id)
  local copy = {}
  for k, v in pairs(e) do copy[k] = v end
  copy.crm_account_id = crm_account_id
  return copy
end

function M.setup(conf)
  conf = conf or {}
  local call = contracts.api("CRM API", conf.crm_url or "http://127.0.0.1:5080", conf.timeout or 30)
  local h = handlers(function(operation, method, path_of, opts)
    opts = opts or {}
    opts.count = count
    return call(operation, method, path_of, opts)
  end)
  local ep = nimbus.endpoint("CrmEndpoint", { concurrency = conf.concurrency or 32, inbox = true })
  ep:use(contracts.validation)

  -- Origin=Crm: the account came from CRM; link it to its ERP customer (idempotent).
  -- Origin=Erp: the customer was created in ERP; upsert a new Origin="Erp" account.
  ep:on("ErpCustomerCreated", function(e, ctx)
    local origin = M.origin_of(e.Origin)
    if origin == nil then
      error(nimbus.permanent(("Validation failed: ErpCustomerCreated.Origin must be Crm (1) or Erp (0), got %s")
                             :format(tostring(e.Origin)), "ValidationError"), 0)
    end
    if origin == "Crm" then return h.link_account(e, ctx) end
    return h.upsert_account(with_account(e, nil), ctx)
  end)

  ep:on("ErpCustomerUpdated", function(e, ctx)
    return h.upsert_account(with_account(e, val(e.CrmAccountId) or e.AccountId), ctx)
  end)

  ep:on("ErpCustomerDeleted", h.delete_account)
  ep:on("ErpContactCreated", h.upsert_contact)
  ep:on("ErpContactUpdated", h.upsert_contact)
  ep:on("ErpContactDeleted", h.delete_contact)

  -- The partner portal's lead (a raw CloudEvent in the original): a Partner contact.
  ep:on("PartnerLeadSubmitted", function(e, ctx)
    nimbus.log.info("partner lead received", { id = ctx.message_id, source = rawget(ctx, "source") or "urn:partnerportal",
                                               type = ctx.event_type, lead = e.LeadId })
    return h.upsert_lead(e, ctx)
  end)

  M.endpoint = ep
  return ep
end

return M

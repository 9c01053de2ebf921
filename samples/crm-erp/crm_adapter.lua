-- The CRM adapter of the CrmErpDemo sample (docs/crm-erp-demo.md section 3.2): endpoint
-- `CrmEndpoint` subscribes to the ERP events (and the partner portal's leads) and writes
-- them into Crm.Api over HTTP.
--
--   require("crm_adapter").setup{ crm_url = "http://127.0.0.1:5080", timeout = 30 }
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

M.calls = { total = 0 }

function M.reset_calls()
  for k in pairs(M.calls) do M.calls[k] = nil end
  M.calls.total = 0
end

local REASONS = {
  [200] = "OK", [201] = "Created", [202] = "Accepted", [204] = "No Content",
  [301] = "Moved Permanently", [302] = "Found", [304] = "Not Modified",
  [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden", [404] = "Not Found",
  [405] = "Method Not Allowed", [408] = "Request Timeout", [409] = "Conflict", [410] = "Gone",
  [412] = "Precondition Failed", [413] = "Payload Too Large", [415] = "Unsupported Media Type",
  [422] = "Unprocessable Entity", [429] = "Too Many Requests",
  [500] = "Internal Server Error", [501] = "Not Implemented", [502] = "Bad Gateway",
  [503] = "Service Unavailable", [504] = "Gateway Timeout",
}
M.REASONS = REASONS

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

-- A path segment, percent-encoded outside the unreserved characters (ids are GUIDs).
local function seg(v)
  return (tostring(v):gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
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

local function make(conf)
  local base = (conf.crm_url or "http://127.0.0.1:5080"):gsub("/+$", "")
  local timeout = conf.timeout or 30

  -- One Crm.Api call; raises the ResponseAssertions-style message on failure.
  local function call(operation, method, path, body)
    local calls = M.calls
    calls.total = calls.total + 1
    calls[operation] = (calls[operation] or 0) + 1
    local res, msg = nimbus.http.request{ method = method, url = base .. path, json = body, timeout = timeout }
    if not res then
      error(("%s failed: CRM API %s %s unreachable: %s"):format(operation, method, path, tostring(msg)), 0)
    end
    if res.status < 200 or res.status > 299 then
      local text = res.body or ""
      if #text > 500 then text = text:sub(1, 500) end
      error(("%s failed: CRM API %s %s → %d %s. Body: %s"):format(operation, method, path, res.status,
            REASONS[res.status] or "Unknown", text), 0)
    end
    return res
  end
  return call
end

function M.setup(conf)
  conf = conf or {}
  local call = make(conf)
  local ep = nimbus.endpoint("CrmEndpoint", { concurrency = conf.concurrency or 32, inbox = true })
  ep:use(contracts.validation)

  -- Origin=Crm: the account came from CRM; link it to its ERP customer (idempotent).
  -- Origin=Erp: the customer was created in ERP; upsert a new Origin="Erp" account.
  ep:on("ErpCustomerCreated", function(e)
    local origin = M.origin_of(e.Origin)
    if origin == nil then
      error(nimbus.permanent(("Validation failed: ErpCustomerCreated.Origin must be Crm (1) or Erp (0), got %s")
                             :format(tostring(e.Origin)), "ValidationError"), 0)
    end
    if origin == "Crm" then
      call("LinkAccountToErp", "POST", "/api/accounts/" .. seg(e.AccountId) .. "/link-erp",
           { erpCustomerId = e.ErpCustomerId, customerNumber = e.CustomerNumber })
    else
      call("UpsertAccountFromErp", "PUT", "/api/accounts/external/" .. seg(e.ErpCustomerId),
           { crmAccountId = NULL, legalName = e.LegalName, taxId = orNull(e.TaxId), countryCode = e.CountryCode,
             customerNumber = e.CustomerNumber })
    end
  end)

  ep:on("ErpCustomerUpdated", function(e)
    call("UpsertAccountFromErp", "PUT", "/api/accounts/external/" .. seg(e.ErpCustomerId),
         { crmAccountId = val(e.CrmAccountId) or e.AccountId, legalName = e.LegalName, taxId = orNull(e.TaxId),
           countryCode = e.CountryCode, customerNumber = e.CustomerNumber })
  end)

  ep:on("ErpCustomerDeleted", function(e)
    call("DeleteAccountFromErp", "POST", "/api/accounts/external/" .. seg(e.ErpCustomerId) .. "/deleted")
  end)

  local function upsert_contact(e)
    call("UpsertContactFromErp", "PUT", "/api/contacts/upsert/" .. seg(e.ContactId),
         { id = e.ContactId, erpCustomerId = orNull(e.CustomerId), firstName = e.FirstName, lastName = e.LastName,
           email = orNull(e.Email), phone = orNull(e.Phone), origin = "Erp" })
  end
  ep:on("ErpContactCreated", upsert_contact)
  ep:on("ErpContactUpdated", upsert_contact)

  ep:on("ErpContactDeleted", function(e)
    call("DeleteContactFromErp", "POST", "/api/contacts/" .. seg(e.ContactId) .. "/deleted")
  end)

  -- The partner portal's lead (a raw CloudEvent in the original): a Partner contact.
  -- CompanyName is dropped.
  ep:on("PartnerLeadSubmitted", function(e, ctx)
    nimbus.log.info("partner lead received", { id = ctx.message_id, source = rawget(ctx, "source") or "urn:partnerportal",
                                               type = ctx.event_type, lead = e.LeadId })
    call("UpsertContactFromPartner", "PUT", "/api/contacts/upsert/" .. seg(e.LeadId),
         { id = e.LeadId, erpCustomerId = NULL, firstName = e.FirstName, lastName = e.LastName,
           email = orNull(e.Email), phone = orNull(e.Phone), origin = "Partner" })
  end)

  M.endpoint = ep
  return ep
end

return M

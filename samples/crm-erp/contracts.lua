-- CrmErpDemo contracts (crmerpdemo.md section 2): event types, required fields, the
-- session key of each type, and a validation middleware that dead-letters an event with
-- missing required fields, as NimBus's ValidationMiddleware does.
local nimbus = require("nimbus")

local M = {}

-- type -> { session = field, required = { fields... } }
M.types = {
  CrmAccountCreated = { session = "AccountId", required = { "AccountId", "LegalName", "CountryCode" } },
  CrmAccountUpdated = { session = "AccountId", required = { "AccountId", "LegalName", "CountryCode" } },
  CrmAccountDeleted = { session = "AccountId", required = { "AccountId" } },
  CrmContactCreated = { session = "ContactId", required = { "ContactId", "FirstName", "LastName" } },
  CrmContactUpdated = { session = "ContactId", required = { "ContactId", "FirstName", "LastName" } },
  CrmContactDeleted = { session = "ContactId", required = { "ContactId" } },
  ErpCreditCheckRequested = { session = "AccountId", required = { "AccountId" } },
  PlaceCustomerOnCreditHold = { session = "AccountId", required = { "AccountId" }, command = true },
  ErpCustomerCreated = { session = "AccountId",
                         required = { "Origin", "AccountId", "ErpCustomerId", "CustomerNumber", "LegalName",
                                      "CountryCode" } },
  ErpCustomerUpdated = { session = "AccountId",
                         required = { "AccountId", "ErpCustomerId", "CustomerNumber", "LegalName", "CountryCode" } },
  ErpCustomerDeleted = { session = "AccountId", required = { "AccountId", "ErpCustomerId" } },
  ErpContactCreated = { session = "ContactId", required = { "ContactId", "FirstName", "LastName" } },
  ErpContactUpdated = { session = "ContactId", required = { "ContactId", "FirstName", "LastName" } },
  ErpContactDeleted = { session = "ContactId", required = { "ContactId" } },
  PartnerLeadSubmitted = { session = "LeadId", required = { "LeadId", "FirstName", "LastName" } },
  ["crm.contact.enriched.v1"] = { session = "contactId", required = { "contactId", "industry" } },
}

-- The session id of an event of `event_type` (its session-key field), or nil.
function M.session_of(event_type, payload)
  local t = M.types[event_type]
  local v = t and payload[t.session]
  return v ~= nil and tostring(v) or nil
end

-- Publishes with the session key the contract names.
function M.publish(event_type, payload)
  return nimbus.publish(event_type, payload, { session = M.session_of(event_type, payload) })
end

local null = require("cjson").null
local function missing(v) return v == nil or v == "" or v == null end

-- Middleware: a missing required field is a permanent failure (DeadLettered, session not
-- blocked) with "Validation failed: <Type>.<Field> is required".
function M.validation(event, ctx, next)
  local t = M.types[ctx.event_type]
  if t then
    for _, f in ipairs(t.required) do
      if missing(event[f]) then
        error(nimbus.permanent(("Validation failed: %s.%s is required"):format(ctx.event_type, f),
                               "ValidationError"), 0)
      end
    end
  end
  return next()
end

-- ISO-8601 UTC now, as the APIs write it.
function M.now_iso()
  local ms = math.floor(require("nimbus.core").now() * 1000)
  return ("%s.%03dZ"):format(os.date("!%Y-%m-%dT%H:%M:%S", ms // 1000), ms % 1000)
end

return M

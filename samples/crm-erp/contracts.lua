-- CrmErpDemo contracts (docs/crm-erp-demo.md section 2): event types, required fields, the
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

---------------------------------------------------------------------------- ids and times
-- Shared by the fake APIs and the adapters.

local seeded = false
function M.guid()
  if not seeded then
    math.randomseed(math.floor(nimbus.now() * 1000000) % 0x7fffffff, os.time())
    seeded = true
  end
  local r = math.random
  return ("%08x-%04x-4%03x-%x%03x-%04x%08x"):format(r(0, 0xffffffff), r(0, 0xffff), r(0, 0xfff),
    r(8, 11), r(0, 0xfff), r(0, 0xffff), r(0, 0xffffffff))
end

function M.iso_of_ms(ms)
  return ("%s.%03dZ"):format(os.date("!%Y-%m-%dT%H:%M:%S", ms // 1000), ms % 1000)
end

-- "2025-12-02T10:00:00Z", "...T10:00:00.123+00:00", "...T12:00:00+02:00" -> ms epoch, or nil
function M.ms_of_iso(s)
  if type(s) ~= "string" then return nil end
  local y, mo, d, h, mi, sec, rest = s:match("^(%d%d%d%d)-(%d%d)-(%d%d)[Tt ](%d%d):(%d%d):(%d%d)(.*)$")
  if not y then return nil end
  local frac = 0
  local f, tail = rest:match("^%.(%d+)(.*)$")
  if f then frac = math.floor(tonumber("0." .. f) * 1000 + 0.5); rest = tail end
  local off = 0
  if rest == "Z" or rest == "z" or rest == "" then off = 0
  else
    local sign, oh, om = rest:match("^([+-])(%d%d):?(%d%d)$")
    if not sign then return nil end
    off = (tonumber(oh) * 3600 + tonumber(om) * 60) * (sign == "-" and -1 or 1)
  end
  -- days from civil (Howard Hinnant), independent of the local time zone
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if mo <= 2 then y = y - 1 end
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (mo + (mo > 2 and -3 or 9)) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  local days = era * 146097 + doe - 719468
  local secs = days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec) - off
  return secs * 1000 + frac
end

-- ISO-8601 UTC now, as the APIs write it.
function M.now_iso()
  local ms = math.floor(nimbus.now() * 1000)
  return ("%s.%03dZ"):format(os.date("!%Y-%m-%dT%H:%M:%S", ms // 1000), ms % 1000)
end

return M

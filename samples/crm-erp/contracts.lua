-- CrmErpDemo contracts (docs/crm-erp-demo.md section 2): event types, required fields, the
-- session key of each type, the validation middleware that dead-letters an event with
-- missing required fields, as NimBus's ValidationMiddleware does (adapters.middleware), and
-- the API call both adapters make (adapters.http_forward with the section 3 outcomes).
--
--   local contracts = require("contracts")
--   local ep = nimbus.endpoint("CrmEndpoint")
--   ep:use(contracts.validation)
--   local call = contracts.api("CRM API", "http://127.0.0.1:5080")
--   ep:on("ErpContactDeleted", call("DeleteContactFromErp", "POST", function(e)
--     return "/api/contacts/" .. contracts.seg(e.ContactId) .. "/deleted"
--   end))
local nimbus = require("nimbus")
local forward = require("adapters.http_forward")
local mw = require("adapters.middleware")

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

-- Middleware: a missing required field is a permanent failure (DeadLettered, session not
-- blocked) with "Validation failed: <Type>.<Field> is required" (adapters.middleware).
local required = {}
for event_type, t in pairs(M.types) do required[event_type] = t.required end
M.validation = mw.required_fields(required)

---------------------------------------------------------------------------- API calls
-- Both adapters call their API the same way (docs/crm-erp-demo.md section 3): every answer
-- that is not 2xx, and no answer at all, fails the event (Failed, the session blocks; no
-- retry policy, as in the original), with
--   "<operation> failed: <API> <METHOD> <path> → <status> <reason>. Body: <first 500 chars>"
--   "<operation> failed: <API> <METHOD> <path> unreachable: <message>"

-- A path segment, percent-encoded outside the unreserved characters (ids are GUIDs).
function M.seg(v)
  return (tostring(v):gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function first_chars(s, n)
  local len = utf8.len(s)
  if len == nil then return s:sub(1, n) end   -- not UTF-8: bytes
  if len <= n then return s end
  return s:sub(1, utf8.offset(s, n + 1) - 1)
end

-- http_forward's error_text in the section 3 wording, for `api` ("CRM API").
local function api_error_text(api)
  return function(f)
    if f.kind == "no_answer" then
      return ("%s failed: %s %s %s unreachable: %s"):format(f.name, api, f.method, f.path, f.message)
    end
    return ("%s failed: %s %s %s → %d %s. Body: %s"):format(f.name, api, f.method, f.path, f.status,
      f.reason or "Unknown", first_chars(f.body, 500))
  end
end
M.api_error_text = api_error_text

-- contracts.api("ERP API", "http://127.0.0.1:5090") -> call, where
--   call(operation, method, path_of, opts) -> an http_forward handler(event, ctx):
--   path_of(event) -> "/api/..." ; opts.json(event) -> the request body ; opts.outcomes adds
--   to "2xx done, anything else failed" (e.g. [404] = function(res, event, ctx) ... end) ;
--   opts.on_response(res, event, ctx) runs on a 2xx.
--   Its handler returns what an outcome function returned (a reply table).
function M.api(api, base, timeout)
  base = base:gsub("/+$", "")
  local text = api_error_text(api)
  return function(operation, method, path_of, opts)
    opts = opts or {}
    local outcomes = { ["2xx"] = "done", ["3xx"] = "failed", ["4xx"] = "failed", ["5xx"] = "failed" }
    for k, v in pairs(opts.outcomes or {}) do outcomes[k] = v end
    local body = opts.json
    return forward.handler{
      name = operation, method = method, timeout = timeout or 30, max_redirects = 0,
      outcomes = outcomes, no_answer = "failed", error_text = text, on_response = opts.on_response,
      map = function(event, ctx)
        if opts.count then opts.count(operation) end
        return { url = base .. path_of(event, ctx), json = body and body(event, ctx) or nil }
      end,
    }
  end
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

-- ERP adapter of the CrmErpDemo sample (docs/crm-erp-demo.md sections 3.1, 4, 5, 8.3): endpoint
-- `ErpEndpoint`, the port of Erp.Adapter.Functions, on the adapter library: the API calls
-- are adapters.http_forward handlers (contracts.api), the knobs adapters.middleware, and the
-- DMF job status checker an adapters.job_poller.
--
--   package.path = "samples/crm-erp/?.lua;" .. package.path
--   local ep = require("erp_adapter").setup{ erp_url = "http://127.0.0.1:5090", checker_every = 1 }
--
-- Pipeline (outermost first): contracts.validation -> service mode -> processing delay ->
-- handler. As in NimBus the middlewares wrap every message type, the request handler and
-- the command included.
--   service mode on:   nimbus.permanent -> DeadLettered, the session is not blocked (a
--                      request gets no reply: the requester times out)
--   processing delay:  nimbus.sleep(delayMs / 1000) before the handler
--   error mode on:     every handler except the hand-off branch of CrmAccountCreated and
--                      the credit check fails (Failed, the session blocks)
-- A knob that cannot be read (2 s timeout, non-2xx, bad JSON) counts as off.
--
-- Every other ERP API call that answers non-2xx raises
--   "<operation> failed: ERP API <METHOD> <path> → <status> <reason>. Body: <first 500 chars>"
-- and one that cannot reach the API raises
--   "<operation> failed: ERP API <METHOD> <path> unreachable: <message>"
-- (plain errors: Failed, the session blocks; no retry policy, as in the original).
--
-- Hand-off: with hand-off mode on, CrmAccountCreated registers a DMF job with the ERP API
-- (POST /api/internal/handoff-jobs) and parks the event Pending+Handoff with the job id
-- "DMF-<12 hex>". The job poller "dmf-jobs" (every `checker_every` seconds) reads
-- GET /api/internal/handoff-jobs/{externalJobId} for each such row (the ERP API settles a
-- due job when it is read, section 8.3):
--   pending      -> left pending
--   completed    -> complete { importedRecordId = externalJobId }
--   failed       -> fail with the job's errorText ("DMF rejected: ..." or "Erp upsert
--                   failed: ..."), type DmfValidationError
--   404          -> fail "DMF job <id> is unknown to the ERP API"
--   no answer, another status, garbage -> logged, asked again at the next run.
local nimbus = require("nimbus")
local cjson = require("cjson")
local mw = require("adapters.middleware")
local poller = require("adapters.job_poller")
local contracts = require("contracts")

local NULL = cjson.null
local M = {}

M.ENDPOINT = "ErpEndpoint"
M.HANDOFF_REASON = "Awaiting ERP DMF import job (demo)"
M.ERROR_MODE_TEXT = "ERP is in error mode — handlers are configured to throw for every inbound message."
M.SERVICE_MODE_TEXT = "ERP is in service mode (maintenance): inbound messages are dead-lettered until it is turned off."
M.DMF_ERROR_TYPE = "DmfValidationError"

local KNOB_TIMEOUT = 2      -- seconds, as ErrorModeGuard / ServiceModeMiddleware
local CALL_TIMEOUT = 30     -- seconds, every other ERP API call

local seg = contracts.seg

-- nil / JSON null -> JSON null (request bodies carry explicit nulls, as the .NET client does)
local function j(v) if v == nil then return NULL end return v end
local function present(v) return v ~= nil and v ~= NULL end

local function job_id()
  return ("DMF-%012x"):format(math.random(0, 0xFFFFFFFFFFFF))
end

---------------------------------------------------------------------------- knobs
-- The four knobs of section 4, each read when needed (no cache: a knob flips take effect at
-- the next message); nil when unreadable.
local function knobs(base)
  local function knob(name) return mw.http_knob{ url = base .. "/api/admin/" .. name, timeout = KNOB_TIMEOUT } end
  local k = { error = knob("error-mode"), delay = knob("processing-delay"), handoff = knob("handoff-mode") }
  function k.on(which)
    local v = k[which]()
    return v ~= nil and v.enabled == true, v
  end
  return k
end

---------------------------------------------------------------------------- handlers
local function customer_body(account, erp_customer_id)
  return { erpCustomerId = j(erp_customer_id), legalName = j(account.LegalName), taxId = j(account.TaxId),
           countryCode = j(account.CountryCode) }
end

local function calls(call)
  local c = {}
  c.upsert_customer = call("UpsertCustomerByCrmAccount", "PUT", function(a)
    return "/api/customers/by-crm/" .. seg(a.AccountId)
  end, { json = function(a) return customer_body(a, present(a.ErpCustomerId) and a.ErpCustomerId or nil) end })

  c.delete_customer = call("DeleteCustomerByCrmAccount", "POST", function(a)
    return "/api/customers/by-crm/" .. seg(a.AccountId) .. "/deleted"
  end)

  c.upsert_contact = call("UpsertContact", "PUT", function(k)
    return "/api/contacts/upsert/" .. seg(k.ContactId)
  end, { json = function(k)
    return { crmAccountId = j(k.AccountId), firstName = j(k.FirstName), lastName = j(k.LastName),
             email = j(k.Email), phone = j(k.Phone) }
  end })

  c.delete_contact = call("DeleteContact", "POST", function(k)
    return "/api/contacts/" .. seg(k.ContactId) .. "/deleted"
  end)

  -- a 404 is "no customer linked": logged, the command completes
  c.credit_hold = call("PlaceCreditHold", "PUT", function(cmd)
    return "/api/customers/credit-hold/by-crm/" .. seg(cmd.AccountId)
  end, {
    json = function(cmd) return { reason = j(cmd.Reason) } end,
    outcomes = { [404] = function(_, cmd)
      nimbus.log.warn("no ERP customer is linked to the CRM account; credit hold not placed", { account = cmd.AccountId })
    end },
    on_response = function(_, cmd) nimbus.log.info("credit hold placed", { account = cmd.AccountId }) end,
  })

  -- The reply of the credit check from the customer (a 404: none).
  local function credit_reply(res, req)
    local customer
    if res.status ~= 404 then
      local v, err = res:json()
      if type(v) ~= "table" then
        error(("GetCustomerByCrmAccount failed: ERP API GET /api/customers/by-crm/%s returned a body that is "
               .. "not a JSON object: %s"):format(seg(req.AccountId), tostring(err or type(v))), 0)
      end
      customer = v
    end
    local status
    if not customer then status = "NotFound"
    elseif customer.isDeleted == true then status = "Deleted"
    elseif customer.creditHold == true then status = "OnHold"
    else status = "Active" end
    return { AccountId = req.AccountId, Approved = status == "Active", Status = status,
             CustomerNumber = customer and j(customer.customerNumber) or NULL, CheckedAt = contracts.now_iso() }
  end
  c.credit_check = call("GetCustomerByCrmAccount", "GET", function(req)
    return "/api/customers/by-crm/" .. seg(req.AccountId)
  end, { outcomes = { ["2xx"] = credit_reply, [404] = credit_reply } })

  -- The hand-off job (section 5.1); parks the event once the ERP API has it. `reg` carries
  -- the account, the job id and the duration from the handler to the request and back.
  c.register_job = call("RegisterHandoffJob", "POST", function() return "/api/internal/handoff-jobs" end, {
    json = function(reg, ctx)
      return { eventId = ctx.event_id, sessionId = tostring(reg.account.AccountId), messageId = j(ctx.message_id),
               originatingMessageId = j(ctx.originating_message_id or ctx.message_id),
               eventTypeId = "CrmAccountCreated", correlationId = j(ctx.correlation_id), externalJobId = reg.job,
               durationSeconds = reg.duration, dueAt = contracts.iso_of_ms(math.floor((nimbus.now() + reg.duration) * 1000)),
               payloadJson = cjson.encode(reg.account) }
    end,
    on_response = function(_, reg, ctx)
      ctx:mark_pending_handoff{ reason = M.HANDOFF_REASON, external_job_id = reg.job, expected_by = reg.duration }
      nimbus.log.info("handed off to the ERP DMF import", { job = reg.job, expected_by = reg.duration })
    end,
  })
  return c
end

---------------------------------------------------------------------------- DMF job poller
local function dmf_poller(ep, base, every)
  return poller.attach(ep, {
    name = "dmf-jobs", every = every, timeout = CALL_TIMEOUT,
    url = function(h)
      if h.external_job_id == nil or h.external_job_id == "" then return nil end   -- logged once, left alone
      return base .. "/api/internal/handoff-jobs/" .. seg(h.external_job_id)
    end,
    status_field = "state", running = { "pending" }, done = { "completed" }, failed = { "failed" },
    result_field = function(_, _, h) return { importedRecordId = h.external_job_id } end,
    error_type = M.DMF_ERROR_TYPE,
    error_text = function(f)
      if f.kind == "not_found" then
        return ("DMF job %s is unknown to the ERP API"):format(f.h.external_job_id), M.DMF_ERROR_TYPE
      end
      local text = f.body.errorText
      if type(text) ~= "string" or text == "" then text = "DMF rejected" end
      return text
    end,
    backoff = { base = every, factor = 1, max = every },   -- every run: the demo shows the settlement at once
  })
end

---------------------------------------------------------------------------- setup
function M.setup(opts)
  opts = opts or {}
  local base = (opts.erp_url or "http://127.0.0.1:5090"):gsub("/+$", "")
  local knob = knobs(base)
  local c = calls(contracts.api("ERP API", base, CALL_TIMEOUT))

  local function error_mode_guard()
    if knob.on("error") then error(M.ERROR_MODE_TEXT, 0) end
  end

  local ep = nimbus.endpoint(M.ENDPOINT, {
    concurrency = 200,   -- ERP Functions host.json: 200 sessions
    timeout = 180,       -- a processing delay may be 100 s, on top of the API calls
  })

  ep:use(contracts.validation)
  ep:use(mw.service_mode{ url = base .. "/api/admin/service-mode", timeout = KNOB_TIMEOUT, action = "deadletter",
                          message = M.SERVICE_MODE_TEXT })
  ep:use(mw.processing_delay{ seconds = function()
    local on, v = knob.on("delay")
    return on and (tonumber(v.delayMs) or 0) / 1000 or 0
  end })

  ep:on("CrmAccountCreated", function(account, ctx)
    local on, mode = knob.on("handoff")
    if on then   -- no error-mode guard on this path
      return c.register_job({ account = account, job = job_id(), duration = tonumber(mode.durationSeconds) or 5 }, ctx)
    end
    error_mode_guard()
    return c.upsert_customer({ AccountId = account.AccountId, LegalName = account.LegalName, TaxId = account.TaxId,
                               CountryCode = account.CountryCode }, ctx)
  end)

  ep:on("CrmAccountUpdated", function(account, ctx)
    error_mode_guard()
    return c.upsert_customer(account, ctx)
  end)

  ep:on("CrmAccountDeleted", function(account, ctx)
    error_mode_guard()
    return c.delete_customer(account, ctx)
  end)

  local function upsert_contact(contact, ctx)
    error_mode_guard()
    return c.upsert_contact(contact, ctx)
  end
  ep:on("CrmContactCreated", upsert_contact)
  ep:on("CrmContactUpdated", upsert_contact)

  ep:on("CrmContactDeleted", function(contact, ctx)
    error_mode_guard()
    return c.delete_contact(contact, ctx)
  end)

  ep:command("PlaceCustomerOnCreditHold", function(cmd, ctx)
    error_mode_guard()
    return c.credit_hold(cmd, ctx)
  end)

  ep:reply("ErpCreditCheckRequested", c.credit_check)   -- no error-mode guard

  dmf_poller(ep, base, opts.checker_every or 1)
  return ep
end

return M

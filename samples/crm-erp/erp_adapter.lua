-- ERP adapter of the CrmErpDemo sample (docs/crm-erp-demo.md sections 3.1, 4, 5, 8.3): endpoint
-- `ErpEndpoint`, the port of Erp.Adapter.Functions, plus the DMF status checker that
-- replaces Erp.Api's HandoffJobBackgroundService.
--
--   require("erp_adapter").setup{ erp_url = "http://127.0.0.1:5090", checker_every = 1 }
--     -> the endpoint
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
-- Status checker "dmf-jobs" (every `checker_every` seconds), for each Pending+Handoff row:
--   GET /api/internal/handoff-jobs/{externalJobId}
--     404                     -> fail "DMF job <id> is unknown to the ERP API"
--     state failed/completed  -> settle the same way (a run that stopped between the API
--                                call and the settlement)
--     dueAt not reached       -> leave it pending
--   GET /api/admin/handoff-mode (the CURRENT failureRate), r = math.random()
--     r < failureRate -> POST .../fail { errorText } then fail with one of the five
--                        "DMF rejected: ..." texts, type DmfValidationError
--     otherwise       -> POST .../apply (upsert + outbox in the API); non-2xx -> POST .../fail
--                        and fail "Erp upsert failed: <msg>"; 2xx -> complete
--                        { importedRecordId = externalJobId }
--   A row whose ERP API calls cannot be made (unreachable, 5xx on the job read) is logged and
--   left pending for the next run; the other rows go on.
local nimbus = require("nimbus")
local cjson = require("cjson")
local contracts = require("contracts")

local NULL = cjson.null
local M = {}

M.ENDPOINT = "ErpEndpoint"
M.HANDOFF_REASON = "Awaiting ERP DMF import job (demo)"
M.ERROR_MODE_TEXT = "ERP is in error mode — handlers are configured to throw for every inbound message."
M.SERVICE_MODE_TEXT = "ERP is in service mode (maintenance): inbound messages are dead-lettered until it is turned off."
M.DMF_ERROR_TYPE = "DmfValidationError"

-- The five canned settlement failures (section 5.3); the fake ERP API's list when it is there.
local ok_erp, erp_api = pcall(require, "fake.erp_api")
M.DMF_REJECTIONS = (ok_erp and type(erp_api) == "table" and erp_api.DMF_REJECTIONS) or {
  "DMF rejected: invalid postal code",
  "DMF rejected: duplicate customer number",
  "DMF rejected: tax ID validation failed",
  "DMF rejected: missing mandatory address line",
  "DMF rejected: country code not configured in legal entity",
}

local KNOB_TIMEOUT = 2      -- seconds, as ErrorModeGuard / ServiceModeMiddleware
local CALL_TIMEOUT = 30     -- seconds, every other ERP API call

local REASONS = {
  [200] = "OK", [201] = "Created", [202] = "Accepted", [204] = "No Content",
  [301] = "Moved Permanently", [302] = "Found", [304] = "Not Modified",
  [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden", [404] = "Not Found",
  [405] = "Method Not Allowed", [406] = "Not Acceptable", [408] = "Request Timeout", [409] = "Conflict",
  [410] = "Gone", [411] = "Length Required", [412] = "Precondition Failed", [413] = "Payload Too Large",
  [415] = "Unsupported Media Type", [422] = "Unprocessable Entity", [429] = "Too Many Requests",
  [500] = "Internal Server Error", [501] = "Not Implemented", [502] = "Bad Gateway",
  [503] = "Service Unavailable", [504] = "Gateway Timeout",
}

---------------------------------------------------------------------------- helpers
-- nil / JSON null -> JSON null (request bodies carry explicit nulls, as the .NET client does)
local function j(v) if v == nil then return NULL end return v end
local function present(v) return v ~= nil and v ~= NULL end

local function first_chars(s, n)
  s = s or ""
  local len = utf8.len(s)
  if len == nil then return s:sub(1, n) end   -- not UTF-8: bytes
  if len <= n then return s end
  return s:sub(1, utf8.offset(s, n + 1) - 1)
end

local function seg(v)
  return (tostring(v):gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function is2xx(status) return status >= 200 and status < 300 end

local function api_error(operation, method, path, res)
  local reason = REASONS[res.status]
  return ("%s failed: ERP API %s %s → %d%s. Body: %s"):format(operation, method, path, res.status,
    reason and (" " .. reason) or "", first_chars(res.body, 500))
end

local function now_ms() return math.floor(nimbus.now() * 1000) end
local guid, ms_of_iso, iso_of_ms = contracts.guid, contracts.ms_of_iso, contracts.iso_of_ms


-- "2025-12-02T10:00:00Z", "...T10:00:00.123+00:00", "...T12:00:00+02:00" -> ms epoch, or nil
M._ms_of_iso = ms_of_iso

local function job_id()
  return ("DMF-%012x"):format(math.random(0, 0xFFFFFFFFFFFF))
end

---------------------------------------------------------------------------- setup
function M.setup(opts)
  opts = opts or {}
  local base = (opts.erp_url or "http://127.0.0.1:5090"):gsub("/+$", "")
  local every = opts.checker_every or 1
  local random = opts.random or math.random   -- tests may pin the roll

  -- One ERP API call. Returns the response of a 2xx (or of a status in `accept`); raises the
  -- section 3 message otherwise.
  local function call(operation, method, path, body, accept)
    local res, msg = nimbus.http.request{ method = method, url = base .. path, json = body, timeout = CALL_TIMEOUT }
    if not res then
      error(("%s failed: ERP API %s %s unreachable: %s"):format(operation, method, path, tostring(msg)), 0)
    end
    if is2xx(res.status) or (accept and accept[res.status]) then return res end
    error(api_error(operation, method, path, res), 0)
  end

  -- A knob's JSON object, or nil when it cannot be read (any failure counts as off).
  local function knob(path)
    local res = nimbus.http.request{ method = "GET", url = base .. path, timeout = KNOB_TIMEOUT }
    if not res or not is2xx(res.status) then return nil end
    local v = res:json()
    if type(v) ~= "table" then return nil end
    return v
  end
  local function knob_on(path)
    local v = knob(path)
    return v ~= nil and v.enabled == true, v
  end

  local function error_mode_guard()
    if knob_on("/api/admin/error-mode") then error(M.ERROR_MODE_TEXT, 0) end
  end

  local ep = nimbus.endpoint(M.ENDPOINT, {
    concurrency = 200,   -- ERP Functions host.json: 200 sessions
    timeout = 180,       -- a processing delay may be 100 s, on top of the API calls
  })

  -------------------------------------------------------------- middleware
  ep:use(contracts.validation)

  ep:use(function(_, _, next)   -- ServiceModeMiddleware
    if knob_on("/api/admin/service-mode") then error(nimbus.permanent(M.SERVICE_MODE_TEXT, "ServiceMode"), 0) end
    return next()
  end)

  ep:use(function(_, _, next)   -- ProcessingDelayMiddleware
    local on, v = knob_on("/api/admin/processing-delay")
    local ms = on and tonumber(v.delayMs) or 0
    if ms > 0 then nimbus.sleep(ms / 1000) end
    return next()
  end)

  -------------------------------------------------------------- accounts
  local function upsert_customer(account, erp_customer_id)
    call("UpsertCustomerByCrmAccount", "PUT", "/api/customers/by-crm/" .. seg(account.AccountId), {
      erpCustomerId = j(erp_customer_id), legalName = j(account.LegalName), taxId = j(account.TaxId),
      countryCode = j(account.CountryCode) })
  end

  ep:on("CrmAccountCreated", function(account, ctx)
    local on, mode = knob_on("/api/admin/handoff-mode")
    if on then
      local id = job_id()
      local duration = tonumber(mode.durationSeconds) or 5
      call("RegisterHandoffJob", "POST", "/api/internal/handoff-jobs", {
        eventId = ctx.event_id,
        sessionId = tostring(account.AccountId),
        messageId = j(ctx.message_id),
        originatingMessageId = j(ctx.originating_message_id or ctx.message_id),
        eventTypeId = "CrmAccountCreated",
        correlationId = j(ctx.correlation_id),
        externalJobId = id,
        durationSeconds = duration,
        dueAt = iso_of_ms(now_ms() + math.floor(duration * 1000)),
        payloadJson = cjson.encode(account),
      })
      ctx:mark_pending_handoff{ reason = M.HANDOFF_REASON, external_job_id = id, expected_by = duration }
      nimbus.log.info("handed off to the ERP DMF import", { job = id, expected_by = duration })
      return   -- no error-mode guard on this path
    end
    error_mode_guard()
    upsert_customer(account, nil)
  end)

  ep:on("CrmAccountUpdated", function(account)
    error_mode_guard()
    upsert_customer(account, present(account.ErpCustomerId) and account.ErpCustomerId or nil)
  end)

  ep:on("CrmAccountDeleted", function(account)
    error_mode_guard()
    call("DeleteCustomerByCrmAccount", "POST", "/api/customers/by-crm/" .. seg(account.AccountId) .. "/deleted")
  end)

  -------------------------------------------------------------- contacts
  local function upsert_contact(contact)
    error_mode_guard()
    call("UpsertContact", "PUT", "/api/contacts/upsert/" .. seg(contact.ContactId), {
      crmAccountId = j(contact.AccountId), firstName = j(contact.FirstName), lastName = j(contact.LastName),
      email = j(contact.Email), phone = j(contact.Phone) })
  end
  ep:on("CrmContactCreated", upsert_contact)
  ep:on("CrmContactUpdated", upsert_contact)

  ep:on("CrmContactDeleted", function(contact)
    error_mode_guard()
    call("DeleteContact", "POST", "/api/contacts/" .. seg(contact.ContactId) .. "/deleted")
  end)

  -------------------------------------------------------------- credit
  ep:command("PlaceCustomerOnCreditHold", function(cmd)
    error_mode_guard()
    local res = call("PlaceCreditHold", "PUT", "/api/customers/credit-hold/by-crm/" .. seg(cmd.AccountId),
                     { reason = j(cmd.Reason) }, { [404] = true })
    if res.status == 404 then
      nimbus.log.warn("no ERP customer is linked to the CRM account; credit hold not placed",
                      { account = cmd.AccountId })
      return
    end
    nimbus.log.info("credit hold placed", { account = cmd.AccountId })
  end)

  ep:reply("ErpCreditCheckRequested", function(req)   -- no error-mode guard
    local res = call("GetCustomerByCrmAccount", "GET", "/api/customers/by-crm/" .. seg(req.AccountId), nil,
                     { [404] = true })
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
    return {
      AccountId = req.AccountId,
      Approved = status == "Active",
      Status = status,
      CustomerNumber = customer and j(customer.customerNumber) or NULL,
      CheckedAt = contracts.now_iso(),
    }
  end)

  -------------------------------------------------------------- DMF status checker
  local function job_path(id) return "/api/internal/handoff-jobs/" .. seg(id) end

  local function settle(chk, what, h, ...)
    local ok, err = chk[what](chk, h, ...)
    if not ok then
      nimbus.log.warn("hand-off settlement refused", { event = h.event_id, job = h.external_job_id, reason = err })
    end
  end

  local function check_one(chk, h)
    local id = h.external_job_id
    if id == nil or id == "" then
      nimbus.log.warn("pending hand-off without an external job id; left alone", { event = h.event_id })
      return
    end
    local res = call("GetHandoffJob", "GET", job_path(id), nil, { [404] = true })
    if res.status == 404 then
      return settle(chk, "fail", h, ("DMF job %s is unknown to the ERP API"):format(id), M.DMF_ERROR_TYPE)
    end
    local job = res:json()
    if type(job) ~= "table" then
      error(("GetHandoffJob failed: ERP API GET %s returned a body that is not a JSON object"):format(job_path(id)), 0)
    end
    if job.state == "completed" then
      return settle(chk, "complete", h, { importedRecordId = id })
    elseif job.state == "failed" then
      local text = present(job.errorText) and tostring(job.errorText) or M.DMF_REJECTIONS[1]
      return settle(chk, "fail", h, text, M.DMF_ERROR_TYPE)
    end
    local due = tonumber(job.dueAtMs) or ms_of_iso(job.dueAt)
    if due and now_ms() < due then return end   -- not due yet

    -- the failure rate at settlement time, not at registration
    local mode = knob("/api/admin/handoff-mode")
    if mode == nil then
      error("ReadHandoffMode failed: ERP API GET /api/admin/handoff-mode could not be read", 0)
    end
    local rate = tonumber(mode.failureRate) or 0
    if random() < rate then
      local text = M.DMF_REJECTIONS[math.random(#M.DMF_REJECTIONS)]
      call("FailHandoffJob", "POST", job_path(id) .. "/fail", { errorText = text })
      return settle(chk, "fail", h, text, M.DMF_ERROR_TYPE)
    end

    local r, msg = nimbus.http.request{ method = "POST", url = base .. job_path(id) .. "/apply", json = {},
                                        timeout = CALL_TIMEOUT }
    if not r then   -- unknown whether it ran: the next run asks again (apply is idempotent)
      error(("ApplyHandoffJob failed: ERP API POST %s/apply unreachable: %s"):format(job_path(id), tostring(msg)), 0)
    end
    if not is2xx(r.status) then
      local b = r:json()
      local text
      if type(b) == "table" and type(b.error) == "string" and b.error:find("^Erp upsert failed: ") then
        text = b.error
      else
        text = "Erp upsert failed: " .. api_error("ApplyHandoffJob", "POST", job_path(id) .. "/apply", r)
      end
      -- mark the job failed in the API too (best effort; the settlement is what counts)
      nimbus.http.request{ method = "POST", url = base .. job_path(id) .. "/fail", json = { errorText = text },
                           timeout = CALL_TIMEOUT }
      return settle(chk, "fail", h, text, M.DMF_ERROR_TYPE)
    end
    return settle(chk, "complete", h, { importedRecordId = id })
  end

  ep:checker("dmf-jobs", { every = every }, function(chk)
    for _, h in ipairs(chk:pending_handoffs()) do
      local ok, err = pcall(check_one, chk, h)
      if not ok then
        nimbus.log.warn("DMF job check failed; it is checked again at the next run",
                        { event = h.event_id, job = h.external_job_id, error = tostring(err) })
      end
    end
  end)

  return ep
end

return M

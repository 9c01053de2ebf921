-- adapters.job_poller: a status checker that settles pending hand-offs by polling the
-- external job behind each one (the Location of a 202 Accepted, by default) and completing or
-- failing the event from the job's state.
--
--   local nimbus  = require("nimbus")
--   local forward = require("adapters.http_forward")
--   local poller  = require("adapters.job_poller")
--
--   local ep = nimbus.endpoint("ImportEndpoint")
--   ep:on("CatalogUploaded", forward.handler{ url = "http://127.0.0.1:5090/api/imports" })  -- 202 + Location
--
--   poller.attach(ep, {
--     every        = 2,                          -- the checker's tick, seconds
--     status_field = "job.state",                -- dotted path in the JSON answer (or a function)
--     done         = { "Succeeded", "Completed" },
--     failed       = { "Failed", "Cancelled" },
--     running      = { "Queued", "Running" },    -- other states are logged as unexpected
--     result_field = "job.result",               -- the completed hand-off's result (default: the body)
--     error_field  = "job.error.message",        -- the failed event's error text
--     error_type   = "ImportFailed",
--     backoff      = { base = 2, factor = 2, max = 120 },   -- per job: 2, 4, 8 ... 120 s apart
--     not_found    = "fail",                     -- 404/410 on the status URL: fail (or "wait")
--     headers      = { Authorization = "Bearer demo-token" },
--     error_text   = function(f) return f.kind == "failed" and ("import " .. f.state) or f.text end,
--     url          = function(h) return h.external_job_id end,   -- the default, for URL job ids
--   })
--
--   -- or as the function of a checker you declare yourself:
--   -- ep:checker("imports", { every = 2 }, poller.checker{ status_field = "state" })
--
-- Each run polls every pending hand-off of the endpoint that is due, one after the other:
--   a done state          chk:complete(h, result)     -> Completed, the session replays
--   a failed state        chk:fail(h, text, type)     -> Failed, the session stays blocked
--   303 See Other         done, result { location = the absolute Location }
--   404 / 410             not_found = "fail": failed with the URL and status; "wait": keep polling
--   a running state       wait (backoff)
--   anything else         (an unknown state, no state field, not JSON, other statuses, no
--                         answer) a warning that names the job, the URL and what came back;
--                         keep polling with backoff. A Retry-After on the answer is respected.
-- error_text(f) -> text[, type]: your wording of a failed job, replacing "job <url> ended
-- <state>: <error>" (f.kind "failed": f.state, f.body the decoded answer) or the 404/410 text
-- (f.kind "not_found"); f also has res, h (the hand-off), url, and text and type (ours).
-- The backoff lives in the checker's memory: after a reload or restart every job is polled once
-- at the first run, then backs off again. A hand-off without a status URL is logged and left
-- to the operator (nimbus-host handoff complete|fail).
local cjson = require("cjson.safe")
local forward = require("adapters.http_forward")

local M = {}

M.DEFAULTS = {
  done = { "Succeeded", "Completed" },
  failed = { "Failed", "Cancelled", "Canceled" },
  running = { "Queued", "Pending", "NotStarted", "Accepted", "Running", "InProgress" },
  status_field = "status",
  error_field = "error",
  error_type = "ExternalJobFailed",
  timeout = 10,
  backoff = { base = 1, factor = 2, max = 60 },
  not_found = "fail",
}

local KEYS = {
  url = "function", headers = "table|function", timeout = "number", status_field = "string|function",
  done = "table", failed = "table", running = "table", result_field = "string|function",
  error_field = "string|function", error_type = "string", backoff = "table", not_found = "string",
  error_text = "function",
}
local ATTACH_KEYS = { name = "string", every = "number", run_timeout = "number" }

-- the running adapter's nimbus, looked up at each use (see adapters/http_forward.lua)
local function rt() return require("nimbus") end
local now = forward._now
local header, get_path = forward.header, forward.get_path

---------------------------------------------------------------------------- options
local key_list = forward._key_list

-- A list of states as a lower-case set (states compare without case).
local function state_set(where, name, list)
  local set = {}
  for i, s in ipairs(list) do
    if type(s) ~= "string" or s == "" then
      error(("%s: %s[%d] must be a non-empty string"):format(where, name, i), 0)
    end
    set[s:lower()] = s
  end
  if next(list) ~= nil and #list == 0 then
    error(("%s: %s must be a list of states, e.g. { \"Succeeded\" }"):format(where, name), 0)
  end
  return set
end

local function compile(opts, where, extra)
  if type(opts) ~= "table" then error(("%s expects a table of options"):format(where), 0) end
  for k, v in pairs(opts) do
    local want = KEYS[k] or (extra and extra[k])
    if not want then
      error(("%s: unknown option %s (options: %s)"):format(where, tostring(k), key_list(KEYS, extra or {})), 0)
    end
    local ok = false
    for t in want:gmatch("[^|]+") do ok = ok or type(v) == t end
    if not ok then
      error(("%s: option %s must be a %s, got %s"):format(where, k, want:gsub("|", " or "), type(v)), 0)
    end
  end
  local d = M.DEFAULTS
  local conf = {
    url = opts.url, headers = opts.headers, error_text = opts.error_text,
    timeout = opts.timeout or d.timeout,
    status_field = opts.status_field or d.status_field,
    result_field = opts.result_field,
    error_field = opts.error_field or d.error_field,
    error_type = opts.error_type or d.error_type,
    not_found = opts.not_found or d.not_found,
  }
  if conf.timeout <= 0 then error(("%s: timeout must be > 0 seconds"):format(where), 0) end
  if conf.not_found ~= "fail" and conf.not_found ~= "wait" then
    error(("%s: not_found must be \"fail\" or \"wait\", got %q"):format(where, conf.not_found), 0)
  end
  for _, f in ipairs({ "status_field", "result_field", "error_field" }) do
    if conf[f] == "" then error(("%s: %s must be a dotted path such as \"job.state\""):format(where, f), 0) end
  end
  conf.done = state_set(where, "done", opts.done or d.done)
  conf.failed = state_set(where, "failed", opts.failed or d.failed)
  conf.running = state_set(where, "running", opts.running or d.running)
  for s, orig in pairs(conf.done) do
    if conf.failed[s] then error(("%s: state %q is both done and failed"):format(where, orig), 0) end
  end
  local b = opts.backoff or {}
  for k, v in pairs(b) do
    if k ~= "base" and k ~= "factor" and k ~= "max" then
      error(("%s: unknown backoff option %s (base, factor, max)"):format(where, tostring(k)), 0)
    end
    if type(v) ~= "number" then error(("%s: backoff.%s must be a number"):format(where, k), 0) end
  end
  conf.base = b.base or d.backoff.base
  conf.factor = b.factor or d.backoff.factor
  conf.max = b.max or d.backoff.max
  if conf.base <= 0 then error(("%s: backoff.base must be > 0 seconds"):format(where), 0) end
  if conf.factor < 1 then error(("%s: backoff.factor must be >= 1"):format(where), 0) end
  if conf.max < conf.base then error(("%s: backoff.max must be >= backoff.base"):format(where), 0) end
  return conf
end

---------------------------------------------------------------------------- one job
local function list_of(set)
  local out = {}
  for _, orig in pairs(set) do out[#out + 1] = orig end
  table.sort(out)
  return table.concat(out, ", ")
end

local function status_text(status)
  local reason = forward.REASONS[status]
  return reason and (status .. " " .. reason) or tostring(status)
end

local function field(conf_value, body, res, h)
  if type(conf_value) == "function" then return conf_value(body, res, h) end
  return get_path(body, conf_value)
end

-- The status URL of a hand-off, or nil and why not.
local function url_of(conf, h)
  local url
  if conf.url then
    url = conf.url(h)
  else
    url = h.external_job_id
  end
  if type(url) == "string" and url:match("^https?://[^/?#]+") then return url end
  if conf.url then
    return nil, ("the url function returned %s, not an http(s) URL"):format(type(url) == "string"
           and ("%q"):format(url) or tostring(url))
  end
  return nil, ("its external job id %s is not an http(s) URL; give url = function(h) ... end")
              :format(h.external_job_id and ("%q"):format(h.external_job_id) or "is empty and")
end

-- The text of a failed job: its error field (a string, a table's message, or the table as
-- JSON) after the state.
local function failure_text(conf, body, res, h, url, state)
  local e = field(conf.error_field, body, res, h)
  if type(e) == "table" then e = e.message or e.error or cjson.encode(e) end
  local text = ("job %s ended %s"):format(url, state)
  if e ~= nil and e ~= cjson.null and tostring(e) ~= "" then text = text .. ": " .. tostring(e) end
  return text
end

-- A verdict on one answer: { "complete", result } | { "fail", text, type } | { "wait" } |
-- { "odd", log message, extra log fields }.
local function judge_state(conf, body, res, h, url)
  local state = field(conf.status_field, body, res, h)
  if type(state) == "number" then state = tostring(math.tointeger(state) or state) end
  if type(state) ~= "string" then
    return { "odd", "the job's status has no state in its status field; polled again later",
             { field = type(conf.status_field) == "string" and conf.status_field or "(function)",
               body = forward._first_chars(res.body, 200) } }
  end
  local key = state:lower()
  if conf.done[key] then
    local result = body
    if conf.result_field then result = field(conf.result_field, body, res, h) end
    if result == cjson.null then result = nil end
    return { "complete", result }
  elseif conf.failed[key] then
    return { "fail", failure_text(conf, body, res, h, url, state), conf.error_type,
             { kind = "failed", state = state, body = body } }
  elseif conf.running[key] then
    return { "wait", state }
  end
  return { "odd", "the job reports an unknown state; still waiting",
           { state = state, expected = ("done: %s; failed: %s; running: %s")
             :format(list_of(conf.done), list_of(conf.failed), list_of(conf.running)) } }
end

local function judge(conf, res, h, url)
  local status = res.status
  local loc = header(res.headers, "location")
  if status == 303 and loc then return { "complete", { location = forward.resolve(url, loc) } } end
  if (status == 404 or status == 410) and conf.not_found == "fail" then
    return { "fail", ("job status URL %s answered %s: the API does not know the job (any more); resubmit the event "
                      .. "to send it again, or skip it"):format(url, status_text(status)), "ExternalJobNotFound",
             { kind = "not_found" } }
  end
  if status < 200 or status > 299 then
    return { "odd", ("unexpected answer %s from the job's status URL; polled again later"):format(status_text(status)),
             { status = status, body = forward._first_chars(res.body, 200) } }
  end
  local body, err = res:json()
  if type(body) ~= "table" or not res.body:find("^%s*{") then   -- an array decodes to a table too
    return { "odd", "the job's status is not a JSON object; polled again later",
             { body = forward._first_chars(res.body, 200), error = err or "a JSON value that is not an object" } }
  end
  return judge_state(conf, body, res, h, url)
end

-- The adapter's wording of a failed job (option error_text): text[, type] from
-- error_text(f), f = { kind = "failed" | "not_found", state, body, res, h, url, text, type }
-- where text and type are what the poller would have said.
local function own_text(conf, v, res, h, url)
  local f = v[4]
  f.res, f.h, f.url, f.text, f.type = res, h, url, v[2], v[3]
  local text, etype = conf.error_text(f)
  if type(text) ~= "string" or text == "" then
    error(("job_poller: error_text must return the error text as a non-empty string, got %s"):format(type(text)), 0)
  end
  if etype ~= nil and type(etype) ~= "string" then
    error(("job_poller: error_text's second result (the error type) must be a string, got %s"):format(type(etype)), 0)
  end
  return text, etype or v[3]
end

local function request_headers(conf, h)
  local given = conf.headers
  if type(given) == "function" then given = given(h) end
  local headers = {}
  for k, v in pairs(given or {}) do headers[k] = tostring(v) end
  if header(headers, "accept") == nil then headers.Accept = "application/json" end
  return headers
end

-- Polls one job and acts on the verdict. Returns "settled", "wait" (expected) or "odd"
-- (logged as unexpected), and the answer's Retry-After in seconds, if any.
local function poll_one(conf, chk, h, url)
  local res, msg, code = rt().http.request{ method = "GET", url = url, headers = request_headers(conf, h),
                                            timeout = conf.timeout }
  if not res then
    rt().log.warn("job_poller: the job's status URL did not answer; polled again later",
                  { event = h.event_id, job = url, error = msg, code = code })
    return "odd"
  end
  local ra = forward.retry_after(header(res.headers, "retry-after"))
  local v = judge(conf, res, h, url)
  local kind = v[1]
  if kind == "fail" and conf.error_text then v[2], v[3] = own_text(conf, v, res, h, url) end
  if kind == "complete" or kind == "fail" then
    local ok, err = chk[kind](chk, h, v[2], v[3])
    if not ok then
      rt().log.info("job_poller: the hand-off was settled elsewhere already",
                    { event = h.event_id, job = url, reason = tostring(err) })
    end
    return "settled"
  elseif kind == "wait" then
    rt().log.debug("job_poller: job still running", { event = h.event_id, job = url, state = v[2] })
    return "wait", ra
  end
  local fields = v[3]
  fields.event, fields.job = h.event_id, url
  rt().log.warn("job_poller: " .. v[2], fields)
  return "odd", ra
end

---------------------------------------------------------------------------- the checker
-- The delay before the next poll of a job polled `tries` times: exponential up to the cap,
-- or the answer's Retry-After when that is longer.
local function backoff(conf, tries, ra)
  local delay = math.min(conf.max, conf.base * conf.factor ^ (tries - 1))
  if ra and ra > delay then delay = ra end
  return delay
end

-- One pending hand-off at one run, when it is due: polls it, or says once that it cannot.
-- Returns true once settled. Raises what the adapter's functions (url, headers, fields)
-- raise.
local function check_job(conf, chk, h, st)
  local url, why = url_of(conf, h)
  if not url then
    if not st.url_error then   -- once: it will not get better by itself
      rt().log.warn("job_poller: a pending hand-off has no status URL to poll; settle it by hand (nimbus-host "
                    .. "handoff complete|fail) or fix the url option", { event = h.event_id, reason = why })
    end
    st.url_error, st.next_at = true, now() + conf.max
    return false
  end
  local what, ra = poll_one(conf, chk, h, url)
  if what == "settled" then return true end
  st.tries = st.tries + 1
  st.next_at = now() + backoff(conf, st.tries, ra)
  return false
end

local function make(conf)
  local jobs = {}   -- event_id -> { tries, next_at, url_error }: each job's backoff
  return function(chk)
    local live = {}
    for _, h in ipairs(chk:pending_handoffs()) do
      live[h.event_id] = true
      local st = jobs[h.event_id] or { tries = 0, next_at = 0 }
      jobs[h.event_id] = st
      if now() >= st.next_at then
        local ok, settled = pcall(check_job, conf, chk, h, st)
        if ok and settled then
          jobs[h.event_id] = nil
        elseif not ok then   -- one job's trouble does not hold up the others
          rt().log.warn("job_poller: checking a job failed; polled again later",
                        { event = h.event_id, job = h.external_job_id, error = tostring(settled) })
          st.tries = st.tries + 1
          st.next_at = now() + backoff(conf, st.tries)
        end
      end
    end
    for id in pairs(jobs) do
      if not live[id] then jobs[id] = nil end   -- settled elsewhere (an operator, another host)
    end
  end
end

-- poller.checker{ ... } -> function(chk) for ep:checker(name, { every = s }, fn)
function M.checker(opts)
  local ok, conf = pcall(compile, opts, "job_poller.checker")
  if not ok then error(conf, 2) end
  return make(conf)
end

-- poller.attach(ep, { name = "job-poller", every = 1, run_timeout = s, ... }) -> the checker
function M.attach(ep, opts)
  local where = "job_poller.attach"
  if type(ep) ~= "table" or type(ep.checker) ~= "function" then
    error(where .. ": the first argument must be an endpoint (nimbus.endpoint(...))", 2)
  end
  local ok, conf = pcall(compile, opts or {}, where, ATTACH_KEYS)
  if not ok then error(conf, 2) end
  opts = opts or {}
  local every = opts.every or 1
  if every <= 0 then error(where .. ": every must be > 0 seconds", 2) end
  if opts.run_timeout ~= nil and opts.run_timeout <= 0 then error(where .. ": run_timeout must be > 0 seconds", 2) end
  local name = opts.name or "job-poller"
  local cok, chk = pcall(ep.checker, ep, name, { every = every, timeout = opts.run_timeout }, make(conf))
  if not cok then error(where .. ": " .. tostring(chk):gsub("^[^\n]-:%d+: ", "", 1), 2) end
  return chk
end

return M

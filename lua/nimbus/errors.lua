-- Error values adapters raise to choose an outcome: nimbus.permanent(...) dead-letters
-- the message without blocking its session; nimbus.transient(...) makes the event
-- Pending+Retrying under the endpoint's `transient` policy (its session waits, order kept)
-- and Failed once the attempts are used up. Anything else is a failure.
--
--   local nimbus = require("nimbus")
--   local ep = nimbus.endpoint("Mailer")
--   ep:on("MailRequested", function(mail)
--     if not mail.to then error(nimbus.permanent("no recipient", "BadMail")) end
--     local res = nimbus.http.request{ method = "POST", url = "http://127.0.0.1:5080/mails", json = mail }
--     if res and res.status == 429 then
--       -- not before 30 s (longer than the policy's delay; never past its max_delay)
--       error(nimbus.transient("mail API is throttling", { type = "Throttled", retry_after = 30 }))
--     end
--   end)
--
-- permanent(message [, error_type]) / transient(message [, error_type]): error_type names
-- the failure (default PermanentFailure / TransientFailure). transient's second argument
-- may instead be a table { type = error_type, retry_after = seconds }: retry_after is the
-- least wait before the next attempt (an API's Retry-After); the host waits for the longer
-- of it and the policy's delay, capped by the policy's max_delay (one hour without one).
local M = {}

local Err = {}
Err.__index = Err
Err.__tostring = function(e) return e.kind .. ": " .. e.message end

local TRANSIENT_OPTS = "{ type = error_type, retry_after = seconds }"

-- A transient's options table -> error_type, retry_after; mistakes raise at the caller of
-- nimbus.transient (level 3 from here).
local function transient_opts(o)
  for k in pairs(o) do
    if k ~= "type" and k ~= "retry_after" then
      error(("nimbus.transient: unknown option %s (options: %s)"):format(tostring(k), TRANSIENT_OPTS), 3)
    end
  end
  if o.type ~= nil and type(o.type) ~= "string" then
    error(("nimbus.transient: `type` must be a string naming the failure, got %s"):format(type(o.type)), 3)
  end
  local ra = o.retry_after
  if ra ~= nil and (type(ra) ~= "number" or not (ra >= 0) or ra == math.huge) then
    error(("nimbus.transient: `retry_after` must be a number of seconds >= 0, got %s"):format(tostring(ra)), 3)
  end
  return o.type, ra
end

local function make(kind, default_type)
  return function(message, error_type)
    if message == nil then message = kind .. " failure" end
    local retry_after
    if type(error_type) == "table" and kind == "transient" then
      error_type, retry_after = transient_opts(error_type)
    elseif type(error_type) == "table" then
      error("nimbus.permanent: the error type (argument 2) must be a string; a permanent failure is never "
            .. "retried, so it takes no options", 2)
    end
    return setmetatable({ kind = kind, message = tostring(message), type = error_type or default_type,
                          retry_after = retry_after }, Err)
  end
end

M.permanent = make("permanent", "PermanentFailure")
M.transient = make("transient", "TransientFailure")

function M.is(v) return getmetatable(v) == Err end

-- A transient error's retry_after as the runner reports it: seconds >= 0, else nil (set on
-- the error value directly, it may be anything).
local function retry_after_of(err)
  local ra = rawget(err, "retry_after")
  if type(ra) == "number" and ra >= 0 and ra < math.huge then return ra end
  return nil
end

-- Returns outcome status, error text, error type (and for transient errors the retry_after
-- seconds, or nil) for a caught error value.
function M.classify(err)
  if getmetatable(err) == Err then
    if err.kind == "permanent" then return "deadletter", err.message, err.type end
    return "transient", err.message, err.type, retry_after_of(err)
  end
  if type(err) == "table" then
    local text = err.message or err.msg or err.error
    local mt = getmetatable(err)
    if text == nil and mt and mt.__tostring then text = tostring(err) end
    return "failed", tostring(text or "error object without a message"), tostring(err.type or "LuaError")
  end
  if err == nil then return "failed", "error raised with a nil value", "LuaError" end
  return "failed", tostring(err), "LuaError"
end

return M

-- Error values adapters raise to choose an outcome: nimbus.permanent(...) dead-letters
-- the message without blocking its session; nimbus.transient(...) makes the event
-- Pending+Retrying under the endpoint's `transient` policy (its session waits, order kept)
-- and Failed once the attempts are used up. Anything else is a failure.
local M = {}

local Err = {}
Err.__index = Err
Err.__tostring = function(e) return e.kind .. ": " .. e.message end

local function make(kind, default_type)
  return function(message, error_type)
    if message == nil then message = kind .. " failure" end
    return setmetatable({ kind = kind, message = tostring(message),
                          type = error_type or default_type }, Err)
  end
end

M.permanent = make("permanent", "PermanentFailure")
M.transient = make("transient", "TransientFailure")

function M.is(v) return getmetatable(v) == Err end

-- Returns outcome status, error text, error type for a caught error value.
function M.classify(err)
  if getmetatable(err) == Err then
    if err.kind == "permanent" then return "deadletter", err.message, err.type end
    return "transient", err.message, err.type
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

-- nimbus.internal: the runtime's private half. Not an API for adapters: what is here
-- changes without notice. The host (host/src/lua/nh_vm.c) and nimbus.testing reach the
-- runtime through it, so the public `nimbus` table holds only what adapters may use.
--
--   local nimbus = require("nimbus")             -- fills the slots below
--   local internal = require("nimbus.internal")
--   local out = internal.run("Greeter", "CustomerSignedUp", '{"name":"Ada"}', { event_id = "e1" })
--   local value = internal.decode('{"n": 42}')   -- { n = 42 }, an integer
--
-- Slots that lua/nimbus/init.lua fills when it loads (one VM or one test app each):
--   run(endpoint, event_type, body, ctx) -> outcome table    the handler runner (a task)
--   subscriptions() -> { [endpoint] = { types..., commands = { [type] = true } } }
--   hook(name, i, info)                   runs the i-th nimbus.on function of hook `name`
--   is_alive(event_id) -> boolean         a running handler's liveness (lock renewal)
--   endpoints                             name -> endpoint object (declared so far)
--   classes                               { Endpoint, Ctx, Checker }: method tables (specs)
--   check_report(load_error) -> JSON      what `nimbus-host check` prints (check mode)
local cjson = require("cjson.safe")

local M = {}

local tointeger = math.tointeger

-- lua-cjson decodes every number as a float; JSON has one number type, and adapter
-- authors expect 42 (not 42.0) in messages, keys and string concatenation.
local function integralize(t, depth)
  if depth > 64 then return end
  for k, v in pairs(t) do
    local tv = type(v)
    if tv == "number" then
      local i = tointeger(v)
      if i then t[k] = i end
    elseif tv == "table" then
      integralize(v, depth + 1)
    end
  end
end

-- JSON text -> value, integral numbers as integers; nil, message when malformed.
function M.decode(body)
  local v, err = cjson.decode(body or "")
  if type(v) == "table" then integralize(v, 0) end
  return v, err
end

return M

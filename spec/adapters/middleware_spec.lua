-- adapters/middleware.lua on nimbus.testing: required-field validation, service mode,
-- processing delay and the shared payload checks.
local testing = require("nimbus.testing")

local HERE = debug.getinfo(1, "S").short_src

-- An endpoint "Ep" with the given middleware; its handlers record what reached them.
local function app_with(make_mw, http)
  local reached = {}
  local app = testing.load(function()
    local nimbus = require("nimbus")
    local mw = require("adapters.middleware")
    local ep = nimbus.endpoint("Ep")
    for _, f in ipairs(make_mw(mw)) do ep:use(f) end
    for _, t in ipairs({ "AccountCreated", "ContactCreated", "Other" }) do
      ep:on(t, function(event, ctx) reached[#reached + 1] = { type = ctx.event_type, event = event } end)
    end
  end, { http = http, now = 1764680000 })
  return app, reached
end

-- Calls fn and returns the error it raised (fails the test when it raised none).
local function raised(fn)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  return tostring(err)
end

describe("middleware.required_fields", function()
  local function validating()
    return app_with(function(mw)
      return { mw.required_fields{
        AccountCreated = { "AccountId", "LegalName", ["Address.CountryCode"] = "string", Credit = "number?",
                           Tags = "array?" },
        ["*"] = { "Tenant" },
      } }
    end)
  end

  it("lets a complete event through to the handler", function()
    local app, reached = validating()
    local out = app:send("Ep", "AccountCreated", { Tenant = "t1", AccountId = "A1", LegalName = "Initech",
                                                   Address = { CountryCode = "US" }, Credit = 10 })
    testing.assert_completed(out)
    assert.are.equal(1, #reached)
    assert.are.equal("A1", reached[1].event.AccountId)
  end)

  it("dead-letters an event missing a field, naming it, without running the handler", function()
    local app, reached = validating()
    local out = app:send("Ep", "AccountCreated", { Tenant = "t1", AccountId = "A1", Address = { CountryCode = "US" } })
    testing.assert_dead_lettered(out, "^Validation failed: AccountCreated%.LegalName is required$")
    assert.are.equal("ValidationError", out.error_type)
    assert.are.equal(0, #reached)
  end)

  it("counts null and the empty string as missing, and names every problem with its type", function()
    local app = validating()
    local out = app:send("Ep", "AccountCreated", '{"Tenant":"t1","AccountId":null,"LegalName":"",'
                         .. '"Address":{"CountryCode":7},"Credit":"lots","Tags":{"a":1}}')
    testing.assert_dead_lettered(out)
    assert.are.equal("Validation failed: AccountCreated.AccountId is required; AccountCreated.LegalName is "
      .. "required; AccountCreated.Address.CountryCode must be a string (got number); AccountCreated.Credit must be "
      .. "a number (got string); AccountCreated.Tags must be an array (got object)", out.error_text)
  end)

  it("reports a nested field whose parent is missing", function()
    local app = validating()
    local out = app:send("Ep", "AccountCreated", { Tenant = "t1", AccountId = "A1", LegalName = "X" })
    testing.assert_dead_lettered(out, "AccountCreated%.Address%.CountryCode is required")
  end)

  it("applies \"*\" to every type and leaves types without fields alone", function()
    local app, reached = validating()
    testing.assert_dead_lettered(app:send("Ep", "ContactCreated", { Name = "Ada" }),
      "^Validation failed: ContactCreated%.Tenant is required$")
    testing.assert_completed(app:send("Ep", "ContactCreated", { Tenant = "t1" }))
    assert.are.equal(1, #reached)
  end)

  it("checks integers and booleans", function()
    local app = app_with(function(mw)
      return { mw.required_fields{ Other = { n = "integer", b = "boolean", o = "object" } } }
    end)
    testing.assert_completed(app:send("Ep", "Other", { n = 3, b = false, o = { x = 1 } }))
    local out = app:send("Ep", "Other", { n = 3.5, b = "yes", o = { 1, 2 } })
    assert.are.equal("Validation failed: Other.b must be a boolean (got string); Other.n must be an integer (got "
      .. "number); Other.o must be an object (got array)", out.error_text)
  end)

  it("raises a bad specification at the caller's line", function()
    local mw = require("adapters.middleware")
    local line = debug.getinfo(1, "l").currentline + 1
    local err = raised(function() mw.required_fields{ AccountCreated = { Credit = "numbr" } } end)
    assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
    assert.matches("field Credit: the type must be one of string, number, integer, boolean, object, array, any", err,
                   1, true)
    line = debug.getinfo(1, "l").currentline + 1
    err = raised(function() mw.required_fields{ AccountCreated = { "a..b" } } end)
    assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
    assert.matches("dotted paths", err, 1, true)
    err = raised(function() mw.required_fields{} end)
    assert.matches("expects a table { EventType", err, 1, true)
  end)
end)

describe("middleware.service_mode", function()
  it("makes events wait (transient) while the switch is on, and lets them through when off", function()
    local on = true
    local app, reached = app_with(function(mw)
      return { mw.service_mode{ is_on = function(_, ctx) return on, "ERP upgrade until 14:00" end } }
    end)
    local out = app:send("Ep", "Other", { x = 1 })
    testing.assert_transient(out, "^Ep is in service mode: ERP upgrade until 14:00$")
    assert.are.equal("ServiceMode", out.error_type)
    assert.are.equal(0, #reached)
    on = false
    testing.assert_completed(app:send("Ep", "Other", { x = 1 }))
    assert.are.equal(1, #reached)
  end)

  it("dead-letters instead with action = \"deadletter\" and a message of one's own", function()
    local app = app_with(function(mw)
      return { mw.service_mode{ is_on = function() return true end, action = "deadletter",
                                message = "ERP is in service mode (maintenance)" } }
    end)
    testing.assert_dead_lettered(app:send("Ep", "Other", {}), "^ERP is in service mode %(maintenance%)$")
  end)

  it("reads a JSON switch over HTTP; an unreachable switch counts as off unless told otherwise", function()
    local knob = { enabled = true }
    local http = { ["GET http://erp.test/admin/service-mode"] = function()
      if knob == "down" then return nil, "connection refused", "ECONNREFUSED" end
      return { json = knob }
    end }
    local app = app_with(function(mw)
      return { mw.service_mode{ url = "http://erp.test/admin/service-mode" } }
    end, http)
    local out = app:send("Ep", "Other", {})
    testing.assert_transient(out, "^Ep is in service mode$")
    assert.are.equal(1, #out.http)
    knob = { enabled = false }
    testing.assert_completed(app:send("Ep", "Other", {}))
    knob = "down"
    testing.assert_completed(app:send("Ep", "Other", {}))

    local strict = app_with(function(mw)
      return { mw.service_mode{ url = "http://erp.test/admin/service-mode", when_unknown = "on",
                                field = "state.maintenance" } }
    end, http)
    testing.assert_transient(strict:send("Ep", "Other", {}),
      "switch cannot be read %(GET http://erp.test/admin/service%-mode failed: connection refused%)")
    knob = { state = { maintenance = true } }
    testing.assert_transient(strict:send("Ep", "Other", {}), "^Ep is in service mode$")
    knob = { state = { maintenance = false } }
    testing.assert_completed(strict:send("Ep", "Other", {}))
  end)

  it("reuses a switch's answer for `cache` seconds", function()
    local calls = 0
    local app = app_with(function(mw)
      return { mw.service_mode{ url = "http://erp.test/sm", cache = 10 } }
    end, { ["GET http://erp.test/sm"] = function() calls = calls + 1; return { json = { enabled = false } } end })
    testing.assert_completed(app:send("Ep", "Other", {}))
    testing.assert_completed(app:send("Ep", "Other", {}))
    assert.are.equal(1, calls)
    app:advance(11)
    testing.assert_completed(app:send("Ep", "Other", {}))
    assert.are.equal(2, calls)
  end)

  it("refuses a bad configuration at the caller's line", function()
    local mw = require("adapters.middleware")
    local line = debug.getinfo(1, "l").currentline + 1
    local err = raised(function() mw.service_mode{ url = "http://x/sm", action = "park" } end)
    assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
    assert.matches("`action` must be \"retry\" (wait for the target) or \"deadletter\", got park", err, 1, true)
    assert.matches("give either is_on", raised(function() mw.service_mode{} end), 1, true)
    assert.matches("unknown option urll", raised(function() mw.service_mode{ urll = "http://x" } end), 1, true)
    assert.matches("`field` goes with url", raised(function()
      mw.service_mode{ is_on = function() end, field = "x" }
    end), 1, true)
  end)
end)

describe("middleware.processing_delay", function()
  it("sleeps before the handler, a fixed time or what a function says", function()
    local app, reached = app_with(function(mw)
      return { mw.processing_delay{ seconds = 0.5 },
               mw.processing_delay{ seconds = function(event) return event.extra end } }
    end)
    local out = app:send("Ep", "Other", { extra = 2 })
    testing.assert_completed(out)
    assert.are.same({ 0.5, 2 }, out.sleeps)
    assert.are.equal(1, #reached)
    out = app:send("Ep", "Other", {})   -- nil: no extra delay
    assert.are.same({ 0.5 }, out.sleeps)
  end)

  it("fails the event when the function returns something that is not a delay", function()
    local app, reached = app_with(function(mw)
      return { mw.processing_delay{ seconds = function() return "soon" end } }
    end)
    testing.assert_failed(app:send("Ep", "Other", {}), "the seconds function returned soon")
    assert.are.equal(0, #reached)
  end)

  it("refuses a negative delay at the caller's line", function()
    local mw = require("adapters.middleware")
    local line = debug.getinfo(1, "l").currentline + 1
    local err = raised(function() mw.processing_delay{ seconds = -1 } end)
    assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
  end)
end)

describe("middleware payload checks", function()
  local mw = require("adapters.middleware")

  it("finds integers the host's JSON encoder would change, outside strings only", function()
    assert.is_nil(mw.lossy_number('{"a":12345678901234,"b":"123456789012345678","c":-1.2345678901234567}'))
    assert.are.equal("123456789012345", mw.lossy_number('{"a":1,"b":[2,123456789012345]}'))
    assert.are.equal("-9007199254740993", mw.lossy_number('{"s":"x\\"y 99999999999999999","n":-9007199254740993}'))
    assert.is_nil(mw.lossy_number('{"zeros":000000000000000001}'))
    assert.matches('Send it as a JSON string ("123456789012345")', mw.lossy_number_message("123456789012345"), 1, true)
  end)

  it("gets values at dotted paths", function()
    local v = { a = { b = { c = 3 } }, x = "s" }
    assert.are.equal(3, mw.get(v, "a.b.c"))
    assert.is_nil(mw.get(v, "x.y"))
    assert.is_nil(mw.get(v, "q.r"))
  end)
end)

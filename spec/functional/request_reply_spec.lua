-- Request/reply, commands with one consumer, and the inbox on resubmit (host features the
-- CrmErpDemo needs).
local nh = require("nh")

describe("request/reply", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  local function start(extra)
    local path = sb:adapter("a.lua", ([[
local nimbus = require("nimbus")
local out = %q
local function record(line) local f = assert(io.open(out, "a")) f:write(line, "\n") f:close() end
local erp = nimbus.endpoint("Erp", {})
erp:reply("CreditCheck", function(req)
  if req.AccountId == "bad" then error("lookup failed") end
  if req.AccountId == "slow" then nimbus.sleep(5) end
  return { AccountId = req.AccountId, Approved = true, Status = "Active" }
end)
nimbus.endpoint("Crm", {}):on("Check", function(e)
  local r, err, code = nimbus.request("CreditCheck", { AccountId = e.id }, { timeout = e.timeout or 10 })
  if r then record(e.id .. " ok " .. r.Status .. " " .. tostring(r.Approved))
  else record(e.id .. " " .. code .. " " .. err) end
end)
]]):format(sb.calls_path) .. (extra or ""))
    return sb:spawn(path)
  end

  local function lines()
    local out = {}
    for l in (nh.read(sb.calls_path) or ""):gmatch("[^\n]+") do out[#out + 1] = l end
    table.sort(out)
    return out
  end

  it("returns the responder's table, an error reply, or a time-out", function()
    start()
    local a = sb:publish("Check", { id = "A1" }, { session = "a" })
    local b = sb:publish("Check", { id = "bad" }, { session = "b" })
    local c = sb:publish("Check", { id = "slow", timeout = 0.3 }, { session = "c" })
    for _, m in ipairs({ a, b, c }) do sb:wait_message(m, "Completed", "Crm") end
    local got = lines()
    assert.are.equal("A1 ok Active true", got[1])
    assert.matches("^bad EREPLY .*lookup failed", got[2])
    assert.matches("^slow ETIMEDOUT no reply within", got[3])
    -- the failing request follows the normal failure path on the responder
    local failed = nh.where(sb:events({ endpoint = "Erp" }), "status", "Failed")
    assert.are.equal(1, #failed)
    assert.matches("lookup failed", failed[1].error_text)
  end)

  it("says when no endpoint replies to the type", function()
    local path = sb:adapter("a.lua", ([[
local nimbus = require("nimbus")
nimbus.endpoint("Crm", {}):on("Check", function(e)
  local r, err, code = nimbus.request("Nobody", {})
  local f = assert(io.open(%q, "a")) f:write(tostring(code), " ", tostring(err), "\n") f:close()
end)
]]):format(sb.calls_path))
    sb:spawn(path)
    sb:wait_message(sb:publish("Check", {}, { session = "a" }), "Completed")
    assert.matches("^ENOREPLIER no endpoint replies to Nobody", lines()[1])
  end)
end)

describe("a command", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("refuses a second consuming endpoint at start with a clear error", function()
    local erp = sb:adapter("erp.lua", [[
local nimbus = require("nimbus")
nimbus.endpoint("Erp", {}):command("PlaceCustomerOnCreditHold", function() end)
]])
    sb:spawn(erp)
    local other = sb:adapter("other.lua", [[
local nimbus = require("nimbus")
nimbus.endpoint("Other", {}):on("PlaceCustomerOnCreditHold", function() end)
]])
    local r = sb:cli({ other, "--no-reload" })
    assert.are.equal(2, r.code)
    assert.matches("PlaceCustomerOnCreditHold is a command", r.err)
    assert.matches("Erp already consumes it", r.err)
  end)
end)

describe("the inbox", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("ends a resubmit of an already completed event as Skipped/DuplicateDetected without calling the handler", function()
    local path = sb:adapter("a.lua", ([[
local nimbus = require("nimbus")
nimbus.endpoint("Crm", { inbox = true }):on("ErpCustomerCreated", function(e)
  local f = assert(io.open(%q, "a")) f:write("called\n") f:close()
end)
]]):format(sb.calls_path))
    sb:spawn(path)
    local row = sb:wait_message(sb:publish("ErpCustomerCreated", { AccountId = "A1" }, { session = "A1" }), "Completed")
    sb:cli_ok({ "resubmit", row.event_id, "--force" })   -- a Completed event: only when asked to
    local skipped = sb:wait_event(row.event_id, "Skipped")
    assert.are.equal("DuplicateDetected", skipped.error_text)
    assert.are.equal("called\n", nh.read(sb.calls_path))
  end)

  it("runs a forced resubmit with a new body on an inbox endpoint (a new intent, not a duplicate) and records it", function()
    local path = sb:adapter("a.lua", ([[
local nimbus = require("nimbus")
nimbus.endpoint("Crm", { inbox = true }):on("ErpCustomerCreated", function(e)
  local f = assert(io.open(%q, "a")) f:write("called ", e.AccountId, "\n") f:close()
end)
]]):format(sb.calls_path))
    sb:spawn(path)
    local row = sb:wait_message(sb:publish("ErpCustomerCreated", { AccountId = "A1" }, { session = "A1" }), "Completed")
    sb:cli_ok({ "resubmit", row.event_id, "--force", "--body", '{"AccountId":"A1-fixed"}' })
    nh.eventually(function() return nh.read(sb.calls_path) == "called A1\ncalled A1-fixed\n" end, nil,
                  "the handler to run with the new body")
    local shown = sb:wait_event(row.event_id, "Completed") and sb:show(row.event_id)
    assert.are.equal('{"AccountId":"A1-fixed"}', shown.payload)
    local replaced
    for _, h in ipairs(shown.history) do replaced = replaced or h.previous_payload end
    assert.are.equal('{"AccountId":"A1"}', replaced)
  end)
end)

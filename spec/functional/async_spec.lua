-- Async handlers, budgets and status checkers in a running host (issue: Lua async runtime).
local nh = require("nh")

describe("a running host", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("lets a handler wait with nimbus.sleep while other sessions keep flowing", function()
    local path = sb:adapter("a.lua", [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Ep", { concurrency = 10 })
ep:on("Slow", function(e) nimbus.sleep(1) nimbus.log.info("slow done " .. e.n) end)
ep:on("Fast", function(e) nimbus.log.info("fast done " .. e.n) end)
]])
    local h = sb:spawn(path)
    local slow = sb:publish("Slow", { n = 1 }, { session = "a" })
    local fast = sb:publish("Fast", { n = 2 }, { session = "b" })
    sb:wait_message(fast, "Completed")
    sb:wait_message(slow, "Completed")
    local log = h:log()
    assert.is_truthy(log:find("fast done 2", 1, true) < log:find("slow done 1", 1, true),
      "the fast event finished while the slow one was sleeping")
  end)

  it("fails a runaway handler with 'CPU budget exceeded' and keeps every other session going", function()
    local path = sb:adapter("a.lua", [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Ep", { cpu_budget = 0.2 })
ep:on("Spin", function() while true do pcall(function() while true do end end) end end)
ep:on("Ok", function() end)
]])
    sb:spawn(path)
    local spin = sb:publish("Spin", {}, { session = "s1" })
    local ok = sb:publish("Ok", {}, { session = "s2" })
    local row = sb:wait_message(spin, "Failed")
    assert.matches("CPU budget exceeded", row.error_text)
    assert.are.equal("CpuBudgetExceeded", row.error_type)
    sb:wait_message(ok, "Completed")
  end)

  it("fails a handler past its deadline", function()
    local path = sb:adapter("a.lua", [[
local nimbus = require("nimbus")
nimbus.endpoint("Ep", { timeout = 0.3 }):on("Slow", function() nimbus.sleep(30) end)
]])
    sb:spawn(path)
    local row = sb:wait_message(sb:publish("Slow", {}, { session = "s1" }), "Failed")
    assert.matches("deadline exceeded", row.error_text)
  end)

  it("turns a memory bomb into a handler failure, not a crashed host", function()
    local path = sb:adapter("a.lua", [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Ep", { cpu_budget = 30 })
ep:on("Bomb", function()
  local t = {}
  for i = 1, math.huge do t[i] = ("x"):rep(1000) .. i end
end)
ep:on("Ok", function() end)
]])
    local h = sb:spawn(path, { env = { NIMBUS_MEMORY_LIMIT_MB = "64" } })
    local row = sb:wait_message(sb:publish("Bomb", {}, { session = "s1" }), "Failed")
    assert.matches("not enough memory", row.error_text)
    sb:wait_message(sb:publish("Ok", {}, { session = "s2" }), "Completed")
    assert.is_nil(h:exit_code())
  end)

  it("runs a status checker that settles hand-offs and replays the parked siblings", function()
    local path = sb:adapter("a.lua", ([[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Erp", {})
local f = io.open(%q, "a")
ep:on("Import", function(e, ctx)
  f:write(e.n, "\n") f:flush()
  if e.n == 1 then ctx:mark_pending_handoff{ reason = "DMF import", external_job_id = "DMF-1", expected_by = 60 } end
end)
ep:checker("dmf", { every = 0.05 }, function(chk)
  for _, h in ipairs(chk:pending_handoffs()) do
    assert(h.external_job_id == "DMF-1" and h.payload.n == 1 and h.reason == "DMF import")
    assert(chk:complete(h, { imported = true }))
    local again, why = chk:complete(h, {})
    assert(again == nil and why:find("already queued"), "a second settlement is refused")
  end
end)
ep:checker("broken", { every = 0.05 }, function() error("checker exploded") end)
]]):format(sb.calls_path))
    local h = sb:spawn(path)
    local head = sb:publish("Import", { n = 1 }, { session = "acc" })
    local sibling = sb:publish("Import", { n = 2 }, { session = "acc" })
    local row = sb:wait_message(head, "Completed")
    sb:wait_message(sibling, "Completed")
    assert.are.equal("Completed", row.status)
    assert.are.same({ "1", "2" }, (function()
      local out = {}
      for l in (nh.read(sb.calls_path) or ""):gmatch("[^\n]+") do out[#out + 1] = l end
      return out
    end)(), "the handler ran once for the hand-off and once for the sibling, in order")
    local shown = sb:show(row.event_id)
    assert.are.equal('{"imported":true}', shown.result)
    -- the failing checker is logged and keeps running
    nh.eventually(function()
      local _, n = h:log():gsub("checker Erp/broken failed", "")
      return n >= 2
    end, 20, "the broken checker to fail twice")
  end)

  it("lets a script settle a hand-off with nimbus.handoff.fail against the store", function()
    local path = sb:adapter("a.lua", [[
local nimbus = require("nimbus")
nimbus.endpoint("Erp", {}):on("Import", function(e, ctx)
  ctx:mark_pending_handoff{ reason = "manual approval", external_job_id = "J-9" }
end)
]])
    sb:spawn(path)
    local row = sb:wait_message(sb:publish("Import", {}, { session = "s" }), "Pending")
    local script = sb:adapter("settle.lua", ([[
local nimbus = require("nimbus")
local store = %q
assert(nimbus.handoff.fail({ event_id = %q, session_id = "s", store = store }, "Rejected by approver", "ApprovalRejected"))
local ok, why = nimbus.handoff.fail({ event_id = "0123456789-no-such-event", store = store }, "x")
assert(ok == nil and why:find("no event"), why)
]]):format(sb.store, row.event_id))
    local r = sb:cli({ "-l", script }, { store = false })
    assert.are.equal(0, r.code, r.err)
    local failed = sb:wait_event(row.event_id, "Failed")
    assert.are.equal("Rejected by approver", failed.error_text)
    assert.are.equal("ApprovalRejected", failed.error_type)
  end)
end)

-- Long-running handlers: the host renews the lock while the handler is alive, up to
-- the endpoint's cap (issue: long-running handlers). The pizza test and its variants.
local nh = require("nh")

local function adapter(sb, body)
  return sb:adapter("a.lua", ([[
local nimbus = require("nimbus")
local calls = %q
local function record(tag)
  local f = assert(io.open(calls, "a")) f:write(tag, "\n") f:close()
end
local function count(tag)
  local n, f = 0, io.open(calls, "r")
  if not f then return 0 end
  for l in f:lines() do if l == tag then n = n + 1 end end
  f:close()
  return n
end
]]):format(sb.calls_path) .. body)
end

local function lines(sb)
  local out = {}
  for l in (nh.read(sb.calls_path) or ""):gmatch("[^\n]+") do out[#out + 1] = l end
  return out
end

describe("a handler that outlives its lock", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("the pizza test: a 5 s handler under a 2 s lock runs exactly once and completes once", function()
    local path = adapter(sb, [[
nimbus.endpoint("Pizza", { lock = { duration = 2 } }):on("OrderPlaced", function(order)
  record("bake " .. order.id)
  nimbus.sleep(5)
end)
]])
    sb:spawn(path)
    -- a second host on the same store would take the session if the lock ran out
    sb:spawn(path)
    local mid = sb:publish("OrderPlaced", { id = 7 }, { session = "order-7" })
    sb:wait_message(mid, "Completed")
    assert.are.same({ "bake 7" }, lines(sb))
    local rows = sb:events({})
    assert.are.equal(1, #rows)
    local shown = sb:show(rows[1].event_id)
    assert.are.equal(1, nh.count(shown.history, function(h) return h.status == "Completed" end))
  end)

  it("releases the message when is_alive turns false, and it is handled again later", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6 } }):on("Job", function(job)
  record("start")
  if count("start") == 1 then nimbus.sleep(30) end   -- the first attempt hangs
end, { is_alive = function(ctx) return count("start") > 1 end })
]])
    local h = sb:spawn(path)
    local mid = sb:publish("Job", {}, { session = "s1" })
    local row = sb:wait_message(mid, "Completed")
    assert.are.same({ "start", "start" }, lines(sb))
    assert.is_truthy(h:log():find("is_alive returned false", 1, true))
    assert.are.equal("Completed", row.status)
  end)

  it("treats an is_alive that raises as not alive", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6 } }):on("Job", function(job)
  record("start")
  if count("start") == 1 then nimbus.sleep(30) end
end, { is_alive = function(ctx) if count("start") == 1 then error("probe failed") end return true end })
]])
    local h = sb:spawn(path)
    sb:wait_message(sb:publish("Job", {}, { session = "s1" }), "Completed")
    assert.are.same({ "start", "start" }, lines(sb))
    assert.is_truthy(h:log():find("is_alive raised", 1, true))
  end)

  it("releases the message at the renewal cap (lock.renew_max)", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6, renew_max = 1.5 } }):on("Job", function(job)
  record("start")
  if count("start") == 1 then nimbus.sleep(30) end
end)
]])
    local h = sb:spawn(path)
    local row = sb:wait_message(sb:publish("Job", {}, { session = "s1" }), "Completed")
    assert.are.same({ "start", "start" }, lines(sb))
    assert.is_truthy(h:log():find("renewal cap", 1, true))
    assert.are.equal("Completed", row.status)
  end)

  it("keeps later events of the session behind a released one", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6, renew_max = 1 } }):on("Job", function(job)
  record(job.tag)
  if job.tag == "first" and count("first") == 1 then nimbus.sleep(30) end
end)
]])
    sb:spawn(path)
    local a = sb:publish("Job", { tag = "first" }, { session = "s1" })
    local b = sb:publish("Job", { tag = "second" }, { session = "s1" })
    sb:wait_message(b, "Completed")
    sb:wait_message(a, "Completed")
    assert.are.same({ "first", "first", "second" }, lines(sb))
  end)
end)

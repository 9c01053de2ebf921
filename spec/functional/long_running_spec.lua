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

  -- A cancelled handler is a failure under the endpoint's retry policy (here one retry).
  local function cancellation(shown)
    local rows = nh.where(shown.history, "status", "Failed")
    assert.equal(1, #rows, "one history row for the cancellation")
    assert.equal("HandlerCancelled", rows[1].error_type)
    return rows[1]
  end

  it("fails the attempt when is_alive turns false; the retry policy runs it again", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6 }, retry = { max_retries = 1, base = 0 } }):on("Job", function(job)
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
    assert.equal("handler cancelled: is_alive returned false", cancellation(sb:show(row.event_id)).error_text)
    assert.equal(1, row.retry_count)
  end)

  it("treats an is_alive that raises as not alive, and keeps its error", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6 }, retry = { max_retries = 1, base = 0 } }):on("Job", function(job)
  record("start")
  if count("start") == 1 then nimbus.sleep(30) end
end, { is_alive = function(ctx) if count("start") == 1 then error("probe failed") end return true end })
]])
    local h = sb:spawn(path)
    local row = sb:wait_message(sb:publish("Job", {}, { session = "s1" }), "Completed")
    assert.are.same({ "start", "start" }, lines(sb))
    assert.is_truthy(h:log():find("is_alive raised", 1, true))
    assert.matches("^handler cancelled: is_alive raised: [^\n]*a%.lua:%d+: probe failed",
                   cancellation(sb:show(row.event_id)).error_text)
  end)

  it("fails the attempt at the renewal cap (lock.renew_max); the retry runs it again", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6, renew_max = 1.5 }, retry = { max_retries = 1, base = 0 } })
:on("Job", function(job)
  record("start")
  if count("start") == 1 then nimbus.sleep(30) end
end)
]])
    local h = sb:spawn(path)
    local row = sb:wait_message(sb:publish("Job", {}, { session = "s1" }), "Completed")
    assert.are.same({ "start", "start" }, lines(sb))
    assert.is_truthy(h:log():find("renewal cap", 1, true))
    assert.are.equal("Completed", row.status)
    assert.equal("handler cancelled: renewal cap (lock.renew_max) reached",
                 cancellation(sb:show(row.event_id)).error_text)
  end)

  it("keeps later events of the session behind a cancelled one", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6, renew_max = 1 }, retry = { max_retries = 1, base = 0 } })
:on("Job", function(job)
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

  it("with no retry left, a cancelled handler is Failed with its reason and blocks its session", function()
    local path = adapter(sb, [[
nimbus.endpoint("Ep", { lock = { duration = 0.6, renew_max = 1 } }):on("Job", function(job)
  record(job.tag)
  if job.tag == "first" then nimbus.sleep(30) end
end)
]])
    local h = sb:spawn(path)
    local a = sb:publish("Job", { tag = "first" }, { session = "s1" })
    local b = sb:publish("Job", { tag = "second" }, { session = "s1" })
    local row = sb:wait_message(a, "Failed")
    assert.equal("handler cancelled: renewal cap (lock.renew_max) reached", row.error_text)
    assert.equal("HandlerCancelled", row.error_type)
    sb:wait_message(b, "Deferred")
    assert.equal(row.event_id, sb:session("s1").blocked_by)
    assert.are.same({ "first" }, lines(sb), "not redelivered in a loop")
    assert.is_falsy(h:log():find("DeadLettered", 1, true))
    sb:cli_ok({ "skip", row.event_id })
    sb:wait_message(b, "Completed")
    assert.are.same({ "first", "second" }, lines(sb))
  end)
end)

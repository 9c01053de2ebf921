-- The public face of `nimbus` on the host's real loop (nimbus-host -l busted): task
-- handles from nimbus.spawn (wait, cancel, status), nimbus.every and its cancel,
-- nimbus.now, and where misuse is reported.
local nimbus = require("nimbus")

-- Polls cond() from inside a task until it holds (a deadline, never a fixed wait).
local function until_true(cond, what)
  local deadline = nimbus.now() + 10
  while not cond() do
    if nimbus.now() > deadline then error("not within 10 s: " .. what, 2) end
    nimbus.sleep(0.005)
  end
end

describe("nimbus.spawn task handles", function()
  it("task:wait() returns the task's results once it ended, and again later", function()
    local a, b, again = nimbus.run(function()
      local t = nimbus.spawn(function(x) nimbus.sleep(0.01); return x, x * 2 end, 21)
      assert(t:status() == "running")
      local r1, r2 = t:wait()
      assert(t:status() == "done")
      return r1, r2, select(2, t:wait())
    end)
    assert.are.same({ 21, 42, 42 }, { a, b, again })
  end)

  it("several tasks wait for one; each gets the results", function()
    local got = nimbus.run(function()
      local slow = nimbus.spawn(function() nimbus.sleep(0.02); return "late" end)
      local waiters = {}
      for i = 1, 3 do waiters[i] = nimbus.spawn(function() return i .. ":" .. slow:wait() end) end
      local out = {}
      for i = 1, 3 do out[i] = waiters[i]:wait() end
      return out
    end)
    assert.are.same({ "1:late", "2:late", "3:late" }, got)
  end)

  it("task:wait() raises the task's own error value (a table stays that table)", function()
    local boom = { code = 7 }
    local ok, err = nimbus.run(function()
      local t = nimbus.spawn(function() nimbus.sleep(0); error(boom) end)
      return pcall(t.wait, t)
    end)
    assert.is_false(ok)
    assert.are.equal(boom, err)
    local perm = nimbus.run(function()
      local t = nimbus.spawn(function() error(nimbus.permanent("no such customer")) end)
      local _, e = pcall(t.wait, t)
      return e
    end)
    assert.are.equal("permanent", perm.kind)
    assert.are.equal("no such customer", perm.message)
  end)

  it("task:cancel() stops a waiting task; its waiter gets an error; a second cancel is false", function()
    local res = nimbus.run(function()
      local reached = false
      local t = nimbus.spawn(function() nimbus.sleep(3600); reached = true end)
      local waiter = nimbus.spawn(function() return pcall(t.wait, t) end)
      nimbus.sleep(0)                      -- both started: t sleeps, waiter waits
      local first = t:cancel()
      local ok, err = waiter:wait()
      return { first = first, second = t:cancel(), status = t:status(), ok = ok, err = err, reached = reached }
    end)
    assert.is_true(res.first)
    assert.is_false(res.second)
    assert.are.equal("cancelled", res.status)
    assert.is_false(res.ok)
    assert.matches("task:wait: the task was cancelled", res.err)
    assert.is_false(res.reached)
  end)

  it("cancel after the end is false and keeps the results", function()
    local first, st, v = nimbus.run(function()
      local t = nimbus.spawn(function() return "v" end)
      until_true(function() return t:status() ~= "running" end, "the task to end")
      return t:cancel(), t:status(), t:wait()
    end)
    assert.are.same({ false, "done", "v" }, { first, st, v })
  end)

  it("refuses what can never end: a task waiting for or cancelling itself", function()
    local errs = nimbus.run(function()
      local out = {}
      local t
      t = nimbus.spawn(function()
        out.wait = select(2, pcall(function() return t:wait() end))
        out.cancel = select(2, pcall(function() return t:cancel() end))
      end)
      t:wait()
      return out
    end)
    assert.matches("a task cannot wait for itself", errs.wait)
    assert.matches("a task cannot cancel itself", errs.cancel)
  end)

  it("task:wait() outside a task says where it may be called", function()
    local t = nimbus.spawn(function() end)
    local ok, err = pcall(t.wait, t)
    assert.is_false(ok)
    assert.matches("task:wait must be called from a task", err)
    nimbus.run(function() t:wait() end)   -- it ran meanwhile; nothing left behind
  end)

  it("nimbus.spawn without a function fails at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() nimbus.spawn("not a function") end)
    assert.is_false(ok)
    assert.matches(("public_face_spec%%.lua:%d: nimbus%%.spawn: the first argument must be the function to run"):format(line), err)
  end)
end)

describe("nimbus.every", function()
  it("runs until cancelled; after cancel it runs no more", function()
    local counts = nimbus.run(function()
      local n, m = 0, 0
      local h = nimbus.every(0.01, function() n = n + 1 end, { name = "counter" })
      until_true(function() return n >= 2 end, "two runs")
      local first = h:cancel()
      local at = n
      -- a second timer of the same period: three of its runs, and the first stayed still
      local marker = nimbus.every(0.01, function() m = m + 1 end)
      until_true(function() return m >= 3 end, "three marker runs")
      marker:cancel()
      return { first = first, second = h:cancel(), at = at, now = n }
    end)
    assert.is_true(counts.first)
    assert.is_false(counts.second)
    assert.are.equal(counts.at, counts.now)
  end)

  it("a bad interval fails at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() nimbus.every(0, function() end) end)
    assert.is_false(ok)
    assert.matches(("public_face_spec%%.lua:%d: nimbus%%.every: the interval must be a number of seconds > 0"):format(line), err)
  end)
end)

describe("nimbus.now", function()
  it("is the wall clock in seconds, as a float", function()
    local before = os.time()
    local now = nimbus.now()
    local after = os.time()
    assert.are.equal("float", math.type(now))
    assert.is_true(math.floor(now) >= before and math.floor(now) <= after)
  end)
end)

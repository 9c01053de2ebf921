-- Tasks inside the host: nimbus.sleep / spawn / run, the CPU budget no pcall can
-- swallow, clear errors for waiting calls made where no task can yield.
local nimbus = require("nimbus")
local core = require("nimbus.core")

describe("nimbus.run and nimbus.sleep", function()
  it("runs a function as a task and returns its results", function()
    local a, b = nimbus.run(function(x) nimbus.sleep(0.01) return x + 1, "done" end, 41)
    assert.are.equal(42, a)
    assert.are.equal("done", b)
  end)

  it("re-raises the task's error", function()
    assert.has_error(function() nimbus.run(function() error("inner failure", 0) end) end, "inner failure")
  end)

  it("lets many sleeping tasks wait concurrently", function()
    local woke, asleep, most = 0, 0, 0
    nimbus.run(function()
      for _ = 1, 200 do
        nimbus.spawn(function()
          asleep = asleep + 1
          if asleep > most then most = asleep end
          nimbus.sleep(0.2)
          asleep = asleep - 1
          woke = woke + 1
        end)
      end
      while woke < 200 do nimbus.sleep(0.01) end
    end)
    assert.are.equal(200, woke)
    assert.are.equal(200, most, "all 200 were asleep at the same time")
  end)

  it("passes arguments to spawned functions and starts them after the caller yields", function()
    local order = {}
    nimbus.run(function()
      nimbus.spawn(function(tag) order[#order + 1] = tag end, "spawned")
      order[#order + 1] = "caller"
      nimbus.sleep(0)
    end)
    assert.are.same({ "caller", "spawned" }, order)
  end)
end)

describe("waiting calls outside a task", function()
  it("name the call and say where it was made", function()
    local ok, err = pcall(nimbus.sleep, 0.01)
    assert.is_false(ok)
    assert.matches("nimbus.sleep must be called from a task", err)
    assert.matches("main chunk", err)
  end)

  it("refuse a plain coroutine created inside a task", function()
    local ok, err = nimbus.run(function()
      return coroutine.wrap(function() return pcall(nimbus.sleep, 0.01) end)()
    end)
    assert.is_false(ok)
    assert.matches("coroutine created inside one", err)
  end)

  it("refuse a table.sort comparator (no yield across the C boundary)", function()
    local err
    nimbus.run(function()
      local ok, e = pcall(function()
        local mt = { __lt = function() nimbus.sleep(0.01) return true end }
        local a, b = setmetatable({}, mt), setmetatable({}, mt)
        table.sort({ a, b }, function(x, y) return x < y end)
      end)
      err = not ok and e
    end)
    assert.is_string(err)
    assert.matches("cannot wait here", err)
  end)

  it("refuse a __gc metamethod, without crashing the task", function()
    local err
    local v = nimbus.run(function()
      setmetatable({}, { __gc = function()
        local ok, e = pcall(nimbus.sleep, 0.01)
        err = not ok and e
      end })
      collectgarbage()
      collectgarbage()
      return "task went on"
    end)
    assert.are.equal("task went on", v)
    assert.is_string(err)
    assert.matches("cannot wait here", err)
  end)

  it("refuse nimbus.run from inside a task", function()
    local ok, err = nimbus.run(function() return pcall(nimbus.run, function() end) end)
    assert.is_false(ok)
    assert.matches("cannot be called from a task", err)
  end)
end)

describe("the CPU budget", function()
  it("stops a runaway task even when the loop is wrapped in pcall", function()
    local ok, err = pcall(nimbus.run, function()
      while true do pcall(function() while true do end end) end
    end)
    assert.is_false(ok)
    assert.matches("CPU budget exceeded", err)
  end)

  it("stops a runaway loop inside a nested coroutine", function()
    local ok, err = pcall(nimbus.run, function()
      local co = coroutine.wrap(function() while true do end end)
      while true do pcall(co) end
    end)
    assert.is_false(ok)
    assert.matches("CPU budget exceeded", err)
  end)

  it("restarts at each yield, so long work that yields is fine", function()
    local n = nimbus.run(function()
      local count = 0
      for _ = 1, 30 do
        local t = core.now()
        while core.now() - t < 0.05 do end   -- 50 ms of CPU, 1.5 s in all
        count = count + 1
        nimbus.sleep(0)
      end
      return count
    end)
    assert.are.equal(30, n)
  end)
end)

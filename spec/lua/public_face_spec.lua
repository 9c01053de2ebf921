-- The public face of `nimbus` under nimbus.testing (stock lua5.4): what is on the table
-- and what is not, nimbus.now, task handles from nimbus.spawn, nimbus.every, and
-- configuration mistakes reported at the adapter's own line with "did you mean".
local testing = require("nimbus.testing")

local THIS = debug.getinfo(1, "S").short_src

-- The line after the one calling here: where a one-line mistake below it sits.
local function next_line() return debug.getinfo(2, "l").currentline + 1 end

-- The error testing.load raises for an adapter (a function) that raises.
local function load_error(fn)
  local ok, err = pcall(testing.load, fn)
  assert(not ok, "the adapter loaded")
  return err
end

describe("nimbus's public table", function()
  it("holds no underscore internals; the runtime's private half is nimbus.internal", function()
    local app = testing.load(function() end)
    for k in pairs(app.nimbus) do
      assert(type(k) ~= "string" or k:sub(1, 1) ~= "_" or k == "_VERSION", "public field " .. tostring(k))
    end
    for _, k in ipairs({ "run", "subscriptions", "hook", "is_alive", "decode", "check_report" }) do
      assert.is_function(app._internal[k], k)
    end
    assert.are.equal(app.endpoints, app._internal.endpoints)
  end)

  it("decodes JSON as payloads are decoded (nimbus.json): integral numbers are integers", function()
    local app = testing.load(function() end)
    local v = app.nimbus.json.decode('{"n": 42, "f": 1.5, "a": [1, 2]}')
    assert.are.equal("integer", math.type(v.n))
    assert.are.equal(1.5, v.f)
    assert.are.equal("integer", math.type(v.a[2]))
    local bad, err = app.nimbus.json.decode("{oops")
    assert.is_nil(bad)
    assert.is_string(err)
    assert.are.equal('{"a":1}', app.nimbus.json.encode({ a = 1 }))
  end)
end)

describe("nimbus.now", function()
  it("reads the fake clock that nimbus.sleep and app:advance move", function()
    local seen = {}
    local app = testing.load(function()
      local nimbus = require("nimbus")
      nimbus.endpoint("Clock"):on("Tick", function()
        seen[#seen + 1] = nimbus.now()
        nimbus.sleep(2.5)
        seen[#seen + 1] = nimbus.now()
      end)
    end, { now = 1000 })
    testing.assert_completed(app:send("Clock", "Tick", {}))
    app:advance(10)
    testing.assert_completed(app:send("Clock", "Tick", {}))
    assert.are.same({ 1000, 1002.5, 1012.5, 1015 }, seen)
  end)
end)

describe("nimbus.spawn task handles under nimbus.testing", function()
  local function app_with(handler)
    return testing.load(function()
      local nimbus = require("nimbus")
      nimbus.endpoint("T"):on("Go", function(event, ctx) return handler(nimbus, event, ctx) end)
    end)
  end

  it("task:wait() runs the task at once and returns its results", function()
    local got
    local app = app_with(function(nimbus)
      local t = nimbus.spawn(function(a, b) nimbus.sleep(1); return a + b, "sum" end, 40, 2)
      assert(t:status() == "running")
      got = table.pack(t:wait())
      assert(t:status() == "done")
    end)
    local out = app:send("T", "Go", {})
    testing.assert_completed(out)
    assert.are.same({ 42, "sum", n = 2 }, got)
    assert.are.equal(1, out.slept)
  end)

  it("task:wait() raises the task's own error value: a permanent error dead-letters the waiter", function()
    local app = app_with(function(nimbus)
      local t = nimbus.spawn(function() error(nimbus.permanent("bad row", "RowError")) end)
      t:wait()
    end)
    local out = app:send("T", "Go", {})
    testing.assert_dead_lettered(out, "bad row")
    assert.are.equal("RowError", out.error_type)
    assert.are.same({}, out.spawn_errors)   -- the waiter got it: not an unobserved failure
  end)

  it("task:cancel() before the task ran means it never runs; wait then raises", function()
    local ran, results = false, {}
    local app = app_with(function(nimbus)
      local t = nimbus.spawn(function() ran = true end)
      results.first = t:cancel()
      results.second = t:cancel()
      results.status = t:status()
      results.wait = table.pack(pcall(t.wait, t))
    end)
    testing.assert_completed(app:send("T", "Go", {}))
    assert.is_false(ran)
    assert.is_true(results.first)
    assert.is_false(results.second)
    assert.are.equal("cancelled", results.status)
    assert.is_false(results.wait[1])
    assert.matches("task:wait: the task was cancelled", results.wait[2])
  end)

  it("keeps a spawned task's publishes its own, sent even when the handler then fails", function()
    local app = app_with(function(nimbus)
      nimbus.spawn(function() nimbus.publish("Audit", { at = 1 }) end):wait()
      nimbus.publish("Mine", {})
      error("handler fails")
    end)
    local out = app:send("T", "Go", {})
    testing.assert_failed(out, "handler fails")
    assert.are.equal(1, #out.published)
    assert.are.equal("Audit", out.published[1].type)
    assert.are.equal("Mine", out.discarded[1].type)
  end)

  it("lists the failure of a task nobody waited for in out.spawn_errors", function()
    local app = app_with(function(nimbus) nimbus.spawn(function() error("lost in the background") end) end)
    local out = app:send("T", "Go", {})
    testing.assert_completed(out)
    assert.matches("lost in the background", out.spawn_errors[1])
  end)
end)

describe("nimbus.every under nimbus.testing", function()
  it("runs a named periodic task with app:run_every; a cancelled one cannot be run", function()
    local app = testing.load(function()
      local nimbus = require("nimbus")
      local n = 0
      nimbus.every(30, function() n = n + 1; nimbus.publish("Tick", { n = n }) end, { name = "ticker" })
      local stopped = nimbus.every(5, function() end, { name = "stopped" })
      assert(stopped:cancel() == true and stopped:cancel() == false)
    end)
    local run = app:run_every("ticker")
    assert.is_nil(run.error)
    assert.are.same({ n = 1 }, run.published[1].payload)
    assert.are.same({ n = 2 }, app:run_every("ticker").published[1].payload)
    assert.has_error(function() app:run_every("stopped") end, 'app:run_every: "stopped" was cancelled (handle:cancel())')
    assert.has_error(function() app:run_every("nope") end,
      'app:run_every: the adapter has no nimbus.every named "nope" (it has: "ticker", "stopped")')
  end)

  it("names an unnamed one by the line that declared it", function()
    local line
    local app = testing.load(function()
      line = next_line()
      require("nimbus").every(1, function() end)
    end)
    assert.is_nil(app:run_every(("nimbus.every at %s:%d"):format(debug.getinfo(1, "S").source:sub(2), line)).error)
  end)
end)

describe("configuration mistakes are reported at the adapter's own line", function()
  it("a misspelt endpoint option, with did you mean and the valid options", function()
    local line
    local err = load_error(function()
      local nimbus = require("nimbus")
      line = next_line()
      nimbus.endpoint("Erp", { concurency = 10 })
    end)
    assert.matches(("%s:%d: nimbus%%.endpoint%%(Erp%%): unknown option concurency %%(did you mean concurrency%%?%%); "
                    .. "the valid options are: concurrency, lock, retry, transient, inbox, timeout, cpu_budget, partitions, sessions")
                   :format(THIS:gsub("%p", "%%%0"), line), err)
  end)

  it("a misspelt nested option names its path", function()
    local line
    local err = load_error(function()
      local nimbus = require("nimbus")
      line = next_line()
      nimbus.endpoint("Erp", { retry = { rules = { { mach = "timeout", max_retries = 5 } } } })
    end)
    assert.matches(("%s:%d: .*unknown option retry%%.rules%%[1%%]%%.mach %%(did you mean retry%%.rules%%[1%%]%%.match%%?%%)")
                   :format(THIS:gsub("%p", "%%%0"), line), err)
    assert.matches("retry%.rules%[1%]%.match is required", load_error(function()
      require("nimbus").endpoint("Erp", { retry = { rules = { { max_retries = 5 } } } })
    end))
  end)

  it("a bad option value says what it must be", function()
    assert.matches("timeout must be a number of seconds >= 0.001, got %-1", load_error(function()
      require("nimbus").endpoint("Erp", { timeout = -1 })
    end))
    assert.matches('inbox must be true or false, got "yes"', load_error(function()
      require("nimbus").endpoint("Erp", { inbox = "yes" })
    end))
  end)

  it("handler, command, reply and checker options, and a second handler for a type", function()
    local lines = {}
    local function at(i) lines[i] = debug.getinfo(2, "l").currentline end   -- the mistake is on the same line
    local cases = {
      function(ep) at(1); ep:on("A", function() end, { is_alvie = function() end }) end,
      function(ep) at(2); ep:command("C", function() end, { retry = {} }) end,
      function(ep) at(3); ep:reply("R", function() end, { timeout = 1 }) end,
      function(ep) at(4); ep:checker("jobs", { every = 1, timout = 5 }, function() end) end,
      function(ep) ep:on("D", function() end); at(5); ep:on("D", function() end) end,
      function(ep) at(6); ep.on("E", function() end) end,
    }
    local want = { "unknown option is_alvie %(did you mean is_alive%?%)", "endpoint:command%(\"C\"%): unknown option retry",
                   "endpoint:reply%(\"R\"%): unknown option timeout", "unknown option timout %(did you mean timeout%?%)",
                   "endpoint Ep already has a handler for D %(at .*%d+%)", "call it with a colon, ep:on%(...%)" }
    for i, case in ipairs(cases) do
      local err = load_error(function() case(require("nimbus").endpoint("Ep")) end)
      assert.matches(("^nimbus%%.testing%%.load%%(function%%): the adapter raised an error: %s:%d: ")
                     :format(THIS:gsub("%p", "%%%0"), lines[i]), err)
      assert.matches(want[i], err)
    end
  end)

  it("names the adapter file's line when the adapter is a file", function()
    local path = os.tmpname() .. "_adapter.lua"
    local f = assert(io.open(path, "w"))
    f:write('local nimbus = require("nimbus")\n\nlocal ep = nimbus.endpoint("Erp", {\n  lock = { duraton = 5 } })\n')
    f:close()
    local ok, err = pcall(testing.load, path)
    os.remove(path)
    assert.is_false(ok)
    -- the adapter's file and line (the call spans lines 3 and 4), not the runtime's
    assert.matches("^nimbus%.testing%.load%([^\n]*%): the adapter raised an error: [^\n]*_adapter%.lua:[34]: "
                   .. "nimbus%.endpoint%(Erp%): unknown option lock%.duraton %(did you mean lock%.duration%?%)", err)
  end)

  it("runtime calls: a misspelt publish option or hand-off field fails the handler at its line", function()
    local line1, line2
    local app = testing.load(function()
      local nimbus = require("nimbus")
      local ep = nimbus.endpoint("Ep")
      ep:on("Pub", function()
        line1 = next_line()
        nimbus.publish("X", {}, { sesion = "s1" })
      end)
      ep:on("Hand", function(_, ctx)
        line2 = next_line()
        ctx:mark_pending_handoff{ reason = "r", external_id = "J-1" }
      end)
    end)
    testing.assert_failed(app:send("Ep", "Pub", {}), ("%s:%d: nimbus%%.publish: unknown option sesion %%(did you mean session%%?%%)")
                          :format(THIS:gsub("%p", "%%%0"), line1))
    testing.assert_failed(app:send("Ep", "Hand", {}), ("%s:%d: ctx:mark_pending_handoff: unknown option external_id "
                          .. "%%(did you mean external_job_id%%?%%)"):format(THIS:gsub("%p", "%%%0"), line2))
  end)

  it("blames the adapter's line, not the adapter library's, when a library function passes options on", function()
    -- a chunk named as the host names adapters/ modules: <lua>/../adapters/NAME.lua
    local app = testing.load(function() end)
    local lua_dir = debug.getinfo(app.nimbus.endpoint, "S").source:match("^@(.*/)nimbus/[^/]*$")
    local library = assert(load([[
      return function(name, opts) local ep = require("nimbus").endpoint(name, opts); return ep end
    ]], "@" .. lua_dir .. "../adapters/spec_wrapper.lua"))()
    local line
    local err = load_error(function()
      line = next_line()
      library("Erp", { retyr = {} })
    end)
    assert.matches(("the adapter raised an error: %s:%d: nimbus%%.endpoint%%(Erp%%): unknown option retyr")
                   :format(THIS:gsub("%p", "%%%0"), line), err)
  end)

  it("does not guess when nothing is close", function()
    local err = load_error(function() require("nimbus").endpoint("Erp", { zzzzzz = 1 }) end)
    assert.matches("unknown option zzzzzz; the valid options are", err)
  end)
end)

describe("adapters without endpoints", function()
  it("an adapter that only serves HTTP loads and serves", function()
    local app = testing.load(function()
      require("nimbus").http.serve{ port = 8080, routes = { ["GET /ping"] = function() return 200, { pong = true } end } }
    end)
    assert.are.same({}, app.endpoints)
    assert.are.same({ pong = true }, app:serve_request("GET", "/ping").json)
  end)
end)

-- The adapter author's commands as a new user meets them: `nimbus-host new NAME`, then
-- `test` (busted inside the host), `check`, then running the adapter and publishing to it
-- (from the CLI and from a -l seeding script), then stopping it; and `check` on broken
-- adapters, one problem kind at a time, each reported at its file:line.
local nh = require("nh")
local cjson = require("cjson")

local q = nh.q

-- Runs nimbus-host with args in directory `cwd`: { code, out, err }. env: { NAME = value }.
local function host(cwd, args, env)
  local words = {}
  for i, a in ipairs(args) do words[i] = q(a) end
  local prefix = ""
  for k, v in pairs(env or {}) do prefix = prefix .. k .. "=" .. q(v) .. " " end
  return nh.capture(("cd %s && %s%s %s"):format(q(cwd), prefix, q(nh.bin()), table.concat(words, " ")))
end

local function lines_of(s)
  local out = {}
  for l in s:gmatch("[^\n]+") do out[#out + 1] = l end
  return out
end

-- The line of `text` that starts with `prefix` (a file:line), or nil.
local function line_at(text, prefix)
  for _, l in ipairs(lines_of(text)) do
    if l:sub(1, #prefix) == prefix then return l end
  end
end

describe("nimbus-host new, test, check, run: the scaffold as a new user runs it", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("scaffolds an adapter whose spec passes, which checks clean, runs and handles what is published", function()
    local r = host(sb.dir, { "new", "greeter" })
    assert.are.equal(0, r.code, r.err)
    local dir = sb:path("greeter")
    for _, f in ipairs({ "greeter.lua", "greeter_spec.lua", ".luarc.json" }) do
      assert.is_true(nh.exists(dir .. "/" .. f), f)
    end
    assert.matches("nimbus%-host test", r.out)

    -- .luarc.json: Lua 5.4, and a library directory holding the nimbus definitions
    local luarc = cjson.decode(nh.read(dir .. "/.luarc.json"))
    assert.are.equal("Lua 5.4", luarc["runtime.version"])
    local types = luarc["workspace.library"][1]
    assert.matches("^/", types)
    assert.matches("^%-%-%-@meta nimbus\n", nh.read(types .. "/nimbus.lua"))
    assert.is_truthy(nh.read(types .. "/nimbus/testing.lua"))

    -- test: busted inside the host, on the default *_spec.lua of the directory
    r = host(dir, { "test" })
    assert.are.equal(0, r.code, r.out .. r.err)
    assert.matches("3 successes / 0 failures / 0 errors", r.out)

    -- check: clean, with a summary
    r = host(dir, { "check", "greeter.lua" })
    assert.are.equal(0, r.code, r.out .. r.err)
    assert.matches("1 adapter, 1 endpoint, 1 handler, 0 checkers: no problems", r.out)

    -- run it, publish from the CLI and from a -l seeding script, see each event's outcome
    local h = sb:start(dir .. "/greeter.lua")
    local mid = sb:publish("GreeterRequested", { name = "Ada" }, { session = "ada" })
    assert.are.equal("Completed", sb:wait_message(mid, "Completed").status)
    nh.write(sb:path("seed.lua"), [[
local nimbus = require("nimbus")
local id = assert(nimbus.publish("GreeterRequested", { name = "Bob" }, { session = "bob", message_id = "seed-bob" }))
local _, dup = assert(nimbus.publish("GreeterRequested", { name = "Bob" }, { session = "bob", message_id = "seed-bob" }))
assert(nimbus.publish("GreeterRequested", {}, { session = "nameless", message_id = "seed-nameless" }))
print(id, dup)
]])
    r = host(sb.dir, { "--store", sb.store, "-l", "seed.lua" })
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("seed-bob\ttrue", r.out:match("[^\n]+"))   -- the second one was a duplicate
    assert.are.equal("Completed", sb:wait_message("seed-bob", "Completed").status)
    local nameless = sb:wait_message("seed-nameless", "DeadLettered")
    assert.matches("needs a name", nameless.error_text)
    assert.are.equal(3, #sb:events())                      -- the duplicate was not queued again
    assert.matches("hello .*name=Ada", h:log())
    assert.are.equal(0, h:stop())
  end)

  it("refuses to overwrite, and refuses a name that cannot be an endpoint, with exit 2", function()
    assert.are.equal(0, host(sb.dir, { "new", "greeter" }).code)
    local spec = sb:path("greeter/greeter_spec.lua")
    nh.write(spec, "-- mine\n")
    local r = host(sb.dir, { "new", "greeter" })
    assert.are.equal(2, r.code)
    assert.matches("greeter/greeter%.lua already exists: nothing was written", r.err)
    assert.are.equal("-- mine\n", nh.read(spec))
    r = host(sb.dir, { "new", "9lives" })
    assert.are.equal(2, r.code)
    assert.matches("start with a letter", r.err)
    assert.is_false(nh.exists(sb:path("9lives")))
    assert.are.equal(2, host(sb.dir, { "new" }).code)
    assert.are.equal(2, host(sb.dir, { "new", "a", "b" }).code)
  end)

  it("test: busted's exit status, clear errors for missing specs and a missing busted", function()
    assert.are.equal(0, host(sb.dir, { "new", "greeter" }).code)
    local dir = sb:path("greeter")
    -- a handler that no longer does what its spec says: busted fails, and so does test
    local src = nh.read(dir .. "/greeter.lua"):gsub('nimbus%.log%.info%("hello"', 'nimbus.log.info("bye"')
    nh.write(dir .. "/greeter.lua", src)
    local r = host(dir, { "test", "greeter_spec.lua" })
    assert.are_not.equal(0, r.code)
    assert.matches("1 failure", r.out)
    -- busted's options after --
    r = host(dir, { "test", "greeter_spec.lua", "--", "-o", "TAP" })
    assert.matches("not ok 1 %- ", r.out)

    r = host(dir, { "test", "nope_spec.lua" })
    assert.are.equal(2, r.code)
    assert.matches("no such spec file or directory: nope_spec%.lua", r.err)
    r = host(dir, { "test", "-o", "TAP" })
    assert.are.equal(2, r.code)
    assert.matches("unknown option %-o %(busted's own options go after %-%-", r.err)
    r = host(sb.dir, { "test" })                               -- no *_spec.lua and no spec/ here
    assert.are.equal(2, r.code)
    assert.matches("no specs here", r.err)
    r = host(dir, { "test" }, { PATH = "/nonexistent" })
    assert.are.equal(1, r.code)
    assert.matches("busted is not installed", r.err)
  end)

  it("a -l script without a store to publish to says what to do, at its line", function()
    nh.write(sb:path("seed.lua"), 'local nimbus = require("nimbus")\nnimbus.publish("X", { a = 1 })\n')
    local r = host(sb.dir, { "--store", sb:path("missing/x.db"), "-l", "seed.lua" })
    assert.are.equal(1, r.code)
    assert.matches("seed%.lua:2: nimbus%.publish: store .*missing/x%.db does not exist", r.err)
    assert.matches("nimbus%-host %-%-store PATH %-l SCRIPT%.lua", r.err)
  end)
end)

describe("nimbus-host check on broken adapters", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  local function check(...)
    return host(sb.dir, { "check", ... })
  end

  it("reports a syntax error at its line", function()
    nh.write(sb:path("syntax.lua"), 'local nimbus = require("nimbus")\nlocal ep = nimbus.endpoint("A"\n')
    local r = check("syntax.lua")
    assert.are.equal(1, r.code)
    assert.truthy(line_at(r.out, "syntax.lua:3:"), r.out)
    assert.matches("1 problem in 1 adapter", r.out)
  end)

  it("reports every unknown option, with did-you-mean, and keeps loading", function()
    nh.write(sb:path("options.lua"), [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Erp", { concurency = 5, retry = { max_retires = 3 } })
ep:on("A", function() end, { is_alve = function() return true end })
ep:checker("jobs", { evry = 5 }, function() end)
ep:command("C", function() end, { timeout = 1 })
nimbus.every(10, function() end, { nmae = "tick" })
]])
    local r = check("options.lua")
    assert.are.equal(1, r.code)
    assert.matches("unknown option concurency %(did you mean concurrency%?%)", line_at(r.out, "options.lua:2:"))
    assert.truthy(r.out:find("options.lua:2: nimbus.endpoint(Erp): unknown option retry.max_retires "
                             .. "(did you mean retry.max_retries?)", 1, true), r.out)
    assert.matches("unknown option is_alve %(did you mean is_alive%?%)", line_at(r.out, "options.lua:3:"))
    assert.matches("unknown option evry %(did you mean every%?%)", line_at(r.out, "options.lua:4:"))
    assert.matches("endpoint:command%(\"C\"%): unknown option timeout; the valid options are: is_alive",
                   line_at(r.out, "options.lua:5:"))
    assert.matches("unknown option nmae %(did you mean name%?%)", line_at(r.out, "options.lua:6:"))
  end)

  it("reports a bad option value, and the host's own parser agrees", function()
    nh.write(sb:path("values.lua"), [[
local nimbus = require("nimbus")
nimbus.endpoint("Erp", { concurrency = 0, retry = { strategy = "random" } })
]])
    local r = check("values.lua")
    assert.are.equal(1, r.code)
    assert.matches("concurrency must be an integer from 1 to 100000, got 0", r.out)
    assert.matches("retry%.strategy must be one of fixed, linear, exponential, got \"random\"", r.out)
    assert.truthy(line_at(r.out, "values.lua:2:"))
  end)

  it("accepts every option there is (the runtime's schema and the host's parser agree)", function()
    nh.write(sb:path("full.lua"), [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Erp", {
  concurrency = 200, inbox = true, timeout = 30, cpu_budget = 2,
  lock = { duration = 30, renew_max = 300 },
  transient = { max_attempts = 5, base = 1, max_delay = 60 },
  retry = { max_retries = 3, strategy = "exponential", base = 1, max_delay = 60, jitter = "bounded", jitter_factor = 0.5,
            types = { ErpOrderPlaced = { max_retries = 1, strategy = "fixed" } },
            rules = { { match = "timeout", max_retries = 5, types = { "ErpOrderPlaced" } } } },
})
ep:on("ErpOrderPlaced", function() end, { is_alive = function() return true end })
ep:command("PlaceHold", function() end)
ep:reply("CreditCheck", function() return {} end)
ep:checker("jobs", { every = 1, timeout = 5 }, function() end)
nimbus.every(60, function() end, { timeout = 5, name = "tick" })
nimbus.retention{ resolved = "7d", inbox = "30d" }
]])
    local r = check("full.lua")
    assert.are.equal(0, r.code, r.out .. r.err)
    assert.matches("1 adapter, 1 endpoint, 3 handlers, 1 checker: no problems", r.out)
  end)

  it("reports a second handler for a type, naming the first", function()
    nh.write(sb:path("dup.lua"), [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Erp")
ep:on("OrderPlaced", function() end)
ep:on("OrderPlaced", function() end)
]])
    local r = check("dup.lua")
    assert.are.equal(1, r.code)
    assert.matches("endpoint Erp already has a handler for OrderPlaced %(at .*dup%.lua:3%)", line_at(r.out, "dup.lua:4:"))
  end)

  it("reports a command with two consumers, in one adapter or across adapters", function()
    nh.write(sb:path("one.lua"), [[
local nimbus = require("nimbus")
nimbus.endpoint("Erp"):command("PlaceHold", function() end)
]])
    nh.write(sb:path("two.lua"), [[
local nimbus = require("nimbus")
nimbus.endpoint("Crm"):on("PlaceHold", function() end)
]])
    local r = check("one.lua", "two.lua")
    assert.are.equal(1, r.code)
    assert.matches("PlaceHold is a command and can have exactly one consuming endpoint, but Erp consumes it "
                   .. "%(at .*one%.lua:2%) and Crm too", line_at(r.out, "two.lua:2:"))
    assert.matches("1 problem in 2 adapters", r.out)
    -- each alone is fine
    assert.are.equal(0, check("one.lua").code)
    assert.are.equal(0, check("two.lua").code)
  end)

  it("reports an endpoint defined by two adapters", function()
    nh.write(sb:path("a.lua"), 'require("nimbus").endpoint("Erp"):on("A", function() end)\n')
    nh.write(sb:path("b.lua"), 'local nimbus = require("nimbus")\nnimbus.endpoint("Erp"):on("B", function() end)\n')
    local r = check("a.lua", "b.lua")
    assert.are.equal(1, r.code)
    assert.matches("endpoint Erp is already defined by another adapter %(at .*a%.lua:1%)", line_at(r.out, "b.lua:2:"))
  end)

  it("reports a checker on an endpoint that handles nothing", function()
    nh.write(sb:path("lonely.lua"), [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Poller")
ep:checker("jobs", { every = 5 }, function(chk) end)
]])
    local r = check("lonely.lua")
    assert.are.equal(1, r.code)
    assert.matches("endpoint Poller handles no event type, so none of its events is ever handed off",
                   line_at(r.out, "lonely.lua:3:"))
  end)

  it("reports an option mistake made through the adapter library at the caller's line", function()
    -- adapters/http_forward.lua passes `endpoint` on to nimbus.endpoint: the problem is the
    -- caller's (line 3), not the library's, whatever path the library was loaded from
    nh.write(sb:path("lib.lua"), [[
local forward = require("adapters.http_forward")
forward.endpoint("Orders", { types = { "OrderPlaced" }, url = "http://127.0.0.1:1/orders",
  endpoint = { concurency = 5 } })
forward.endpoint("Audit", { types = { "OrderPlaced" }, url = "http://127.0.0.1:1/audit",
  endpoint = { concurrency = 5 } })
]])
    local r = check("lib.lua")
    assert.are.equal(1, r.code, r.out .. r.err)
    assert.matches("unknown option concurency %(did you mean concurrency%?%)", line_at(r.out, "lib.lua:2:"), 1)
    assert.is_nil(r.out:find("adapters/http_forward.lua", 1, true), r.out)
    assert.matches("1 problem in 1 adapter", r.out)
  end)

  it("reports what stopped loading after what was found before it", function()
    nh.write(sb:path("raises.lua"), [[
local nimbus = require("nimbus")
nimbus.endpoint("Erp", { lokc = {} })
local cfg = nil
print(cfg.url)
]])
    local r = check("raises.lua")
    assert.are.equal(1, r.code)
    local out = lines_of(r.out)
    assert.matches("^raises%.lua:2: .*unknown option lokc %(did you mean lock%?%)", out[1])
    assert.matches("^raises%.lua:4: attempt to index a nil value", out[2])
    assert.matches("2 problems in 1 adapter", r.out)
  end)

  it("loads without side effects: no port, no database file, nothing published", function()
    nh.write(sb:path("effects.lua"), [[
local nimbus = require("nimbus")
local srv = assert(nimbus.http.serve{ port = 0, routes = { ["GET /x"] = function() return 200 end } })
assert(not srv:listening(), "check mode opened a socket")
local db = assert(nimbus.sqlite.open("created.db"))
assert(db:exec("CREATE TABLE t (x)"))
assert(nimbus.publish("Seeded", { a = 1 }))
]])
    local r = check("effects.lua")
    assert.are.equal(0, r.code, r.out .. r.err)
    assert.matches("1 adapter, 0 endpoints, 0 handlers, 0 checkers: no problems", r.out)
    assert.is_false(nh.exists(sb:path("created.db")))
    assert.is_false(nh.exists(sb:path("nimbus.db")))
  end)

  it("refuses bad arguments with exit 2", function()
    local r = check()
    assert.are.equal(2, r.code)
    assert.matches("no adapter given", r.err)
    r = check("missing.lua")
    assert.are.equal(2, r.code)
    assert.matches("cannot read adapter missing%.lua", r.err)
  end)
end)

-- Bad input: malformed messages, broken adapters, bad stores, and operator/CLI misuse.
-- Every refusal must exit 2 with a reason and change nothing.
local nh = require("nh")

describe("bad input", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  local function crash_handlers()
    return [[
ep:on("Crash", function(event, ctx)
  record(event, ctx, "Ep")
  local missing = nil
  return missing.field
end)
]]
  end

  describe("messages", function()
    it("malformed JSON (--raw) is DeadLettered without running the handler and does not block the session", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local bad = sb:publish("Ok", '{"tag": "bad", oops', { session = "s1", raw = true })
      local good = sb:publish("Ok", { tag = "good" }, { session = "s1" })
      local row = sb:wait_message(bad, "DeadLettered")
      sb:wait_message(good, "Completed")
      assert.matches("malformed JSON", row.error_text)
      assert.same({ "good" }, sb:call_tags("s1"))
      assert.equal("event", sb:calls()[1].kind, "the next event was not parked")
      assert.is_nil(sb:session("s1"))
    end)

    it("a JSON payload that is not an object (--raw) is DeadLettered and does not block the session", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local bad1 = sb:publish("Ok", "42", { session = "s1", raw = true })
      local bad2 = sb:publish("Ok", '[{"tag": "in-array"}]', { session = "s1", raw = true })
      local good = sb:publish("Ok", { tag = "good" }, { session = "s1" })
      local r1 = sb:wait_message(bad1, "DeadLettered")
      local r2 = sb:wait_message(bad2, "DeadLettered")
      sb:wait_message(good, "Completed")
      assert.matches("JSON object", r1.error_text)
      assert.matches("JSON object", r2.error_text)
      assert.same({ "good" }, sb:call_tags("s1"))
      assert.is_nil(sb:session("s1"))
    end)

    it("an unknown event type sent with --to is Unsupported and does not block the session", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local u = sb:publish("Mystery", { tag = "m" }, { session = "s1", to = "Ep" })
      local good = sb:publish("Ok", { tag = "good" }, { session = "s1" })
      local row = sb:wait_message(u, "Unsupported")
      sb:wait_message(good, "Completed")
      assert.matches("Mystery", row.error_text or "Mystery")
      assert.same({ "good" }, sb:call_tags("s1"))
      assert.is_nil(sb:session("s1"))
    end)

    it("a runtime error in the handler is Failed with file:line: message and a Lua traceback", function()
      sb:start(sb:recorder{ types = { "Ok" }, extra = crash_handlers() })
      local m = sb:publish("Crash", { tag = "x" }, { session = "s1" })
      local row = sb:wait_message(m, "Failed")
      assert.matches("Ep%.lua:%d+: attempt to index a nil value", row.error_text)
      assert.equal("LuaError", row.error_type)
      local shown = sb:show(row.event_id)
      assert.matches("stack traceback", shown.error_stack)
      assert.matches("Ep%.lua:%d+", shown.error_stack)
      assert.equal(row.event_id, sb:session("s1").blocked_by)
    end)
  end)

  describe("adapters", function()
    it("a syntax error makes the host exit 2 naming file:line", function()
      local path = sb:adapter("broken.lua", 'local nimbus = require("nimbus")\nlocal ep = nimbus.endpoint("Ep")\nep:on("Ok", function(\n')
      local r = sb:cli({ path })
      assert.equal(2, r.code)
      assert.matches("broken%.lua:%d+:", r.err)
      assert.is_nil(r.err:find("ready:", 1, true))
    end)

    it("a runtime error while loading makes the host exit 2 with file:line: message", function()
      local path = sb:adapter("boom.lua", 'local nimbus = require("nimbus")\n\nerror("config missing: ERP_URL")\n')
      local r = sb:cli({ path })
      assert.equal(2, r.code)
      assert.matches("boom%.lua:3: config missing: ERP_URL", r.err)
    end)

    it("a main chunk that never returns fails the load within its budget, naming file:line, on one line", function()
      local path = sb:adapter("hang.lua", 'local nimbus = require("nimbus")\nnimbus.endpoint("Ep", {}):on("Ok", function() end)\n'
        .. 'while true do pcall(function() while true do end end) end\n')
      local r = nh.capture("NIMBUS_LOAD_TIMEOUT=1 " .. nh.q(nh.bin()) .. " " .. nh.q(path) .. " --store " .. nh.q(sb.store))
      assert.equal(2, r.code)
      assert.matches("cannot load adapter: [^\n]*hang%.lua:3: loading the adapter took longer than 1 s", r.err)
    end)

    it("a reload to a main chunk that never returns keeps the old code serving; SIGTERM still stops the host", function()
      local path = sb:recorder{ types = { "Ok" } }
      local h = sb:start(path, { args = { "--no-reload" }, env = { NIMBUS_LOAD_TIMEOUT = "1" } })
      sb:wait_message(sb:publish("Ok", { tag = "before" }, { session = "s1" }), "Completed")
      local src = nh.read(path)
      nh.write(path, src .. "\nwhile true do end\n")
      h:signal("HUP")
      h:wait_log("failed; the running version keeps serving")
      assert.matches("Ep%.lua:%d+: loading the adapter took longer than 1 s", h:log())
      sb:wait_message(sb:publish("Ok", { tag = "after" }, { session = "s1" }), "Completed")
      h:signal("TERM")
      assert.equal(0, h:wait_exit(20))
    end)

    it("os.exit in a handler fails the event instead of stopping the host", function()
      local h = sb:start(sb:recorder{ types = { "Ok" }, extra = 'ep:on("Quit", function() os.exit(3) end)' })
      local row = sb:wait_message(sb:publish("Quit", {}, { session = "q" }), "Failed")
      assert.matches("os%.exit is not available in an adapter", row.error_text)
      assert.is_true(h:alive())
      sb:wait_message(sb:publish("Ok", { tag = "still" }, { session = "s2" }), "Completed")
    end)

    it("an unknown endpoint option makes the host exit 2 naming the option", function()
      local path = sb:recorder{ types = { "Ok" }, options = "retry = { max_retry = 3 }" }
      local r = sb:cli({ path })
      assert.equal(2, r.code)
      assert.matches("max_retry", r.err)
      -- blames the adapter's own line, not the nimbus runtime's
      assert.matches("cannot load adapter: [^\n]*Ep%.lua:%d+: nimbus%.endpoint%(Ep%)", r.err)
    end)

    it("an invalid retry strategy makes the host exit 2", function()
      local path = sb:recorder{ types = { "Ok" }, options = 'retry = { max_retries = 1, strategy = "random" }' }
      local r = sb:cli({ path })
      assert.equal(2, r.code)
      assert.matches("strategy", r.err)
    end)

    it("an adapter that defines no endpoint makes the host exit 2", function()
      local path = sb:adapter("empty.lua", 'local nimbus = require("nimbus")\n')
      local r = sb:cli({ path })
      assert.equal(2, r.code)
      assert.matches("endpoint", r.err)
    end)

    it("a missing adapter file makes the host exit 2 naming it", function()
      local r = sb:cli({ sb:path("adapters/nope.lua") })
      assert.equal(2, r.code)
      assert.matches("nope.lua", r.err, 1, true)
    end)
  end)

  describe("stores", function()
    it("a store in a missing directory makes the host exit 2 naming the directory", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local missing = sb:path("no/such/dir")
      local r = sb:cli({ adapter }, { store = missing .. "/nimbus.db" })
      assert.equal(2, r.code)
      assert.matches(missing, r.err, 1, true)
      assert.is_false(nh.exists(missing))
    end)

    it("an sqlite file that is not a nimbus-host store is refused with exit 2 and left untouched", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      local foreign = sb:path("foreign.db")
      assert.equal(0, nh.sh(("sqlite3 %s 'create table x(a); insert into x values (1)'"):format(nh.q(foreign))))
      local r = sb:cli({ adapter }, { store = foreign })
      assert.equal(2, r.code)
      assert.matches("not a nimbus%-host store", r.err)
      local tables = nh.capture(("sqlite3 %s \"select name from sqlite_master where type = 'table' order by name\""):format(nh.q(foreign)))
      assert.equal("x\n", tables.out)
      local ev = sb:cli({ "events", "--json" }, { store = foreign })
      assert.equal(2, ev.code)
      assert.matches("not a nimbus%-host store", ev.err)
    end)
  end)

  describe("the CLI", function()
    local UNKNOWN = "00000000-0000-4000-8000-000000000000"

    it("refuses operator commands for an unknown event id with exit 2", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local row = sb:wait_message(sb:publish("Ok", { tag = "c" }, { session = "s1" }), "Completed")
      local before = sb:events()
      for _, args in ipairs({
        { "resubmit", UNKNOWN }, { "skip", UNKNOWN }, { "handoff", "complete", UNKNOWN },
        { "handoff", "fail", UNKNOWN, "--error", "x" }, { "show", UNKNOWN },
      }) do
        local r = sb:cli(args)
        assert.equal(2, r.code, table.concat(args, " "))
        assert.matches(UNKNOWN, r.err, 1, true)
        assert.equal("", r.out)
      end
      assert.same(before, sb:events())
      assert.equal(1, sb:call_count("c"))
      assert.equal("Completed", sb:row(row.event_id).status)
    end)

    it("refuses resubmit of a Deferred event and skip of a Completed or Skipped one with exit 2; nothing changes", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local c = sb:wait_message(sb:publish("Ok", { tag = "c" }, { session = "s0" }), "Completed")
      local f = sb:wait_message(sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" }), "Failed")
      local d = sb:wait_message(sb:publish("Ok", { tag = "d" }, { session = "s1" }), "Deferred")
      local before = sb:events()

      local r = sb:cli({ "resubmit", d.event_id })
      assert.equal(2, r.code)
      assert.matches("Deferred", r.err)
      assert.matches(f.event_id, r.err, 1, true)
      r = sb:cli({ "skip", c.event_id })
      assert.equal(2, r.code)
      assert.matches("Completed", r.err)
      assert.same(before, sb:events())

      sb:cli_ok({ "skip", f.event_id })
      sb:wait_event(f.event_id, "Skipped")
      sb:wait_message(d.message_id, "Completed")
      r = sb:cli({ "skip", f.event_id })
      assert.equal(2, r.code)
      assert.matches("Skipped", r.err)
      assert.same({ "f", "d" }, sb:call_tags("s1"))
    end)

    it("refuses publish with invalid JSON (without --raw) with exit 2 and queues nothing", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local r = sb:cli({ "publish", "Ok", "{not json", "--session", "s1" })
      assert.equal(2, r.code)
      assert.equal("", r.out)
      assert.equal(0, sb:queued())
      -- The host is still fine and the session free.
      sb:wait_message(sb:publish("Ok", { tag = "after" }, { session = "s1" }), "Completed")
      assert.same({ "after" }, sb:call_tags())
    end)

    it("refuses at the door what the host would dead-letter: non-object payloads, empty types, non-UTF-8 sessions", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local f = sb:wait_message(sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" }), "Failed")
      for _, args in ipairs({
        { { "publish", "Ok", "[1,2,3]", "--session", "s2" }, "must be a JSON object" },
        { { "publish", "Ok", '"text"', "--session", "s2" }, "must be a JSON object" },
        { { "publish", "", "{}" }, "event type is empty" },
        { { "publish", "Ok", "{}", "--session", "\255\254" }, "UTF%-8" },
        { { "resubmit", f.event_id, "--body", "[1,2]" }, "must be a JSON object" },
      }) do
        local r = sb:cli(args[1])
        assert.equal(2, r.code, table.concat(args[1], " "))
        assert.matches(args[2], r.err)
      end
      -- nothing was queued or changed: the blocker is still Failed with its payload
      local shown = sb:show(f.event_id)
      assert.equal("Failed", shown.status)
      assert.matches('"tag":"f"', shown.payload)
      assert.equal(1, #sb:call_tags())
    end)

    -- embedded only: on a broker `publish --to` asks the broker whether the queue exists
    -- (amqp_spec), and each consuming endpoint derives its own EventId from the MessageId
    if nh.transport == "embedded" then
    it("publish --to an endpoint the store does not know is refused, naming the known ones", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local r = sb:cli({ "publish", "Ok", "{}", "--to", "NoSuchEndpoint" }, { transport = false })
      assert.equal(2, r.code)
      assert.matches("%-%-to NoSuchEndpoint: no such endpoint in this store %(known: Ep%)", r.err)
      assert.equal(0, sb:queued(), "nothing was queued")
    end)

    it("publish names the EventId of each copy, which show takes", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local r = sb:cli({ "publish", "Ok", '{"tag":"x"}', "--session", "s9" }, { transport = false })
      assert.equal(0, r.code, r.err)
      local eid = r.err:match("queued as event (%S+) for Ep")
      assert.truthy(eid, r.err)
      sb:wait_event(eid, "Completed")
      assert.equal(eid, sb:show(eid).event_id)
    end)
    end

    it("publish --message-id is idempotent: a retried publish is stored once and says so", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local first = sb:cli({ "publish", "Ok", '{"tag":"once"}', "--session", "s1", "--message-id", "order-42" })
      assert.equal(0, first.code, first.err)
      assert.equal("order-42\n", first.out)
      sb:wait_message("order-42", "Completed")
      local again = sb:cli({ "publish", "Ok", '{"tag":"once"}', "--session", "s1", "--message-id", "order-42" })
      assert.equal(0, again.code, again.err)
      assert.equal("order-42\n", again.out)
      assert.matches("MessageId order%-42 was already published at [^\n]+: not stored again", again.err)
      sb:wait_message(sb:publish("Ok", { tag = "after" }, { session = "s1" }), "Completed")
      assert.same({ "once", "after" }, sb:call_tags("s1"), "stored and handled once")
      local bad = sb:cli({ "publish", "Ok", "{}", "--message-id", "" })
      assert.equal(2, bad.code)
    end)

    it("nimbus.publish{message_id=} is idempotent: in handlers, across a failed attempt, outside handlers", function()
      -- outside handlers: a checker publishes the same MessageId on every tick, in this
      -- host and in the next one
      -- (once the test says go: on a broker, a publish before the host's queue is bound
      -- would be routed nowhere, and its id would still count as published)
      local extra = [[ep:checker("boot", { every = 0.05 }, function()
  local go = io.open(DIR .. "/go", "r")
  if not go then return end
  go:close()
  nimbus.publish("Ok", { tag = "boot" }, { session = "s0", message_id = "boot-1" })
end)]]
      local h = sb:start(sb:recorder{ types = { "Ok", "Go" }, extra = extra, options = "retry = { max_retries = 1, base = 0 }" })
      sb:touch("go")
      sb:wait_message("boot-1", "Completed")
      h:wait_log("MessageId boot-1 was already published at")
      -- in handlers: two events publish the same MessageId; the first attempt of a third
      -- fails (its publish is never sent) and its retry publishes once
      local pub = function(tag, id) return { { type = "Ok", session = "s1", message_id = id, payload = { tag = tag } } } end
      sb:wait_message(sb:publish("Go", { tag = "a", publish = pub("a-out", "order-7") }, { session = "g" }), "Completed")
      sb:wait_message(sb:publish("Go", { tag = "b", publish = pub("b-out", "order-7") }, { session = "g" }), "Completed")
      sb:wait_message(sb:publish("Go", { tag = "c", fail_times = 1, publish = pub("c-out", "order-8") },
                                 { session = "g" }), "Completed")
      local last = sb:publish("Ok", { tag = "last" }, { session = "s1" })
      sb:wait_message(last, "Completed")
      assert.same({ "a-out", "c-out", "last" }, sb:call_tags("s1"), "each MessageId stored and handled once")
      assert.equal("order-7", sb:wait_message("order-7", "Completed").message_id)
      local said = nh.json_lines(nh.read(sb:path("published.jsonl")))
      assert.same({ by = "a", id = "order-7", duplicate = false }, said[1])
      assert.same({ by = "b", id = "order-7", duplicate = true }, said[2], "the second call is told")
      assert.matches("MessageId order%-7 was already published at [^\n]+: not published again", h:log())
      h:stop()
      h = sb:start(sb:recorder{ types = { "Ok", "Go" }, extra = extra, options = "retry = { max_retries = 1, base = 0 }" })
      h:wait_log("MessageId boot-1 was already published at")
      sb:wait_message(sb:publish("Ok", { tag = "after" }, { session = "s0" }), "Completed")
      assert.same({ "boot", "after" }, sb:call_tags("s0"), "the checker's publishes were stored once")
      h:stop()
      -- a bad id is refused where the adapter calls it
      h = sb:spawn(sb:recorder{ types = { "Ok" }, name = "bad.lua",
                               extra = 'nimbus.publish("Ok", {}, { message_id = 42 })' }, { wait = false })
      h:wait_exit(nh.DEADLINE)
      assert.matches("bad%.lua:%d+: nimbus%.publish: message_id must be a UTF%-8 string of 1 to 200 bytes", h:log())
    end)

    it("refuses invalid JSON in resubmit --body and handoff --result with exit 2", function()
      sb:start(sb:recorder{ types = { "Ok" } })
      local f = sb:wait_message(sb:publish("Ok", { tag = "f", fail = true }, { session = "s1" }), "Failed")
      local h = sb:wait_message(sb:publish("Ok", { tag = "h", handoff = "x" }, { session = "s2" }), "Pending")
      local r = sb:cli({ "resubmit", f.event_id, "--body", "{nope" })
      assert.equal(2, r.code)
      r = sb:cli({ "handoff", "complete", h.event_id, "--result", "[1," })
      assert.equal(2, r.code)
      r = sb:cli({ "handoff", "fail", h.event_id })
      assert.equal(2, r.code, "handoff fail needs --error")
      assert.matches("%-%-error", r.err)
      -- Nothing was queued: the first valid command for each is accepted.
      sb:cli_ok({ "handoff", "complete", h.event_id })
      sb:cli_ok({ "skip", f.event_id })
      sb:wait_event(h.event_id, "Completed")
      sb:wait_event(f.event_id, "Skipped")
      assert.equal(1, sb:call_count("f"))
      assert.equal(1, sb:call_count("h"))
    end)

    it("refuses unknown options with exit 2", function()
      local adapter = sb:recorder{ types = { "Ok" } }
      for _, args in ipairs({
        { adapter, "--bogus" }, { "publish", "Ok", "{}", "--sesion", "s1" }, { "events", "--colour" },
        { "sessions", "--all" }, { "resubmit", UNKNOWN, "--force" }, { "skip", UNKNOWN, "-x" },
        { "show", UNKNOWN, "--yaml" },
      }) do
        local r = sb:cli(args)
        assert.equal(2, r.code, table.concat(args, " ") .. "\n" .. r.err)
        assert.is_true(#r.err > 0, "a reason is printed")
      end
      assert.is_false(nh.exists(sb.store), "no command created the store")
    end)

    it("prints the usage to stderr with exit 2 when given nothing", function()
      local r = sb:cli({}, { store = false })
      assert.equal(2, r.code)
      assert.equal("", r.out)
      assert.matches("^usage:", r.err)
    end)

    it("refuses an unknown subcommand with exit 2", function()
      local r = sb:cli({ "frobnicate" })
      assert.equal(2, r.code)
      assert.is_true(#r.err > 0)
    end)

    it("runs a -l script with thousands of arguments (busted passes every spec file)", function()
      local script = nh.write(sb:path("count.lua"), "print(#arg, arg[#arg])\n")
      local args = { "-l", script }
      for i = 1, 5000 do args[#args + 1] = tostring(i) end
      local r = sb:cli(args, { store = false })
      assert.equal(0, r.code, r.err)
      assert.equal("5000\t5000", r.out:match("[^\n]+"))
    end)
  end)
end)

-- Changing an endpoint's partition count on RabbitMQ (docs/broker-partitions.md, "Changing
-- P"): `nimbus-host partitions Ep P --transport ...` moves the messages of the old queues to
-- the new ones in order, refused while a host consumes them; and `publish --to` an endpoint
-- with partitions from a process that does not run it. Runs as ctest
-- functional_amqp_partitions_migrate (NH_TRANSPORT set, the broker started by the rabbitmq
-- fixture); every sandbox has its own vhost.
local nh = require("nh")

if nh.transport ~= "amqp" then
  error("partitions_migrate_spec.lua tests RabbitMQ partitions and needs NH_TRANSPORT=amqp://guest:guest@127.0.0.1:5672 "
    .. "(run it with `ctest -R functional_amqp_partitions_migrate`, which starts the broker)")
end

local partition_of = nh.partition_of

local function vq(sb, queue) return "/queues/" .. nh.urlencode(sb.vhost) .. "/" .. nh.urlencode(queue) end

local function queue(sb, name) return nh.rmq_queue(sb.vhost, name) end

local function binding_keys(sb, name)
  local keys = {}
  for _, b in ipairs(nh.decode(nh.rmq_api("GET", vq(sb, name) .. "/bindings").body)) do
    if b.source ~= "" then keys[b.routing_key] = true end
  end
  return keys
end

-- Nothing consumes the endpoint's queues any more (a stopped host's consumers leave the
-- management API's list as its connection closes).
local function no_consumers(sb)
  nh.eventually(function()
    for _, c in ipairs(nh.decode(nh.rmq_api("GET", "/consumers/" .. nh.urlencode(sb.vhost)).body)) do
      if c.queue.name:match("^Ep") then return false end
    end
    return true
  end, nil, "the stopped hosts' consumers still listed")
end

-- Queue depths of Ep.p0 .. p<n-1> as the broker shows them, equal to `want` (lists).
local function depths_become(sb, n, want)
  local got = {}
  nh.eventually(function()
    for i = 0, n - 1 do got[i + 1] = (queue(sb, "Ep.p" .. i) or {}).messages or -1 end
    return table.concat(got, " ") == table.concat(want, " ")
  end, nil, function() return ("queue depths %s, expected %s"):format(table.concat(got, " "), table.concat(want, " ")) end)
end

local function partitions(sb, ep, p, url, ...)
  return sb:cli({ "partitions", ep, tostring(p), "--transport", url or sb.transport_url, ... }, { store = false })
end

-- A session id over 600 bytes whose partition of 4 is not that of its first 511 bytes: the
-- move must hash all of it, as its publishers do.
local function long_session()
  for k = 1, 1000 do
    local id = ("long%d-"):format(k) .. ("x"):rep(600)
    if partition_of(id, 4) ~= partition_of(id:sub(1, 511), 4) and partition_of(id, 4) ~= partition_of(id, 2) then
      return id
    end
  end
end

-- `sessions` x `per` events, types A and B by turns, each session's tags in publishing order;
-- the last session's id is long (long_session) when `long` is set.
local function publish_round(sb, sessions, per, long)
  local published = {}
  local long_id = long and long_session()
  for i = 1, per do
    for s = 1, sessions do
      local session = (long and s == sessions) and long_id or ("s" .. s)
      local tag = ("s%d-%d"):format(s, i)
      sb:publish(i % 2 == 0 and "B" or "A", { tag = tag }, { session = session })
      published[session] = published[session] or {}
      table.insert(published[session], tag)
    end
  end
  return published
end

local function completed(sb, n) return sb:wait_completed(n) end

-- A TCP listener on a free port that accepts connections and never sends a byte (a hung
-- broker), in a python3 process of its own that ends by itself after two minutes.
-- Returns { port = ..., stop = function }.
local BLACK_HOLE = [[
import os, socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
s.settimeout(1)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d %d" % (s.getsockname()[1], os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
held, end = [], time.time() + 120
while time.time() < end:
    try:
        held.append(s.accept())
    except socket.timeout:
        pass
]]
local function black_hole(sb)
  local file = sb:path("black-hole")
  assert(nh.sh(("python3 -c %s %s >/dev/null 2>&1 </dev/null &"):format(nh.q(BLACK_HOLE), nh.q(file))) == 0)
  local port, pid = nh.eventually(function() return (nh.read(file) or ""):match("^%d+ %d+$") end, 10,
    "the black hole's port"):match("^(%d+) (%d+)$")
  return { port = port, stop = function() nh.sh("kill " .. pid .. " 2>/dev/null") end }
end

describe("nimbus-host partitions (RabbitMQ)", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("moves the events of 2 partitions to 4 in order; a host with partitions = 4 handles each once, every "
    .. "session in publishing order", function()
    local two = sb:recorder{ types = { "A", "B" }, options = "partitions = 2" }
    assert.equal(0, sb:spawn(two):stop())   -- declares Ep.p0, Ep.p1; then nobody consumes them
    local published = publish_round(sb, 12, 4, true)
    local want2 = { 0, 0 }
    for s in pairs(published) do want2[partition_of(s, 2) + 1] = want2[partition_of(s, 2) + 1] + 4 end
    depths_become(sb, 2, want2)
    no_consumers(sb)
    -- an operator's own binding on a queue that stays: removed with the old layout, and said
    nh.rmq_api("POST", "/bindings/" .. nh.urlencode(sb.vhost) .. "/e/nimbus.events/q/Ep.p1", { routing_key = "Order.#" })

    local r = partitions(sb, "Ep", 4)
    assert.equal(0, r.code, r.out .. r.err)
    assert.truthy(r.out:find("removed binding(s) no host makes (Ep.p1: Order.#)", 1, true), r.out)
    local moved = tonumber(r.out:match("^Ep: moved (%d+) message%(s%) from 2 partition%(s%) %(Ep%.p0 %.%. Ep%.p1%) "
      .. "to 4 %(Ep%.p0 %.%. Ep%.p3%)"))
    assert.truthy(moved, r.out)
    local want4, expect_moved = { 0, 0, 0, 0 }, 0
    for s in pairs(published) do
      local p = partition_of(s, 4)
      want4[p + 1] = want4[p + 1] + 4
      if p ~= partition_of(s, 2) then expect_moved = expect_moved + 4 end
    end
    assert.equal(expect_moved, moved, r.out)
    assert.is_true(expect_moved > 0 and expect_moved < 48, "the sessions all stay or all move: the test shows little")
    depths_become(sb, 4, want4)
    -- the new layout's bindings only: partition 1 of 4 binds A.*.*.*.*.*.*.0.1, no longer A.*.*.*.*.*.*.*.1
    local keys = binding_keys(sb, "Ep.p1")
    assert.truthy(keys["A.*.*.*.*.*.*.0.1"] and keys["B.*.*.*.*.*.*.0.1"], nh.encode(keys))
    assert.is_nil(keys["A.*.*.*.*.*.*.*.1"], nh.encode(keys))
    assert.is_nil(keys["Order.#"], nh.encode(keys))
    for _, name in ipairs(nh.rmq_queue_names(sb.vhost)) do
      assert.is_nil(name:find("migrating", 1, true), "the migration's marker is left: " .. name)
    end
    -- the same again: nothing to do
    r = partitions(sb, "Ep", 4)
    assert.equal(0, r.code, r.out .. r.err)
    assert.truthy(r.out:find("Ep already has 4 partition(s)", 1, true), r.out)

    local four = sb:recorder{ types = { "A", "B" }, options = "partitions = 4", name = "Ep4.lua" }
    sb:spawn(four)
    completed(sb, 48)
    for s, tags in pairs(published) do
      assert.same(tags, sb:call_tags(s), "session " .. s)
      for _, tag in ipairs(tags) do assert.equal(1, sb:call_count(tag), tag) end
    end
  end)

  it("refused while a host consumes the endpoint: exit 1, nothing moved", function()
    local two = sb:recorder{ types = { "A" }, options = "partitions = 2" }
    sb:spawn(two)
    -- the command reads the consumers from the management API, which shows them up to its
    -- statistics interval late: wait until they show (docs/broker-partitions.md)
    nh.eventually(function()
      local n = 0
      for _, c in ipairs(nh.decode(nh.rmq_api("GET", "/consumers/" .. nh.urlencode(sb.vhost)).body)) do
        if c.queue.name:match("^Ep%.p%d$") then n = n + 1 end
      end
      return n == 2
    end, nil, "the host's two consumers in the management API")
    local r = partitions(sb, "Ep", 4)
    assert.equal(1, r.code, r.out .. r.err)
    assert.truthy(r.err:find("stop every host that consumes Ep first", 1, true), r.err)
    assert.truthy(r.err:find("consumer(s) on Ep.p0", 1, true), r.err)
    assert.is_nil(queue(sb, "Ep.p2"), "new queues declared")
    assert.truthy(binding_keys(sb, "Ep.p1")["A.*.*.*.*.*.*.*.1"], "the old bindings were touched")
    for _, name in ipairs(nh.rmq_queue_names(sb.vhost)) do
      assert.is_nil(name:find("migrating", 1, true), "a migration marker: " .. name)
    end
  end)

  it("an interrupted migration is finished by running it again; hosts refuse to start meanwhile", function()
    local one = sb:recorder{ types = { "A", "B" } }
    assert.equal(0, sb:spawn(one):stop())   -- the single queue Ep
    local published = publish_round(sb, 6, 2)
    nh.eventually(function() return (queue(sb, "Ep") or {}).messages == 12 end, nil, "12 events waiting in Ep")
    no_consumers(sb)
    -- what a run stopped half way leaves: its marker, the new queues beside the old
    nh.rmq_api("PUT", vq(sb, "Ep.migrating-1-to-2"), { durable = true })
    local h = sb:spawn(sb:recorder{ types = { "A", "B" }, options = "partitions = 2", name = "Ep2.lua" },
      { wait = false })
    assert.equal(1, h:wait_exit(60))
    assert.truthy(h:log():find("nimbus-host partitions Ep 2", 1, true), h:log())
    local r = partitions(sb, "Ep", 4)
    assert.equal(1, r.code, r.out .. r.err)
    assert.truthy(r.err:find("finish it first (nimbus-host partitions Ep 2)", 1, true), r.err)

    r = partitions(sb, "Ep", 2)
    assert.equal(0, r.code, r.out .. r.err)
    -- 12 published; a CI run under load once moved 15 (the run kept no broker log, so where
    -- the 3 came from is not known; publishing is at-least-once). What must hold is checked
    -- below: each of the 12 events runs, once, in its session's order
    local moved = tonumber(r.out:match("^Ep: moved (%d+) message%(s%) from 1 partition%(s%) %(Ep%) to 2 "
      .. "%(Ep%.p0 %.%. Ep%.p1%)"))
    assert.truthy(moved and moved >= 12, r.out)
    assert.is_nil(queue(sb, "Ep"), "the old queue is left")
    assert.is_nil(queue(sb, "Ep.migrating-1-to-2"), "the marker is left")
    sb:spawn(sb:recorder{ types = { "A", "B" }, options = "partitions = 2", name = "Ep2b.lua" })
    completed(sb, 12)
    for s, tags in pairs(published) do assert.same(tags, sb:call_tags(s), "session " .. s) end
  end)

  it("a move that gets nowhere (an AMQP peer that never answers) stops after --stall-timeout, saying why; "
    .. "run again against the broker, it finishes", function()
    local two = sb:recorder{ types = { "A", "B" }, options = "partitions = 2" }
    assert.equal(0, sb:spawn(two):stop())
    no_consumers(sb)
    local published = publish_round(sb, 4, 2)
    nh.eventually(function()
      return ((queue(sb, "Ep.p0") or {}).messages or 0) + ((queue(sb, "Ep.p1") or {}).messages or 0) == 8
    end, nil, "8 events waiting in Ep.p0 and Ep.p1")
    -- the management API is the broker's, the AMQP port a listener that accepts and never
    -- answers: the steps before the move pass, the move itself gets nowhere
    local hole = black_hole(sb)
    local r = partitions(sb, "Ep", 4, (sb.transport_url:gsub(":%d+/", ":" .. hole.port .. "/", 1)),
      "--stall-timeout", "2")
    hole.stop()
    assert.equal(1, r.code, r.out .. r.err)
    assert.truthy(r.err:find("the broker did not open the AMQP connection in 2 s: check the broker", 1, true), r.err)
    assert.truthy(r.err:find("(0 message(s) moved so far; the rest stay where they were)", 1, true), r.err)
    assert.truthy(queue(sb, "Ep.migrating-2-to-4"), "the marker queue says a migration is to finish")

    r = partitions(sb, "Ep", 4)
    assert.equal(0, r.code, r.out .. r.err)
    assert.is_nil(queue(sb, "Ep.migrating-2-to-4"), "the marker is left")
    sb:spawn(sb:recorder{ types = { "A", "B" }, options = "partitions = 4", name = "Ep4.lua" })
    completed(sb, 8)
    for sess, tags in pairs(published) do assert.same(tags, sb:call_tags(sess), "session " .. sess) end
  end)

  it("publish --to an endpoint with partitions that this process does not run: its session's partition", function()
    local four = sb:recorder{ types = { "A" }, options = "partitions = 4" }
    assert.equal(0, sb:spawn(four):stop())
    local want = { 0, 0, 0, 0 }
    for s = 1, 6 do
      sb:publish("A", { tag = "t" .. s }, { session = "k" .. s, to = "Ep" })
      want[partition_of("k" .. s, 4) + 1] = want[partition_of("k" .. s, 4) + 1] + 1
    end
    depths_become(sb, 4, want)
    sb:spawn(four)
    completed(sb, 6)
    for s = 1, 6 do assert.same({ "t" .. s }, sb:call_tags("k" .. s)) end
  end)

  it("bad input: exit 2 for usage, 1 for what fails", function()
    for _, p in ipairs({ "3", "0", "512", "x", "4.0" }) do
      local r = partitions(sb, "Ep", p)
      assert.equal(2, r.code, p .. ": " .. r.err)
      assert.truthy(r.err:find("power of two", 1, true), r.err)
    end
    local r = sb:cli({ "partitions", "Ep", "4" }, { store = false })
    assert.equal(2, r.code, r.err)
    assert.truthy(r.err:find("--transport", 1, true), r.err)
    r = partitions(sb, "Ep", 4, sb.transport_url:gsub("%?.*$", "") .. "?management=none")
    assert.equal(2, r.code, r.err)
    assert.truthy(r.err:find("management API", 1, true), r.err)

    r = partitions(sb, "Ep", 4, nil, "--stall-timeout", "0")
    assert.equal(2, r.code, r.err)
    assert.truthy(r.err:find("--stall-timeout 0: give the seconds", 1, true), r.err)

    r = partitions(sb, "Nope", 4)
    assert.equal(1, r.code, r.err)
    assert.truthy(r.err:find("endpoint Nope has no queues on the broker yet", 1, true), r.err)
    r = partitions(sb, "Ep", 4, "amqp://guest:guest@127.0.0.1:1?management=http%3A%2F%2F127.0.0.1%3A1")
    assert.equal(1, r.code, r.err)
    assert.truthy(r.err:find("cannot reach the RabbitMQ management API", 1, true), r.err)
    r = partitions(sb, "Ep", 4, (sb.transport_url:gsub("//[^:]+:[^@]+@", "//guest:wrong@")))
    assert.equal(1, r.code, r.err)
    assert.truthy(r.err:find("refused user guest", 1, true), r.err)
  end)
end)

-- Session ownership on the broker at scale (docs/broker-partitions.md): three hosts on one
-- PostgreSQL store and a RabbitMQ broker of this test's own, one endpoint of 8 partitions,
-- 20,000 events over 500 sessions with failures, hand-offs and retries. Mid-stream one host is
-- killed with SIGKILL and another started; later the broker is stopped for a few seconds and
-- started again. Afterwards: every event Completed once the operator resubmitted the failures and
-- completed the hand-offs, per-session order kept across hosts (the order handlers started in),
-- no event run again after its outcome was recorded, and every partition owned by exactly one
-- live host, spread evenly. Runs as ctest functional_pgamqp_partitions_scale (fixture
-- "postgres"; NH_STORE_BACKEND=postgres gives the sandbox its database). NH_SCALE_EVENTS makes
-- it smaller for a quick run by hand.
local nh = require("nh")

if not os.getenv("NH_STORE_BACKEND") or os.getenv("NH_STORE_BACKEND") ~= "postgres" then
  error("partitions_scale_spec.lua needs NH_STORE_BACKEND=postgres and the test cluster (run it with "
    .. "`ctest -R functional_pgamqp_partitions_scale`, which starts it)")
end

local scale = require("scale")
local N_EVENTS, N_SESSIONS = scale.N_EVENTS, scale.N_SESSIONS
local PARTITIONS = 8

-- Per partition the connection RabbitMQ made active, and per connection on how many.
local function owners(b)
  local r = nh.rmq_api("GET", "/consumers/%2F", nil, { mgmt = b.mgmt })
  local owner, active = {}, {}
  for _, c in ipairs(nh.decode(r.body)) do
    local i = tonumber(c.queue.name:match("^Ep%.p(%d+)$"))
    local conn = type(c.channel_details) == "table" and c.channel_details.connection_name
    if i and conn then
      active[conn] = (active[conn] or 0) + (c.active and 1 or 0)
      if c.active then owner[i] = (owner[i] and owner[i] .. " AND " or "") .. conn end
    end
  end
  return owner, active
end

local function spread_evenly(b, hosts)
  local owner, active = owners(b)
  for i = 0, PARTITIONS - 1 do
    if not owner[i] or owner[i]:find(" AND ", 1, true) then return false end
  end
  local n = 0
  for _, k in pairs(active) do
    n = n + 1
    if k < PARTITIONS // hosts or k > -(-PARTITIONS // hosts) then return false end
  end
  return n == hosts
end

local function describe_owners(b, hosts)
  local owner, active = owners(b)
  local s = {}
  for i = 0, PARTITIONS - 1 do s[#s + 1] = ("p%d: %s"):format(i, owner[i] or "none") end
  for conn, n in pairs(active) do s[#s + 1] = ("%s active on %d"):format(conn, n) end
  local out = table.concat(s, "; ")
  for tag, h in pairs(hosts) do out = out .. ("\n--- %s:\n%s"):format(tag, h:log():sub(-2500)) end
  return out
end

local occurrences = nh.occurrences

describe("partitions at scale on a PostgreSQL store", function()
  local sb, b

  before_each(function() sb = nh.sandbox() end)
  after_each(function()
    if b then pcall(b.run, "stop") end
    sb:cleanup()
  end)

  it(("three hosts, 8 partitions, %d events over %d sessions with failures, hand-offs and retries; a kill -9, "
    .. "a new host, the broker stopped and started: nothing lost, every session in order"):format(N_EVENTS,
    N_SESSIONS), function()
    b = nh.private_broker(sb:path("rabbitmq"), "nhscale")   -- stopped mid-stream: not the suite's
    b.run("start")
    local calls = sb:path("calls.log")
    local ep = sb:adapter("Ep.lua", scale.endpoint_adapter(calls, "partitions = " .. PARTITIONS))
    local seeder = sb:adapter("Seed.lua", scale.seeder_adapter())
    local hosts = {}
    local function start(tag)
      hosts[tag] = sb:spawn(ep, { transport = b.url, env = { NH_HOST_TAG = tag } })
      return hosts[tag]
    end
    start("h1")
    start("h2")
    start("h3")
    nh.eventually(function() return spread_evenly(b, 3) end, 90, function() return describe_owners(b, hosts) end)
    sb:spawn(seeder, { transport = b.url })
    local seeds = scale.seeder(sb, b.url)

    -- a quarter in, kill -9 of a host mid-stream, and a new one
    seeds.seed(math.ceil(seeds.n / 2))
    scale.settled(sb, N_EVENTS // 4, "a quarter of the events Completed")
    assert.equal(137, hosts.h1:kill())
    start("h4")

    -- half in, the broker goes away for a few seconds
    scale.settled(sb, math.min(N_EVENTS // 2, seeds.done * scale.PER_SEED // 2), "half of the events Completed")
    local reconnecting = occurrences(hosts.h2:log(), "reconnecting in")
    local connected = occurrences(hosts.h2:log(), "AMQP connected")
    b.run("stop")
    nh.eventually(function() return occurrences(hosts.h2:log(), "reconnecting in") > reconnecting end, 60,
      function() return "h2 never noticed the broker went:\n" .. hosts.h2:log():sub(-2000) end)
    b.run("start")
    nh.eventually(function() return occurrences(hosts.h2:log(), "AMQP connected") > connected end, 90,
      function() return "h2 never connected again:\n" .. hosts.h2:log():sub(-2000) end)
    seeds.seed(seeds.n)

    scale.operate(sb)
    local extra = scale.check(sb, calls)

    -- the live hosts share the partitions, one each at a time
    local live = { h2 = hosts.h2, h3 = hosts.h3, h4 = hosts.h4 }
    for tag, h in pairs(live) do assert.is_true(h:alive(), tag .. " died:\n" .. h:log():sub(-2000)) end
    nh.eventually(function() return spread_evenly(b, 3) end, 90, function() return describe_owners(b, live) end)
    print(("# %d events, %d of the plain ones ran more than once (outcome not committed)"):format(N_EVENTS, extra))
  end)
end)

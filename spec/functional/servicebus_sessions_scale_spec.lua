-- Service Bus sessions at scale (docs/servicebus-amqp.md, "Sessions") against a FAKE Service Bus
-- peer (host/tests/fake_servicebus.c with --sessions): the shape of partitions_scale_spec.lua.
-- Three hosts on one PostgreSQL store consume one session-enabled subscription, 16 session
-- receivers each; N events over 500 sessions with failures, hand-offs and retries. Mid-stream
-- one host is killed with SIGKILL and another started; later one host is frozen (SIGSTOP) past
-- its session locks, so the fake takes its sessions back while its handlers run, and thawed;
-- then the fake drops every connection (SIGUSR1: the broker going away, its state kept).
-- Afterwards: every event Completed once the operator resubmitted the failures and completed
-- the hand-offs, per-session order kept across hosts, no event run again after its outcome was
-- recorded, and the fake never granted a session to two receivers at once. Runs as ctest
-- functional_pgservicebus_sessions_scale (fixture "postgres"). NH_SCALE_EVENTS makes it smaller.
local nh = require("nh")
local sbfake = require("sbfake")
local scale = require("scale")
sbfake.require_fake("servicebus_sessions_scale_spec.lua")
if os.getenv("NH_STORE_BACKEND") ~= "postgres" then
  error("servicebus_sessions_scale_spec.lua needs NH_STORE_BACKEND=postgres and the test cluster (run it with "
    .. "`ctest -R functional_pgservicebus_sessions_scale`, which starts it)")
end

local N_EVENTS, N_SESSIONS = scale.N_EVENTS, scale.N_SESSIONS

-- Per session, the fake's grants and their ends must alternate: a session is held by one
-- receiver at a time. Returns a complaint, or nil.
local function double_grants(fake)
  local holder = {}
  for _, e in ipairs(fake:events()) do
    if e.ev == "session-accept" then
      if holder[e.session] then
        return ("session %s granted to %s:%s while %s held it"):format(e.session, e.conn, e.link, holder[e.session])
      end
      holder[e.session] = e.conn .. ":" .. e.link
    elseif (e.ev == "session-release" or e.ev == "session-lock-lost") and e.session then
      holder[e.session] = nil
    end
  end
end

describe("Service Bus sessions at scale on a PostgreSQL store (fake Service Bus peer)", function()
  local sb
  before_each(function() sb = nh.sandbox() end)
  after_each(function() sbfake.teardown(sb) end)

  it(("three hosts, 16 session receivers each, %d events over %d sessions with failures, hand-offs and retries; "
    .. "a kill -9, a new host, a host frozen past its locks, the connections dropped: nothing lost, every session in "
    .. "order (fake Service Bus peer)"):format(N_EVENTS, N_SESSIONS), function()
    local fake = sbfake.start(sb, { subs = { Ep = { "Ev" }, Seed = { "Seed" } }, sessions = { "Ep" },
      lock_ms = 3000, session_wait_ms = 500 })
    local calls = sb:path("calls.log")
    local ep = sb:adapter("Ep.lua", scale.endpoint_adapter(calls, "sessions = 16"))
    local seeder = sb:adapter("Seed.lua", scale.seeder_adapter())
    local hosts = {}
    local function start(tag)
      hosts[tag] = sb:spawn(ep, { transport = fake:url(), env = { NH_HOST_TAG = tag } })
      return hosts[tag]
    end
    start("h1")
    start("h2")
    start("h3")
    sb:spawn(seeder, { transport = fake:url() })
    local seeds = scale.seeder(sb, fake:url())

    -- a quarter in, kill -9 of a host mid-stream, and a new one
    seeds.seed(math.ceil(seeds.n / 2))
    scale.settled(sb, N_EVENTS // 4, "a quarter of the events Completed")
    assert.equal(137, hosts.h1:kill())
    start("h4")

    -- a third in, h2 frozen until the fake took back a session it held, then thawed
    scale.settled(sb, math.min(N_EVENTS // 3, seeds.done * scale.PER_SEED // 3), "a third of the events Completed")
    local lost = #fake:events("session-lock-lost")
    hosts.h2:signal("STOP")
    nh.eventually(function() return #fake:events("session-lock-lost") > lost end, 60,
      function() return "the fake never took a session back from the frozen h2\n" .. fake:dump():sub(-3000) end)
    hosts.h2:signal("CONT")

    -- half in, every connection dropped (the hosts reconnect)
    scale.settled(sb, math.min(N_EVENTS // 2, seeds.done * scale.PER_SEED // 2), "half of the events Completed")
    local connected = nh.occurrences(hosts.h3:log(), "AMQP connected")
    fake:signal("USR1")
    nh.eventually(function() return nh.occurrences(hosts.h3:log(), "AMQP connected") > connected end, 90,
      function() return "h3 never connected again:\n" .. hosts.h3:log():sub(-2000) end)
    seeds.seed(seeds.n)

    scale.operate(sb)
    local extra = scale.check(sb, calls)
    assert.is_nil(double_grants(fake))
    for _, tag in ipairs({ "h2", "h3", "h4" }) do
      assert.is_true(hosts[tag]:alive(), tag .. " died:\n" .. hosts[tag]:log():sub(-2000))
    end
    print(("# %d events, %d of the plain ones ran more than once (outcome not committed)"):format(N_EVENTS, extra))
  end)
end)

-- An endpoint's RabbitMQ partitions (docs/broker-partitions.md): how long after kill -9 of
-- the host active on them the standby host handles their events, and how three hosts sharing
-- 8 partitions compare with one host on one queue.
--
--   nimbus-host -l spec/bench/partitions.lua path/to/nimbus-host path/to/nh-amqp-bench
--
-- Environment: BENCH_PARTITIONS (8), BENCH_ROUNDS (5), BENCH_KEEP=1 (keep the temp dir and
-- vhosts), NH_RMQ_PORT (5672), NH_RMQ_MGMT_PORT (15672); for the scale-out part
-- BENCH_SCALE_N (12000 events), BENCH_SCALE_SESSIONS (500), BENCH_IO_MS (5: what each handler
-- waits, with nimbus.sleep, standing in for a call to another system), BENCH_SCALE_ROUNDS (2).
-- The broker is scripts/rabbitmq.sh's, started if it is not running and then stopped again.
--
-- Failover:
-- Each round, in a fresh vhost and store (sqlite, shared by the two hosts):
--   1. host A with an endpoint of P partitions, alone, so RabbitMQ makes it the active
--      consumer of every partition; an event whose handler holds A's loop (it never returns),
--      so A cannot hand partitions on to B (docs/broker-partitions.md, "Spreading");
--   2. host B, standby on every partition; then one event per partition (sessions picked by
--      the same hash the host routes on): they go to A, which cannot take them;
--   3. kill -9 of A; the clock starts;
--   4. the time until B's handler has run each of the P events: the first and the last.
-- Reported: the median over the rounds of the first and of the last, and the slowest round.
--
-- Scale-out, alternating, BENCH_SCALE_ROUNDS times each, in a fresh vhost and store (sqlite,
-- shared by the hosts): one host with `partitions = 1`, and three hosts with `partitions = 8`
-- once they have spread the partitions (each active on 2 or 3). nh-amqp-bench sends
-- BENCH_SCALE_N events over BENCH_SCALE_SESSIONS sessions (routing keys with the session's
-- bucket); timed from the first send to the last event Completed in the store.
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")

local HOST = B.host_binary("partitions.lua")
local TOOL = arg[2]
if not TOOL or not os.execute("test -x " .. B.sh_quote(TOOL)) then
  io.stderr:write("usage: nimbus-host -l spec/bench/partitions.lua NIMBUS_HOST_BINARY NH_AMQP_BENCH_BINARY\n")
  os.exit(2)
end
local SCALE_N = B.env_int("BENCH_SCALE_N", 12000)
local SCALE_SESSIONS = B.env_int("BENCH_SCALE_SESSIONS", 500)
local IO_MS = B.env_int("BENCH_IO_MS", 5)
local SCALE_ROUNDS = B.env_int("BENCH_SCALE_ROUNDS", 2)
local P = B.env_int("BENCH_PARTITIONS", 8)
local ROUNDS = B.env_int("BENCH_ROUNDS", 5)
local KEEP = os.getenv("BENCH_KEEP") == "1"
local AMQP_PORT = B.env_int("NH_RMQ_PORT", 5672)
local MGMT_PORT = B.env_int("NH_RMQ_MGMT_PORT", 15672)
local RABBITMQ_SH = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/../../scripts/rabbitmq.sh"
local MGMT = ("http://127.0.0.1:%d"):format(MGMT_PORT)

local TMP = B.tmpdir("nimbus-partitions-bench")
local hosts = B.hosts(TMP)
local vhosts, broker_started = {}, false

local function api(method, path, body)
  local cmd = ("curl -sS --max-time 30 -u guest:guest -o /dev/null -w '%%{http_code}' -X %s -H 'content-type: "
               .. "application/json' %s%s"):format(method, B.sh_quote(MGMT .. "/api" .. path),
               body and (" -d " .. B.sh_quote(cjson.encode(body))) or "")
  local out = B.sh(cmd .. " 2>&1")
  local code = tonumber(out:match("(%d%d%d)%s*$"))
  if not code or code >= 300 then B.die(("management API %s %s: %s"):format(method, path, out)) end
end

local function api_get(path)
  local out, rc = B.sh(("curl -sS --max-time 30 -u guest:guest %s 2>&1"):format(B.sh_quote(MGMT .. "/api" .. path)))
  local ok, v = pcall(cjson.decode, out)
  if rc ~= 0 or not ok then B.die(("management API GET %s: %s"):format(path, out)) end
  return v
end

-- A fresh vhost (deleted at the end) and directory; the transport URL for it.
local function fresh(tag)
  local dir = TMP .. "/" .. tag
  os.execute("mkdir -p " .. B.sh_quote(dir))
  local vhost = ("nimbus-partitions-%d-%d"):format(os.time(), math.random(100000, 999999))
  api("PUT", "/vhosts/" .. vhost)
  vhosts[#vhosts + 1] = vhost
  api("PUT", "/permissions/" .. vhost .. "/guest", { configure = ".*", write = ".*", read = ".*" })
  return dir, vhost, ("amqp://guest:guest@127.0.0.1:%d/%s?management=%s"):format(AMQP_PORT, vhost, MGMT)
end

-- FNV-1a of the session id, low bits: the partition the host routes it to (nh_amqp_msg.c).
local function partition_of(session)
  local h = 2166136261
  for i = 1, #session do h = ((h ~ session:byte(i)) * 16777619) & 0xffffffff end
  return (h & 0xff) & (P - 1)
end

-- One session per partition.
local function probe_sessions()
  local out, n = {}, 0
  for i = 1, 100000 do
    local s = "probe-" .. i
    local p = partition_of(s)
    if not out[p + 1] then out[p + 1], n = s, n + 1 end
    if n == P then return out end
  end
  B.die("no session for some partition")
end

local ADAPTER = [[
local nimbus = require("nimbus")
local CALLS = %q
-- the Hold handler never yields: a CPU budget and a deadline far beyond the round
local ep = nimbus.endpoint("Fail", { partitions = %d, lock = { duration = 5 }, timeout = 3600, cpu_budget = 3600 })
ep:on("Hold", function()
  local f = assert(io.open(CALLS, "a")); f:write("hold\n"); f:close()
  while true do end   -- holds the loop of the active host until it is killed
end)
ep:on("Probe", function(_, ctx)
  local f = assert(io.open(CALLS, "a"))
  f:write(("%%s %%.6f\n"):format(ctx.session_id, require("system").gettime()))
  f:close()
end)
]]

local function round(r, sessions)
  local dir, _, url = fresh("r" .. r)
  local calls = dir .. "/calls.log"
  B.write_file(dir .. "/fail.lua", ADAPTER:format(calls, P))
  local function start(name)
    local h = hosts:spawn(("%s-%d"):format(name, r), ("%s %s --store %s --transport %s --admin off --no-reload")
      :format(B.sh_quote(HOST), B.sh_quote(dir .. "/fail.lua"), B.sh_quote(dir .. "/store.db"), B.sh_quote(url)))
    hosts:wait_ready(h, 30)
    return h
  end
  local a = start("active")
  local function publish(etype, session)
    local out, code = B.sh(("%s publish %s '{}' --session %s --store %s --transport %s 2>&1"):format(B.sh_quote(HOST),
      etype, B.sh_quote(session), B.sh_quote(dir .. "/store.db"), B.sh_quote(url)))
    if code ~= 0 then B.die("publish failed: " .. out) end
  end
  publish("Hold", "hold")
  local t0 = system.monotime()
  while not (B.read_file(calls) or ""):find("hold\n", 1, true) do
    if system.monotime() - t0 > 30 then B.die("the active host never ran Hold:\n" .. hosts:log_tail(a)) end
    system.sleep(0.005)
  end
  local b = start("standby")
  for _, s in ipairs(sessions) do publish("Probe", s) end
  system.sleep(0.2)   -- the probes reach the active host's link (it cannot take them)
  local t_kill = system.gettime()
  os.execute("kill -KILL " .. a.pid)
  local got = {}
  local deadline = system.monotime() + 60
  while true do
    got = {}
    for s, t in (B.read_file(calls) or ""):gmatch("(probe%-%d+) ([%d%.]+)\n") do got[s] = tonumber(t) end
    local n = 0
    for _ in pairs(got) do n = n + 1 end
    if n == P then break end
    if system.monotime() > deadline then
      B.die(("round %d: %d of %d probes handled 60 s after the kill:\n%s"):format(r, n, P, hosts:log_tail(b)))
    end
    system.sleep(0.002)
  end
  local first, last = math.huge, 0
  for _, t in pairs(got) do
    first = math.min(first, t - t_kill)
    last = math.max(last, t - t_kill)
  end
  hosts:check_stop(b)
  hosts:stop(a, 1)
  return first, last
end

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

---------------------------------------------------------------------------- scale-out

local SCALE_ADAPTER = [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Scale", { partitions = %d })
ep:on("BenchEvent", function() nimbus.sleep(%d / 1000) end)
]]

-- Each host's count of partitions it is active on, once every partition has one (else nil).
local function spread(vhost, parts)
  local active, owned = {}, 0
  for _, c in ipairs(api_get("/consumers/" .. vhost)) do
    local conn = type(c.channel_details) == "table" and c.channel_details.connection_name
    if conn and c.queue.name:match("^Scale%.p%d+$") then
      active[conn] = (active[conn] or 0) + (c.active and 1 or 0)
      if c.active then owned = owned + 1 end
    end
  end
  if owned ~= parts then return nil end
  local counts = {}
  for _, n in pairs(active) do counts[#counts + 1] = n end
  return counts
end

local function completed(store)
  local out = B.sh(("sqlite3 %s \"SELECT count(*) FROM audit WHERE status = 'Completed'\" 2>/dev/null")
    :format(B.sh_quote(store)))
  return tonumber(out:match("%d+")) or 0
end

local function scale_round(tag, nhosts, parts)
  local dir, vhost, url = fresh(tag)
  local store = dir .. "/store.db"
  B.write_file(dir .. "/scale.lua", SCALE_ADAPTER:format(parts, IO_MS))
  local list = {}
  for i = 1, nhosts do
    local h = hosts:spawn(("%s-h%d"):format(tag, i), ("%s %s --store %s --transport %s --admin off --no-reload")
      :format(B.sh_quote(HOST), B.sh_quote(dir .. "/scale.lua"), B.sh_quote(store), B.sh_quote(url)))
    hosts:wait_ready(h, 30)
    list[i] = h
  end
  local t0 = system.monotime()
  while parts > 1 do   -- every host active on its share before the clock starts
    local counts = spread(vhost, parts)
    local even = counts and #counts == nhosts
    for _, n in ipairs(counts or {}) do even = even and n >= parts // nhosts and n <= -(-parts // nhosts) end
    if even then break end
    if system.monotime() - t0 > 120 then B.die(tag .. ": the partitions did not spread within 120 s") end
    system.sleep(0.2)
  end
  local spread_s = system.monotime() - t0
  t0 = system.monotime()
  local out, rc = B.sh(("NH_BENCH_BUCKETS=1 %s send %s %s %d %d 2>&1"):format(B.sh_quote(TOOL),
    B.sh_quote(url:gsub("%?.*$", "")), B.sh_quote("/exchange/nimbus.events/BenchEvent"), SCALE_N, SCALE_SESSIONS))
  if rc ~= 0 then B.die(tag .. ": nh-amqp-bench send failed: " .. out) end
  local deadline = t0 + 600
  while completed(store) < SCALE_N do
    for _, h in ipairs(list) do if not B.alive(h.pid) then hosts:died(h) end end
    if system.monotime() > deadline then B.die(("%s: %d of %d Completed after 600 s"):format(tag, completed(store),
      SCALE_N)) end
    system.sleep(0.1)
  end
  local secs = system.monotime() - t0
  for _, h in ipairs(list) do hosts:check_stop(h) end
  return SCALE_N / secs, spread_s
end

local function main()
  local _, st = B.sh(B.sh_quote(RABBITMQ_SH) .. " status >/dev/null 2>&1")
  if st ~= 0 then
    local out, rc = B.sh(B.sh_quote(RABBITMQ_SH) .. " start 2>&1")
    io.write(out)
    if rc ~= 0 then B.die("cannot start RabbitMQ (scripts/rabbitmq.sh start)") end
    broker_started = true
  end
  local sessions = probe_sessions()
  print(("partition failover: an endpoint of %d partitions, two hosts, kill -9 of the active one, %d rounds")
    :format(P, ROUNDS))
  local firsts, lasts, worst = {}, {}, 0
  for r = 1, ROUNDS do
    local first, last = round(r, sessions)
    print(("  round %d: first partition's event handled %.0f ms after the kill, last %.0f ms"):format(r, first * 1000,
      last * 1000))
    firsts[#firsts + 1], lasts[#lasts + 1] = first, last
    worst = math.max(worst, last)
  end
  local mf, ml = median(firsts), median(lasts)
  print(("  median: first %.0f ms, all %d partitions %.0f ms; slowest round %.0f ms"):format(mf * 1000, P, ml * 1000,
    worst * 1000))
  print(("RESULT partition_failover_first_ms=%.0f partition_failover_all_ms=%.0f partition_failover_worst_ms=%.0f")
    :format(mf * 1000, ml * 1000, worst * 1000))

  print(("scale-out: %d events over %d sessions, each handler waiting %d ms; one host on one queue vs three hosts "
    .. "on 8 partitions, %d rounds each"):format(SCALE_N, SCALE_SESSIONS, IO_MS, SCALE_ROUNDS))
  local one, three, spreads = {}, {}, {}
  for r = 1, SCALE_ROUNDS do
    one[r] = scale_round("one" .. r, 1, 1)
    three[r], spreads[r] = scale_round("three" .. r, 3, 8)
    print(("  round %d: one host %.0f events/s, three hosts %.0f events/s (spread in %.1f s)"):format(r, one[r],
      three[r], spreads[r]))
  end
  local m1, m3 = median(one), median(three)
  print(("  median: one host %.0f events/s, three hosts %.0f events/s, %.2fx"):format(m1, m3, m3 / m1))
  print(("RESULT scale_one_eps=%.0f scale_three_eps=%.0f scale_ratio=%.2f"):format(m1, m3, m3 / m1))
  return 0
end

local function cleanup()
  hosts:cleanup(KEEP)
  if not KEEP then
    for _, v in ipairs(vhosts) do pcall(api, "DELETE", "/vhosts/" .. v) end
  end
  if broker_started then B.sh(B.sh_quote(RABBITMQ_SH) .. " stop >/dev/null 2>&1") end
end

B.run(main, cleanup)

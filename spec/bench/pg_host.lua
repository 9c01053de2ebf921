-- make bench: hosts end to end on a PostgreSQL store against one on sqlite (docs/store-backends.md).
--   nimbus-host -l spec/bench/pg_host.lua BUILD_DIR
-- Starts the project's PostgreSQL cluster (scripts/postgres.sh, under BUILD_DIR/postgres).
-- 1. One host, producer and consumer of the bench adapter (spec/bench/bench_adapter.lua, the
--    end-to-end run of throughput.lua), on a fresh sqlite file and on a fresh database,
--    alternating, BENCH_PG_ROUNDS times (3): events/s, CPU per 1,000 events, p99 latency, and
--    on PostgreSQL the events per pump transaction (the host's own count at stop).
-- 2. Consume only, on PostgreSQL: N events pre-loaded, then drained by one host and by three
--    hosts at once (on a 2-core machine this shows the overhead, not the scaling).
-- 3. With a broker (RabbitMQ, scripts/rabbitmq.sh, started if it is not running): N events
--    pre-loaded on the broker (nh-amqp-bench send), drained by one host beside a sqlite store and
--    beside a PostgreSQL one (audit, outbox and delivery counts there), alternating: events/s from
--    `ready:`, the host's CPU per 1,000 events.
-- BENCH_PG_HOST_N events (default 20000) over BENCH_SESSIONS (1000) sessions; BENCH_PG_CONSUME=0
-- runs part 1 only; BENCH_PG_AMQP=0 leaves part 3 out.
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local cjson = require("cjson")
local system = require("system")
local build = assert(arg[1], "usage: pg_host.lua BUILD_DIR")
local HOST = build .. "/host/nimbus-host"
local N = B.env_int("BENCH_PG_HOST_N", 20000)
local SESSIONS = B.env_int("BENCH_SESSIONS", 1000)
local CONC = B.env_int("BENCH_CONCURRENCY", 256)
local ROUNDS = B.env_int("BENCH_PG_ROUNDS", 3)
local ADAPTER = B.dir .. "/bench_adapter.lua"
local q = B.sh_quote

local root = B.dir .. "/../.."
local pgsh = "NH_PG_DIR=" .. q(build .. "/postgres") .. " " .. q(root .. "/scripts/postgres.sh")
local TMP = B.tmpdir("pg-host")
local hosts = B.hosts(TMP)
local dbs = {}

local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c[(#c + 1) // 2]
end

local function fresh_db(name)
  B.sh(pgsh .. " dropdb " .. name .. " >/dev/null 2>&1")
  local out, rc = B.sh(pgsh .. " createdb " .. name .. " 2>&1")
  if rc ~= 0 then B.die("scripts/postgres.sh createdb failed: " .. out) end
  dbs[#dbs + 1] = name
  return (out:match("(postgres%S+)"))
end

local function psql_value(url, sql)
  local out, rc = B.sh(("psql -X -A -t -q %s -c %s 2>&1"):format(q(url), q(sql)))
  if rc ~= 0 then B.die("psql: " .. out) end
  return (out:gsub("%s+$", ""))
end

local function start_host(name, mode, store)
  local result = TMP .. "/" .. name .. ".json"
  local env = ("BENCH_MODE=%s BENCH_RESULT=%s BENCH_N=%d BENCH_SESSIONS=%d BENCH_CHUNK=%d BENCH_CONCURRENCY=%d "
               .. "BENCH_WINDOW=%d NIMBUS_ADMIN=off"):format(mode, q(result), N, SESSIONS, CONC, CONC, 2 * CONC)
  local h = hosts:spawn(name, ("%s %s %s --store %s --no-reload"):format(env, q(HOST), q(ADAPTER), q(store)))
  h.result = result
  hosts:wait_ready(h, 30)
  return h
end

local function wait_result(h, budget)
  local t0 = system.monotime()
  while true do
    local s = B.read_file(h.result)
    if s then
      h.cpu_done = B.proc_cpu(h.pid)
      return cjson.decode(s)
    end
    if not B.alive(h.pid) then hosts:died(h) end
    if system.monotime() - t0 > budget then B.die(h.name .. ": not finished:\n" .. hosts:log_tail(h)) end
    system.sleep(0.02)
  end
end

-- "N messages fetched in M transactions" from a stopped host's log
local function per_transaction(h)
  local n, t = hosts:log(h):match("(%d+) messages fetched in (%d+) transactions")
  return n and tonumber(n) / math.max(1, tonumber(t)) or 0
end

-- CPU seconds of the cluster's processes now (the server's side of a run: its backends,
-- WAL writer, checkpointer; a backend that exits takes its share with it, so read it while
-- the host's connections are open)
local function server_cpu()
  local main = (B.read_file(build .. "/postgres/data/postmaster.pid") or ""):match("^(%d+)")
  if not main then return 0 end
  local sum = B.proc_cpu(main) or 0
  for pid in B.sh("pgrep -P " .. main .. " 2>/dev/null"):gmatch("%d+") do sum = sum + (B.proc_cpu(pid) or 0) end
  return sum
end

local function e2e(name, store, pg)
  local h = start_host(name, "e2e", store)
  local cpu0 = B.proc_cpu(h.pid)
  local scpu0 = pg and server_cpu()
  B.publish(HOST, store, "BenchStart", "{}", "bench-producer")
  local r = wait_result(h, 300)
  local scpu = pg and (server_cpu() - scpu0) * 1e6 / r.count or 0
  hosts:check_stop(h)
  return { rate = r.count / (r.t_last - r.t_first_publish), cpu = (h.cpu_done - cpu0) * 1e6 / r.count,
           server_cpu = scpu, p99 = r.p99_ms, per_tx = per_transaction(h) }
end

-- N events pre-loaded into a fresh database, then drained by `n` consumer hosts at once;
-- timed from the consumers' start to the last Completed audit row (polled with psql).
local function consume(n, round)
  local url = fresh_db(("nh_bench_consume_%d_%d"):format(n, round))
  hosts:check_stop(start_host(("subscribe-%d-%d"):format(n, round), "subscribe", url))
  local p = start_host(("preload-%d-%d"):format(n, round), "preload", url)
  B.publish(HOST, url, "BenchStart", "{}", "bench-producer")
  wait_result(p, 300)
  hosts:check_stop(p)
  local cs = {}
  local t0 = system.gettime()
  for i = 1, n do cs[i] = start_host(("consume-%d-%d-%d"):format(n, round, i), "consume", url) end
  while tonumber(psql_value(url, "SELECT count(*) FROM audit WHERE status = 'Completed'")) < N do
    if system.gettime() - t0 > 300 then B.die("consume: not finished in 300 s") end
    system.sleep(0.1)
  end
  local span = system.gettime() - t0
  for _, c in ipairs(cs) do hosts:stop(c, 30) end
  return N / span
end

-- ---------------------------------------------------------------- 3. with a broker

local RMQ = q(root .. "/scripts/rabbitmq.sh")
local AMQP_SEND = build .. "/bench/nh-amqp-bench"
local broker_started, vhosts = false, {}

local function mgmt(method, path, body)
  local out, rc = B.sh(("curl -sf -u guest:guest -X %s %s http://127.0.0.1:15672/api%s 2>&1"):format(method,
    body and ("-H 'content-type: application/json' -d " .. q(body)) or "", path))
  if rc ~= 0 then B.die(("RabbitMQ's management API, %s %s: %s"):format(method, path, out)) end
end

local function completed_in(store, pg)
  local sql = "SELECT count(*) FROM audit WHERE status = 'Completed'"
  if pg then return tonumber(psql_value(store, sql)) end
  return tonumber((B.sh(("sqlite3 %s %s 2>/dev/null"):format(q(store), q(sql))))) or 0
end

-- N events on the broker, drained by one host beside `which` store; events/s and CPU per 1,000.
local function broker_drain(which, round)
  local vhost = ("nh-bench-pgamqp-%d-%s"):format(round, which)
  mgmt("PUT", "/vhosts/" .. vhost)
  vhosts[#vhosts + 1] = vhost
  mgmt("PUT", "/permissions/" .. vhost .. "/guest", '{"configure":".*","write":".*","read":".*"}')
  local url = "amqp://guest:guest@127.0.0.1:5672/" .. vhost
  local pg = which == "pg"
  local store = pg and fresh_db("nh_bench_amqp_" .. round) or ("%s/amqp-%d.db"):format(TMP, round)
  local adapter = TMP .. "/amqp_adapter.lua"
  B.write_file(adapter, ('local ep = require("nimbus").endpoint("BenchEp", { concurrency = %d })\n'
                         .. 'ep:on("BenchEvent", function() end)\n'):format(CONC))
  local cmd = ("NIMBUS_ADMIN=off %s %s --store %s --transport %s --no-reload"):format(q(HOST), q(adapter), q(store), q(url))
  local d = hosts:spawn(("amqp-declare-%s-%d"):format(which, round), cmd)   -- its queue and binding
  hosts:wait_ready(d, 30)
  hosts:check_stop(d)
  local out, rc = B.sh(("%s send %s /exchange/nimbus.events/BenchEvent %d %d 64 2>&1"):format(q(AMQP_SEND), q(url), N,
                                                                                           SESSIONS))
  if rc ~= 0 then B.die("nh-amqp-bench send: " .. out) end
  local h = hosts:spawn(("amqp-%s-%d"):format(which, round), cmd)
  hosts:wait_ready(h, 30)
  local t0, cpu0 = system.gettime(), B.proc_cpu(h.pid)
  while completed_in(store, pg) < N do
    if not B.alive(h.pid) then hosts:died(h) end
    if system.gettime() - t0 > 300 then B.die(h.name .. ": not drained in 300 s:\n" .. hosts:log_tail(h)) end
    system.sleep(0.05)
  end
  local span, cpu = system.gettime() - t0, (B.proc_cpu(h.pid) - cpu0) * 1e6 / N
  hosts:check_stop(h)
  return N / span, cpu
end

local function with_broker()
  if select(2, B.sh(RMQ .. " status >/dev/null 2>&1")) ~= 0 then
    local out, rc = B.sh(RMQ .. " start 2>&1")
    if rc ~= 0 then B.die("scripts/rabbitmq.sh start failed: " .. out) end
    broker_started = true
  end
  local got = { sqlite = { rate = {}, cpu = {} }, pg = { rate = {}, cpu = {} } }
  for round = 1, ROUNDS do
    for _, which in ipairs({ "sqlite", "pg" }) do
      got[which].rate[round], got[which].cpu[round] = broker_drain(which, round)
    end
  end
  print(("with RabbitMQ (%d pre-loaded, drained by one host): sqlite store %.0f events/s (%.1f ms CPU per 1,000), "
         .. "PostgreSQL store %.0f events/s (%.1f ms CPU per 1,000), %.2fx")
        :format(N, median(got.sqlite.rate), median(got.sqlite.cpu), median(got.pg.rate), median(got.pg.cpu),
                median(got.pg.rate) / median(got.sqlite.rate)))
  return median(got.pg.rate), median(got.sqlite.rate)
end

local function main()
  local out, code = B.sh(pgsh .. " start 2>&1")
  if code ~= 0 then B.die("scripts/postgres.sh start failed: " .. out) end
  print(("hosts end to end, sqlite and PostgreSQL stores: %d events over %d sessions, medians of %d alternating runs")
        :format(N, SESSIONS, ROUNDS))
  local got = { sqlite = { rate = {}, cpu = {}, server_cpu = {}, p99 = {}, per_tx = {} },
                pg = { rate = {}, cpu = {}, server_cpu = {}, p99 = {}, per_tx = {} } }
  for round = 1, ROUNDS do
    for _, which in ipairs({ "sqlite", "pg" }) do
      local store = which == "sqlite" and ("%s/e2e-%d.db"):format(TMP, round) or fresh_db("nh_bench_e2e_" .. round)
      local r = e2e(which .. "-" .. round, store, which == "pg")
      for k, v in pairs(r) do got[which][k][round] = v end
    end
  end
  for _, which in ipairs({ "sqlite", "pg" }) do
    local g = got[which]
    print(("  %-10s %7.0f events/s  %5.1f ms CPU per 1,000 (host)  p99 %4.0f ms  %6.1f events per transaction")
          :format(which == "pg" and "postgresql" or which, median(g.rate), median(g.cpu), median(g.p99), median(g.per_tx)))
  end
  local ratio = median(got.pg.rate) / median(got.sqlite.rate)
  print(("  ratio      %.2fx sqlite's rate on PostgreSQL (target 0.5x); PostgreSQL's own CPU %.1f ms per 1,000 events")
        :format(ratio, median(got.pg.server_cpu)))
  if os.getenv("BENCH_PG_CONSUME") == "0" then return 0 end   -- part 1 only (profiling the server)
  local one, three = {}, {}
  for round = 1, ROUNDS do
    one[round] = consume(1, round)
    three[round] = consume(3, round)
  end
  print(("consume only on PostgreSQL (%d pre-loaded): one host %.0f events/s, three hosts %.0f events/s (%.2fx)")
        :format(N, median(one), median(three), median(three) / median(one)))
  local amqp_pg, amqp_sqlite = 0, 0
  if os.getenv("BENCH_PG_AMQP") ~= "0" then amqp_pg, amqp_sqlite = with_broker() end
  print(("RESULT pg_e2e_events_per_s=%.0f sqlite_e2e_events_per_s=%.0f pg_ratio=%.2f pg_p99_ms=%.0f "
         .. "pg_events_per_tx=%.1f pg_consume_1=%.0f pg_consume_3=%.0f pg_amqp_events_per_s=%.0f "
         .. "sqlite_amqp_events_per_s=%.0f")
        :format(median(got.pg.rate), median(got.sqlite.rate), ratio, median(got.pg.p99), median(got.pg.per_tx),
                median(one), median(three), amqp_pg, amqp_sqlite))
  return 0
end

B.run(main, function()
  hosts:cleanup(os.getenv("BENCH_KEEP") == "1")
  for _, name in ipairs(dbs) do B.sh(pgsh .. " dropdb " .. name .. " >/dev/null 2>&1") end
  for _, v in ipairs(vhosts) do pcall(mgmt, "DELETE", "/vhosts/" .. v) end
  if broker_started then B.sh(RMQ .. " stop >/dev/null 2>&1") end
  B.sh("rm -rf " .. q(TMP))
end)

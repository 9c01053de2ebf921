-- What the admin API's event stream (GET /api/v1/stream) costs the host: the end-to-end
-- throughput run of spec/bench/throughput.lua (bench_adapter.lua, e2e mode: a producer
-- endpoint publishing, a consumer endpoint consuming, one host, embedded transport) with
-- the admin listener on, first with no stream client, then with BENCH_STREAM_CLIENTS
-- `curl -sN` clients on /api/v1/stream. Each round runs both set-ups back to back, in
-- alternating order; the median of the rounds' slowdowns is the figure (target: under 5%
-- with ten clients).
--
--   nimbus-host -l spec/bench/admin_stream.lua path/to/nimbus-host
--
-- Environment: BENCH_N (events per run, 100000), BENCH_ROUNDS (6), BENCH_STREAM_CLIENTS
-- (10), BENCH_SESSIONS, BENCH_CONCURRENCY as throughput.lua, BENCH_KEEP=1 (keep the temp
-- dir). The first client writes what it gets to a file, so the run shows that events were
-- delivered (a stream sends about 128 KiB of them a tick and skips ahead when it falls far
-- behind, so at tens of thousands of events a second a client gets a share of them, and
-- counts); the others write to /dev/null. The clients run on the same machine as the host:
-- their CPU time is part of what the figure shows.
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local env_int, sh_quote, read_file, die, alive = B.env_int, B.sh_quote, B.read_file, B.die, B.alive

local HOST = B.host_binary("admin_stream.lua")
local N = env_int("BENCH_N", 100000)
local ROUNDS = env_int("BENCH_ROUNDS", 6)
local CLIENTS = env_int("BENCH_STREAM_CLIENTS", 10)
local SESSIONS = env_int("BENCH_SESSIONS", 1000)
local CONC = env_int("BENCH_CONCURRENCY", 256)
local ADAPTER = B.dir .. "/bench_adapter.lua"

local TMP = B.tmpdir("nimbus-bench-sse")
local hosts = B.hosts(TMP)

local function start_host(name, store, result)
  local env = table.concat({ "BENCH_MODE=e2e", "BENCH_RESULT=" .. sh_quote(result), "BENCH_N=" .. N,
                             "BENCH_SESSIONS=" .. SESSIONS, "BENCH_CONCURRENCY=" .. CONC, "BENCH_CHUNK=" .. CONC,
                             "BENCH_WINDOW=" .. 2 * CONC }, " ")
  local h = hosts:spawn(name, env .. " " .. sh_quote(HOST) .. " " .. sh_quote(ADAPTER) .. " --store " ..
                        sh_quote(store) .. " --no-reload --admin 127.0.0.1:0")
  hosts:wait_ready(h, 20)
  h.port = hosts:log(h):match("operator API on http://127%.0%.0%.1:(%d+)/")
  if not h.port then die(name .. ": no admin line in the log:\n" .. hosts:log_tail(h)) end
  return h
end

local function wait_for(what, budget, fn)
  local t0 = system.monotime()
  while not fn() do
    if system.monotime() - t0 > budget then die(what .. ": not after " .. budget .. " s") end
    system.sleep(0.01)
  end
end

-- Opens n stream clients; the first keeps what it gets in `keep`.
local function open_clients(h, name, n, keep)
  local list = {}
  local url = sh_quote("http://127.0.0.1:" .. h.port .. "/api/v1/stream")
  for i = 1, n do
    list[i] = hosts:spawn(("%s-client%d"):format(name, i), "curl -sN -o " .. sh_quote(i == 1 and keep or "/dev/null") ..
                          " " .. url)
  end
  if n > 0 then
    wait_for("the first stream client's counts event", 10, function()
      return (read_file(keep) or ""):find("event: counts", 1, true) ~= nil
    end)
    system.sleep(0.3)   -- the others connected by now; a late one only misses the first events
  end
  return list
end

-- One end-to-end run; returns events/s and the status events the first client got.
local function run(name, nclients)
  local store, result, keep = TMP .. "/" .. name .. ".db", TMP .. "/" .. name .. ".json", TMP .. "/" .. name .. ".sse"
  local h = start_host(name, store, result)
  local clients = open_clients(h, name, nclients, keep)
  local out, code = B.sh(sh_quote(HOST) .. " publish BenchStart '{}' --session bench-producer --store " ..
                         sh_quote(store) .. " 2>&1")
  if code ~= 0 then die("publish BenchStart failed: " .. out) end
  local r
  wait_for(name .. ": the run's result", 300, function()
    if not alive(h.pid) then hosts:died(h) end
    local s = read_file(result)
    if s then r = cjson.decode(s) end
    return r ~= nil
  end)
  system.sleep(0.6)   -- one more tick: the last statuses reach the client
  for _, c in ipairs(clients) do hosts:stop(c, 5) end
  hosts:check_stop(h)
  local got = 0
  for _ in (read_file(keep) or ""):gmatch("event: status\n") do got = got + 1 end
  os.remove(keep)
  os.remove(store)
  return r.count / (r.t_last - r.t_first_publish), got
end

local function median(t)
  local s = { table.unpack(t) }
  table.sort(s)
  return s[math.ceil(#s / 2)]
end

local function main()
  print(("admin stream bench: %d events per run, %d rounds, 0 and %d stream clients, embedded transport"):format(N,
        ROUNDS, CLIENTS))
  local r0, r10 = {}, {}
  for i = 1, ROUNDS do
    -- the order alternates, so a drift of the machine over the bench favours neither
    local got
    if i % 2 == 1 then r0[i] = run("r" .. i .. "-c0", 0) end
    r10[i], got = run("r" .. i .. "-c" .. CLIENTS, CLIENTS)
    if i % 2 == 0 then r0[i] = run("r" .. i .. "-c0", 0) end
    print(("  round %d: %6.0f events/s with no client, %6.0f with %d (the first got %d status events)"):format(i,
          r0[i], r10[i], CLIENTS, got))
    if got == 0 then die("the first client got no status event") end
  end
  -- each round's two runs are back to back, so their ratio is the figure least moved by
  -- other load on the machine; its median is the verdict
  local ratios = {}
  for i = 1, ROUNDS do ratios[i] = (1 - r10[i] / r0[i]) * 100 end
  local m0, m10, slower = median(r0), median(r10), median(ratios)
  print(("median: %.0f events/s with no stream client, %.0f with %d; per round %.1f%% slower at the median "
         .. "(target under 5%%)"):format(m0, m10, CLIENTS, slower))
  print(("RESULT sse0_events_per_s=%.0f sse%d_events_per_s=%.0f slower_pct=%.1f"):format(m0, CLIENTS, m10, slower))
  return 0
end

B.run(main, function() hosts:cleanup(os.getenv("BENCH_KEEP") == "1") end)

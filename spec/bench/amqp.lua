-- AMQP 1.0 benchmark of nimbus-host over RabbitMQ, against a bare proton-c consumer.
--
--   make bench
--   nimbus-host -l spec/bench/amqp.lua path/to/nimbus-host path/to/nh-amqp-bench
--
-- Environment: BENCH_N (events, default 20000), BENCH_SESSIONS (1000), BENCH_CONCURRENCY (the
-- host endpoint's, 256), BENCH_PAYLOAD (padding bytes per event, 64), BENCH_CREDIT (link credit
-- of the bare consumer, 1000), BENCH_WINDOW (unsettled sends of the pre-load, 1000),
-- BENCH_TARGET_RATIO (0.8), BENCH_STRICT=1 (exit 1 when the host is below the ratio),
-- BENCH_POLL_MS (store poll interval, 20), BENCH_KEEP=1 (keep the temp dir and the vhost),
-- BENCH_DEADLINE (seconds for the whole bench, 300), BENCH_SKIP_HOST=1 (bare runs only),
-- BENCH_ROUNDS (host runs, 3; each is followed by a bare run; medians are reported),
-- BENCH_PERF=FILE (attach `perf record -g` to the first timed host, profile to FILE),
-- NH_RMQ_PORT (5672), NH_RMQ_MGMT_PORT (15672).
--
-- The broker is scripts/rabbitmq.sh's (started if it is not running, and then stopped again at
-- the end). Everything happens in a fresh vhost, deleted at the end. Every run drains N
-- messages from the same sender (nh-amqp-bench send: the host's wire contract, same payload),
-- pre-loaded before the clock starts. Order: bare, then BENCH_ROUNDS times host, bare.
--   1. bare ceiling: queue BareQ bound to nimbus.events with key BenchEvent, pre-loaded, then
--      drained by `nh-amqp-bench consume` (reads and accepts each message, nothing else);
--      BareQ is deleted afterwards so that it gets no copies of the host run's messages. It
--      runs before and after each host run; the median is the ceiling (the broker's rate
--      varies a lot from run to run when the machine is shared: 8k to 40k events/s was seen
--      on 2 busy cores).
--   2. host: `nimbus-host run` on a trivial adapter (endpoint BenchEp, one handler for
--      BenchEvent that returns) is started once so it declares its queue and binding, stopped,
--      the queue is pre-loaded, then the host is started again and timed until the store holds
--      N Completed audit rows for BenchEp (then it is stopped and its queue deleted). Reported:
--      events/s from `ready:` (the start-up separately), ratio to the bare consumer, CPU
--      (utime+stime of the host) per 1,000 events, peak RSS (VmHWM).
-- Exits 1 if a run did not complete (or, with BENCH_STRICT=1, the ratio is below target).
local system = require("system")
local cjson = require("cjson")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local env_int, sh_quote, sh, read_file, write_file, die, alive, mb =
  B.env_int, B.sh_quote, B.sh, B.read_file, B.write_file, B.die, B.alive, B.mb

local HOST, TOOL = arg[1], arg[2]
if not HOST or not TOOL then
  io.stderr:write("usage: nimbus-host -l spec/bench/amqp.lua NIMBUS_HOST_BINARY NH_AMQP_BENCH_BINARY\n")
  os.exit(2)
end

local N = env_int("BENCH_N", 20000)
local SESSIONS = env_int("BENCH_SESSIONS", 1000)
local CONC = env_int("BENCH_CONCURRENCY", 256)
local PAYLOAD = env_int("BENCH_PAYLOAD", 64)
local CREDIT = env_int("BENCH_CREDIT", 1000)
local WINDOW = env_int("BENCH_WINDOW", 1000)
local TARGET_RATIO = tonumber(os.getenv("BENCH_TARGET_RATIO") or "") or 0.8
local STRICT = os.getenv("BENCH_STRICT") == "1"
local KEEP = os.getenv("BENCH_KEEP") == "1"
local POLL_S = env_int("BENCH_POLL_MS", 20) / 1000
local ROUNDS = math.max(1, env_int("BENCH_ROUNDS", 3))
local DEADLINE_S = env_int("BENCH_DEADLINE", 300)
local AMQP_PORT = env_int("NH_RMQ_PORT", 5672)
local MGMT_PORT = env_int("NH_RMQ_MGMT_PORT", 15672)
local t_bench0 = system.monotime()

local EXCHANGE, EVENT, ENDPOINT, BAREQ = "nimbus.events", "BenchEvent", "BenchEp", "BareQ"

for _, bin in ipairs({ HOST, TOOL }) do
  if not os.execute("test -x " .. sh_quote(bin)) then
    io.stderr:write("bench: " .. bin .. " is not an executable (build it: make build)\n")
    os.exit(2)
  end
end

local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local RABBITMQ_SH = here .. "/../../scripts/rabbitmq.sh"

local function remaining()
  return DEADLINE_S - (system.monotime() - t_bench0)
end

local TMP = (sh("mktemp -d -t nimbus-amqp-bench.XXXXXX")):gsub("%s+$", "")
assert(TMP ~= "" and TMP:match("nimbus%-amqp%-bench"), "mktemp failed")

---------------------------------------------------------------------------- broker + management API
local API = ("http://127.0.0.1:%d/api"):format(MGMT_PORT)
local VHOST = ("nimbus-bench-%d-%d"):format(os.time(), math.random(100000, 999999))
local URL = ("amqp://guest:guest@127.0.0.1:%d/%s"):format(AMQP_PORT, VHOST)
-- the host finds the management API through the URL (its default is port 15672)
local HOST_URL = ("%s?management=http://127.0.0.1:%d"):format(URL, MGMT_PORT)
local broker_started, vhost_created = false, false

-- One management API call; returns the decoded body (or true when empty). Dies on a non-2xx
-- status unless `allow` lists it.
local function api(method, path, body, allow)
  local out_file = TMP .. "/api.out"
  local cmd = "curl -sS --max-time 30 -u guest:guest -o " .. sh_quote(out_file) .. " -w '%{http_code}' -X " .. method ..
              " -H 'content-type: application/json' " .. sh_quote(API .. path)
  if body then cmd = cmd .. " -d " .. sh_quote(cjson.encode(body)) end
  local code_s, rc = sh(cmd .. " 2>&1")
  local code = tonumber(code_s:match("(%d%d%d)%s*$"))
  local resp = read_file(out_file) or ""
  os.remove(out_file)
  if rc ~= 0 or not code then die(("management API %s %s: curl failed: %s"):format(method, path, code_s)) end
  if code >= 300 and not (allow and allow[code]) then
    die(("management API %s %s: HTTP %d %s"):format(method, path, code, resp))
  end
  if code >= 300 then return nil, code end
  if resp:match("^%s*$") then return true, code end
  local ok, v = pcall(cjson.decode, resp)
  return ok and v or resp, code
end

local function ensure_broker()
  local _, st = sh(sh_quote(RABBITMQ_SH) .. " status >/dev/null 2>&1")
  if st == 0 then return end
  local out, rc = sh(sh_quote(RABBITMQ_SH) .. " start 2>&1")
  io.write(out)
  if rc ~= 0 then die("cannot start RabbitMQ (scripts/rabbitmq.sh start, exit " .. tostring(rc) .. ")") end
  broker_started = true
end

local function vq(name) return "/" .. VHOST .. "/" .. name end

local function create_vhost()
  api("PUT", "/vhosts/" .. VHOST)
  vhost_created = true
  api("PUT", "/permissions/" .. VHOST .. "/guest", { configure = ".*", write = ".*", read = ".*" })
end

local function declare_exchange()
  api("PUT", "/exchanges" .. vq(EXCHANGE), { type = "topic", durable = true, auto_delete = false, internal = false,
                                               arguments = {} })
end

-- Exact (basic.get, not the management stats that lag by seconds): true if the queue holds a message.
local function queue_has_message(queue)
  local r = api("POST", "/queues" .. vq(queue) .. "/get",
                { count = 1, ackmode = "reject_requeue_true", encoding = "auto", truncate = 100 })
  return type(r) == "table" and #r > 0
end

---------------------------------------------------------------------------- processes
local procs = {}

local proc_kb, proc_cpu = B.proc_field, B.proc_cpu

-- Runs `cmd` in the background under a `sh` wrapper that records its pid ($!) and, when it
-- ends, its exit status; stdin from `stdin` (/dev/null), stdout to h.out, stderr to h.log.
local function spawn(name, cmd, stdin)
  local h = { name = name, log = TMP .. "/" .. name .. ".log", out = TMP .. "/" .. name .. ".out",
              rcfile = TMP .. "/" .. name .. ".rc", pidfile = TMP .. "/" .. name .. ".pid" }
  local inner = cmd .. " <" .. sh_quote(stdin or "/dev/null") .. " 2>" .. sh_quote(h.log) .. " >" .. sh_quote(h.out) ..
                " & echo $! > " ..
                sh_quote(h.pidfile) .. "; wait $!; echo $? > " .. sh_quote(h.rcfile)
  if not os.execute("sh -c " .. sh_quote(inner) .. " >/dev/null 2>&1 &") then die("cannot start " .. name) end
  local t0 = system.monotime()
  while not h.pid do
    local s = read_file(h.pidfile)
    if s and s:match("%d+\n") then h.pid = tonumber(s:match("%d+")) end
    if system.monotime() - t0 > 10 then die(name .. ": no pid after 10 s") end
    if not h.pid then system.sleep(0.002) end
  end
  procs[#procs + 1] = h
  return h
end

local function log_of(h) return read_file(h.log) or "" end

local function wait_rc(h, timeout)
  local t0 = system.monotime()
  while true do
    local rc = tonumber((read_file(h.rcfile) or ""):match("%d+"))
    if rc then h.stopped, h.rc = true, rc; return rc end
    if system.monotime() - t0 > timeout then return nil end
    system.sleep(0.005)
  end
end

local function stop(h, timeout)
  if h.stopped then return h.rc end
  if alive(h.pid) then os.execute("kill -TERM " .. h.pid .. " 2>/dev/null") end
  local rc = wait_rc(h, timeout or 20)
  if rc then return rc end
  os.execute("kill -KILL " .. h.pid .. " 2>/dev/null")
  return wait_rc(h, 5)
end

-- Runs the bench tool to completion; returns its JSON result.
local function tool(name, args, budget)
  local h = spawn(name, "NH_BENCH_TIMEOUT=" .. math.max(5, math.floor(budget)) .. " NH_BENCH_WINDOW=" .. WINDOW ..
                  " " .. sh_quote(TOOL) .. " " .. args)
  local rc = wait_rc(h, budget + 10)
  if rc == nil then stop(h, 1); die(name .. ": nh-amqp-bench did not finish in " .. budget .. " s: " .. log_of(h)) end
  if rc ~= 0 then die(("%s: nh-amqp-bench exit %d: %s"):format(name, rc, log_of(h))) end
  local ok, r = pcall(cjson.decode, read_file(h.out) or "")
  if not ok then die(name .. ": no JSON result from nh-amqp-bench: " .. (read_file(h.out) or "") .. log_of(h)) end
  return r
end

local function preload(name, queue_hint)
  local args = { "send", sh_quote(URL), sh_quote("/exchange/" .. EXCHANGE .. "/" .. EVENT), N, SESSIONS, PAYLOAD }
  local r = tool(name, table.concat(args, " "), math.max(10, remaining() / 3))
  if r.accepted ~= N then die(("%s: %s of %d accepted"):format(name, tostring(r.accepted), N)) end
  if not queue_has_message(queue_hint) then
    die(("%s: the broker accepted %d messages but queue %s is empty (not bound to %s/%s?)"):format(name, N, queue_hint,
        EXCHANGE, EVENT))
  end
  return r
end

---------------------------------------------------------------------------- the host's store, polled
-- One long-lived sqlite3 reading queries from a FIFO (spawning sqlite3 at every poll costs
-- about 4 ms of CPU each, on a machine the host and the broker share).
local sqlp

local function sql_fifo(tag)
  local fifo = TMP .. "/sql" .. tag .. ".in"
  if not os.execute("mkfifo " .. sh_quote(fifo)) then die("mkfifo failed") end
  return fifo
end

-- Call after the host is spawned: children inherit the FIFO's descriptor (Lua cannot open it
-- close-on-exec).
local function sql_open(db, tag, fifo)
  -- Opened read-write, which does not block, and keeps a reader on the FIFO: if sqlite3 dies, a
  -- write fails quietly (sql_row notices) instead of killing this script with SIGPIPE.
  local w = assert(io.open(fifo, "r+"))
  sqlp = spawn("sqlite3-" .. tag, "sqlite3 -batch " .. sh_quote(db), fifo)
  sqlp.w = w
  sqlp.seq, sqlp.off = 0, 0
  w:write(".timeout 5000\n")   -- the CLI's default is no busy timeout at all
end

-- Runs one query that yields a single row; returns its columns (strings, in order).
local function sql_row(query, timeout)
  sqlp.seq = sqlp.seq + 1
  local tag = "q" .. sqlp.seq
  sqlp.w:write("select '" .. tag .. "', * from (" .. query .. ");\n")
  sqlp.w:flush()
  local t0 = system.monotime()
  while true do
    local out = read_file(sqlp.out) or ""
    local line = out:match("\n?" .. tag .. "|([^\n]*)\n", sqlp.off + 1)
    if line then
      local cols = {}
      for c in (line .. "|"):gmatch("([^|]*)|") do cols[#cols + 1] = c end
      sqlp.off = #out
      return cols
    end
    local err = log_of(sqlp)
    if err:match("%S") then die("sqlite3: " .. err) end
    if not alive(sqlp.pid) then die("sqlite3 exited") end
    if system.monotime() - t0 > (timeout or 10) then die("sqlite3: no answer to " .. query) end
    system.sleep(0.001)
  end
end

local function sql_close()
  if sqlp and sqlp.w then
    sqlp.w:write(".quit\n")
    sqlp.w:close()
    sqlp.w = nil
    wait_rc(sqlp, 5)
  end
end

local COMPLETED_Q = ("select count(*) from audit where endpoint = '%s' and status = 'Completed'"):format(ENDPOINT)

local function audit_breakdown(db)
  local out = sh("sqlite3 " .. sh_quote(db) .. " " ..
                 sh_quote("select status, count(*) from audit where endpoint = '" .. ENDPOINT .. "' group by status") ..
                 " 2>&1")
  local t, total = {}, 0
  for st, c in out:gmatch("([^|\n]+)|(%d+)") do t[st] = tonumber(c); total = total + tonumber(c) end
  return t, total, out
end

---------------------------------------------------------------------------- runs
local bare_runs = 0
local function run_bare()
  bare_runs = bare_runs + 1
  declare_exchange()
  api("PUT", "/queues" .. vq(BAREQ), { durable = true, auto_delete = false, arguments = {} })
  api("POST", "/bindings/" .. VHOST .. "/e/" .. EXCHANGE .. "/q/" .. BAREQ, { routing_key = EVENT, arguments = {} })
  local pre = preload("preload-bare" .. bare_runs, BAREQ)
  local r = tool("consume-bare" .. bare_runs, table.concat({ "consume", sh_quote(URL), BAREQ, N, CREDIT }, " "),
                 math.max(10, remaining() / 2))
  if r.consumed ~= N then die(("bare consumer: %s of %d consumed"):format(tostring(r.consumed), N)) end
  r.left = queue_has_message(BAREQ)
  r.preload = pre
  -- The host run's messages must reach BenchEp only.
  api("DELETE", "/queues" .. vq(BAREQ))
  return r
end

local ADAPTER_SRC = [[
-- written by spec/bench/amqp.lua: one endpoint, one trivial handler
local nimbus = require("nimbus")
local ep = nimbus.endpoint("BenchEp", { concurrency = %d })
ep:on("BenchEvent", function() end)
]]

local function start_host(name, adapter, store)
  return spawn(name, sh_quote(HOST) .. " run " .. sh_quote(adapter) .. " --store " .. sh_quote(store) ..
               " --transport " .. sh_quote(HOST_URL) .. " --no-reload")
end

-- The host logs `ready:` once its endpoints are subscribed.
local function wait_ready(h, timeout)
  local t0 = system.monotime()
  while true do
    local log = log_of(h)
    if log:match("ready:") then return system.monotime() end
    if not alive(h.pid) then
      wait_rc(h, 2)
      die(("%s: host exited during start-up (status %s):\n%s"):format(h.name, tostring(h.rc), log))
    end
    if system.monotime() - t0 > timeout then die(h.name .. ": no `ready:` line after " .. timeout .. " s:\n" .. log) end
    system.sleep(0.002)
  end
end

local function check_stop(h)
  local rc = stop(h)
  if rc ~= 0 then
    die(("%s: host exit status %s after SIGTERM (expected 0):\n%s"):format(h.name, tostring(rc), log_of(h)))
  end
end

local function run_host(round)
  local adapter, store = TMP .. "/bench_amqp_adapter.lua", TMP .. "/amqp" .. round .. ".db"
  write_file(adapter, ADAPTER_SRC:format(CONC))
  -- 1. declare: the host creates the exchange, its queue and the binding
  local d = start_host("host-declare" .. round, adapter, store)
  wait_ready(d, 30)
  check_stop(d)
  local q = api("GET", "/queues" .. vq(ENDPOINT), nil, { [404] = true })
  if not q then die("the host logged `ready:` but there is no queue " .. ENDPOINT .. " in vhost " .. VHOST ..
                    ":\n" .. log_of(d)) end
  if q.durable ~= true then die("queue " .. ENDPOINT .. " is not durable") end
  -- 2. pre-load (the same sender and messages as the bare run)
  local pre = preload("preload-host" .. round, ENDPOINT)
  -- 3. drain, timed
  local fifo = sql_fifo(round)
  local t_launch = system.monotime()
  local h = start_host("host" .. round, adapter, store)
  local perf
  if os.getenv("BENCH_PERF") and round == 1 then   -- attaches while the host starts: misses its first ~0.1 s
    perf = spawn("perf", "perf record -F 999 -g -p " .. h.pid .. " -o " .. sh_quote(os.getenv("BENCH_PERF")))
  end
  sql_open(store, round, fifo)
  local t_ready = wait_ready(h, 30)
  local cpu_ready = proc_cpu(h.pid)
  local done, t_done, last_n, t_progress = 0, nil, -1, system.monotime()
  local hwm, cpu, wchar, rchar
  while true do
    done = tonumber(sql_row(COMPLETED_Q)[1])
    local t = system.monotime()
    if done >= N then
      t_done = t
      hwm, cpu = proc_kb(h.pid, "VmHWM"), proc_cpu(h.pid)
      local io_ = read_file("/proc/" .. h.pid .. "/io") or ""
      wchar, rchar = tonumber(io_:match("wchar:%s*(%d+)")), tonumber(io_:match("rchar:%s*(%d+)"))
      break
    end
    if done ~= last_n then last_n, t_progress = done, t end
    if not alive(h.pid) then
      wait_rc(h, 2)
      die(("host exited (status %s) after %d of %d Completed:\n%s"):format(tostring(h.rc), done, N, log_of(h)))
    end
    if t - t_progress > 30 then
      local _, _, bd = audit_breakdown(store)
      die(("host: stuck at %d of %d Completed for 30 s; audit by status:\n%s\nhost log:\n%s"):format(done, N, bd,
          log_of(h):sub(-4000)))
    end
    if remaining() < 10 then die(("host: %d of %d Completed when the bench deadline came:\n%s"):format(done, N,
                                 log_of(h):sub(-4000))) end
    system.sleep(POLL_S)
  end
  sql_close()
  local log_at_done = log_of(h)
  check_stop(h)
  if perf then stop(perf, 30) end   -- perf ends with its target
  local counts, total = audit_breakdown(store)
  return {
    preload = pre, t_launch = t_launch, t_ready = t_ready, t_done = t_done, hwm_kb = hwm, cpu_s = cpu,
    cpu_ready_s = cpu_ready, wchar = wchar, rchar = rchar, completed = counts.Completed or 0, total = total,
    counts = counts,
    left = queue_has_message(ENDPOINT), log = log_at_done, rc = h.rc,
  }
end

---------------------------------------------------------------------------- report

local function median(xs)
  local t = {}
  for i, x in ipairs(xs) do t[i] = x end
  table.sort(t)
  local n = #t
  if n % 2 == 1 then return t[(n + 1) // 2] end
  return (t[n // 2] + t[n // 2 + 1]) / 2
end

local function main()
  local ver = (sh(sh_quote(HOST) .. " --version 2>&1")):gsub("%s+$", "")
  ensure_broker()
  local ov = api("GET", "/overview")
  print(("nimbus-host AMQP 1.0 bench: %s; RabbitMQ %s (Erlang %s)"):format(ver, tostring(ov.rabbitmq_version),
        tostring(ov.erlang_version)))
  print(("  N=%d events  sessions=%d  payload pad=%d B  host concurrency=%d  bare credit=%d  vhost %s")
        :format(N, SESSIONS, PAYLOAD, CONC, CREDIT, VHOST))
  print("  messages: durable, sent unsettled to /exchange/" .. EXCHANGE .. "/" .. EVENT ..
        ", pre-loaded before each timed run; order: bare" ..
        string.rep(os.getenv("BENCH_SKIP_HOST") == "1" and ", bare" or ", host, bare", ROUNDS))
  create_vhost()

  local skip_host = os.getenv("BENCH_SKIP_HOST") == "1"
  local bares, hosts = { run_bare() }, {}
  for round = 1, ROUNDS do
    if not skip_host then
      hosts[round] = run_host(round)
      api("DELETE", "/queues" .. vq(ENDPOINT))   -- host stopped: the next bare run's messages go to BareQ only
    end
    bares[#bares + 1] = run_bare()
  end

  local bare_rates, bare_cpus, bare_rss, extra, each = {}, {}, 0, 0, {}
  for i, b in ipairs(bares) do
    bare_rates[i], bare_cpus[i] = b.rate, b.cpu_s
    bare_rss = math.max(bare_rss, b.max_rss_kb)
    extra = extra + (b.released_extra or 0)
    each[i] = ("%.0f"):format(b.rate)
  end
  local bare_rate, bare_cpu = median(bare_rates), median(bare_cpus)
  print("")
  print(("bare proton-c consumer (nh-amqp-bench consume: read + accept, rcv-settle-mode first, credit %d):")
        :format(CREDIT))
  print(("  throughput      %.0f events/s   (median of %d runs: %s; link attach to last accept)")
        :format(bare_rate, #bares, table.concat(each, ", ")))
  print(("  CPU             %.1f ms per 1,000 events (whole process)"):format(bare_cpu * 1e6 / N))
  print(("  peak RSS        %s"):format(mb(bare_rss)))
  if extra > 0 then
    print(("  note            the broker delivered %d messages beyond the credit granted (released by the tool)")
          :format(extra))
  end
  for _, b in ipairs(bares) do if b.left then print("  WARNING         BareQ still held messages after a run") end end
  if skip_host then
    print(("pre-load (nh-amqp-bench send, window %d): %.0f msg/s"):format(WINDOW, bares[1].preload.rate))
    print("")
    print(("RESULT amqp_bare_events_per_s=%.0f bare_cpu_ms_per_1k=%.1f"):format(bare_rate, bare_cpu * 1e6 / N))
    return 0
  end

  -- the host figures are those of the median run (by rate); peak RSS is the highest of all runs
  local host_rates, host_each, hwm = {}, {}, 0
  for i, r in ipairs(hosts) do
    r.rate = N / (r.t_done - r.t_ready)
    host_rates[i], host_each[i] = r.rate, ("%.0f"):format(r.rate)
    hwm = math.max(hwm, r.hwm_kb or 0)
  end
  table.sort(hosts, function(x, y) return x.rate < y.rate end)
  local h = hosts[(#hosts + 1) // 2]
  local rate = median(host_rates)
  local span = N / rate
  local ratio = rate / bare_rate
  local cpu_run = h.cpu_s - h.cpu_ready_s
  print("")
  print(("nimbus-host (trivial Lua handler, endpoint %s, sqlite store with audit + history):"):format(ENDPOINT))
  print(("  throughput      %.0f events/s   (%d Completed in %.3f s from `ready:`, polled every %d ms%s)")
        :format(rate, N, span, POLL_S * 1000,
                #hosts > 1 and ("; median of %d runs: %s"):format(#hosts, table.concat(host_each, ", ")) or ""))
  print(("  start-up        `ready:` %.3f s after launch; %.0f events/s counted from launch")
        :format(h.t_ready - h.t_launch, N / (h.t_done - h.t_launch)))
  print(("  ratio           %.2f of the bare consumer (target %.2f: %s)"):format(ratio, TARGET_RATIO,
        ratio >= TARGET_RATIO and "met" or "NOT met"))
  print(("  CPU             %.1f ms per 1,000 events (%.3f s from `ready:` to the last Completed; %.3f s with "
         .. "start-up)")
        :format(cpu_run * 1e6 / N, cpu_run, h.cpu_s))
  print(("  peak RSS        %s (VmHWM of the host)"):format(mb(hwm)))
  if h.wchar then
    print(("  I/O             %.1f KB written, %.1f KB read per event (read/write syscalls: sqlite and the socket)")
          :format(h.wchar / N / 1024, h.rchar / N / 1024))
  end
  local others = {}
  for st, c in pairs(h.counts) do if st ~= "Completed" then others[#others + 1] = st .. " " .. c end end
  print(("  audit           %d Completed of %d rows%s; queue %s after SIGTERM (exit %s)"):format(h.completed, h.total,
        #others > 0 and (" (" .. table.concat(others, ", ") .. ")") or "",
        h.left and "NOT empty" or "empty", tostring(h.rc)))
  print(("pre-load (nh-amqp-bench send, window %d): %.0f msg/s into BareQ, %.0f msg/s into %s")
        :format(WINDOW, bares[1].preload.rate, h.preload.rate, ENDPOINT))
  print("")
  print(("RESULT amqp_host_events_per_s=%.0f amqp_bare_events_per_s=%.0f ratio=%.2f host_cpu_ms_per_1k=%.1f " ..
         "host_peak_rss_mb=%.1f bare_cpu_ms_per_1k=%.1f"):format(rate, bare_rate, ratio, cpu_run * 1e6 / N,
        hwm / 1024, bare_cpu * 1e6 / N))
  for _, r in ipairs(hosts) do
    if r.completed ~= N or r.total ~= N then
      die(("audit: %d Completed of %d rows for %s, expected %d of %d"):format(r.completed, r.total, ENDPOINT, N, N))
    end
    if r.left then die("queue " .. ENDPOINT .. " still holds messages after the host stopped (not settled?)") end
  end
  if STRICT and ratio < TARGET_RATIO then
    io.stderr:write(("bench: ratio %.2f is below the target %.2f\n"):format(ratio, TARGET_RATIO))
    return 1
  end
  return 0
end

local function cleanup()
  sql_close()
  for _, h in ipairs(procs) do
    if not h.stopped and h.pid and alive(h.pid) then os.execute("kill -KILL " .. h.pid .. " 2>/dev/null") end
  end
  for _, h in ipairs(procs) do
    local t0 = system.monotime()
    while h.pid and (alive(h.pid) or not read_file(h.rcfile)) and system.monotime() - t0 < 5 do system.sleep(0.01) end
  end
  if vhost_created and not KEEP then pcall(api, "DELETE", "/vhosts/" .. VHOST) end
  if broker_started then
    local out = sh(sh_quote(RABBITMQ_SH) .. " stop 2>&1")
    io.write(out)
  end
  if KEEP then
    io.stderr:write("bench: kept " .. TMP .. " and vhost " .. VHOST .. "\n")
  else
    os.execute("rm -rf " .. sh_quote(TMP))
  end
end

B.run(main, cleanup)

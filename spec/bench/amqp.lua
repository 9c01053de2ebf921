-- AMQP 1.0 benchmark of nimbus-host over RabbitMQ, against a bare proton-c consumer and a
-- Node.js peer (rhea + better-sqlite3) doing the same store writes.
--
--   make bench
--   nimbus-host -l spec/bench/amqp.lua path/to/nimbus-host path/to/nh-amqp-bench
--
-- Environment: BENCH_N (events, default 20000), BENCH_SESSIONS (1000), BENCH_CONCURRENCY (the
-- host endpoint's, 256), BENCH_PAYLOAD (padding bytes per event, 64), BENCH_CREDIT (link credit
-- of the bare consumer, 1000), BENCH_WINDOW (unsettled sends of the pre-load, 1000),
-- BENCH_TARGET_RATIO (0.8), BENCH_STRICT=1 (exit 1 when the host is below the ratio),
-- BENCH_POLL_MS (store poll interval, 20), BENCH_KEEP=1 (keep the temp dir and the vhost),
-- BENCH_DEADLINE (seconds for the whole bench, 300), BENCH_SKIP_HOST=1 (no host runs),
-- BENCH_ROUNDS (rounds of host, node, bare runs, 3; medians are reported),
-- BENCH_PERF=FILE (attach `perf record -g` to the first timed host, profile to FILE; BENCH_PERF_OPTS
-- replaces `-F 999 -g`, e.g. "-F 4999 --call-graph dwarf"),
-- BENCH_HOST_WRAP=CMD (timed hosts run under CMD, e.g. "valgrind --tool=callgrind
-- --callgrind-out-file=/tmp/cg.%p": instructions per event, repeatable on a busy machine),
-- BENCH_NODE (the Node.js peer: unset = run it when it can be set up, else say why not and go
-- on; 0 = skip it; 1 = a peer that cannot be set up fails the bench), BENCH_NODE_WINDOW (its
-- credit window, 4 x BENCH_CONCURRENCY as the host's), BENCH_NODE_BATCH (deliveries per
-- transaction at most, 256), NH_RMQ_PORT (5672), NH_RMQ_MGMT_PORT (15672).
--
-- The broker is scripts/rabbitmq.sh's (started if it is not running, and then stopped again at
-- the end). Everything happens in a fresh vhost, deleted at the end. Every run drains N
-- messages from the same sender (nh-amqp-bench send: the host's wire contract, same payload),
-- pre-loaded before the clock starts. Order: bare, then BENCH_ROUNDS times host, node, bare.
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
--   3. node peer (spec/bench/node-peer/peer.js, see its header): a plain Node.js consumer, rhea
--      (AMQP 1.0) and better-sqlite3, that per event does the host's audit upsert (Completed,
--      payload, ids, session, timestamps), history insert and processed insert, with the host's
--      schema and pragmas, one transaction per event-loop turn of at most 256 deliveries, each
--      accepted after its batch committed, credit as the host's (a window of 4 x 256 topped up
--      at half). Queue NodeQ bound like BareQ, pre-loaded, then the peer is started and timed
--      exactly as the host: from its `ready:` (link attached) until its store holds N Completed
--      rows for NodeEp, CPU and VmHWM from /proc at that moment; then SIGTERM, queue deleted.
--      It does no session locking or ordering, no savepoint per event, no retries, no Lua: the
--      least a Node.js service recording the same audit trail does, not a like-for-like host.
--      Also reported: its own timing (link attached to last commit) and batch sizes.
--      Set-up: `scripts/npm.sh node-peer` when spec/bench/node-peer/node_modules is missing or
--      stale: `npm ci` from the npm registry, better-sqlite3 compiled from source against the
--      running node's headers (GitHub and nodejs.org, where its prebuilt binary and node-gyp's
--      headers come from, are not needed; g++, make, python3 are); about 2 minutes, not counted
--      in BENCH_DEADLINE.
--      Without node (or node < 20, or a failed set-up) the peer is skipped and the output says
--      why.
-- Then a table of the medians (events/s, CPU ms per 1,000 events, peak RSS) and the ratios
-- host/bare, host/node, node/bare of each; the RESULT line adds the node figures after the
-- host's (amqp_node_events_per_s, node_cpu_ms_per_1k, node_peak_rss_mb, host_node_ratio,
-- host_node_cpu_ratio) and bare_peak_rss_mb.
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
local NODE_MODE = os.getenv("BENCH_NODE") or ""
local NODE_WINDOW = env_int("BENCH_NODE_WINDOW", math.max(16, 4 * CONC))
local NODE_BATCH = env_int("BENCH_NODE_BATCH", 256)
local t_bench0 = system.monotime()   -- reset after the node peer's set-up

local EXCHANGE, EVENT, ENDPOINT, BAREQ = "nimbus.events", "BenchEvent", "BenchEp", "BareQ"
local NODE_EP, NODEQ = "NodeEp", "NodeQ"

for _, bin in ipairs({ HOST, TOOL }) do
  if not os.execute("test -x " .. sh_quote(bin)) then
    io.stderr:write("bench: " .. bin .. " is not an executable (build it: make build)\n")
    os.exit(2)
  end
end

local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local RABBITMQ_SH = here .. "/../../scripts/rabbitmq.sh"
local NPM_SH = here .. "/../../scripts/npm.sh"
local PEER_DIR = here .. "/node-peer"

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

local function completed_q(endpoint)
  return ("select count(*) from audit where endpoint = '%s' and status = 'Completed'"):format(endpoint)
end

local function audit_breakdown(db, endpoint)
  local out = sh("sqlite3 " .. sh_quote(db) .. " " ..
                 sh_quote("select status, count(*) from audit where endpoint = '" .. (endpoint or ENDPOINT) ..
                          "' group by status") ..
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
  local wrap = name:match("^host%d") and os.getenv("BENCH_HOST_WRAP") or nil
  return spawn(name, (wrap and wrap .. " " or "") .. sh_quote(HOST) .. " run " .. sh_quote(adapter) .. " --store " .. sh_quote(store) ..
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
      die(("%s: exited during start-up (status %s):\n%s"):format(h.name, tostring(h.rc), log))
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

-- Polls the store (sql_open'd) until it holds N Completed audit rows for `endpoint`; then reads
-- the process's VmHWM, CPU and I/O counters while it still runs. `what` names it in failures.
local function wait_completed(h, store, endpoint, what)
  local q = completed_q(endpoint)
  local last_n, t_progress = -1, system.monotime()
  while true do
    local done = tonumber(sql_row(q)[1])
    local t = system.monotime()
    if done >= N then
      local io_ = read_file("/proc/" .. h.pid .. "/io") or ""
      return { t_done = t, hwm_kb = proc_kb(h.pid, "VmHWM"), cpu_s = proc_cpu(h.pid),
               wchar = tonumber(io_:match("wchar:%s*(%d+)")), rchar = tonumber(io_:match("rchar:%s*(%d+)")) }
    end
    if done ~= last_n then last_n, t_progress = done, t end
    if not alive(h.pid) then
      wait_rc(h, 2)
      die(("%s exited (status %s) after %d of %d Completed:\n%s"):format(what, tostring(h.rc), done, N, log_of(h)))
    end
    if t - t_progress > 30 then
      local _, _, bd = audit_breakdown(store, endpoint)
      die(("%s: stuck at %d of %d Completed for 30 s; audit by status:\n%s\nlog:\n%s"):format(what, done, N, bd,
          log_of(h):sub(-4000)))
    end
    if remaining() < 10 then die(("%s: %d of %d Completed when the bench deadline came:\n%s"):format(what, done, N,
                                 log_of(h):sub(-4000))) end
    system.sleep(POLL_S)
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
    perf = spawn("perf", "perf record " .. (os.getenv("BENCH_PERF_OPTS") or "-F 999 -g") .. " -p " .. h.pid ..
                 " -o " .. sh_quote(os.getenv("BENCH_PERF")))
  end
  sql_open(store, round, fifo)
  local t_ready = wait_ready(h, 30)
  local cpu_ready = proc_cpu(h.pid)
  local w = wait_completed(h, store, ENDPOINT, "host")
  local t_done, hwm, cpu, wchar, rchar = w.t_done, w.hwm_kb, w.cpu_s, w.wchar, w.rchar
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

---------------------------------------------------------------------------- the Node.js peer
-- Whether the peer can run: true, or false and why not. Installs its npm packages when they are
-- missing (scripts/npm.sh node-peer: a no-op when installed for this lock and this node).
local function node_setup()
  if NODE_MODE == "0" then return false, "BENCH_NODE=0" end
  local function skip(why)
    if NODE_MODE == "1" then die("node peer (BENCH_NODE=1): " .. why) end
    return false, why
  end
  local path = (sh("command -v node 2>/dev/null")):gsub("%s+$", "")
  if path == "" then return skip("no node on PATH (Debian package nodejs, Node.js 20 or later)") end
  local ver = (sh("node -p process.versions.node 2>&1")):gsub("%s+$", "")
  local major = tonumber(ver:match("^(%d+)%."))
  if not major or major < 20 then
    return skip(("node %s at %s: better-sqlite3 12 needs Node.js 20 or later"):format(ver, path))
  end
  if sh("command -v npm 2>/dev/null") == "" then return skip("node " .. ver .. " but no npm on PATH") end
  local t0 = system.monotime()
  local out, rc = sh("timeout 900 " .. sh_quote(NPM_SH) .. " node-peer 2>&1")
  if rc ~= 0 then
    local head = {}   -- the first lines say what failed (npm's code and message, the compiler's error)
    for line in out:gmatch("[^\n]+") do
      if #head < 12 and not line:match("^npm error%s+at ") and not line:match("^gyp ERR! stack") then
        head[#head + 1] = line
      end
    end
    return skip(("scripts/npm.sh node-peer failed (exit %s) after %.0f s (run it by hand for the whole " ..
                 "output):\n    %s"):format(tostring(rc), system.monotime() - t0, table.concat(head, "\n    ")))
  end
  if out:match("%S") then
    io.write(out)
    print(("  (the node peer's set-up took %.0f s, not counted in BENCH_DEADLINE)"):format(system.monotime() - t0))
  end
  return true, ("node %s (%s)"):format(ver, path)
end

local function run_node(round)
  declare_exchange()
  api("PUT", "/queues" .. vq(NODEQ), { durable = true, auto_delete = false, arguments = {} })
  api("POST", "/bindings/" .. VHOST .. "/e/" .. EXCHANGE .. "/q/" .. NODEQ, { routing_key = EVENT, arguments = {} })
  local pre = preload("preload-node" .. round, NODEQ)
  local store = TMP .. "/node" .. round .. ".db"
  local fifo = sql_fifo("n" .. round)
  local t_launch = system.monotime()
  local h = spawn("node" .. round, "PEER_WINDOW=" .. NODE_WINDOW .. " PEER_BATCH=" .. NODE_BATCH .. " node " ..
                  sh_quote(PEER_DIR .. "/peer.js") .. " " .. sh_quote(URL) .. " " .. NODEQ .. " " .. sh_quote(store) ..
                  " " .. NODE_EP)
  -- its schema exists once it logs `ready:` (link attached): the reader opens the file after that
  local t_ready = wait_ready(h, 30)
  local cpu_ready = proc_cpu(h.pid)
  sql_open(store, "n" .. round, fifo)
  local w = wait_completed(h, store, NODE_EP, "node peer")
  sql_close()
  local rc = stop(h)
  if rc ~= 0 then
    die(("%s: node peer exit status %s after SIGTERM (expected 0):\n%s"):format(h.name, tostring(rc), log_of(h)))
  end
  local ok, self = pcall(cjson.decode, read_file(h.out) or "")
  if not ok or type(self) ~= "table" then
    die(h.name .. ": no JSON result from the node peer: " .. (read_file(h.out) or "") .. log_of(h))
  end
  local counts, total = audit_breakdown(store, NODE_EP)
  local r = {
    preload = pre, t_launch = t_launch, t_ready = t_ready, t_done = w.t_done, hwm_kb = w.hwm_kb, cpu_s = w.cpu_s,
    cpu_ready_s = cpu_ready, wchar = w.wchar, rchar = w.rchar, completed = counts.Completed or 0, total = total,
    counts = counts, self = self, left = queue_has_message(NODEQ), rc = rc,
  }
  api("DELETE", "/queues" .. vq(NODEQ))   -- the next runs' messages go to their own queue only
  return r
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

-- The figures of a set of timed runs (host or node): the median rate; CPU, start-up and I/O of
-- the median run (by rate); the highest VmHWM of all.
local function summarize(runs)
  local rates, each, hwm = {}, {}, 0
  for i, r in ipairs(runs) do
    r.rate = N / (r.t_done - r.t_ready)
    rates[i], each[i] = r.rate, ("%.0f"):format(r.rate)
    hwm = math.max(hwm, r.hwm_kb or 0)
  end
  local sorted = {}
  for i, r in ipairs(runs) do sorted[i] = r end
  table.sort(sorted, function(x, y) return x.rate < y.rate end)
  local m = sorted[(#sorted + 1) // 2]
  local rate = median(rates)
  return { rate = rate, each = each, hwm = hwm, m = m, span = N / rate, cpu_run = m.cpu_s - m.cpu_ready_s }
end

local function print_timed(S)
  local m = S.m
  print(("  throughput      %.0f events/s   (%d Completed in %.3f s from `ready:`, polled every %d ms%s)")
        :format(S.rate, N, S.span, POLL_S * 1000,
                #S.each > 1 and ("; median of %d runs: %s"):format(#S.each, table.concat(S.each, ", ")) or ""))
  print(("  start-up        `ready:` %.3f s after launch; %.0f events/s counted from launch")
        :format(m.t_ready - m.t_launch, N / (m.t_done - m.t_launch)))
end

local function print_tail(S, who)
  local m = S.m
  print(("  CPU             %.1f ms per 1,000 events (%.3f s from `ready:` to the last Completed; %.3f s with "
         .. "start-up)"):format(S.cpu_run * 1e6 / N, S.cpu_run, m.cpu_s))
  print(("  peak RSS        %s (VmHWM of the %s)"):format(mb(S.hwm), who))
  if m.wchar then
    print(("  I/O             %.1f KB written, %.1f KB read per event (read/write syscalls: sqlite and the socket)")
          :format(m.wchar / N / 1024, m.rchar / N / 1024))
  end
end

local function audit_line(r, queue)
  local others = {}
  for st, c in pairs(r.counts) do if st ~= "Completed" then others[#others + 1] = st .. " " .. c end end
  print(("  audit           %d Completed of %d rows%s; queue %s %s after SIGTERM (exit %s)"):format(r.completed,
        r.total, #others > 0 and (" (" .. table.concat(others, ", ") .. ")") or "", queue,
        r.left and "NOT empty" or "empty", tostring(r.rc or 0)))
end

local function main()
  local skip_host = os.getenv("BENCH_SKIP_HOST") == "1"
  local ver = (sh(sh_quote(HOST) .. " --version 2>&1")):gsub("%s+$", "")
  local node_ok, node_why = node_setup()
  t_bench0 = system.monotime()   -- BENCH_DEADLINE counts from here: a first npm build takes ~2 minutes
  ensure_broker()
  local ov = api("GET", "/overview")
  print(("nimbus-host AMQP 1.0 bench: %s; RabbitMQ %s (Erlang %s)"):format(ver, tostring(ov.rabbitmq_version),
        tostring(ov.erlang_version)))
  print(("  N=%d events  sessions=%d  payload pad=%d B  host concurrency=%d  bare credit=%d  node window=%d " ..
         "batch<=%d  vhost %s"):format(N, SESSIONS, PAYLOAD, CONC, CREDIT, NODE_WINDOW, NODE_BATCH, VHOST))
  print("  node peer: " .. (node_ok and node_why .. ", spec/bench/node-peer (rhea, better-sqlite3)"
                                    or "SKIPPED: " .. node_why))
  local round_order = (skip_host and "" or ", host") .. (node_ok and ", node" or "") .. ", bare"
  print("  messages: durable, sent unsettled to /exchange/" .. EXCHANGE .. "/" .. EVENT ..
        ", pre-loaded before each timed run; order: bare" .. string.rep(round_order, ROUNDS))
  create_vhost()

  local bares, hosts, nodes = { run_bare() }, {}, {}
  for round = 1, ROUNDS do
    if not skip_host then
      hosts[round] = run_host(round)
      api("DELETE", "/queues" .. vq(ENDPOINT))   -- host stopped: the next runs' messages go to their own queue only
    end
    if node_ok then nodes[round] = run_node(round) end
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

  local H, ND
  local result = {}
  if not skip_host then
    H = summarize(hosts)
    local ratio = H.rate / bare_rate
    print("")
    print(("nimbus-host (trivial Lua handler, endpoint %s, sqlite store with audit + history):"):format(ENDPOINT))
    print_timed(H)
    print(("  ratio           %.2f of the bare consumer (target %.2f: %s)"):format(ratio, TARGET_RATIO,
          ratio >= TARGET_RATIO and "met" or "NOT met"))
    print_tail(H, "host")
    audit_line(H.m, ENDPOINT)
    result[#result + 1] = ("amqp_host_events_per_s=%.0f amqp_bare_events_per_s=%.0f ratio=%.2f " ..
                           "host_cpu_ms_per_1k=%.1f host_peak_rss_mb=%.1f bare_cpu_ms_per_1k=%.1f")
                          :format(H.rate, bare_rate, ratio, H.cpu_run * 1e6 / N, H.hwm / 1024, bare_cpu * 1e6 / N)
  else
    result[#result + 1] = ("amqp_bare_events_per_s=%.0f bare_cpu_ms_per_1k=%.1f"):format(bare_rate, bare_cpu * 1e6 / N)
  end
  if node_ok then
    ND = summarize(nodes)
    local self = ND.m.self
    print("")
    print(("Node.js peer (%s; rhea + better-sqlite3 %s, endpoint %s: audit upsert + history + processed per event, " ..
           "a transaction per <=%d, accept after commit):"):format(self.node or "node", self.sqlite or "?", NODE_EP,
           NODE_BATCH))
    print_timed(ND)
    local self_s = ((self.last_commit_ms or 0) - (self.ready_ms or 0)) / 1000
    if self_s > 0 and (self.batches or 0) > 0 then
      print(("  self-timed      %.0f events/s inside the peer (link attached to last commit, median run); %d " ..
             "transactions, %.0f deliveries each on average, at most %d"):format(N / self_s, self.batches,
             (self.committed or 0) / self.batches, self.max_batch or 0))
    end
    print_tail(ND, "node process")
    audit_line(ND.m, NODEQ)
    result[#result + 1] = ("amqp_node_events_per_s=%.0f node_cpu_ms_per_1k=%.1f node_peak_rss_mb=%.1f")
                          :format(ND.rate, ND.cpu_run * 1e6 / N, ND.hwm / 1024)
  else
    print("")
    print("Node.js peer: SKIPPED: " .. node_why)
  end

  local pre = { ("%.0f msg/s into BareQ"):format(bares[1].preload.rate) }
  if H then pre[#pre + 1] = ("%.0f msg/s into %s"):format(H.m.preload.rate, ENDPOINT) end
  if ND then pre[#pre + 1] = ("%.0f msg/s into %s"):format(ND.m.preload.rate, NODEQ) end
  print(("pre-load (nh-amqp-bench send, window %d): %s"):format(WINDOW, table.concat(pre, ", ")))

  if H or ND then
    print("")
    print("comparison (medians; 2 shared cores: each median's spread is listed above):")
    print("                  events/s   CPU ms/1k events   peak RSS")
    local function row(name, rate, cpu_ms, rss_kb)
      print(("  %-14s %9.0f   %16.1f   %8s"):format(name, rate, cpu_ms, mb(rss_kb)))
    end
    row("bare", bare_rate, bare_cpu * 1e6 / N, bare_rss)
    if H then row("host", H.rate, H.cpu_run * 1e6 / N, H.hwm) end
    if ND then row("node", ND.rate, ND.cpu_run * 1e6 / N, ND.hwm) end
    local function ratio_row(name, a_rate, a_cpu, a_rss, b_rate, b_cpu, b_rss)
      print(("  %-14s %9.2f   %16.2f   %8.2f"):format(name, a_rate / b_rate, a_cpu / b_cpu, a_rss / b_rss))
    end
    if H then ratio_row("host/bare", H.rate, H.cpu_run, H.hwm, bare_rate, bare_cpu, bare_rss) end
    if H and ND then
      ratio_row("host/node", H.rate, H.cpu_run, H.hwm, ND.rate, ND.cpu_run, ND.hwm)
      result[#result + 1] = ("host_node_ratio=%.2f host_node_cpu_ratio=%.2f"):format(H.rate / ND.rate,
                                                                                      H.cpu_run / ND.cpu_run)
    end
    if ND then ratio_row("node/bare", ND.rate, ND.cpu_run, ND.hwm, bare_rate, bare_cpu, bare_rss) end
    print("  (a rate ratio above 1 is faster; a CPU or RSS ratio below 1 is cheaper)")
  end
  print("")
  print("RESULT " .. table.concat(result, " ") .. (" bare_peak_rss_mb=%.1f"):format(bare_rss / 1024))

  for _, r in ipairs(hosts) do
    if r.completed ~= N or r.total ~= N then
      die(("audit: %d Completed of %d rows for %s, expected %d of %d"):format(r.completed, r.total, ENDPOINT, N, N))
    end
    if r.left then die("queue " .. ENDPOINT .. " still holds messages after the host stopped (not settled?)") end
  end
  for _, r in ipairs(nodes) do
    if r.completed ~= N or r.total ~= N then
      die(("node peer audit: %d Completed of %d rows for %s, expected %d of %d"):format(r.completed, r.total, NODE_EP,
          N, N))
    end
    if r.self.committed ~= N then
      die(("node peer: committed %s, expected %d"):format(tostring(r.self.committed), N))
    end
    if r.left then die("queue " .. NODEQ .. " still holds messages after the node peer stopped (not settled?)") end
  end
  if H and STRICT and H.rate / bare_rate < TARGET_RATIO then
    io.stderr:write(("bench: ratio %.2f is below the target %.2f\n"):format(H.rate / bare_rate, TARGET_RATIO))
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

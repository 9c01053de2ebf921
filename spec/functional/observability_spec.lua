-- Observability (issue 14): /metrics in the Prometheus text format (promtool checks it)
-- whose counters move by exactly what happened, /readyz, JSON log lines with their fields
-- for every story an operator must hear of, and lifecycle hooks (nimbus.on) that run
-- once per event after the outcome committed, never change it, and live under budgets.
-- Real host, real HTTP (curl), Debian's promtool.
local nh = require("nh")

local function http_text(url)
  local r = nh.capture(("curl -sS --max-time 30 -w '\\n%%{http_code}' %s"):format(nh.q(url)))
  assert(r.code == 0, "curl failed: " .. r.err)
  local text, status = r.out:match("^(.*)\n(%d+)$")
  return tonumber(status), text
end

local samples = nh.prom_samples

-- One sample by name and label set in the host's order (e.g. 'endpoint="Ep",type="Ok"').
local function value(s, name, labels)
  return s[labels and (name .. "{" .. labels .. "}") or name]
end

local function log_lines(h)
  local rows = {}
  for line in h:log():gmatch("[^\n]+") do
    local ok, row = pcall(nh.decode, line)
    assert(ok and type(row) == "table", "not a JSON log line: " .. line)
    rows[#rows + 1] = row
  end
  return rows
end

-- The first JSON log line whose fields all equal `want` (nil if none).
local function find_line(h, want)
  for _, row in ipairs(log_lines(h)) do
    local all = true
    for k, v in pairs(want) do
      if row[k] ~= v then all = false break end
    end
    if all then return row end
  end
end

local function wait_line(h, want, what)
  return nh.eventually(function() return find_line(h, want) end, nh.DEADLINE,
    function() return ("no log line %s (%s) in:\n%s"):format(nh.encode(want), what or "", h:log()) end)
end

describe("observability", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  local function start(extra, options)
    local h = sb:start(sb:recorder{ types = { "Ok" }, options = options or "retry = { max_retries = 0 }",
                                    extra = extra },
                       { args = { "--admin", "127.0.0.1:0", "--log-format", "json" } })
    local port = assert(h:admin_port(), "no admin line in the log:\n" .. h:log())
    return h, "http://127.0.0.1:" .. port
  end

  local function metrics(base)
    local status, text = http_text(base .. "/metrics")
    assert.are.equal(200, status, text)
    return samples(text), text
  end

  it("serves /metrics that promtool accepts, counters moving by exactly what happened", function()
    local h, base = start()
    local ok1 = sb:publish("Ok", { tag = "a" }, { session = "s1" })
    local ok2 = sb:publish("Ok", { tag = "b" }, { session = "s1" })
    local bad = sb:publish("Ok", { tag = "c", fail = true }, { session = "s2" })
    local behind = sb:publish("Ok", { tag = "d" }, { session = "s2" })
    local off = sb:publish("Ok", { tag = "e", handoff = "erp import", job = "J1" }, { session = "s3" })
    sb:wait_message(ok1, "Completed")
    sb:wait_message(ok2, "Completed")
    local failed = sb:wait_message(bad, "Failed")
    sb:wait_message(behind, "Deferred")
    local pending = sb:wait_message(off, "Pending")

    local s = metrics(base)
    assert.are.equal(2, value(s, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="completed"'))
    assert.are.equal(1, value(s, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="failed"'))
    assert.are.equal(1, value(s, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="parked"'))
    assert.are.equal(1, value(s, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="handed_off"'))
    assert.are.equal(2, value(s, "nimbus_sessions_blocked", 'endpoint="Ep"'))
    assert.are.equal(1, value(s, "nimbus_events_parked", 'endpoint="Ep"'))
    assert.are.equal(1, value(s, "nimbus_handoffs_pending", 'endpoint="Ep"'))
    assert.are.equal(1, value(s, "nimbus_handoffs_opened_total", 'endpoint="Ep"'))
    assert.are.equal(4, value(s, "nimbus_handler_duration_seconds_count", 'endpoint="Ep",type="Ok"'))
    local transport = os.getenv("NH_TRANSPORT") and "amqp" or "embedded"
    assert.are.equal(1, value(s, "nimbus_transport_connected", ('transport="%s"'):format(transport)))

    -- the operator resolves both: the skip replays the parked event, the hand-off completes
    sb:cli_ok({ "skip", failed.event_id, "--reason", "bad card" })
    sb:cli_ok({ "handoff", "complete", pending.event_id })
    sb:wait_message(behind, "Completed")
    sb:wait_event(pending.event_id, "Completed")

    local got = nh.eventually(function()
      local m, t = metrics(base)
      if value(m, "nimbus_sessions_blocked", 'endpoint="Ep"') == 0 then return { m, t } end
    end, nh.DEADLINE, "the blocked-sessions gauge back at 0")
    local s2, text = got[1], got[2]
    assert.are.equal(4, value(s2, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="completed"'))
    assert.are.equal(1, value(s2, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="skipped"'))
    assert.are.equal(1, value(s2, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="failed"'))
    assert.are.equal(0, value(s2, "nimbus_events_parked", 'endpoint="Ep"'))
    assert.are.equal(0, value(s2, "nimbus_handoffs_pending", 'endpoint="Ep"'))
    assert.are.equal(1, value(s2, "nimbus_handoffs_settled_total", 'endpoint="Ep",result="completed"'))
    assert.are.equal(1, value(s2, "nimbus_operator_actions_total", 'endpoint="Ep",action="skip",result="applied"'))
    assert.are.equal(1, value(s2, "nimbus_operator_actions_total",
                              'endpoint="Ep",action="handoff_complete",result="applied"'))
    assert.are.equal(2, value(s2, "nimbus_session_blocks_total", 'endpoint="Ep"'))
    assert.are.equal(2, value(s2, "nimbus_session_unblocks_total", 'endpoint="Ep"'))
    assert.are.equal(5, value(s2, "nimbus_handler_duration_seconds_count", 'endpoint="Ep",type="Ok"'))

    -- promtool reads it as Prometheus would
    nh.write(sb:path("metrics.txt"), text)
    local r = nh.capture("promtool check metrics < " .. nh.q(sb:path("metrics.txt")))
    assert.are.equal(0, r.code, "promtool: " .. r.out .. r.err)
  end)

  it("starts the store-wide gauges from the store: a restarted host shows what is blocked", function()
    local h = start()
    local bad = sb:publish("Ok", { tag = "a", fail = true }, { session = "s1" })
    local behind = sb:publish("Ok", { tag = "b" }, { session = "s1" })
    sb:wait_message(bad, "Failed")
    sb:wait_message(behind, "Deferred")
    h:stop()
    local _, base2 = start()
    local s = metrics(base2)
    assert.are.equal(1, value(s, "nimbus_sessions_blocked", 'endpoint="Ep"'))
    assert.are.equal(1, value(s, "nimbus_events_parked", 'endpoint="Ep"'))
    assert.is_nil(value(s, "nimbus_events_total", 'endpoint="Ep",type="Ok",outcome="failed"'))   -- counters start at 0
  end)

  it("answers /healthz and /readyz", function()
    local _, base = start()
    local status, body = nh.http_json(base .. "/healthz")
    assert.are.equal(200, status)
    assert.are.equal("ok", body.status)
    status, body = nh.http_json(base .. "/readyz")
    assert.are.equal(200, status)
    assert.are.equal("ready", body.status)
  end)

  it("tells each story in one JSON log line with its fields", function()
    local h = start([[
local chk_ep = nimbus.endpoint("Checked", {})
chk_ep:on("Never", function() end)
chk_ep:checker("poll", { every = 0.05 }, function(chk) nimbus.log.info("checker ran", { pending = 0 }) end)
]], "retry = { max_retries = 1, base = 0.05, strategy = 'fixed', jitter = 'none' }, "
     .. "transient = { max_attempts = 2, base = 0.05, max_delay = 0.05 }")
    local bad = sb:publish("Ok", { tag = "a", fail = true, message = "card declined" }, { session = "s1" })
    local failed = sb:wait_message(bad, "Failed")
    local busy = sb:publish("Ok", { tag = "b", transient_times = 1 }, { session = "s2" })
    local dl = sb:publish("Ok", { tag = "c", permanent = "no such customer" }, { session = "s3" })
    local off = sb:publish("Ok", { tag = "d", handoff = "erp import", job = "J9" }, { session = "s4" })
    sb:wait_message(busy, "Completed")
    sb:wait_message(dl, "DeadLettered")
    local pending = sb:wait_message(off, "Pending")

    -- the retry scheduled, then the failure that blocks the session for good
    local retry = wait_line(h, { level = "error", event_id = failed.event_id, outcome = "failed", retry_in_ms = 50 },
                            "a failure with its retry")
    assert.are.equal("Ep", retry.endpoint)
    assert.are.equal("s1", retry.session)
    assert.are.equal("Ok", retry.type)
    assert.truthy(retry.error:find("card declined", 1, true), retry.error)
    local final = wait_line(h, { level = "error", event_id = failed.event_id, outcome = "failed",
                                 msg = "handler failed; session s1 blocked until resubmit or skip" })
    assert.is_nil(final.retry_in_ms)
    local blocked = wait_line(h, { level = "warn", session = "s1", blocked_by = failed.event_id }, "session blocked")
    assert.are.equal("Ep", blocked.endpoint)
    -- a transient failure: warn with its attempt
    local tr = wait_line(h, { level = "warn", outcome = "retrying", session = "s2" }, "a transient retry")
    assert.are.equal(1, tr.attempt)
    assert.are.equal(2, tr.max_attempts)
    assert.are.equal("busy", tr.error)
    wait_line(h, { level = "info", session = "s2", released_by = tr.event_id }, "the session unblocked")
    -- dead-lettered
    local d = wait_line(h, { level = "error", outcome = "dead_lettered", session = "s3" }, "the dead-letter")
    assert.are.equal("no such customer", d.error)
    -- a hand-off opened, then settled by the operator
    wait_line(h, { level = "info", outcome = "handed_off", event_id = pending.event_id }, "hand-off opened")
    sb:cli_ok({ "handoff", "complete", pending.event_id })
    wait_line(h, { level = "info", outcome = "completed", event_id = pending.event_id, action = "handoff_complete" },
              "hand-off settled")
    -- an operator action
    sb:cli_ok({ "skip", failed.event_id, "--reason", "refunded by hand" })
    wait_line(h, { level = "info", outcome = "skipped", event_id = failed.event_id, action = "skip" }, "the skip")
    wait_line(h, { level = "info", session = "s1", released_by = failed.event_id }, "s1 unblocked")
    -- nimbus.log fields are JSON fields; a handler's lines name its event, a checker's its endpoint
    local lua = wait_line(h, { subsys = "lua", msg = "checker ran" }, "the checker's line")
    assert.are.equal("Checked", lua.endpoint)
    assert.are.equal("poll", lua.checker)
    assert.are.equal(0, lua.pending)
  end)

  it("runs nimbus.on hooks once per event after the outcome, posting to a local HTTP route", function()
    local port = nh.free_port()
    local h, base = start(([[
local got = {}
assert(nimbus.http.serve{ host = "127.0.0.1", port = %d, routes = {
  ["POST /chat"] = function(req)
    local f = assert(io.open(DIR .. "/chat.jsonl", "a"))
    f:write(req.body, "\n")
    f:close()
    return 204
  end,
} })
nimbus.on("event_failed", function(info)
  local res = nimbus.http.request{ method = "POST", url = "http://127.0.0.1:%d/chat",
    headers = { ["Content-Type"] = "application/json" },
    body = cjson.encode({ text = info.endpoint .. " " .. info.event_id .. ": " .. info.error,
                          session = info.session_id, hook = info.hook }) }
  assert(res.status == 204, "chat answered " .. tostring(res.status))
end)
nimbus.on("session_blocked", function(info)
  nimbus.log.info("blocked hook", { blocked_by = info.blocked_by })
end)
nimbus.on("session_unblocked", function(info) error("the unblocked hook breaks") end)
nimbus.on("dead_lettered", function(info) while true do end end)
]]):format(port, port))
    local bad = sb:publish("Ok", { tag = "a", fail = true, message = "card declined" }, { session = "s1" })
    local failed = sb:wait_message(bad, "Failed")
    local chat = nh.eventually(function() return nh.read(sb:path("chat.jsonl")) end, nh.DEADLINE, "the chat post")
    local post = nh.decode(chat:match("[^\n]+"))
    assert.are.equal("event_failed", post.hook)
    assert.are.equal("s1", post.session)
    assert.truthy(post.text:find(failed.event_id, 1, true))
    assert.truthy(post.text:find("card declined", 1, true))
    wait_line(h, { msg = "blocked hook", blocked_by = failed.event_id, hook = "session_blocked" })

    -- a hook that raises is logged and counted; the skip it follows stands
    sb:cli_ok({ "skip", failed.event_id })
    sb:wait_event(failed.event_id, "Skipped")
    wait_line(h, { level = "error", hook = "session_unblocked" }, "the failing hook")
    -- a hook that loops is stopped by its CPU budget; the dead-letter stands
    local dl = sb:publish("Ok", { tag = "b", permanent = "no such customer" }, { session = "s2" })
    sb:wait_message(dl, "DeadLettered")
    wait_line(h, { level = "error", hook = "dead_lettered" }, "the looping hook stopped")
    local s = nh.eventually(function()
      local m = metrics(base)
      if value(m, "nimbus_hook_runs_total", 'hook="dead_lettered",result="killed"') then return m end
    end, nh.DEADLINE, "the hook counters")
    assert.are.equal(1, value(s, "nimbus_hook_runs_total", 'hook="event_failed",result="ok"'))
    assert.are.equal(1, value(s, "nimbus_hook_runs_total", 'hook="session_blocked",result="ok"'))
    assert.are.equal(1, value(s, "nimbus_hook_runs_total", 'hook="session_unblocked",result="error"'))
    assert.are.equal(1, value(s, "nimbus_hook_runs_total", 'hook="dead_lettered",result="killed"'))
    -- once per event: one chat post for the one failure
    local n = 0
    for _ in nh.read(sb:path("chat.jsonl")):gmatch("[^\n]+") do n = n + 1 end
    assert.are.equal(1, n)
    assert.is_true(h:alive())
  end)

  it("flags an overdue hand-off once: log line, metric, hook, events and sessions", function()
    local h, base = start([[
nimbus.on("handoff_overdue", function(info)
  local f = assert(io.open(DIR .. "/overdue.jsonl", "a"))
  f:write(cjson.encode(info), "\n")
  f:close()
end)
]])
    local mid = sb:publish("Ok", { tag = "a", handoff = "erp import", job = "J7", expected_by = 0.2 }, { session = "s1" })
    local ev = sb:wait_message(mid, "Pending")
    local line = wait_line(h, { level = "warn", event_id = ev.event_id, external_job_id = "J7" }, "the overdue line")
    assert.truthy(line.msg:find("hand-off overdue", 1, true), line.msg)
    local hooked = nh.eventually(function() return nh.read(sb:path("overdue.jsonl")) end, nh.DEADLINE, "the hook")
    local info = nh.decode(hooked:match("[^\n]+"))
    assert.are.equal("handoff_overdue", info.hook)
    assert.are.equal(ev.event_id, info.event_id)
    assert.are.equal("J7", info.external_job_id)
    assert.truthy(info.expected_by)
    local row = sb:events({ session = "s1" })[1]
    assert.is_true(row.overdue)
    assert.truthy(row.overdue_at)
    local sess = nh.decode(sb:cli_ok({ "sessions", "--json" }):match("[^\n]+"))
    assert.is_true(sess.handoff_overdue)
    -- flagged once: a later event, published after the flag, completes; still one flag
    local later = sb:publish("Ok", { tag = "b" }, { session = "s2" })
    sb:wait_message(later, "Completed")
    local s = metrics(base)
    assert.are.equal(1, value(s, "nimbus_handoffs_overdue_total", 'endpoint="Ep"'))
    local flags = 0
    for _, hrow in ipairs(sb:show(ev.event_id).history) do
      if hrow.message_type == "HandoffOverdue" then flags = flags + 1 end
    end
    assert.are.equal(1, flags)
    local n = 0
    for _ in nh.read(sb:path("overdue.jsonl")):gmatch("[^\n]+") do n = n + 1 end
    assert.are.equal(1, n)
    -- settled: no longer overdue
    sb:cli_ok({ "handoff", "complete", ev.event_id })
    sb:wait_event(ev.event_id, "Completed")
    assert.is_false(sb:events({ session = "s1" })[1].overdue)
  end)

  it("records each run's queue and processing times on the audit row", function()
    start()
    local done = sb:publish("Ok", { tag = "a" }, { session = "s1" })
    local bad = sb:publish("Ok", { tag = "b", fail = true }, { session = "s2" })
    local parked = sb:publish("Ok", { tag = "c" }, { session = "s2" })
    local row = sb:wait_message(done, "Completed")
    assert.is_true(math.type(row.queue_time_ms) == "integer" and row.queue_time_ms >= 0, nh.encode(row))
    assert.is_true(math.type(row.processing_time_ms) == "integer" and row.processing_time_ms >= 0, nh.encode(row))
    sb:wait_message(bad, "Failed")
    local p = sb:wait_message(parked, "Deferred")
    assert.are.equal(nil, p.queue_time_ms)   -- not run yet: no times (JSON null)
    local shown = sb:cli_ok({ "show", row.event_id })
    assert.truthy(shown:find("timing     queued %d+ ms, handler %d+ ms"), shown)
  end)

  it("refuses an unknown hook name at load, naming the valid ones", function()
    sb:adapter("bad.lua", [[
local nimbus = require("nimbus")
nimbus.endpoint("Ep", {}):on("Ok", function() end)
nimbus.on("event_failled", function() end)
]])
    local r = sb:cli({ "run", sb.adapter_dir .. "/bad.lua", "--admin", "off" })
    assert.are.equal(2, r.code)   -- an adapter that does not load is a usage error
    assert.truthy(r.err:find("bad.lua:3: nimbus.on: unknown hook \"event_failled\"", 1, true), r.err)
    assert.truthy(r.err:find("event_failed, dead_lettered, session_blocked, session_unblocked, handoff_overdue", 1,
                             true), r.err)
  end)
  it("runs the chat-alerts sample: a failed payment reaches the chat route once, with the session's block", function()
    local src = os.getenv("NIMBUS_SOURCE_DIR") or "."
    local h = sb:start(src .. "/samples/chat-alerts/adapter.lua", { args = { "--admin", "off", "--log-format", "json" } })
    local id = sb:publish("PaymentCaptured", { order_id = "A-1", amount = -5 }, { session = "A-1" })
    local row = sb:wait_message(id, "Failed")
    local failed = wait_line(h, { msg = "[chat] PaymentService: event " .. row.event_id .. " (PaymentCaptured, session A-1) "
                                       .. "failed: " .. row.error_text })
    assert.are.equal("#integrations", failed.channel)
    wait_line(h, { msg = ("[chat] PaymentService: session A-1 is blocked by %s; resubmit or skip it: nimbus-host show %s")
                         :format(row.event_id, row.event_id) })
    -- a good payment says nothing in the chat
    sb:wait_message(sb:publish("PaymentCaptured", { order_id = "B-1", amount = 5 }, { session = "B-1" }), "Completed")
    local chats = 0
    for _, line in ipairs(log_lines(h)) do
      if type(line.msg) == "string" and line.msg:find("[chat]", 1, true) then chats = chats + 1 end
    end
    assert.are.equal(2, chats)
  end)
end)

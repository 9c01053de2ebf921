-- Traces (docs/observability.md, "Traces: W3C Trace Context and OTLP"): the traceparent that
-- travels with every message, the spans of handler runs and of nimbus.http.request calls, and
-- their export with OTLP/HTTP JSON (--otlp). Real processes only: the collector is an HTTP
-- server of its own (spec/functional/fixtures/otlp_receiver.lua, run with `nimbus-host -l`)
-- that keeps every export it is sent; the adapters record what ctx told them.
--
-- Runs on both transports (NH_TRANSPORT, spec/helpers/nh.lua): the one case that must put a
-- message with a hand-made traceparent on the wire writes the embedded queue row with sqlite3
-- (as handoff_spec and parking_spec do), or sends an AMQP message with spec/helpers/amqp_send.py.
local nh = require("nh")

local HERE = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local RECEIVER = HERE .. "/fixtures/otlp_receiver.lua"

local CONSUMER, CLIENT = 5, 3      -- OTLP SpanKind
local STATUS_ERROR = 2             -- OTLP StatusCode

---------------------------------------------------------------------------- files

-- Complete lines only: a line still being appended (no newline yet) is left for the next poll.
local function lines_of(path)
  local rows = {}
  for line in (nh.read(path) or ""):gmatch("([^\n]*)\n") do
    if line ~= "" then rows[#rows + 1] = nh.decode(line) end
  end
  return rows
end

local function hex(n) return nh.random_hex(n) end

-- "00-<32>-<16>-<2>" -> { version, trace_id, parent_id, flags } (nil when it is not that shape)
local function split_tp(tp)
  if type(tp) ~= "string" then return nil end
  local v, t, p, f = tp:match("^(%x%x)%-(%x+)%-(%x+)%-(%x%x)$")
  if not v or #t ~= 32 or #p ~= 16 then return nil end
  return { version = v, trace_id = t, parent_id = p, flags = f }
end

---------------------------------------------------------------------------- the collector

-- Starts the OTLP receiver (a nimbus-host -l process the sandbox stops at cleanup); port:
-- the one to bind (default: a free one). Returns { port, url (base URL), out (the exports,
-- one JSON document a line), probe (headers seen by GET /probe), hdr, host }.
local function start_receiver(sb, port)
  local n = (sb._receivers or 0) + 1
  sb._receivers = n
  local port_file, out = sb:path(("otlp-%d.port"):format(n)), sb:path(("otlp-%d.jsonl"):format(n))
  local h = sb:spawn({ "-l", RECEIVER, port_file, out, tostring(port or 0) },
                     { store = false, transport = false, wait = false })
  h.receiver = true
  local got = nh.eventually(function()
    local s = nh.read(port_file)
    if h:exit_code() then return "exited" end
    return s and tonumber(s:match("%d+"))
  end, nh.DEADLINE, function() return "the OTLP receiver never wrote its port; log:\n" .. h:log() end)
  assert(got ~= "exited", "the OTLP receiver exited: " .. h:log())
  return { port = got, url = "http://127.0.0.1:" .. got, out = out, probe = out .. ".probe", hdr = out .. ".hdr",
           host = h }
end

local function attr_value(v)
  if type(v) ~= "table" then return v end
  if v.stringValue ~= nil then return v.stringValue end
  if v.intValue ~= nil then return math.tointeger(tonumber(v.intValue)) or tonumber(v.intValue) end
  if v.boolValue ~= nil then return v.boolValue end
  if v.doubleValue ~= nil then return tonumber(v.doubleValue) end
  return v
end

local function attr_map(list)
  local m = {}
  for _, a in ipairs(list or {}) do m[a.key] = attr_value(a.value) end
  return m
end

local function lower(s) return type(s) == "string" and s:lower() or s end

-- Every span the receiver got, flattened: traceId, spanId, parentSpanId ("" when none; ids
-- lower-cased, OTLP/JSON hex is case-insensitive), name, kind, attrs (key -> value),
-- status ({ code, message }), resource (key -> value), raw (the span as sent).
local function spans(recv)
  local out = {}
  for _, doc in ipairs(lines_of(recv.out)) do
    for _, rs in ipairs(doc.resourceSpans or {}) do
      local res = attr_map((rs.resource or {}).attributes)
      for _, ss in ipairs(rs.scopeSpans or {}) do
        for _, sp in ipairs(ss.spans or {}) do
          out[#out + 1] = { traceId = lower(sp.traceId), spanId = lower(sp.spanId),
                            parentSpanId = lower(sp.parentSpanId) or "", name = sp.name, kind = sp.kind,
                            attrs = attr_map(sp.attributes), status = sp.status or {}, resource = res, raw = sp }
        end
      end
    end
  end
  return out
end

local function describe_spans(list)
  local o = {}
  for _, s in ipairs(list) do
    o[#o + 1] = ("%s kind=%s trace=%s span=%s parent=%s event=%s outcome=%s status=%s"):format(tostring(s.name),
      tostring(s.kind), tostring(s.traceId), tostring(s.spanId), tostring(s.parentSpanId),
      tostring(s.attrs["nimbus.event_id"]), tostring(s.attrs["nimbus.outcome"]), nh.encode(s.status))
  end
  return #o > 0 and table.concat(o, "\n") or "(no spans)"
end

local function filter(list, pred)
  local out = {}
  for _, x in ipairs(list) do if pred(x) then out[#out + 1] = x end end
  return out
end

-- Waits until pred(all spans) is truthy; returns that value.
local function wait_spans(recv, pred, what)
  local last
  return nh.eventually(function()
    last = spans(recv)
    return pred(last)
  end, nh.DEADLINE, function() return ("%s; the receiver has:\n%s"):format(what, describe_spans(last or {})) end)
end

-- The handler spans ("process <type>") of one event, waiting for at least n (default 1).
local function wait_handler_spans(recv, event_id, n)
  return wait_spans(recv, function(all)
    local l = filter(all, function(s) return s.attrs["nimbus.event_id"] == event_id and s.kind == CONSUMER end)
    return #l >= (n or 1) and l
  end, ("%d handler span(s) of event %s"):format(n or 1, event_id))
end

---------------------------------------------------------------------------- metrics and log

local samples = nh.prom_samples

local function metrics(h)
  local port = assert(h:admin_port(), "no admin line in the log:\n" .. h:log())
  local r = nh.capture(("curl -sS --max-time 30 -w '\\n%%{http_code}' %s"):format(
    nh.q("http://127.0.0.1:" .. port .. "/metrics")))
  assert(r.code == 0, "curl failed: " .. r.err)
  local text, status = r.out:match("^(.*)\n(%d+)$")
  assert.are.equal("200", status, text)
  return samples(text)
end

local function metric(h, key) return metrics(h)[key] or 0 end

local INVALID = "nimbus_trace_context_invalid_total"
local EXPORT_FAILURES = "nimbus_otlp_export_failures_total"
local function spans_total(result) return ('nimbus_otlp_spans_total{result="%s"}'):format(result) end

-- JSON log lines (the hosts run with --log-format json); anything else is skipped.
local function log_rows(h)
  local rows = {}
  for line in h:log():gmatch("[^\n]+") do
    local ok, row = pcall(nh.decode, line)
    if ok and type(row) == "table" then rows[#rows + 1] = row end
  end
  return rows
end

local function otlp_lines(h, level)
  return filter(log_rows(h), function(r) return r.subsys == "otlp" and r.level == level end)
end

---------------------------------------------------------------------------- the adapter

-- Alpha handles Start: it records its ctx, makes the HTTP calls the payload lists (each
-- result recorded), publishes Next in the same session unless next == false, then fails
-- with "boom: <tag>" when fail is set. Beta handles Next and records its ctx. Records go to
-- seen.jsonl (handler runs) and http.jsonl (HTTP calls) in the sandbox.
local function trace_adapter(sb)
  return sb:adapter("traced.lua", ([[
local nimbus = require("nimbus")
local cjson = require("cjson")
local DIR = %q

local function append(name, row)
  local f = assert(io.open(DIR .. "/" .. name, "a"))
  f:write(cjson.encode(row) .. "\n")
  f:close()
end

local function record(endpoint, event, ctx)
  append("seen.jsonl", { endpoint = endpoint, tag = event.tag, type = ctx.event_type, event_id = ctx.event_id,
    message_id = ctx.message_id, session = ctx.session_id, retry_count = ctx.retry_count,
    trace_id = ctx.trace_id or "(nil)", traceparent = ctx.traceparent or "(nil)" })
end

local alpha = nimbus.endpoint("Alpha", { retry = { max_retries = 1, base = 0.05, strategy = "fixed", jitter = "none" } })
alpha:on("Start", function(event, ctx)
  record("Alpha", event, ctx)
  for i, call in ipairs(event.http or {}) do
    local res, err, code = nimbus.http.request{ method = call.method or "GET", url = call.url, headers = call.headers,
                                                timeout = 10 }
    append("http.jsonl", { tag = event.tag, i = i, url = call.url, status = res and res.status or cjson.null,
                           err = err or cjson.null, code = code or cjson.null })
  end
  if event.next ~= false then
    nimbus.publish("Next", { tag = event.tag .. "-next" }, { session = ctx.session_id })
  end
  if event.fail then error("boom: " .. event.tag) end
end)

local beta = nimbus.endpoint("Beta", {})
beta:on("Next", function(event, ctx) record("Beta", event, ctx) end)
]]):format(sb.dir))
end

local function seen(sb, endpoint, tag)
  return filter(lines_of(sb:path("seen.jsonl")), function(r)
    return (not endpoint or r.endpoint == endpoint) and (not tag or r.tag == tag)
  end)
end

local function wait_seen(sb, endpoint, tag, n)
  return nh.eventually(function()
    local l = seen(sb, endpoint, tag)
    return #l >= (n or 1) and l
  end, nh.DEADLINE, function()
    return ("no %d run(s) of %s tag %s; seen:\n%s"):format(n or 1, endpoint, tag, nh.read(sb:path("seen.jsonl")) or "")
  end)
end

-- Waits for an audit row of `endpoint` in `session` with `status`; returns it.
local function wait_row(sb, endpoint, session, status)
  local rows = sb:wait_rows(function(rows)
    for _, r in ipairs(rows) do
      if r.endpoint == endpoint and r.session_id == session and r.status == status then return true end
    end
  end, ("a %s row of %s in session %s"):format(status, endpoint, session))
  for _, r in ipairs(rows) do
    if r.endpoint == endpoint and r.session_id == session and r.status == status then return r end
  end
end

-- publish with --traceparent (and the sandbox's transport): { code, out, err }
local function publish_tp(sb, event_type, payload, session, traceparent)
  return sb:cli({ "publish", event_type, nh.encode(payload), "--session", session, "--traceparent", traceparent })
end

-- Puts one Start message for Alpha on the wire with the given trace headers, as another
-- producer would: the embedded queue row (sqlite3), or an AMQP message on Alpha's queue.
local function inject_start(sb, m)
  if nh.transport == "amqp" then
    local app = { MessageType = "EventRequest", EventTypeId = "Start", EventId = m.event_id, traceparent = m.traceparent,
                  tracestate = m.tracestate }
    sb:amqp_send("/amq/queue/Alpha", { {
      body = nh.encode(m.payload),
      properties = { id = m.message_id, group_id = m.session, subject = "Start", content_type = "application/json" },
      application_properties = app,
    } })
    return
  end
  local function lit(v) return v == nil and "NULL" or ("'" .. tostring(v):gsub("'", "''") .. "'") end
  local sql = ("INSERT INTO queue(endpoint, session_id, message_id, event_id, event_type, message_type, retry_count,"
    .. " enqueued_at, visible_at, body, traceparent, tracestate) VALUES ('Alpha', %s, %s, %s, 'Start', 'EventRequest',"
    .. " 0, 0, 0, %s, %s, %s)"):format(lit(m.session), lit(m.message_id), lit(m.event_id), lit(nh.encode(m.payload)),
      lit(m.traceparent), lit(m.tracestate))
  local r = nh.capture(("sqlite3 -cmd '.timeout 10000' %s %s"):format(nh.q(sb.store), nh.q(sql)))
  assert(r.code == 0, "sqlite3: " .. r.err)
end

---------------------------------------------------------------------------- specs

describe("tracing", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function()
    -- the hosts first (each sends its last batch at stop), then the receivers
    for _, h in ipairs(sb.hosts) do
      if not h.receiver then pcall(h.stop, h) end
    end
    sb:cleanup()
  end)

  -- A host running the traced adapter; $NIMBUS_OTLP is emptied unless opts.env sets it, so
  -- a host without --otlp exports nothing whatever the caller's environment holds.
  local function start_host(extra_args, opts)
    local args = { "--admin", "127.0.0.1:0", "--log-format", "json" }
    for _, a in ipairs(extra_args or {}) do args[#args + 1] = a end
    local o = { args = args, env = { NIMBUS_OTLP = "" } }
    for k, v in pairs(opts or {}) do o[k] = v end
    return sb:start(trace_adapter(sb), o)
  end

  it("one trace across two endpoints and an HTTP call, exported with OTLP/HTTP JSON", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local probe_url = recv.url .. "/probe"
    local mid = sb:publish("Start", { tag = "t1", http = { { url = probe_url } } }, { session = "s1" })
    local a_row = sb:wait_message(mid, "Completed", "Alpha")
    local b_row = wait_row(sb, "Beta", "s1", "Completed")
    local a_seen = wait_seen(sb, "Alpha", "t1")[1]
    local b_seen = wait_seen(sb, "Beta", "t1-next")[1]

    local all = wait_spans(recv, function(l)
      local a = filter(l, function(s) return s.attrs["nimbus.event_id"] == a_row.event_id end)
      local b = filter(l, function(s) return s.attrs["nimbus.event_id"] == b_row.event_id end)
      local c = filter(l, function(s) return s.kind == CLIENT end)
      return #a >= 1 and #b >= 1 and #c >= 1 and l
    end, "the spans of Alpha, its HTTP call and Beta")
    local a = filter(all, function(s) return s.attrs["nimbus.event_id"] == a_row.event_id end)
    local b = filter(all, function(s) return s.attrs["nimbus.event_id"] == b_row.event_id end)
    local c = filter(all, function(s) return s.kind == CLIENT end)
    assert.are.equal(1, #a, describe_spans(all))
    assert.are.equal(1, #b, describe_spans(all))
    assert.are.equal(1, #c, describe_spans(all))
    a, b, c = a[1], b[1], c[1]

    -- Alpha: a root (published by the CLI without --traceparent), CONSUMER, its attributes
    assert.are.equal("process Start", a.name)
    assert.are.equal(CONSUMER, a.kind)
    assert.are.equal("", a.parentSpanId, "a CLI publish without --traceparent starts no trace")
    assert.truthy(a.traceId:match("^%x+$") and #a.traceId == 32, a.traceId)
    assert.truthy(a.spanId:match("^%x+$") and #a.spanId == 16, a.spanId)
    assert.are_not.equal(("0"):rep(32), a.traceId)
    assert.are.equal("nimbus", a.attrs["messaging.system"])
    assert.are.equal("process", a.attrs["messaging.operation"])
    assert.are.equal("Alpha", a.attrs["messaging.destination.name"])
    assert.are.equal(mid, a.attrs["messaging.message.id"])
    assert.are.equal(a_row.event_id, a.attrs["nimbus.event_id"])
    assert.are.equal("Start", a.attrs["nimbus.event_type"])
    assert.are.equal("s1", a.attrs["nimbus.session_id"])
    assert.are.equal("event", a.attrs["nimbus.run_kind"])
    assert.are.equal(0, a.attrs["nimbus.retry_count"])
    assert.is_not_nil(a.attrs["nimbus.delivery_count"])
    assert.are.equal("completed", a.attrs["nimbus.outcome"])
    assert.are_not.equal(STATUS_ERROR, a.status.code)
    local t0, t1 = math.tointeger(tonumber(a.raw.startTimeUnixNano)), math.tointeger(tonumber(a.raw.endTimeUnixNano))
    assert.truthy(t0 and t1 and t0 > 0 and t0 <= t1, nh.encode(a.raw))

    -- the HTTP client span: a child of Alpha's, in its trace
    assert.are.equal("HTTP GET", c.name)
    assert.are.equal(a.traceId, c.traceId)
    assert.are.equal(a.spanId, c.parentSpanId)
    assert.are.equal("GET", c.attrs["http.request.method"])
    assert.are.equal(probe_url, c.attrs["url.full"])
    assert.are.equal("127.0.0.1", c.attrs["server.address"])
    assert.are.equal(recv.port, c.attrs["server.port"])
    assert.are.equal(200, c.attrs["http.response.status_code"])
    assert.are_not.equal(STATUS_ERROR, c.status.code)

    -- the server got the client span's traceparent
    local heard = lines_of(recv.probe)
    assert.are.equal(1, #heard)
    local tp = split_tp(heard[1].traceparent)
    assert.truthy(tp, "the probe got no valid traceparent header: " .. tostring(heard[1].traceparent))
    assert.are.equal("00", tp.version)
    assert.are.equal(a.traceId, tp.trace_id)
    assert.are.equal(c.spanId, tp.parent_id)
    assert.are.equal("01", tp.flags)

    -- Beta: a child of Alpha's span (Alpha published Next), in the same trace
    assert.are.equal("process Next", b.name)
    assert.are.equal(CONSUMER, b.kind)
    assert.are.equal(a.traceId, b.traceId)
    assert.are.equal(a.spanId, b.parentSpanId)
    assert.are.equal("Beta", b.attrs["messaging.destination.name"])
    assert.are.equal("Next", b.attrs["nimbus.event_type"])
    assert.are.equal("completed", b.attrs["nimbus.outcome"])
    assert.are_not.equal(a.spanId, b.spanId)

    -- what the handlers saw: the trace id (lower-case hex) and their own span's traceparent
    assert.are.equal(a.traceId, a_seen.trace_id)
    assert.are.equal(a.traceId, b_seen.trace_id)
    assert.truthy(b_seen.trace_id:match("^[0-9a-f]+$") and #b_seen.trace_id == 32, b_seen.trace_id)
    assert.are.equal(("00-%s-%s-01"):format(a.traceId, a.spanId), a_seen.traceparent)
    assert.are.equal(("00-%s-%s-01"):format(b.traceId, b.spanId), b_seen.traceparent)

    -- the resource, and the exports' media type
    for _, s in ipairs({ a, b, c }) do
      assert.are.equal("nimbus-host", s.resource["service.name"])
      assert.truthy(type(s.resource["service.instance.id"]) == "string" and s.resource["service.instance.id"] ~= "",
                    nh.encode(s.resource))
      assert.truthy(type(s.resource["service.version"]) == "string" and s.resource["service.version"] ~= "",
                    nh.encode(s.resource))
    end
    local hdrs = nh.eventually(function()
      local l = lines_of(recv.hdr)
      return #l >= 1 and l
    end, nh.DEADLINE, "the exports' headers")
    for _, hdr in ipairs(hdrs) do
      assert.truthy(hdr.content_type:find("application/json", 1, true), hdr.content_type)
    end
  end)

  it("HTTP client spans: a caller's own traceparent header is kept; a refused connection is an ERROR span", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local own = ("00-%s-%s-01"):format(hex(16), hex(8))
    local refused_url = ("http://127.0.0.1:%d/nothing-here"):format(nh.free_port())
    local mid = sb:publish("Start", { tag = "h1", next = false, http = {
      { url = recv.url .. "/probe", headers = { traceparent = own } },
      { url = refused_url },
    } }, { session = "s1" })
    local row = sb:wait_message(mid, "Completed", "Alpha")
    local calls = nh.eventually(function()
      local l = lines_of(sb:path("http.jsonl"))
      return #l >= 2 and l
    end, nh.DEADLINE, "the two HTTP calls")
    assert.are.equal(200, calls[1].status)
    assert.is_nil(calls[2].status, "nothing listens at " .. refused_url)

    local heard = lines_of(recv.probe)
    assert.are.equal(1, #heard)
    assert.are.equal(own, heard[1].traceparent, "the caller set traceparent: it goes as the caller wrote it")

    local all = wait_spans(recv, function(l)
      local a = filter(l, function(s) return s.attrs["nimbus.event_id"] == row.event_id end)
      local c = filter(l, function(s) return s.kind == CLIENT end)
      return #a >= 1 and #c >= 2 and l
    end, "Alpha's span and its two client spans")
    local a = filter(all, function(s) return s.attrs["nimbus.event_id"] == row.event_id end)[1]
    local bad = filter(all, function(s) return s.kind == CLIENT and s.attrs["url.full"] == refused_url end)
    assert.are.equal(1, #bad, describe_spans(all))
    bad = bad[1]
    assert.are.equal("HTTP GET", bad.name)
    assert.are.equal(a.traceId, bad.traceId)
    assert.are.equal(a.spanId, bad.parentSpanId)
    assert.are.equal(STATUS_ERROR, bad.status.code, nh.encode(bad.raw))
    assert.is_nil(bad.attrs["http.response.status_code"])
  end)

  it("publish --traceparent continues the caller's trace", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local trace, parent = hex(16), hex(8)
    local r = publish_tp(sb, "Start", { tag = "c1" }, "s1", ("00-%s-%s-01"):format(trace, parent))
    assert.are.equal(0, r.code, r.err)
    local mid = r.out:match("^%s*(%S+)")
    local row = sb:wait_message(mid, "Completed", "Alpha")
    local b_row = wait_row(sb, "Beta", "s1", "Completed")
    local a = wait_handler_spans(recv, row.event_id)[1]
    local b = wait_handler_spans(recv, b_row.event_id)[1]
    assert.are.equal(trace, a.traceId)
    assert.are.equal(parent, a.parentSpanId)
    assert.are_not.equal(parent, a.spanId)
    assert.are.equal(trace, b.traceId)
    assert.are.equal(a.spanId, b.parentSpanId)
    local a_seen = wait_seen(sb, "Alpha", "c1")[1]
    assert.are.equal(trace, a_seen.trace_id)
    assert.are.equal(("00-%s-%s-01"):format(trace, a.spanId), a_seen.traceparent)
    assert.are.equal(trace, wait_seen(sb, "Beta", "c1-next")[1].trace_id)
  end)

  it("publish refuses a malformed --traceparent with exit 2, naming the option, and sends nothing", function()
    start_host()
    local t, p = hex(16), hex(8)
    for _, bad in ipairs({
      "not-a-traceparent",
      ("00-%s-%s-01"):format(t:sub(2), p),                  -- a 31-digit trace id
      ("00-%s-%s-01"):format(t:upper(), p:upper()),         -- upper-case hex
      ("00-%s-%s-01"):format(("0"):rep(32), p),             -- an all-zero trace id
      ("00-%s-%s-01"):format(t, ("0"):rep(16)),             -- an all-zero parent id
      ("ff-%s-%s-01"):format(t, p),                         -- version ff
      ("00-%s-%s-01-extra"):format(t, p),                   -- version 00 is exactly 55 characters
    }) do
      local r = publish_tp(sb, "Start", { tag = "never", next = false }, "s1", bad)
      assert.are.equal(2, r.code, bad .. ": " .. r.err)
      assert.truthy(r.err:find("--traceparent", 1, true), bad .. ": " .. r.err)
      assert.are.equal("", r.out, bad)
    end
    -- nothing went out: a good event published after them is the only one the handler sees
    local mid = sb:publish("Start", { tag = "after", next = false }, { session = "s1" })
    sb:wait_message(mid, "Completed", "Alpha")
    local runs = seen(sb, "Alpha")
    assert.are.equal(1, #runs, nh.encode(runs))
    assert.are.equal("after", runs[1].tag)
  end)

  it("a malformed traceparent on a message: the handler runs in a new trace, and the metric counts it", function()
    local recv = start_receiver(sb)
    local h = start_host({ "--otlp", recv.url })
    local base = metric(h, INVALID)
    local claimed = "0af7651916cd43dd8448eb211c80319c"

    local function run(n, traceparent, tracestate)
      local m = { session = "m" .. n, message_id = "tp-msg-" .. n .. "-" .. hex(4), event_id = "tp-event-" .. n .. "-" .. hex(4),
                  traceparent = traceparent, tracestate = tracestate, payload = { tag = "m" .. n, next = false } }
      inject_start(sb, m)
      local row = sb:wait_message(m.message_id, "Completed", "Alpha")
      local span = wait_handler_spans(recv, row.event_id)[1]
      local s = wait_seen(sb, "Alpha", "m" .. n)[1]
      assert.are.equal(span.traceId, s.trace_id)
      return span
    end

    -- a parent id that is not hex: ignored, a root span in a fresh trace, counted once
    local s1 = run(1, ("00-%s-00f067aa0ba902zz-01"):format(claimed))
    assert.are.equal("", s1.parentSpanId)
    assert.are_not.equal(claimed, s1.traceId)
    assert.are.equal("completed", s1.attrs["nimbus.outcome"])
    nh.eventually(function() return metric(h, INVALID) >= base + 1 end, nh.DEADLINE, INVALID .. " never moved")
    assert.are.equal(base + 1, metric(h, INVALID))

    -- an all-zero trace id is as invalid
    local s2 = run(2, ("00-%s-00f067aa0ba902b7-01"):format(("0"):rep(32)))
    assert.are.equal("", s2.parentSpanId)
    assert.are_not.equal(("0"):rep(32), s2.traceId)
    assert.are_not.equal(s1.traceId, s2.traceId)
    nh.eventually(function() return metric(h, INVALID) >= base + 2 end, nh.DEADLINE, INVALID .. " never moved again")
    assert.are.equal(base + 2, metric(h, INVALID))

    -- an invalid tracestate is dropped, its valid traceparent kept (and not counted)
    local trace, parent = hex(16), hex(8)
    local s3 = run(3, ("00-%s-%s-01"):format(trace, parent), "Not A=Valid,,=tracestate")
    assert.are.equal(trace, s3.traceId)
    assert.are.equal(parent, s3.parentSpanId)
    assert.are.equal(base + 2, metric(h, INVALID))
  end)

  -- The trace show --json gives for the event (its trace_id).
  local function shown_trace(sb_, event_id)
    local shown = sb_:show(event_id)
    assert.truthy(shown.trace_id, "show --json names no trace_id: " .. nh.encode(shown))
    return shown.trace_id
  end

  -- The event's spans: its first run and its one retry (Alpha has max_retries = 1), by retry_count.
  local function failed_twice(recv, mid, tag)
    local runs = wait_seen(sb, "Alpha", tag, 2)
    local row = sb:wait_message(mid, "Failed", "Alpha")
    local both = wait_handler_spans(recv, row.event_id, 2)
    table.sort(both, function(x, y) return (x.attrs["nimbus.retry_count"] or 0) < (y.attrs["nimbus.retry_count"] or 0) end)
    assert.are.equal(2, #both, describe_spans(both))
    for _, s in ipairs(both) do
      assert.are.equal("process Start", s.name)
      assert.are.equal(STATUS_ERROR, s.status.code, nh.encode(s.raw))
      assert.truthy(type(s.status.message) == "string" and s.status.message:find("boom: " .. tag, 1, true),
                    nh.encode(s.status))
      assert.are.equal("failed", s.attrs["nimbus.outcome"])
      assert.are.equal(row.error_type, s.attrs["error.type"])
    end
    local first, retry = both[1], both[2]
    assert.are.equal(0, first.attrs["nimbus.retry_count"])
    assert.are.equal("event", first.attrs["nimbus.run_kind"])
    assert.are.equal(1, retry.attrs["nimbus.retry_count"])
    assert.are.equal("retry", retry.attrs["nimbus.run_kind"])
    assert.are_not.equal(first.spanId, retry.spanId)
    return first, retry, runs, row
  end

  it("a failing handler's span is an ERROR with the error text; its retry runs in the same trace", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local mid = sb:publish("Start", { tag = "f1", fail = true, next = false }, { session = "s1" })
    local first, retry, runs, row = failed_twice(recv, mid, "f1")
    -- it arrived without a context: the first run started the trace, the retry is its child
    assert.are.equal("", first.parentSpanId)
    assert.are.equal(first.traceId, retry.traceId, "the retry runs in the trace of the event's first run")
    assert.are.equal(first.spanId, retry.parentSpanId, "the retry is a child of the first run")
    for _, r in ipairs(runs) do assert.are.equal(first.traceId, r.trace_id) end
    -- the audit row keeps that trace (show --json)
    assert.are.equal(first.traceId, shown_trace(sb, row.event_id))
  end)

  it("the retry of an event that came with a traceparent runs in that trace", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local trace, parent = hex(16), hex(8)
    local r = publish_tp(sb, "Start", { tag = "f2", fail = true, next = false }, "s1", ("00-%s-%s-01"):format(trace, parent))
    assert.are.equal(0, r.code, r.err)
    local first, retry, runs, row = failed_twice(recv, r.out:match("^%s*(%S+)"), "f2")
    assert.are.equal(trace, first.traceId)
    assert.are.equal(parent, first.parentSpanId)
    assert.are.equal(trace, retry.traceId)
    for _, run in ipairs(runs) do assert.are.equal(trace, run.trace_id) end
    assert.are.equal(trace, shown_trace(sb, row.event_id))
  end)

  it("a parked event keeps its context until it is replayed; a resubmit runs in the event's trace", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local t1, p1, t2, p2 = hex(16), hex(8), hex(16), hex(8)
    local r1 = publish_tp(sb, "Start", { tag = "head", fail = true, next = false }, "s1", ("00-%s-%s-01"):format(t1, p1))
    assert.are.equal(0, r1.code, r1.err)
    local head_mid = r1.out:match("^%s*(%S+)")
    local head = sb:wait_message(head_mid, "Failed", "Alpha")
    wait_seen(sb, "Alpha", "head", 2)
    local r2 = publish_tp(sb, "Start", { tag = "behind", next = false }, "s1", ("00-%s-%s-01"):format(t2, p2))
    assert.are.equal(0, r2.code, r2.err)
    local behind_mid = r2.out:match("^%s*(%S+)")
    local parked = sb:wait_message(behind_mid, "Deferred", "Alpha")

    sb:cli_ok({ "resubmit", head.event_id, "--body", nh.encode({ tag = "head", next = false }) })
    sb:wait_event(head.event_id, "Completed")
    sb:wait_message(behind_mid, "Completed", "Alpha")

    local head_spans = wait_handler_spans(recv, head.event_id, 3)
    local resubmit = filter(head_spans, function(s) return s.attrs["nimbus.run_kind"] == "resubmit" end)
    assert.are.equal(1, #resubmit, describe_spans(head_spans))
    assert.are.equal(t1, resubmit[1].traceId, "a resubmit runs in the trace the event arrived with")
    assert.are.equal("completed", resubmit[1].attrs["nimbus.outcome"])
    for _, s in ipairs(head_spans) do assert.are.equal(t1, s.traceId) end

    local replay = wait_handler_spans(recv, parked.event_id)
    assert.are.equal(1, #replay, describe_spans(replay))
    assert.are.equal("replay", replay[1].attrs["nimbus.run_kind"])
    assert.are.equal(t2, replay[1].traceId, "the parked event kept its own context")
    assert.are.equal(p2, replay[1].parentSpanId)
    assert.are.equal(t2, wait_seen(sb, "Alpha", "behind")[1].trace_id)
    assert.are.equal(t2, shown_trace(sb, parked.event_id))
  end)

  it("with the collector down nothing is lost: exports fail, are counted, and warn once per streak", function()
    local port = nh.free_port()
    local h = start_host({ "--otlp", "http://127.0.0.1:" .. port })
    local function wave(name, n)
      local mids = {}
      for i = 1, n do mids[i] = sb:publish("Start", { tag = name .. i, next = false }, { session = name .. i }) end
      for i = 1, n do sb:wait_message(mids[i], "Completed", "Alpha") end
    end

    wave("w1-", 3)
    nh.eventually(function()
      local m = metrics(h)
      return (m[EXPORT_FAILURES] or 0) >= 1 and (m[spans_total("dropped_export_failed")] or 0) >= 1
    end, nh.DEADLINE, function()
      return "no failed export counted; metrics:\n" .. nh.encode(metrics(h)) .. "\nlog:\n" .. h:log()
    end)
    wave("w2-", 3)
    nh.eventually(function() return metric(h, EXPORT_FAILURES) >= 2 end, nh.DEADLINE,
                  function() return "no second failed export; log:\n" .. h:log() end)
    assert.are.equal(6, #seen(sb, "Alpha"))
    assert.are.equal(0, metric(h, spans_total("exported")))
    assert.are.equal(1, #otlp_lines(h, "warn"), "one warning for the streak; log:\n" .. h:log())
    assert.is_true(h:alive())

    -- the collector comes up on that port: spans flow again, one info line says so
    local infos = #otlp_lines(h, "info")
    local recv = start_receiver(sb, port)
    local mid = sb:publish("Start", { tag = "w3", next = false }, { session = "w3" })
    local row = sb:wait_message(mid, "Completed", "Alpha")
    wait_handler_spans(recv, row.event_id)
    nh.eventually(function() return #otlp_lines(h, "info") > infos end, nh.DEADLINE,
                  function() return "no info line from otlp once the collector answered; log:\n" .. h:log() end)
    assert.are.equal(infos + 1, #otlp_lines(h, "info"), h:log())
    assert.are.equal(1, #otlp_lines(h, "warn"))
    assert.is_true(metric(h, spans_total("exported")) >= 1)
  end)

  it("without --otlp the context still travels: a downstream handler sees the upstream trace id", function()
    start_host()
    local m1 = sb:publish("Start", { tag = "p1" }, { session = "s1" })
    local m2 = sb:publish("Start", { tag = "p2" }, { session = "s2" })
    sb:wait_message(m1, "Completed", "Alpha")
    sb:wait_message(m2, "Completed", "Alpha")
    wait_row(sb, "Beta", "s1", "Completed")
    wait_row(sb, "Beta", "s2", "Completed")
    local a1, b1 = wait_seen(sb, "Alpha", "p1")[1], wait_seen(sb, "Beta", "p1-next")[1]
    local a2, b2 = wait_seen(sb, "Alpha", "p2")[1], wait_seen(sb, "Beta", "p2-next")[1]
    for _, r in ipairs({ a1, b1, a2, b2 }) do
      assert.truthy(r.trace_id:match("^[0-9a-f]+$") and #r.trace_id == 32, nh.encode(r))
      local tp = split_tp(r.traceparent)
      assert.truthy(tp, nh.encode(r))
      assert.are.equal(r.trace_id, tp.trace_id)
      assert.are.equal("01", tp.flags, "new traces are sampled")
    end
    assert.are.equal(a1.trace_id, b1.trace_id)
    assert.are.equal(a2.trace_id, b2.trace_id)
    assert.are_not.equal(a1.trace_id, a2.trace_id, "two CLI publishes start two traces")
    assert.are_not.equal(split_tp(a1.traceparent).parent_id, split_tp(b1.traceparent).parent_id,
                         "each handler has its own span")
  end)

  it("an unsampled context travels on with flags 00 and nothing of it is exported", function()
    local recv = start_receiver(sb)
    start_host({ "--otlp", recv.url })
    local trace = hex(16)
    local r = publish_tp(sb, "Start", { tag = "u1", http = { { url = recv.url .. "/probe" } } }, "s1",
                         ("00-%s-%s-00"):format(trace, hex(8)))
    assert.are.equal(0, r.code, r.err)
    sb:wait_message(r.out:match("^%s*(%S+)"), "Completed", "Alpha")
    wait_row(sb, "Beta", "s1", "Completed")
    local a_seen, b_seen = wait_seen(sb, "Alpha", "u1")[1], wait_seen(sb, "Beta", "u1-next")[1]
    for _, s in ipairs({ a_seen, b_seen }) do
      local tp = split_tp(s.traceparent)
      assert.truthy(tp, nh.encode(s))
      assert.are.equal(trace, tp.trace_id)
      assert.are.equal("00", tp.flags, "the unsampled flag travels on: " .. s.traceparent)
    end
    local heard = split_tp(lines_of(recv.probe)[1].traceparent)
    assert.are.equal(trace, heard.trace_id)
    assert.are.equal("00", heard.flags)

    -- a sampled event after it: once its span is in, nothing of the unsampled trace is
    local mid = sb:publish("Start", { tag = "later", next = false }, { session = "s2" })
    local row = sb:wait_message(mid, "Completed", "Alpha")
    wait_handler_spans(recv, row.event_id)
    local leaked = filter(spans(recv), function(s) return s.traceId == trace end)
    assert.are.equal(0, #leaked, describe_spans(leaked))
  end)

  it("exports to $NIMBUS_OTLP when --otlp is not given", function()
    local recv = start_receiver(sb)
    start_host(nil, { env = { NIMBUS_OTLP = recv.url } })
    local mid = sb:publish("Start", { tag = "e1", next = false }, { session = "s1" })
    local row = sb:wait_message(mid, "Completed", "Alpha")
    local s = wait_handler_spans(recv, row.event_id)[1]
    assert.are.equal("process Start", s.name)
    assert.are.equal("nimbus-host", s.resource["service.name"])
  end)
end)

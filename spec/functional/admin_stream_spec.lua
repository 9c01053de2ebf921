-- The admin API's Server-Sent Events (GET /api/v1/stream): a client gets the counts at
-- once, then `event: status` for every event that changes (its latest state) and new
-- counts; `endpoint` filters; a client that leaves does not disturb the host, ten at once
-- all get the news, a reconnecting client resumes after its Last-Event-ID. Real host,
-- real HTTP: each client is a `curl -sN` in the background writing to a file.
local nh = require("nh")
local cjson = require("cjson")

local get = nh.http_json

-- The events of an SSE text: { event =, data = (decoded JSON), id = } per block; comments
-- (": keep-alive") and field-only blocks (retry:) are left out.
local function parse_sse(text)
  local out = {}
  for block in text:gmatch("(.-)\n\n") do
    local ev = {}
    for line in block:gmatch("[^\n]+") do
      local field, value = line:match("^(%a+): ?(.*)$")
      if field then ev[field] = value end
    end
    if ev.event then
      local ok, decoded = pcall(nh.decode, ev.data or "")
      ev.data = ok and decoded or ev.data
      out[#out + 1] = ev
    end
  end
  return out
end

local Stream = {}
Stream.__index = Stream

function Stream:text() return nh.read(self.path) or "" end
function Stream:events() return parse_sse(self:text()) end

-- Waits until pred(events) holds; returns what it returned.
function Stream:wait(pred, what)
  return nh.eventually(function() return pred(self:events()) end, nh.DEADLINE,
    function() return ("%s; stream %s so far:\n%s"):format(what, self.name, self:text()) end)
end

function Stream:wait_counts(pred)
  return self:wait(function(evs)
    for _, e in ipairs(evs) do
      if e.event == "counts" and type(e.data) == "table" and (not pred or pred(e.data)) then return e end
    end
  end, "a counts event")
end

-- Waits for `event: status` of event_id with that status; returns the event.
function Stream:wait_status(event_id, status)
  return self:wait(function(evs)
    for _, e in ipairs(evs) do
      if e.event == "status" and type(e.data) == "table" and e.data.event_id == event_id and
         (not status or e.data.status == status) then
        return e
      end
    end
  end, ("status %s of %s"):format(tostring(status), event_id))
end

function Stream:statuses_of(event_id)
  local n = 0
  for _, e in ipairs(self:events()) do
    if e.event == "status" and type(e.data) == "table" and e.data.event_id == event_id then n = n + 1 end
  end
  return n
end

-- Ends the client (the connection drops, as when a browser tab closes).
function Stream:close()
  if self.pid then nh.sh(("kill %d 2>/dev/null"):format(self.pid)) end
  self.pid = nil
end

-- The count of one status for one endpoint in a counts event's data.
local function count_of(counts, endpoint, status)
  for _, ep in ipairs(counts.endpoints or {}) do
    if ep.endpoint == endpoint then return ep.counts[status] end
  end
end

describe("admin event stream", function()
  local sb, base, streams

  before_each(function()
    sb = nh.sandbox()
    streams = {}
  end)
  after_each(function()
    for _, s in ipairs(streams) do s:close() end
    sb:cleanup()
  end)

  -- A host with the API on a free port (adapters: a list of recorder options, or of
  -- adapter files).
  local function start(adapters)
    local files = {}
    for i, opts in ipairs(adapters or { {} }) do
      if type(opts) == "table" then
        opts.types = opts.types or { "Ok" }
        opts.options = opts.options or "retry = { max_retries = 0 }"
        files[i] = sb:recorder(opts)
      else
        files[i] = opts
      end
    end
    local h = sb:start(files, { args = { "--admin", "127.0.0.1:0" } })
    local port = h:admin_port()
    assert(port, "no admin line in the log:\n" .. h:log())
    base = "http://127.0.0.1:" .. port .. "/api/v1"
    return h
  end

  -- Opens a client on /stream (query: "?endpoint=..."; headers: a list) and waits for its
  -- first counts event, so the stream is established before the test goes on.
  local function open(query, headers)
    local name = "client" .. (#streams + 1)
    local s = setmetatable({ name = name, path = sb:path(name .. ".sse") }, Stream)
    local extra = ""
    for _, h in ipairs(headers or {}) do extra = extra .. " -H " .. nh.q(h) end
    local pidfile = sb:path(name .. ".pid")
    assert(nh.sh(("curl -sN --max-time 300%s %s >%s 2>/dev/null </dev/null & echo $! >%s"):format(extra,
      nh.q(base .. "/stream" .. (query or "")), nh.q(s.path), nh.q(pidfile))) == 0)
    s.pid = tonumber(nh.eventually(function() return nh.read(pidfile) end, 10, "curl's pid"):match("%d+"))
    streams[#streams + 1] = s
    s:wait_counts()
    return s
  end

  it("sends the counts at once, then each changed event's latest status and new counts", function()
    local h = start()
    local s = open()
    assert.truthy(s:text():find("^retry: 2000\n\n"), s:text())
    local head = nh.capture(("curl -s -i -N --max-time 2 %s"):format(nh.q(base .. "/stream")))
    assert.truthy(head.out:find("Content-Type: text/event-stream", 1, true), head.out)
    assert.truthy(head.out:find("Cache-Control: no-store", 1, true), head.out)

    local ok = sb:wait_message(sb:publish("Ok", { tag = "a" }, { session = "s1" }), "Completed")
    local bad = sb:wait_message(sb:publish("Ok", { tag = "b", fail = true }, { session = "s2" }), "Failed")
    local st = s:wait_status(ok.event_id, "Completed")
    assert.equal("s1", st.data.session_id)
    assert.equal(ok.endpoint, st.data.endpoint)
    local failed = s:wait_status(bad.event_id, "Failed")
    assert.truthy(failed.data.error_text:find("boom: b", 1, true))
    -- counts follow once the changes came (at most every 2 s)
    local counts = s:wait_counts(function(c)
      return count_of(c, ok.endpoint, "Completed") == 1 and count_of(c, ok.endpoint, "Failed") == 1
    end)
    assert.equal(1, counts.data.endpoints[1].live_hosts)
    -- the ids a client resumes from only grow
    local last = -1
    for _, e in ipairs(s:events()) do
      if e.id then
        assert.truthy(tonumber(e.id) > last)
        last = tonumber(e.id)
      end
    end
    assert.truthy(last > 0, "no id: in\n" .. s:text())
    assert.truthy(h:alive())
  end)

  it("filters status events to one endpoint; an unknown endpoint or parameter is 400", function()
    start({ { endpoint = "Alpha", types = { "Ok" } }, { endpoint = "Beta", types = { "Other" } } })
    local all, beta = open(), open("?endpoint=Beta")
    local a = sb:wait_message(sb:publish("Ok", { tag = "a" }, { session = "s1" }), "Completed")
    all:wait_status(a.event_id, "Completed")
    local b = sb:wait_message(sb:publish("Other", { tag = "b" }, { session = "s2" }), "Completed")
    all:wait_status(b.event_id, "Completed")
    beta:wait_status(b.event_id, "Completed")
    -- Alpha's event went out a tick before Beta's: had the filter let it through, it would be here
    assert.equal(0, beta:statuses_of(a.event_id))

    local status, body = get(base .. "/stream?endpoint=Unknown")
    assert.equal(400, status)
    assert.equal("endpoint", body.field)
    status, body = get(base .. "/stream?colour=red")
    assert.equal(400, status)
    assert.equal("colour", body.field)
  end)

  it("survives a client that leaves mid-stream: the host keeps working, a later stream works", function()
    local h = start()
    local first = open()
    local e1 = sb:wait_message(sb:publish("Ok", { tag = "e1" }, { session = "s1" }), "Completed")
    first:wait_status(e1.event_id, "Completed")
    first:close()
    for i = 2, 6 do sb:publish("Ok", { tag = "e" .. i }, { session = "s" .. i }) end
    sb:wait_rows(function(rows) return nh.count(rows, function(r) return r.status == "Completed" end) == 6 end,
                 "six completed")
    assert.truthy(h:alive())
    local later = open()
    local e7 = sb:wait_message(sb:publish("Ok", { tag = "e7" }, { session = "s7" }), "Completed")
    later:wait_status(e7.event_id, "Completed")
    -- a host with a client still connected stops at once, and cleanly
    assert.equal(0, h:stop())
    assert.falsy(h:log():find("handles still open", 1, true), h:log())
    assert.falsy(h:log():find("%serror%s+%["), h:log())
  end)

  it("sends the status to ten clients at once", function()
    local h = start()
    local clients = {}
    for i = 1, 10 do clients[i] = open() end
    local row = sb:wait_message(sb:publish("Ok", { tag = "x", fail = true }, { session = "s1" }), "Failed")
    for i = 1, 10 do
      local e = clients[i]:wait_status(row.event_id, "Failed")
      assert.equal(row.event_id, e.data.event_id)
    end
    assert.equal(0, h:stop())   -- ten streams open: ended, freed (ASan's leak check would say)
  end)

  it("sends a burst larger than a tick's share in slices, every event, without dropping the client", function()
    -- BURST failures with a 300-character error each, handled in a second or so: megabytes
    -- of status events a tick, past a client's buffer cap, had they all gone out at once
    local BURST = 3000
    local h = start({ sb:adapter("Burst.lua", [[
local nimbus = require("nimbus")
local ep = nimbus.endpoint("Ep", { retry = { max_retries = 0 } })
ep:on("Ok", function() error(string.rep("x", 300)) end)
ep:on("Burst", function(e)
  for i = 1, e.n do nimbus.publish("Ok", { i = i }, { session = "b" .. i }) end
end)]]) })
    local s = open()
    sb:publish("Burst", { n = BURST }, { session = "s0" })
    local rows = sb:wait_rows(function(r)
      return nh.count(r, function(x) return x.status == "Failed" end) == BURST
    end, "the burst failed")
    local want = {}
    for _, r in ipairs(rows) do if r.status == "Failed" then want[r.event_id] = true end end
    s:wait(function(evs)
      local got = {}
      for _, e in ipairs(evs) do
        if e.event == "status" and type(e.data) == "table" and e.data.status == "Failed" then got[e.data.event_id] = true end
      end
      for id in pairs(want) do if not got[id] then return false end end
      return true
    end, "every event of the burst")
    assert.falsy(h:log():find("dropping a stream client", 1, true), h:log())
    assert.equal(0, h:stop())
  end)

  it("resumes after the Last-Event-ID a reconnecting client sends", function()
    start()
    local s = open()
    local e1 = sb:wait_message(sb:publish("Ok", { tag = "r1" }, { session = "s1" }), "Completed")
    local got = s:wait(function(evs)
      for _, e in ipairs(evs) do
        if e.event == "status" and e.data.event_id == e1.event_id and e.data.status == "Completed" and e.id then
          return e
        end
      end
    end, "e1 with an id")
    s:close()
    local e2 = sb:wait_message(sb:publish("Ok", { tag = "r2" }, { session = "s2" }), "Completed")
    local again = open(nil, { "Last-Event-ID: " .. got.id })
    again:wait_status(e2.event_id, "Completed")
    assert.equal(0, again:statuses_of(e1.event_id))   -- seen before the id: not sent again
  end)
end)

-- Bulk operator commands, run as an operator would on real processes: `resubmit --all` and
-- `skip --all` with their filters and --dry-run, resuming an interrupted run, failure groups
-- (`failures`), and the filters of `events` (--count, --limit, --type, --since, --follow).
local nh = require("nh")

local RESUBMIT, SKIP = "ResubmissionRequest", "SkipRequest"

-- The spec's adapter: one endpoint per file, retry off (a failure is Failed at once).
-- Every call is appended to the sandbox's calls.log (the format of sb:recorder, so
-- sb:calls / sb:call_tags work). Payload:
--   fail = "text"         error("text", 0) (no position prefix: the text is exactly this)
--   fail_typed = "text"   error({ message = text, type = error_type }) (error type error_type)
--   permanent = "text"    error(nimbus.permanent(text)) (DeadLettered)
-- all three only while the sandbox file `fixed` does not exist (sb:touch("fixed") fixes them);
--   seed = { n =, type =, prefix =, fail = "fmt %d" }   publishes n events of `type`, each in
--                         its own session prefix..i, with fail = fmt:format(i) when given
local function adapter(sb, endpoint, types)
  local tlist = {}
  for i, t in ipairs(types) do tlist[i] = ("%q"):format(t) end
  return sb:adapter(endpoint .. ".lua", ([[
local nimbus = require("nimbus")
local cjson = require("cjson")
local CALLS, DIR, ENDPOINT = %q, %q, %q

local function fixed()
  local f = io.open(DIR .. "/fixed", "r")
  if f then f:close() return true end
  return false
end

local function handle(ev, ctx)
  local f = assert(io.open(CALLS, "a"))
  f:write(cjson.encode({ tag = ev.tag, endpoint = ENDPOINT, event_id = ctx.event_id, session = ctx.session_id,
                         type = ctx.event_type, kind = ctx.kind }), "\n")
  f:close()
  if ev.seed then
    for i = 1, ev.seed.n do
      local tag = ev.seed.prefix .. i
      nimbus.publish(ev.seed.type, { tag = tag, fail = ev.seed.fail and ev.seed.fail:format(i) }, { session = tag })
    end
    return
  end
  if ev.hold then   -- in a handler until the file "release" exists
    while true do
      local r = io.open(DIR .. "/release", "r")
      if r then r:close() break end
      nimbus.sleep(0.05)
    end
  end
  if fixed() then return end
  if ev.fail then error(ev.fail, 0) end
  if ev.fail_typed then error({ message = ev.fail_typed, type = ev.error_type }) end
  if ev.permanent then error(nimbus.permanent(ev.permanent)) end
end

local ep = nimbus.endpoint(ENDPOINT, { retry = { max_retries = 0 } })
for _, t in ipairs({ %s }) do ep:on(t, handle) end
]]):format(sb.calls_path, sb.dir, endpoint, table.concat(tlist, ", ")))
end

-- `nimbus-host ARGS... --store STORE` with extra environment variables: { code, out, err }.
local function run_env(sb, env, args)
  local parts = {}
  for k, v in pairs(env) do parts[#parts + 1] = k .. "=" .. nh.q(v) end
  parts[#parts + 1] = nh.q(nh.bin())
  for _, a in ipairs(args) do parts[#parts + 1] = nh.q(a) end
  parts[#parts + 1] = "--store"
  parts[#parts + 1] = nh.q(sb.store)
  return nh.capture(table.concat(parts, " "), sb.dir)
end

local function cat(a, b)
  local out = {}
  for _, x in ipairs(a) do out[#out + 1] = x end
  for _, x in ipairs(b or {}) do out[#out + 1] = x end
  return out
end

local function sorted(list)
  local out = {}
  for i, x in ipairs(list) do out[i] = x end
  table.sort(out)
  return out
end

-- A dry run's output: the count, the listed event ids, and the "... and K more" number.
local function parse_dry(out, verb)
  -- (after an interrupted run, a first line says the count is what resuming it would queue)
  local n = out:match("^(%d+) events? would be " .. verb .. " %(dry run: nothing was queued%)\n")
    or out:match("^an interrupted run of this command [^\n]*\n(%d+) events? would be " .. verb ..
                 " %(dry run: nothing was queued%)\n")
  assert(n, "not the output of a dry run: " .. out)
  local ids = {}
  for id in out:gmatch("\n  (%S+)  %S+  %S+  %S+  %S+") do ids[#ids + 1] = id end
  return tonumber(n), ids, tonumber(out:match("\n  %.%.%. and (%d+) more\n"))
end

-- A real run's output: the number queued and the per-endpoint counts.
local function parse_queued(out, cmd)
  local n, per = out:match("queued (%d+) " .. cmd .. " requests? for ([^;]+); the hosts owning the endpoints")
  assert(n, "not the output of a real run: " .. out)
  local eps = {}
  for ep, k in per:gmatch("(%S+) %((%d+)%)") do eps[ep] = tonumber(k) end
  return tonumber(n), eps
end

-- How many `message_type` requests the event's history holds, and whether the last one
-- still waits (nothing recorded after it).
local function requests_of(shown, message_type)
  local n, waiting = 0, false
  for _, h in ipairs(shown.history or {}) do
    if h.message_type == message_type and h.status == "Requested" then
      n = n + 1
      waiting = true
    elseif waiting then
      waiting = false
    end
  end
  return n, waiting
end

local function request_counts(sb, ids, message_type)
  local out = {}
  for _, id in ipairs(ids) do out[id] = (requests_of(sb:show(id), message_type)) end
  return out
end

-- Waits until every request of the events has been applied by the host.
local function wait_applied(sb, ids, message_type)
  for _, id in ipairs(ids) do
    local shown
    nh.eventually(function()
      shown = sb:show(id)
      local n, waiting = requests_of(shown, message_type)
      return n > 0 and not waiting
    end, nil, function() return "request never applied: " .. nh.encode(shown or {}) end)
  end
end

-- failures --json, decoded
local function failures(sb, endpoint)
  local args = { "failures", "--json" }
  if endpoint then args[#args + 1] = "--endpoint"; args[#args + 1] = endpoint end
  return nh.json_lines(sb:cli_ok(args))
end

local function group_where(groups, endpoint, message, error_type)
  for _, g in ipairs(groups) do
    if g.endpoint == endpoint and g.message == message and (not error_type or g.error_type == error_type) then
      return g
    end
  end
  error(("no failure group %s / %s in %s"):format(endpoint, message, nh.encode(groups)), 2)
end

local function count(sb, filters)
  local out = sb:cli_ok(cat({ "events", "--count" }, filters))
  local n = out:match("^(%d+)\n$")
  assert(n, "events --count printed " .. out)
  return tonumber(n)
end

-- The same while the endpoint may have no events yet (then --endpoint is refused): 0.
local function count_soon(sb, filters)
  local r = sb:cli(cat({ "events", "--count" }, filters))
  return r.code == 0 and tonumber(r.out:match("^(%d+)\n$")) or 0
end

describe("bulk operator commands", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("resubmit --all --group replays every session of the group in its own order", function()
    sb:start(adapter(sb, "Ep", { "Order" }))
    local N = 20
    local parked = {}
    for i = 1, N do
      sb:publish("Order", { tag = "h" .. i, fail = ("order %d failed"):format(100 + 37 * i) }, { session = "s" .. i })
    end
    for k = 1, 3 do
      for i = 1, N do
        parked[#parked + 1] = sb:publish("Order", { tag = ("s%d-p%d"):format(i, k) }, { session = "s" .. i })
      end
    end
    sb:wait_rows(function(rows)
      return nh.count(rows, function(r) return r.status == "Failed" end) == N
        and nh.count(rows, function(r) return r.status == "Deferred" end) == 3 * N
    end, "20 Failed heads, 60 Deferred")

    local groups = failures(sb)
    assert.equal(1, #groups, "one group for every order failure: " .. nh.encode(groups))
    local g = groups[1]
    assert.equal("order <n> failed", g.message)
    assert.equal(N, g.count)
    assert.equal("Ep", g.endpoint)
    assert.equal("LuaError", g.error_type)
    assert.matches("^%x+$", g.group)
    assert.equal(12, #g.group)

    sb:touch("fixed")
    local dry = sb:cli_ok({ "resubmit", "--all", "--group", g.group, "--dry-run" })
    local n, listed, more = parse_dry(dry, "resubmitted")
    assert.equal(N, n)
    assert.equal(10, #listed)
    assert.equal(N - 10, more)
    local out = sb:cli_ok({ "resubmit", "--all", "--group", g.group })
    local queued, eps = parse_queued(out, "resubmit")
    assert.equal(N, queued)
    assert.same({ Ep = N }, eps)
    assert.not_matches("no running host", out, 1, true)

    local rows = sb:wait_rows(function(rs)
      return #rs == 4 * N and nh.count(rs, function(r) return r.status == "Completed" end) == 4 * N
    end, "every event Completed")
    assert.equal(4 * N, #rows)
    for i = 1, N do
      local s = "s" .. i
      assert.same({ "h" .. i, "h" .. i, s .. "-p1", s .. "-p2", s .. "-p3" }, sb:call_tags(s))
      local kinds = {}
      for _, c in ipairs(sb:calls_where("session", s)) do kinds[#kinds + 1] = c.kind end
      assert.same({ "event", "resubmit", "replay", "replay", "replay" }, kinds)
    end
    nh.eventually(function() return #sb:sessions() == 0 end, nil, "every session free")
    assert.equal("no unresolved failures\n", sb:cli_ok({ "failures" }))
  end)

  describe("filters: --dry-run counts what the real run queues, and the real run requests exactly the selected events", function()
    -- One store for all the filters (these its run in order and share it): EpA (Order, Invoice) and EpB (Shipment),
    -- two batches of failures with a time between them. Nothing is ever fixed, so a resubmitted
    -- event ends in the status it had; only its updated_at moves (the time filters go first).
    local fs, tag_of, ids, T
    local function id_of(tag)
      for id, t in pairs(tag_of) do if t == tag then return id end end
      error("no event tagged " .. tag)
    end
    local function tags(list)
      local out = {}
      for i, id in ipairs(list) do out[i] = tag_of[id] end
      table.sort(out)
      return out
    end

    lazy_setup(function()
      fs = nh.sandbox()
      fs:start({ adapter(fs, "EpA", { "Order", "Invoice" }), adapter(fs, "EpB", { "Shipment" }) })
      local mid_tag = {}
      local function pub(typ, payload, session)
        mid_tag[fs:publish(typ, payload, { session = session })] = payload.tag
      end
      local batch1 = {
        { "Order", { tag = "a1", fail = "order 17 failed" }, "a1" },
        { "Order", { tag = "a1-parked" }, "a1" },
        { "Order", { tag = "a2", fail = "order 942 failed" }, "a2" },
        { "Invoice", { tag = "i1", fail = "invoice rejected by ERP" }, "i1" },
        { "Invoice", { tag = "i2", fail = "invoice rejected by ERP" }, "i2" },
        { "Order", { tag = "d1", permanent = "bad payload 5" }, "d1" },
        { "Order", { tag = "d2", permanent = "bad payload 6" }, "d2" },
        { "Order", { tag = "c1" }, "c1" },
        { "Shipment", { tag = "b1", fail = "carrier timeout" }, "b1" },
        { "Shipment", { tag = "b1-parked" }, "b1" },
        { "Shipment", { tag = "b2", fail = "carrier timeout" }, "b2" },
        { "Shipment", { tag = "c2" }, "c2" },
      }
      for _, p in ipairs(batch1) do pub(p[1], p[2], p[3]) end
      local rows1 = fs:wait_rows(function(rows)
        return #rows == #batch1 and nh.count(rows, function(r) return r.status == "Failed" end) == 6
          and nh.count(rows, function(r) return r.status == "Deferred" end) == 2
          and nh.count(rows, function(r) return r.status == "DeadLettered" end) == 2
          and nh.count(rows, function(r) return r.status == "Completed" end) == 2
      end, "batch 1 settled")
      local last1 = ""
      for _, r in ipairs(rows1) do if r.updated_at > last1 then last1 = r.updated_at end end
      pub("Order", { tag = "a3", fail = "order 3 failed" }, "a3")
      pub("Invoice", { tag = "i3" }, "i3")
      pub("Shipment", { tag = "b3", fail = "carrier timeout" }, "b3")
      local rows = fs:wait_rows(function(rs)
        return #rs == #batch1 + 3 and nh.count(rs, function(r) return r.status == "Failed" end) == 8
          and nh.count(rs, function(r) return r.status == "Completed" end) == 3
      end, "batch 2 settled")
      tag_of, ids = {}, {}
      local first2
      for _, r in ipairs(rows) do
        tag_of[r.event_id] = assert(mid_tag[r.message_id], "a row of an unknown message")
        ids[#ids + 1] = r.event_id
        if r.updated_at > last1 and (not first2 or r.updated_at < first2) then first2 = r.updated_at end
      end
      -- the first change of batch 2, as `events --json` shows it: --since T is batch 2, --before T batch 1
      T = first2
      assert.is_true(T > last1)
    end)

    lazy_teardown(function() if fs then fs:cleanup() end end)

    -- Dry run, then the real run, of `resubmit --all FILTERS`; checks both against the tags
    -- expected and waits until the host applied every request.
    local function check(filters, expected)
      local before = request_counts(fs, ids, RESUBMIT)
      local dry = fs:cli_ok(cat({ "resubmit", "--all" }, cat(filters, { "--dry-run" })))
      local n, listed = parse_dry(dry, "resubmitted")
      assert.same(before, request_counts(fs, ids, RESUBMIT), "a dry run queues nothing")
      local out = fs:cli_ok(cat({ "resubmit", "--all" }, filters))
      local queued = 0
      if #expected == 0 then
        assert.matches("^no events match %-%-[^\n]+ %(nothing to do%)\n$", out)
      else
        queued = parse_queued(out, "resubmit")
      end
      local after = request_counts(fs, ids, RESUBMIT)
      local requested = {}
      for _, id in ipairs(ids) do
        assert.is_true(after[id] - before[id] <= 1, "one request per event")
        if after[id] > before[id] then requested[#requested + 1] = id end
      end
      assert.same(sorted(expected), tags(requested), "the events requested")
      assert.equal(#expected, queued, "queued = the events requested")
      assert.equal(#expected, n, "the dry run's count = what the real run queued")
      if #expected <= 10 then assert.same(sorted(expected), tags(listed), "the dry run lists them") end
      wait_applied(fs, requested, RESUBMIT)
      return out, dry
    end

    it("--since / --before (the event's last change) split the two batches", function()
      check({ "--status", "failed", "--since", T }, { "a3", "b3" })
      check({ "--status", "failed", "--before", T }, { "a1", "a2", "i1", "i2", "b1", "b2" })
    end)

    it("--endpoint: only that endpoint's events, never a parked one; Completed ones only with --force", function()
      local out = check({ "--endpoint", "EpB" }, { "b1", "b2", "b3" })
      local _, eps = parse_queued(out, "resubmit")
      assert.same({ EpB = 3 }, eps)
      out = check({ "--endpoint", "EpB", "--force" }, { "b1", "b2", "b3", "c2" })
      assert.same({ EpB = 4 }, select(2, parse_queued(out, "resubmit")))
      assert.equal("Deferred", fs:row(id_of("b1-parked")).status)
    end)

    it("--status, case-insensitive: failed and deadlettered are apart", function()
      check({ "--status", "DeadLettered" }, { "d1", "d2" })
      local _, dry = check({ "--status", "FAILED" }, { "a1", "a2", "a3", "i1", "i2", "b1", "b2", "b3" })
      assert.matches("^8 events would be resubmitted", dry)
      -- resolved events run again only when asked to (their side effects repeat)
      check({ "--status", "completed", "--endpoint", "EpA" }, {})
      check({ "--status", "completed", "--endpoint", "EpA", "--force" }, { "c1", "i3" })
    end)

    it("--type", function()
      check({ "--status", "failed", "--type", "Invoice" }, { "i1", "i2" })
      check({ "--endpoint", "EpA", "--type", "Invoice" }, { "i1", "i2" })
      check({ "--endpoint", "EpA", "--type", "Invoice", "--force" }, { "i1", "i2", "i3" })
    end)

    it("--session: resubmit takes the blocker, never its parked event; skip would take both", function()
      check({ "--endpoint", "EpA", "--session", "a1" }, { "a1" })
      local n, listed = parse_dry(fs:cli_ok({ "skip", "--all", "--endpoint", "EpA", "--session", "a1", "--dry-run" }), "skipped")
      assert.equal(2, n)
      assert.same({ "a1", "a1-parked" }, tags(listed))
    end)

    it("--error: a case-insensitive substring of the error text", function()
      check({ "--status", "failed", "--error", "ORDER 9" }, { "a2" })
      check({ "--endpoint", "EpB", "--error", "Carrier Time" }, { "b1", "b2", "b3" })
    end)

    it("--group: texts differing only by a number share a group; other texts, types and endpoints do not", function()
      local groups = failures(fs)
      local orders = group_where(groups, "EpA", "order <n> failed", "LuaError")
      local invoices = group_where(groups, "EpA", "invoice rejected by ERP", "LuaError")
      local carriers = group_where(groups, "EpB", "carrier timeout", "LuaError")
      local bad = group_where(groups, "EpA", "bad payload <n>", "PermanentFailure")
      assert.equal(4, #groups, nh.encode(groups))
      assert.equal(3, orders.count)
      assert.equal(2, invoices.count)
      assert.equal(3, carriers.count)
      assert.equal(2, bad.count)
      assert.same({ "EpB" }, (function()
        local eps = {}
        for _, g in ipairs(failures(fs, "EpB")) do eps[#eps + 1] = g.endpoint end
        return eps
      end)())
      check({ "--group", orders.group }, { "a1", "a2", "a3" })
      check({ "--group", bad.group }, { "d1", "d2" })
      check({ "--group", carriers.group, "--before", "1d" }, {})
    end)
  end)

  it("skip --all of the blockers unblocks the sessions and their parked events replay; Completed events are not counted", function()
    sb:start(adapter(sb, "Ep", { "Order" }))
    local parked = {}
    for i = 1, 4 do
      sb:publish("Order", { tag = "k" .. i, fail = "credit check failed" }, { session = "k" .. i })
      for p = 1, 2 do parked[#parked + 1] = sb:publish("Order", { tag = ("k%d-p%d"):format(i, p) }, { session = "k" .. i }) end
    end
    for i = 1, 2 do sb:publish("Order", { tag = "c" .. i }, { session = "c" .. i }) end
    sb:wait_rows(function(rows)
      return #rows == 14 and nh.count(rows, function(r) return r.status == "Failed" end) == 4
        and nh.count(rows, function(r) return r.status == "Deferred" end) == 8
        and nh.count(rows, function(r) return r.status == "Completed" end) == 2
    end, "4 Failed, 8 Deferred, 2 Completed")

    -- every event of the endpoint but the Completed ones
    local n, listed, more = parse_dry(sb:cli_ok({ "skip", "--all", "--endpoint", "Ep", "--dry-run" }), "skipped")
    assert.equal(12, n)
    assert.equal(10, #listed)
    assert.equal(2, more)
    assert.equal("no events match --status Completed (nothing to do)\n",
      sb:cli_ok({ "skip", "--all", "--status", "completed" }))

    local blockers = sb:events({ status = "failed" })
    local dn = parse_dry(sb:cli_ok({ "skip", "--all", "--status", "failed", "--dry-run" }), "skipped")
    assert.equal(4, dn)
    local queued, eps = parse_queued(sb:cli_ok({ "skip", "--all", "--status", "failed" }), "skip")
    assert.equal(4, queued)
    assert.same({ Ep = 4 }, eps)

    for _, b in ipairs(blockers) do sb:wait_event(b.event_id, "Skipped") end
    for _, mid in ipairs(parked) do sb:wait_message(mid, "Completed") end
    for i = 1, 4 do
      local s = "k" .. i
      assert.same({ s, s .. "-p1", s .. "-p2" }, sb:call_tags(s), "the blocker never ran again; the parked ones in order")
    end
    for _, b in ipairs(blockers) do
      local nreq = requests_of(sb:show(b.event_id), SKIP)
      assert.equal(1, nreq)
    end
    nh.eventually(function() return #sb:sessions() == 0 end, nil, "every session free")
    -- all Completed or Skipped now: nothing left to skip
    assert.equal("no events match --endpoint Ep (nothing to do)\n", sb:cli_ok({ "skip", "--all", "--endpoint", "Ep" }))
  end)

  it("skip --all of blocked sessions skips their parked events too: none of them runs", function()
    local host = sb:start(adapter(sb, "Ep", { "Order" }))
    local parked = {}
    for i = 1, 3 do
      sb:publish("Order", { tag = "z" .. i, fail = "credit check failed" }, { session = "z" .. i })
      for p = 1, 2 do parked[#parked + 1] = sb:publish("Order", { tag = ("z%d-p%d"):format(i, p) }, { session = "z" .. i }) end
    end
    sb:wait_rows(function(rows)
      return nh.count(rows, function(r) return r.status == "Failed" end) == 3
        and nh.count(rows, function(r) return r.status == "Deferred" end) == 6
    end, "3 Failed, 6 Deferred")
    local queued = parse_queued(sb:cli_ok({ "skip", "--all", "--endpoint", "Ep" }), "skip")
    assert.equal(9, queued)
    for _, mid in ipairs(parked) do sb:wait_message(mid, "Skipped") end
    for _, r in ipairs(sb:events({ status = "failed" })) do error("still Failed: " .. r.event_id) end
    for i = 1, 3 do assert.same({ "z" .. i }, sb:call_tags("z" .. i), "only the failed head ever ran") end
    nh.eventually(function() return #sb:sessions() == 0 end, nil, "every session free")
    assert.is_true(host:alive())
  end)

  it("a run killed mid-way and run again queues exactly the rest; the host applies each request once", function()
    local ep = adapter(sb, "Ep", { "Job" })
    local seeder = adapter(sb, "Seeder", { "Seed" })
    local host = sb:start({ ep, seeder })
    local N = 300
    sb:publish("Seed", { tag = "seed", seed = { n = N, type = "Job", prefix = "j", fail = "job %d failed" } })
    nh.eventually(function() return count_soon(sb, { "--endpoint", "Ep", "--status", "failed" }) == N end, 60,
      function() return "300 Failed jobs; log:\n" .. host:log() end)
    assert.equal(0, host:stop())

    local cmd = { "resubmit", "--all", "--endpoint", "Ep" }
    local killed = run_env(sb, { NIMBUS_BULK_BATCH = "50", NIMBUS_TEST_BULK_KILL_AFTER = "2" }, cmd)
    assert.equal(137, killed.code, killed.out .. killed.err)
    local left = parse_dry(run_env(sb, { NIMBUS_BULK_BATCH = "50" }, cat(cmd, { "--dry-run" })).out, "resubmitted")
    assert.equal(N - 100, left, "two batches of 50 were committed before the kill")

    local again = run_env(sb, { NIMBUS_BULK_BATCH = "50" }, cmd)
    assert.equal(0, again.code, again.err)
    assert.matches("resuming the run started at %d%d%d%d%-%d%d%-%d%dT[%d:.]+Z", again.out)
    assert.matches("(100 requests queued then)", again.out, 1, true)
    assert.matches("note: no running host serves Ep", again.out, 1, true)
    assert.is_nil(again.out:find("://[^/@]*:[^/@*]+@"), "a store URL's password is shown: " .. again.out)
    local queued, eps = parse_queued(again.out, "resubmit")
    assert.equal(N - 100, queued)
    assert.same({ Ep = N - 100 }, eps)

    local third = sb:cli_ok(cmd)
    assert.equal("no events match --endpoint Ep (nothing to do)\n", third)
    assert.not_matches("resuming", third)
    assert.equal(N, count(sb, { "--endpoint", "Ep", "--status", "failed" }), "no host: nothing applied yet")

    sb:touch("fixed")
    sb:start({ ep, seeder })
    nh.eventually(function() return count_soon(sb, { "--endpoint", "Ep", "--status", "completed" }) == N end, 60,
      "every job resubmitted and Completed")
    local jobs = sb:events({ endpoint = "Ep" })
    assert.equal(N, #jobs)
    local calls = {}
    for _, c in ipairs(sb:calls()) do
      if c.endpoint == "Ep" then
        calls[c.tag] = calls[c.tag] or {}
        table.insert(calls[c.tag], c.kind)
      end
    end
    for i = 1, N do assert.same({ "event", "resubmit" }, calls["j" .. i], "the handler calls of j" .. i) end
    for _, r in ipairs(jobs) do
      local nreq, waiting = requests_of(sb:show(r.event_id), RESUBMIT)
      assert.equal(1, nreq, "one resubmit request for " .. r.session_id)
      assert.is_false(waiting)
    end
    assert.equal(0, #sb:sessions({ endpoint = "Ep" }))
  end)

  it("failures: groups mask the variable parts and the group id is the same in another store", function()
    sb:start({ adapter(sb, "EpA", { "Order" }), adapter(sb, "EpB", { "Order" }) })
    local texts = {
      { tag = "o1", fail = "order 17 failed" },
      { tag = "o2", fail = "order 942 failed" },
      { tag = "t1", fail_typed = "order 5 failed", error_type = "ErpError" },
      { tag = "u1", fail = "customer 6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f not found" },
      { tag = "u2", fail = "customer 0b5e9a12-7c3d-4e8f-9a1b-2c3d4e5f6a7b not found" },
      { tag = "x1", fail = "job 0a1b2c3d4e lost" },
      { tag = "x2", fail = "job ffee99 lost" },
      { tag = "q1", fail = [[no account 'Ada Lovelace' for "ERP-1"]] },
      { tag = "q2", fail = [[no account 'Bob' for "CRM"]] },
      { tag = "r1", fail = "GET http://erp.test/api/orders?id=5&x=y returned 503\nsecond line 1" },
      { tag = "r2", fail = "GET http://erp.test/api/orders?id=77 returned 502\nanother second line" },
    }
    for i, p in ipairs(texts) do sb:publish("Order", p, { session = "g" .. i }) end
    sb:wait_rows(function(rows) return #rows == 2 * #texts and nh.count(rows, function(r) return r.status == "Failed" end) == 2 * #texts end,
      "every copy Failed")

    local groups = failures(sb, "EpA")
    local orders = group_where(groups, "EpA", "order <n> failed", "LuaError")
    assert.equal(2, orders.count)
    assert.is_true(orders.first_seen <= orders.last_seen)
    assert.is_truthy(orders.sample_error_text == "order 17 failed" or orders.sample_error_text == "order 942 failed")
    assert.equal(orders.sample_error_text, sb:show(orders.sample_event_id).error_text)
    local typed = group_where(groups, "EpA", "order <n> failed", "ErpError")
    assert.equal(1, typed.count)
    assert.not_equal(orders.group, typed.group, "another error type is another group")
    assert.equal(2, group_where(groups, "EpA", "customer <uuid> not found").count)
    assert.equal(2, group_where(groups, "EpA", "job <id> lost").count)
    assert.equal(2, group_where(groups, "EpA", [[no account '<s>' for "<s>"]]).count)
    assert.equal(2, group_where(groups, "EpA", "GET http://erp.test/api/orders?<q> returned <n>").count)
    assert.equal(6, #groups, nh.encode(groups))
    for _, g in ipairs(groups) do assert.matches("^%x%x%x%x%x%x%x%x%x%x%x%x$", g.group) end

    local other = group_where(failures(sb, "EpB"), "EpB", "order <n> failed", "LuaError")
    assert.equal(2, other.count)
    assert.not_equal(orders.group, other.group, "another endpoint is another group")
    assert.equal(12, #failures(sb))

    -- a second store: same endpoint, type and text, same group id
    local sb2 = nh.sandbox()
    local ok, err = pcall(function()
      sb2:start(adapter(sb2, "EpA", { "Order" }))
      local m = sb2:publish("Order", { tag = "z", fail = "order 31337 failed" }, { session = "z" })
      sb2:wait_message(m, "Failed")
      local g2 = failures(sb2)
      assert.equal(1, #g2)
      assert.equal(orders.group, g2[1].group, "the group id is stable across stores")
      assert.equal("order <n> failed", g2[1].message)
    end)
    sb2:cleanup()
    assert(ok, err)
  end)

  it("refuses bad input with exit 2 and a one-line reason, says when nothing matches, and queues for a stopped host", function()
    local ep = adapter(sb, "Ep", { "Order" })
    local host = sb:start(ep)
    local heads, parked = {}, {}
    for i = 1, 2 do
      heads[i] = sb:publish("Order", { tag = "h" .. i, fail = "stock level 0 for item 4" }, { session = "s" .. i })
      parked[i] = sb:publish("Order", { tag = "p" .. i }, { session = "s" .. i })
    end
    for i = 1, 2 do sb:wait_message(heads[i], "Failed"); sb:wait_message(parked[i], "Deferred") end
    assert.equal(0, host:stop())
    local failed = sb:events({ status = "failed" })

    local function refused(args, hint, opts)
      local r = sb:cli(args, opts)
      local what = table.concat(args, " ")
      assert.equal(2, r.code, what .. ": " .. r.out .. r.err)
      assert.equal("", r.out, what)
      assert(r.err:find("^nimbus%-host %a+: [^\n]+\n$"), what .. ": not one line: " .. r.err)
      assert(r.err:find(hint, 1, true), what .. ": no '" .. hint .. "' in: " .. r.err)
    end
    refused({ "resubmit", "--all" }, "say --endpoint E or --status S (or --group G)")
    refused({ "skip", "--all" }, "say --endpoint E or --status S (or --group G)")
    refused({ "resubmit", "--all", "--type", "Order", "--session", "s1" }, "say --endpoint E or --status S")
    refused({ "resubmit", "--status", "failed" }, "add --all")
    refused({ "skip", "--endpoint", "Ep" }, "add --all")
    refused({ "resubmit", failed[1].event_id, "--all", "--status", "failed" }, "not both")
    refused({ "resubmit", "--all", "--status", "failed", "--body", "{}" }, "--body applies to one event")
    refused({ "skip", "--all", "--endpoint", "Nope" }, "unknown --endpoint Nope (this store has events of Ep)")
    refused({ "resubmit", "--all", "--group", "nope" }, "not a failure group id")
    -- a well-formed group with no unresolved event (resolved already): nothing to do, and a note
    local empty = sb:cli({ "resubmit", "--all", "--group", "0123456789ab" })
    assert.equal(0, empty.code, empty.err)
    assert.matches("no unresolved event is in failure group 0123456789ab", empty.err)
    assert.matches("^no events match %-%-group 0123456789ab %(nothing to do%)", empty.out)
    refused({ "resubmit", "--all", "--status", "failed", "--since", "yesterday" }, "give ISO-8601 UTC")
    refused({ "resubmit", "--all", "--status", "failed", "--before", "2026-13-45" }, "give ISO-8601 UTC")
    refused({ "resubmit", "--all", "--status", "broken" }, "one of completed, failed, pending")
    refused({ "skip", "--all", "--status", "failed", "--since", "1h", "--before", "2h" }, "--since is not before --before")
    refused({ "resubmit", "--all", "--status", "failed" }, "start the host first", { store = sb:path("missing.db") })

    -- a filter that matches nothing: exit 0 and it says so
    local none = sb:cli({ "resubmit", "--all", "--status", "failed", "--error", "no such text" })
    assert.equal(0, none.code, none.err)
    assert.equal("no events match --status Failed --error no such text (nothing to do)\n", none.out)
    local dry0 = sb:cli_ok({ "skip", "--all", "--endpoint", "Ep", "--before", "2000-01-01", "--dry-run" })
    assert.equal("0 events would be skipped (dry run: nothing was queued)\n", dry0)

    -- nothing above queued anything
    for _, f in ipairs(failed) do assert.equal(0, (requests_of(sb:show(f.event_id), RESUBMIT))) end
    for _, f in ipairs(failed) do assert.equal(0, (requests_of(sb:show(f.event_id), SKIP))) end

    -- no host serves the store: the requests wait in it, and the next host applies them
    local stopped = sb:cli_ok({ "skip", "--all", "--status", "failed" })
    assert.equal(2, (parse_queued(stopped, "skip")))
    assert.matches("no running host serves Ep", stopped, 1, true)
    for _, f in ipairs(failed) do
      local nreq, waiting = requests_of(sb:show(f.event_id), SKIP)
      assert.equal(1, nreq)
      assert.is_true(waiting)
      assert.equal("Failed", sb:row(f.event_id).status)
    end
    local again = sb:cli({ "skip", "--all", "--status", "failed" })
    assert.equal(0, again.code)
    assert.equal("no events match --status Failed (nothing to do)\n", again.out, "queued requests are not queued twice")
    sb:start(ep)
    for _, f in ipairs(failed) do sb:wait_event(f.event_id, "Skipped") end
    for i = 1, 2 do sb:wait_message(parked[i], "Completed") end
    assert.same({ "h1", "p1" }, sb:call_tags("s1"))
    assert.same({ "h2", "p2" }, sb:call_tags("s2"))
  end)

  -- On a broker the broker holds the events: the queue table has operator requests only, so
  -- both listings show nothing there (docs: `events --status queued|running`).
  it("events --status queued|running lists the work not finished yet: in a handler, and waiting behind it", function()
    local broker = nh.transport == "amqp"
    local ep = adapter(sb, "EpA", { "Order" })
    sb:start(ep)
    local held = sb:publish("Order", { tag = "h1", hold = true }, { session = "s1" })
    local behind = sb:publish("Order", { tag = "h2" }, { session = "s1" })
    nh.eventually(function() return #sb:call_tags("s1") == 1 end, nil, "the first handler started")
    local function listed(status, extra)
      local args = { "events", "--status", status, "--json" }
      for _, a in ipairs(extra or {}) do args[#args + 1] = a end
      return nh.json_lines(sb:cli_ok(args))
    end
    local running = listed("running")
    local queued = listed("queued", { "--endpoint", "EpA" })
    if broker then
      assert.same({ {}, {} }, { running, queued })
      assert.equal("0\n", sb:cli_ok({ "events", "--status", "queued", "--count" }))
    else
      assert.equal(1, #running, nh.encode(running))
      assert.equal("Running", running[1].status)
      assert.equal("s1", running[1].session_id)
      assert.matches("in a handler on ", running[1].error_text, 1, true)
      assert.equal(1, #queued, nh.encode(queued))
      assert.equal("Queued", queued[1].status)
      assert.equal("s1", queued[1].session_id)
      assert.equal("1\n", sb:cli_ok({ "events", "--status", "queued", "--count" }))
    end
    assert.equal("0\n", sb:cli_ok({ "events", "--status", "queued", "--session", "s2", "--count" }))
    local r = sb:cli({ "events", "--status", "queued", "--since", "1h" })
    assert.equal(2, r.code)
    assert.matches("--since applies to the audit trail, not to --status queued", r.err, 1, true)

    nh.write(sb.dir .. "/release", "")
    sb:wait_message(held, "Completed")
    sb:wait_message(behind, "Completed")
    assert.equal("nothing is running\n", sb:cli_ok({ "events", "--status", "running" }))
    assert.equal("nothing is queued\n", sb:cli_ok({ "events", "--status", "queued" }))
  end)

  it("events: --count, --limit, --type, --since, --follow, and unknown --endpoint / --status", function()
    sb:start({ adapter(sb, "EpA", { "Order", "Invoice" }), adapter(sb, "EpB", { "Shipment" }) })
    local mids = {
      sb:publish("Order", { tag = "o1" }, { session = "o1" }),
      sb:publish("Invoice", { tag = "i1" }, { session = "i1" }),
      sb:publish("Order", { tag = "o2", fail = "order 2 failed" }, { session = "o2" }),
      sb:publish("Shipment", { tag = "s1" }, { session = "s1" }),
      sb:publish("Invoice", { tag = "i2" }, { session = "i2" }),
      sb:publish("Order", { tag = "o3" }, { session = "o3" }),
    }
    local all = sb:wait_rows(function(rows)
      return #rows == 6 and nh.count(rows, function(r) return r.status == "Completed" end) == 5
    end, "six events settled")

    assert.equal(6, count(sb, {}))
    assert.equal(2, count(sb, { "--type", "Invoice" }))
    assert.equal(1, count(sb, { "--endpoint", "EpA", "--status", "FAILED" }))
    assert.equal(5, count(sb, { "--endpoint", "EpA" }))
    assert.equal(6, count(sb, { "--since", "1h" }))
    assert.equal(0, count(sb, { "--before", "1h" }))
    assert.equal(6, count(sb, { "--before", os.date("!%Y-%m-%d", os.time() + 2 * 86400) }))
    assert.equal(6, count(sb, { "--before", os.date("!%Y-%m-%dT%H:%M:%SZ", os.time() + 3600) }))
    assert.equal(0, count(sb, { "--since", os.date("!%Y-%m-%dT%H:%M:%SZ", os.time() + 3600) }))
    assert.equal(1, count(sb, { "--error", "ORDER 2" }))

    local newest = sb:events({ limit = "2" })
    assert.same({ all[5].event_id, all[6].event_id }, { newest[1].event_id, newest[2].event_id },
      "--limit: the newest N, oldest first")
    local text = sb:cli_ok({ "events", "--limit", "1" })
    assert.matches(all[6].event_id, text, 1, true)
    assert.not_matches(all[5].event_id, text, 1, true)

    local invoices = sb:events({ type = "Invoice" })
    assert.equal(2, #invoices)
    for _, r in ipairs(invoices) do assert.equal("Invoice", r.event_type) end

    local times = {}
    for i, r in ipairs(all) do times[i] = r.updated_at end
    table.sort(times)
    local T = times[4]
    local since = sb:events({ since = T })
    local want = {}
    for _, r in ipairs(all) do if r.updated_at >= T then want[#want + 1] = r.event_id end end
    local got = {}
    for _, r in ipairs(since) do got[#got + 1] = r.event_id end
    assert.same(want, got)
    assert.is_true(#got >= 1 and #got < 6, nh.encode(got))

    -- --follow prints the listing, then every change, until SIGTERM
    -- the listing is in the order the host first saw each event, which across two endpoints
    -- need not be the order of publishing: find EpB's one event by its type
    local s1 = assert(nh.where(all, "event_type", "Shipment")[1], "the Shipment row")
    local follow = sb:spawn({ "events", "--follow", "--json", "--endpoint", "EpB" }, { wait = false, transport = false })
    nh.eventually(function() return follow:log():find(s1.event_id, 1, true) end, nil,
      function() return "the listing never showed " .. s1.event_id .. ":\n" .. follow:log() end)
    local m = sb:publish("Shipment", { tag = "s2" }, { session = "s2" })
    local row = sb:wait_message(m, "Completed")
    nh.eventually(function()
      for _, r in ipairs(nh.json_lines(follow:log())) do
        if r.event_id == row.event_id and r.status == "Completed" then return true end
      end
    end, nil, function() return "the new event never followed:\n" .. follow:log() end)
    assert.not_matches("Invoice", follow:log(), 1, true)
    assert.equal(0, follow:stop())

    local r = sb:cli({ "events", "--endpoint", "Nope" })
    assert.equal(2, r.code)
    assert.matches("unknown --endpoint Nope (this store has events of EpA, EpB)", r.err, 1, true)
    r = sb:cli({ "events", "--status", "lost" })
    assert.equal(2, r.code)
    assert.matches("unknown --status lost (one of completed, failed, pending, deferred, deadlettered, unsupported, skipped",
      r.err, 1, true)
    r = sb:cli({ "events", "--count", "--limit", "2" })
    assert.equal(2, r.code)
    r = sb:cli({ "events", "--limit", "0" })
    assert.equal(2, r.code)
    assert.matches("positive number", r.err, 1, true)
  end)
end)

-- Retention (issue 10): resolved events are deleted once they are old enough, by hand
-- (`purge`) or in the background (`--retention`, `nimbus.retention{...}`); unresolved
-- events and their parked siblings never are.
local nh = require("nh")

-- Milliseconds since the epoch of an ISO-8601 UTC time with milliseconds, as `events --json` prints.
local function iso_ms(s)
  local y, mo, d, h, mi, sec, ms = s:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)%.(%d+)Z$")
  assert(y, "not an ISO time: " .. tostring(s))
  -- os.time reads a local time; the difference to UTC is the same for every moment we use
  local t = os.time({ year = tonumber(y), month = tonumber(mo), day = tonumber(d), hour = tonumber(h),
                      min = tonumber(mi), sec = tonumber(sec), isdst = false })
  local off = os.time(os.date("*t", 0)) - os.time(os.date("!*t", 0))
  return (t + off) * 1000 + tonumber(ms)
end

local function iso(ms)
  return os.date("!%Y-%m-%dT%H:%M:%S", ms // 1000) .. ("." .. ("%03d"):format(ms % 1000)) .. "Z"
end

local function now_ms()
  local p = io.popen("date +%s%3N")
  local v = tonumber(p:read("l"))
  p:close()
  return v
end

-- The latest updated_at of the rows, plus 1 ms, once the wall clock has passed it (a
-- cutoff that every one of those rows is older than; polled, not slept).
local function cutoff_after(rows)
  local latest = 0
  for _, r in ipairs(rows) do latest = math.max(latest, iso_ms(r.updated_at)) end
  local c = latest + 1
  nh.eventually(function() return now_ms() > c end, 5, "the clock to pass the cutoff")
  return c
end

describe("retention", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  -- A Failed blocker with two Deferred siblings in s1, a dead-lettered event in s2, and
  -- `n` Completed events in other sessions.
  local function outage(n)
    local head = sb:publish("Ok", { tag = "head", fail = true }, { session = "s1" })
    local p1 = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
    local p2 = sb:publish("Ok", { tag = "p2" }, { session = "s1" })
    local dl = sb:publish("Ok", { tag = "dl", permanent = "bad payload" }, { session = "s2" })
    local done = {}
    for i = 1, n do done[i] = sb:publish("Ok", { tag = "c" .. i }, { session = "c" .. i }) end
    local rows = { head = sb:wait_message(head, "Failed"), dl = sb:wait_message(dl, "DeadLettered"), p1 = p1, p2 = p2 }
    sb:wait_message(p1, "Deferred")
    sb:wait_message(p2, "Deferred")
    for i = 1, n do sb:wait_message(done[i], "Completed") end
    return rows
  end

  local function statuses()
    local out = {}
    for _, r in ipairs(sb:events()) do out[r.status] = (out[r.status] or 0) + 1 end
    return out
  end

  it("purge deletes resolved events and their history, never an unresolved one or its parked siblings", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" })
    local ev = outage(5)
    local completed = nh.where(sb:events(), "status", "Completed")
    assert.equal(5, #completed)
    local cutoff = cutoff_after(completed)

    local dry = sb:cli_ok({ "purge", "--resolved-before", iso(cutoff), "--dry-run" })
    assert.truthy(dry:find("^5 resolved events"), dry)
    assert.same({ Completed = 5, Failed = 1, Deferred = 2, DeadLettered = 1 }, statuses())   -- dry run: nothing gone

    local out = sb:cli_ok({ "purge", "--resolved-before", iso(cutoff) })
    assert.truthy(out:find("deleted 5 resolved events", 1, true), out)
    assert.same({ Failed = 1, Deferred = 2, DeadLettered = 1 }, statuses())
    local r = sb:cli({ "show", completed[1].event_id })
    assert.equal(2, r.code, "a purged event is gone, history and all")
    assert.equal(2, sb:session("s1").parked)

    -- the blocked session still recovers in order after the purge
    sb:cli_ok({ "skip", ev.head.event_id })
    sb:wait_message(ev.p1, "Completed")
    sb:wait_message(ev.p2, "Completed")
    assert.same({ "head", "p1", "p2" }, sb:call_tags("s1"))
  end)

  it("purge deletes old inbox entries with --inbox-before, counted first by --dry-run, and keeps the events", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "inbox = true" })
    local rows = {}
    for i = 1, 3 do rows[i] = sb:wait_message(sb:publish("Ok", { tag = "i" .. i }, { session = "i" .. i }), "Completed") end
    -- an age in whole seconds: wait until every entry is more than 1 s old (the inbox row is
    -- written with its event's outcome, within a moment of its updated_at)
    local latest = cutoff_after(rows)
    nh.eventually(function() return now_ms() > latest + 1500 end, 5, "the entries to be older than 1 s")

    local dry = sb:cli_ok({ "purge", "--inbox-before", "1s", "--dry-run" })
    assert.truthy(dry:find("0 resolved events and 3 inbox entries would be deleted", 1, true), dry)
    local out = sb:cli_ok({ "purge", "--inbox-before", "1s" })
    assert.truthy(out:find("deleted 0 resolved events (0 history rows), 3 inbox and 0 processed entries", 1, true), out)
    assert.same({ Completed = 3 }, statuses(), "--inbox-before alone deletes no event")
    dry = sb:cli_ok({ "purge", "--inbox-before", "1s", "--dry-run" })
    assert.truthy(dry:find("0 resolved events and 0 inbox entries would be deleted", 1, true), dry)
  end)

  it("purge refuses bad input with a clear error", function()
    sb:start(sb:recorder{ types = { "Ok" } })
    sb:wait_message(sb:publish("Ok", { tag = "a" }, { session = "a" }), "Completed")
    local cases = {
      { { "purge" }, "say what to delete" },
      { { "purge", "--resolved-before", "0" }, "every resolved event" },
      { { "purge", "--resolved-before", "0s" }, "every resolved event" },
      { { "purge", "--resolved-before", "soon" }, "not a time" },
      { { "purge", "--resolved-before", "2999-01-01" }, "in the future" },
      { { "purge", "--resolved-before", "7d", "extra" }, "unexpected argument" },
    }
    for _, c in ipairs(cases) do
      local r = sb:cli(c[1])
      assert.equal(2, r.code, table.concat(c[1], " "))
      assert.truthy(r.err:find(c[2], 1, true), r.err)
    end
    assert.equal(1, #sb:events(), "nothing was deleted")
    local r = sb:cli({ "purge", "--resolved-before", "7d" })
    assert.equal(0, r.code)
    assert.truthy(r.out:find("deleted 0 resolved events", 1, true), r.out)
  end)

  it("--retention deletes resolved events in the background while the host runs", function()
    sb:start(sb:recorder{ types = { "Ok" }, options = "retry = { max_retries = 0 }" }, { args = { "--retention", "1s" } })
    local ev = outage(3)
    nh.eventually(function() return statuses().Completed == nil end, 60, "the Completed events to be deleted")
    assert.same({ Failed = 1, Deferred = 2, DeadLettered = 1 }, statuses())
    assert.equal(2, sb:session("s1").parked)
    assert.truthy(sb:row(ev.dl.event_id), "a dead-lettered event stays until an operator resolves it")
  end)

  it("nimbus.retention{...} in the adapter does the same; a bad age fails the load with file:line", function()
    local good = sb:recorder{ types = { "Ok" }, extra = 'nimbus.retention{ resolved = "1s", inbox = "1s" }' }
    sb:start(good)
    local mid = sb:publish("Ok", { tag = "a" }, { session = "a" })
    sb:wait_message(mid, "Completed")
    nh.eventually(function() return #sb:events() == 0 end, 60, "the Completed event to be deleted")

    local bad = sb:recorder{ name = "Bad.lua", endpoint = "Bad", types = { "Ok2" },
                             extra = 'nimbus.retention{ resolved = "0s" }' }
    local h = sb:start(bad, { wait = false, store = sb:path("other.db") })
    assert.equal(2, h:wait_exit(20))
    assert.truthy(h:log():find("Bad.lua:%d+: nimbus.retention: resolved = 0s"), h:log())
  end)
end)

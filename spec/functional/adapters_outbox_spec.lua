-- adapters.outbox_relay in a real host (spec/functional/fixtures/adapters_outbox/relay.lua)
-- relaying a sqlite outbox that another process (fixtures/adapters_outbox/writer.lua under
-- `nimbus-host -l`) writes at the same time: every row handled exactly once, the rows of a
-- session in id order, every row marked sent; and a table missing a column stops the host
-- from starting, with the column and the table named.
local nh = require("nh")

local FIXTURES = (os.getenv("NIMBUS_SOURCE_DIR") or ".") .. "/spec/functional/fixtures/adapters_outbox"
local ROWS, SESSIONS = 300, 7

local SCHEMA = [[CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, event_type TEXT NOT NULL,
  session_id TEXT, payload TEXT NOT NULL, msg_id TEXT, sent_at TEXT);
CREATE INDEX outbox_unsent ON outbox(id) WHERE sent_at IS NULL;]]

local function sqlite(db, sql)
  local r = nh.capture(("sqlite3 -cmd '.timeout 10000' %s %s"):format(nh.q(db), nh.q(sql)))
  assert(r.code == 0, "sqlite3 failed: " .. r.err)
  return r.out
end

describe("outbox_relay in a real host", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("relays rows written concurrently: each once, in id order per session, all marked sent", function()
    local db, calls = sb:path("shop.db"), sb:path("calls.jsonl")
    sqlite(db, SCHEMA)
    sb:start(FIXTURES .. "/relay.lua", { env = { OUTBOX_DB = db, OUTBOX_CALLS = calls } })

    -- the writer: its own process, in the background; its exit status goes to writer.rc. It
    -- writes half the rows, waits until the relay has sent one, then writes the rest: the
    -- second half is written while the relay works (its exit status says it saw that).
    local cmd = ("(%s -l %s %s %d %d >%s 2>&1; echo $? >%s.tmp && mv %s.tmp %s) </dev/null >/dev/null 2>&1 &")
      :format(nh.q(nh.bin()), nh.q(FIXTURES .. "/writer.lua"), nh.q(db), ROWS, SESSIONS, nh.q(sb:path("writer.log")),
              nh.q(sb:path("writer.rc")), nh.q(sb:path("writer.rc")), nh.q(sb:path("writer.rc")))
    assert(nh.sh(cmd) == 0)
    local rc = nh.eventually(function() return nh.read(sb:path("writer.rc")) end, 120, "the writer's exit")
    assert.are.equal("0", rc:match("%d+"), "writer failed: " .. tostring(nh.read(sb:path("writer.log"))))

    -- every row sent, and handled
    nh.eventually(function() return sqlite(db, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == "0\n" end,
                  nh.DEADLINE, function() return "unsent rows: " .. sqlite(db, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") end)
    local rows = sb:wait_rows(function(r)
      return nh.count(r, function(x) return x.status == "Completed" end) >= ROWS
    end, ROWS .. " completed events")
    assert.are.equal(ROWS, #rows)
    local mids = {}
    for _, r in ipairs(rows) do
      assert.are.equal("Completed", r.status)
      assert.is_nil(mids[r.message_id], "published twice: " .. r.message_id)
      mids[r.message_id] = true
    end
    for k = 1, ROWS do assert.is_true(mids["outbox-" .. k], "no event for row " .. k) end

    local handled = nh.json_lines(nh.read(calls) or "")
    assert.are.equal(ROWS, #handled)
    local seen, per_session = {}, {}
    for _, c in ipairs(handled) do
      assert.is_nil(seen[c.row], "row handled twice: " .. tostring(c.row))
      seen[c.row] = true
      assert.are.equal("outbox-" .. c.row, c.message_id)
      assert.are.equal("s" .. (c.row % SESSIONS), c.session)
      assert.are.equal(c.row % 4 == 0 and "ItemRemoved" or "ItemAdded", c.type)
      local list = per_session[c.session] or {}
      per_session[c.session] = list
      list[#list + 1] = c
    end
    -- handled in the order the rows were written, within each session
    assert.are.equal(SESSIONS, (function() local n = 0 for _ in pairs(per_session) do n = n + 1 end return n end)())
    for session, list in pairs(per_session) do
      for i, c in ipairs(list) do
        assert.are.equal(i, c.seq, ("session %s: call %d is seq %d (row %d)"):format(session, i, c.seq, c.row))
        if i > 1 then assert.is_true(c.row > list[i - 1].row) end
      end
    end
  end)

  it("refuses to start on an outbox table without the session column, naming it and the table", function()
    local db = sb:path("shop.db")
    sqlite(db, "CREATE TABLE outbox (id INTEGER PRIMARY KEY, event_type TEXT, payload TEXT, msg_id TEXT, sent_at TEXT)")
    local host = sb:start(FIXTURES .. "/relay.lua", { env = { OUTBOX_DB = db, OUTBOX_CALLS = sb:path("calls.jsonl") },
                                                       wait = false })
    local code = host:wait_exit(nh.DEADLINE)
    assert.are.equal(2, code)
    local log = host:log()
    assert.matches("relay.lua:%d+: outbox_relay.start: the outbox relay cannot start: table outbox in " .. db:gsub("%p", "%%%0")
                   .. " has no column session_id %(columns%.session%)", log)
    assert.is_nil(log:find("ready:", 1, true))
    assert.are.equal("0\n", sqlite(db, "SELECT count(*) FROM outbox"))
  end)
end)

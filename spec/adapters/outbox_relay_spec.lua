-- adapters/outbox_relay.lua on nimbus.testing, over a real sqlite file (nimbus.sqlite is
-- the host's own inside nimbus-host): order, marking, batches, rows that cannot be
-- published, publish failures and the refusal to start on a table that lacks a column.
local testing = require("nimbus.testing")
local nimbus = require("nimbus")

local HERE = debug.getinfo(1, "S").short_src

local SCHEMA = [[CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, event_type TEXT, session_id TEXT,
                 payload TEXT, sent_at TEXT, msg_id TEXT)]]

local files = {}

-- A fresh sqlite file with the outbox table (or `schema`); returns its path and a handle.
local function outbox_db(schema)
  local path = os.tmpname()
  files[#files + 1] = path
  local db = assert(nimbus.sqlite.open(path))
  assert(db:exec(schema or SCHEMA))
  return path, db
end

local function add(db, etype, session, payload, msg_id)
  local _, id = assert(db:exec("INSERT INTO outbox(event_type, session_id, payload, msg_id) VALUES (?, ?, ?, ?)",
                               etype, session, payload, msg_id))
  return id
end

local function unsent(db)
  local ids = {}
  for _, r in ipairs(db:rows("SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id")) do ids[#ids + 1] = r.id end
  return ids
end

-- An app running a relay named "relay" over path; POST /poll polls at once, POST /stop stops it.
local function relay_app(path, opts)
  return testing.load(function()
    local nimbus_ = require("nimbus")
    local outbox = require("adapters.outbox_relay")
    local o = { source = outbox.sqlite{ path = path }, name = "relay", every = 1 }
    for k, v in pairs(opts or {}) do o[k] = v end
    local relay = outbox.start(o)
    assert(nimbus_.http.serve{ port = 0, routes = {
      ["POST /poll"] = function() return 200, { published = relay:poll(), stats = relay.stats } end,
      ["POST /stop"] = function() relay:stop(); return 204 end,
    } })
  end)
end

local function sessions_and_types(published)
  local out = {}
  for i, p in ipairs(published) do out[i] = p.opts.session .. ":" .. p.type .. ":" .. tostring(p.payload.n) end
  return out
end

describe("outbox_relay", function()
  after_each(function()
    for _, f in ipairs(files) do
      os.remove(f); os.remove(f .. "-wal"); os.remove(f .. "-shm")
    end
    files = {}
  end)

  it("publishes unsent rows in id order and marks them sent in the same database", function()
    local path, db = outbox_db()
    add(db, "A", "s1", '{"n":1}')
    add(db, "B", "s2", '{"n":2}')
    add(db, "C", "s1", '{"n":3,"nested":{"k":[1,2]}}')
    local app = relay_app(path)
    local run = app:run_every("relay")
    assert.is_nil(run.error)
    assert.are.same({ "s1:A:1", "s2:B:2", "s1:C:3" }, sessions_and_types(run.published))
    assert.are.same({ n = 3, nested = { k = { 1, 2 } } }, run.published[3].payload)
    assert.are.same({}, unsent(db))
    local row = db:first("SELECT sent_at FROM outbox WHERE id = 1")
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ$", row.sent_at)

    add(db, "D", "s2", '{"n":4}')
    run = app:run_every("relay")
    assert.are.same({ "s2:D:4" }, sessions_and_types(run.published))   -- the sent ones are not published again
    assert.are.equal(0, #app:run_every("relay").published)
  end)

  it("drains more than one batch in a poll, yielding between batches", function()
    local path, db = outbox_db()
    for i = 1, 5 do add(db, "T", "s" .. (i % 2), ('{"n":%d}'):format(i)) end
    local app = relay_app(path, { batch = 2 })
    local run = app:run_every("relay")
    assert.are.same({ "s1:T:1", "s0:T:2", "s1:T:3", "s0:T:4", "s1:T:5" }, sessions_and_types(run.published))
    assert.are.equal(2, #run.sleeps)   -- after each full batch
    assert.are.same({}, unsent(db))
  end)

  it("deletes the rows it sent with mark = \"delete\" (no sent column needed)", function()
    local path, db = outbox_db("CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT, akey TEXT, body TEXT)")
    db:exec("INSERT INTO events(kind, akey, body) VALUES ('X', 'k', '{\"n\":1}'), ('Y', 'k', '{\"n\":2}')")
    local app = testing.load(function()
      local outbox = require("adapters.outbox_relay")
      outbox.start{ source = outbox.sqlite{ path = path, table = "events" }, name = "relay", mark = "delete",
                    columns = { id = "seq", type = "kind", session = "akey", payload = "body" } }
    end)
    local run = app:run_every("relay")
    assert.are.same({ "k:X:1", "k:Y:2" }, sessions_and_types(run.published))
    assert.are.equal(0, db:first("SELECT count(*) AS n FROM events").n)
  end)

  it("leaves a row that cannot be published unsent, holds its session behind it, and goes on with the others", function()
    local path, db = outbox_db()
    add(db, "A", "s1", '{"n":1}')
    local bad = add(db, "A", "s1", "not json")
    add(db, "A", "s1", '{"n":3}')            -- waits behind the bad row
    add(db, "A", "s2", '{"n":4}')            -- another session: goes on
    add(db, "", "s3", '{"n":5}')             -- no type
    add(db, "A", "s5", '[1,2]')              -- not an object
    add(db, "A", "s6", '{"n":6')             -- not JSON
    local app = relay_app(path)
    local run = app:run_every("relay")
    assert.are.same({ "s1:A:1", "s2:A:4" }, sessions_and_types(run.published))
    assert.are.same({ 2, 3, 5, 6, 7 }, unsent(db))
    local errors = {}
    for _, l in ipairs(run.logs) do if l.level == "error" then errors[#errors + 1] = l.message end end
    assert.are.equal(4, #errors)
    assert.matches("outbox row cannot be published; it stays unsent and its session waits behind it", errors[1], 1, true)
    assert.matches("id=" .. bad, errors[1], 1, true)
    assert.matches("column payload must hold a JSON object, it holds: not json", errors[1], 1, true)
    assert.matches("column event_type is empty: it must hold the event type", errors[2], 1, true)
    assert.matches("column payload must hold a JSON object, it holds: [1,2]", errors[3], 1, true)
    assert.matches("column payload is not JSON: ", errors[4], 1, true)

    run = app:run_every("relay")
    assert.are.equal(0, #run.published)
    assert.are.equal(0, #run.logs)           -- each bad row is reported once

    db:exec("UPDATE outbox SET payload = '{\"n\":2}' WHERE id = ?", bad)   -- an operator fixes the row
    run = app:run_every("relay")
    assert.are.same({ "s1:A:2", "s1:A:3" }, sessions_and_types(run.published))
  end)

  it("publishes the payload column's text byte for byte: long integers and empty arrays unchanged", function()
    local path, db = outbox_db()
    local text = '{"n":123456789012345678, "tags":[], "nested":{"big":-98765432109876543210,"list":[{}]}}'
    add(db, "A", "s1", text, "m-1")
    local run = relay_app(path, { columns = { message_id = "msg_id" } }):run_every("relay")
    assert.are.equal(1, #run.published)
    assert.are.equal(text, run.published[1].body)
    assert.are.same({ session = "s1", message_id = "m-1" }, run.published[1].opts)
    assert.are.same({}, unsent(db))
  end)

  it("stops a poll when publishing fails, keeps what is not published, and starts again from it", function()
    local path, db = outbox_db()
    for i = 1, 4 do add(db, "T", "s", ('{"n":%d}'):format(i)) end
    local app = relay_app(path, { batch = 10 })
    local real = app.nimbus.publish
    app.nimbus.publish = function(t, p, o)
      if nimbus.json.decode(p).n == 3 then return nil, "store busy", "EIO" end
      return real(t, p, o)
    end
    local run = app:run_every("relay")
    assert.are.same({ "s:T:1", "s:T:2" }, sessions_and_types(run.published))
    assert.are.same({ 3, 4 }, unsent(db))
    assert.matches("publishing outbox row 3 failed: store busy", run.logs[#run.logs].message, 1, true)
    app.nimbus.publish = real
    run = app:run_every("relay")
    assert.are.same({ "s:T:3", "s:T:4" }, sessions_and_types(run.published))
    local res = app:serve_request("POST", "/poll")
    assert.are.same({ polls = 3, published = 4, failures = 1, busy = 0,
                      last_error = "publishing outbox row 3 failed: store busy" },
                    res.json.stats)
  end)

  it("gives up a poll when the application holds the write lock, and marks and relays at the next one", function()
    local path, db = outbox_db()
    add(db, "T", "s", '{"n":1}')
    local app = testing.load(function()
      local outbox = require("adapters.outbox_relay")
      outbox.start{ source = outbox.sqlite{ path = path, busy_timeout = 0 }, name = "relay" }
    end)
    assert(db:exec("BEGIN IMMEDIATE"))                 -- the application is writing
    add(db, "T", "s", '{"n":2}')
    local run = app:run_every("relay")
    -- row 1 was read and published before the lock was needed; its mark waits
    assert.are.same({ "s:T:1" }, sessions_and_types(run.published))
    assert.are.equal("warn", run.logs[1].level)
    assert.matches("the outbox database is busy (a writer holds its lock); the next poll tries again",
                   run.logs[1].message, 1, true)
    assert(db:exec("COMMIT"))
    assert.are.same({ 1, 2 }, unsent(db))
    run = app:run_every("relay")
    -- row 1 is marked, not published again
    assert.are.same({ "s:T:2" }, sessions_and_types(run.published))
    assert.are.same({}, unsent(db))
  end)

  it("does nothing once stopped", function()
    local path, db = outbox_db()
    add(db, "T", "s", '{"n":1}')
    local app = relay_app(path)
    assert.are.equal(204, app:serve_request("POST", "/stop").status)
    local res = app:serve_request("POST", "/poll")
    assert.are.equal(0, res.json.published)
    assert.are.same({ 1 }, unsent(db))
  end)

  it("refuses to start on a table that lacks a column, naming the column and the table, at the caller's line", function()
    local path = outbox_db("CREATE TABLE outbox (id INTEGER PRIMARY KEY, event_type TEXT, payload TEXT, sent_at TEXT)")
    local line
    local ok, err = pcall(testing.load, function()
      local outbox = require("adapters.outbox_relay")
      line = debug.getinfo(1, "l").currentline + 1
      outbox.start{ source = outbox.sqlite{ path = path } }
    end)
    assert.is_false(ok)
    assert.matches("the adapter raised an error: " .. HERE .. ":" .. line .. ":", err, 1, true)
    assert.matches(("outbox_relay.start: the outbox relay cannot start: table outbox in %s has no column session_id "
                    .. "(columns.session): add it, or set columns.session to the column that holds the session"):format(path),
                   err, 1, true)

    ok, err = pcall(testing.load, function()
      local outbox = require("adapters.outbox_relay")
      outbox.start{ source = outbox.sqlite{ path = path, table = "missing" } }
    end)
    assert.is_false(ok)
    assert.matches("there is no table missing in " .. path, err, 1, true)

    ok, err = pcall(testing.load, function()
      local outbox = require("adapters.outbox_relay")
      outbox.start{ source = outbox.sqlite{ path = path }, columns = { session = "event_type", message_id = "uuid" } }
    end)
    assert.is_false(ok)
    assert.matches("has no column uuid (columns.message_id)", err, 1, true)
  end)

  it("refuses bad options at the caller's line", function()
    local outbox = require("adapters.outbox_relay")
    local path = outbox_db()
    local function refusal(fn)
      local ok, err = pcall(fn)
      assert.is_false(ok)
      return err
    end
    local line = debug.getinfo(1, "l").currentline + 1
    local err = refusal(function() outbox.sqlite{ path = path, table = "out box" } end)
    assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
    assert.matches("`table` must be a plain table name", err, 1, true)
    assert.matches("give either path", refusal(function() outbox.sqlite{} end), 1, true)
    assert.matches("`source` is required", refusal(function() outbox.start{} end), 1, true)
    assert.matches("unknown column role kind", refusal(function()
      outbox.start{ source = outbox.sqlite{ path = path }, columns = { kind = "x" } }
    end), 1, true)
    assert.matches("unknown option batchsize", refusal(function()
      outbox.start{ source = outbox.sqlite{ path = path }, batchsize = 5 }
    end), 1, true)
  end)
end)

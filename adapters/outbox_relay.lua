-- adapters.outbox_relay: publishes the rows of an outbox table, in id order, and marks them
-- sent in the same database: for systems that write their events in the transaction that
-- changes their data (the transactional outbox). At least once: a row is marked after it
-- is published, so a crash between the two publishes it again; give each row a unique
-- message id (columns.message_id) and the second publish is dropped (within 24 h).
--
--   local nimbus = require("nimbus")
--   local outbox = require("adapters.outbox_relay")
--
--   -- the application writes, in its own transactions:
--   --   INSERT INTO outbox(event_type, session_id, payload) VALUES ('OrderPlaced', 'c-7', '{"id":"o-1"}')
--   local db = assert(nimbus.sqlite.open("shop.db"))
--   db:exec([[CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, event_type TEXT NOT NULL,
--             session_id TEXT, payload TEXT NOT NULL, sent_at TEXT)]])
--   db:exec("CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox(id) WHERE sent_at IS NULL")
--
--   local relay = outbox.start{
--     source = outbox.sqlite{ db = db, table = "outbox" },      -- or path = "shop.db"
--     columns = { id = "id", type = "event_type", session = "session_id", payload = "payload",
--                 sent = "sent_at" },                           -- these are the defaults
--     batch = 100,                                              -- rows per transaction
--     every = 0.5,                                              -- seconds between polls
--   }
--
--   local ep = nimbus.endpoint("Shipping")
--   ep:on("OrderPlaced", function(order, ctx) nimbus.log.info("ship", { order = order.id }) end)
--
-- outbox.start(opts) -> relay. Checks the table at once: a missing table or column raises
-- at your call (the host refuses to start), naming the column, the option that names it and
-- the table. Then it polls every `every` seconds (a periodic task of the host, stopped with
-- the VM on reload or shutdown; a poll never overlaps the previous one): rows not sent yet,
-- by increasing id, `batch` at a time, read in one statement; it publishes them in order
-- (nimbus.publish: type, the payload text unchanged, session) and marks each sent right after
-- its publish (sent = the UTC time as ISO-8601 text; or mark = "delete" removes them, and
-- then no `sent` column is needed). No transaction of the source is held while it publishes:
-- the application's writers wait for one short write at most. A full batch is followed by
-- the next at once.
-- A row whose session is NULL is published without one (a session of its own: no order
-- with other rows).
--   Options: source (required), columns, batch (100), every (1 s), mark ("sent" | "delete"),
--   timeout (60 s: one poll's deadline), name (the periodic task's, in logs and for
--   nimbus.testing's app:run_every; default "outbox relay <source>"). columns.message_id
--   (optional): a column of unique ids (UUIDs the writer sets) used as message ids.
-- relay:poll() -> published count: one poll now (from a task: a handler, a checker, a route).
-- relay:stop(): later polls do nothing. relay.stats: { polls, published, failures, busy,
-- last_error }.
--
-- Order: one relay publishes rows one at a time in id order, so the events of a session
-- reach the broker in the order their rows were written. Run one relay per outbox: a second
-- one could publish a row the first has published and not marked yet (the second publish is
-- dropped when columns.message_id is set, as after a crash or a reload between a publish and
-- its mark; a mark the database was too busy for is made at the next poll, without a second
-- publish). A row that cannot
-- be published (type empty, payload not a JSON object) is logged (error, once per relay) and left
-- unsent; later rows of its session wait behind it, other sessions go on. Fix the row (UPDATE it) and the relay takes it at its next poll. When
-- publishing fails (store or broker down) the poll stops and the next one starts again
-- from the oldest unsent row.
--
-- Sources: outbox.sqlite{ path = "shop.db" | db = handle, table = "outbox", busy_timeout = 0.2 }
-- (nimbus.sqlite: a path opens its own handle and puts the file in WAL mode; busy_timeout
-- is how long a poll waits for the application's write lock, blocking the host's loop
-- meanwhile, before it gives up until the next poll (a warning); the application's
-- writers need a busy timeout too, as they may wait for one of the relay's marks). A source
-- is a small interface, so a PostgreSQL one (not in the host yet) slots in beside it:
--   src:describe() -> "table outbox in shop.db"
--   src:check(columns, mark) -> true | nil, message   (the table and every named column exist)
--   src:batch(after_id, limit, fn) -> rows_seen, last_id | nil, message, code: reads up
--     to `limit` unsent rows by id (those with id > after_id, or from the first when after_id
--     is nil), each a table keyed by the logical names (id, type, session, payload,
--     message_id); calls fn(row) for each, outside any transaction (fn may wait), which
--     returns true (published: mark it now), false (leave it) or nil (stop the batch).
--     code "SQLITE_BUSY" when a lock was not to be had: the relay warns and tries again at
--     the next poll. (PostgreSQL: ids must be committed in order, e.g. under a lock, or a
--     row whose transaction commits late is published after higher ids.)
local cjson = require("cjson.safe")
local mw = require("adapters.middleware")

local M = {}

local DEFAULT_COLUMNS = { id = "id", type = "event_type", session = "session_id", payload = "payload",
                          sent = "sent_at" }
local COLUMN_NAMES = { id = true, type = true, session = true, payload = true, sent = true, message_id = true }
local START_OPTS = { source = true, columns = true, batch = true, every = true, mark = true, timeout = true,
                     name = true }

local function ident_ok(name) return type(name) == "string" and name:match("^[%a_][%w_]*$") ~= nil end
local function quote_ident(name) return '"' .. name .. '"' end

---------------------------------------------------------------------------- sqlite source
local Sqlite = {}
Sqlite.__index = Sqlite

function M.sqlite(opts)
  local what = "outbox_relay.sqlite"
  mw.check_options(opts, { path = true, db = true, table = true, busy_timeout = true }, what, 2)
  if (opts.path == nil) == (opts.db == nil) then
    error(what .. ": give either path = \"file.db\" or db = an open nimbus.sqlite handle", 2)
  end
  local tbl = opts.table or "outbox"
  if not ident_ok(tbl) then
    error(what .. ": `table` must be a plain table name (letters, digits, _), got " .. tostring(tbl), 2)
  end
  local db, where = opts.db, "the given database"
  if opts.path ~= nil then
    if type(opts.path) ~= "string" or opts.path == "" then error(what .. ": `path` must be a file path", 2) end
    local err
    -- A short wait by default: the busy wait blocks the host's loop, and a poll that finds
    -- the application's write lock taken just tries again at the next one.
    db, err = require("nimbus").sqlite.open(opts.path, { busy_timeout = opts.busy_timeout or 0.2 })
    if not db then error(("%s: cannot open the outbox database %s: %s"):format(what, opts.path, tostring(err)), 2) end
    where = opts.path
  elseif opts.busy_timeout ~= nil then
    error(what .. ": `busy_timeout` goes with path (an open db keeps its own)", 2)
  end
  return setmetatable({ db = db, table = tbl, where = where }, Sqlite)
end

function Sqlite:describe() return ("table %s in %s"):format(self.table, self.where) end

function Sqlite:check(columns, mark)
  local t = self.db:first("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", self.table)
  if not t then return nil, ("there is no table %s in %s"):format(self.table, self.where) end
  local have = {}
  local info, err = self.db:rows(("PRAGMA table_info(%s)"):format(quote_ident(self.table)))
  if not info then return nil, err end
  for _, c in ipairs(info) do have[c.name] = true end
  for _, logical in ipairs({ "id", "type", "session", "payload", "sent", "message_id" }) do
    local col = columns[logical]
    if col and not (logical == "sent" and mark == "delete") and not have[col] then
      return nil, ("table %s in %s has no column %s (columns.%s): add it, or set columns.%s to the column that holds "
                   .. "the %s"):format(self.table, self.where, col, logical, logical,
                   ({ id = "increasing row id", type = "event type", session = "session (ordering key)",
                      payload = "JSON payload", sent = "time the row was sent (NULL until then)",
                      message_id = "unique message id" })[logical])
    end
  end
  self.columns, self.mark = columns, mark
  local c = columns
  local list = { ("%s AS id"):format(quote_ident(c.id)), ("%s AS type"):format(quote_ident(c.type)),
                 ("%s AS session"):format(quote_ident(c.session)), ("%s AS payload"):format(quote_ident(c.payload)) }
  if c.message_id then list[#list + 1] = ("%s AS message_id"):format(quote_ident(c.message_id)) end
  local unsent = mark == "delete" and "1" or ("%s IS NULL"):format(quote_ident(c.sent))
  local base = ("SELECT %s FROM %s WHERE %s"):format(table.concat(list, ", "), quote_ident(self.table), unsent)
  self.sql_first = ("%s ORDER BY %s LIMIT ?"):format(base, quote_ident(c.id))
  self.sql_after = ("%s AND %s > ? ORDER BY %s LIMIT ?"):format(base, quote_ident(c.id), quote_ident(c.id))
  if mark == "delete" then
    self.sql_mark = ("DELETE FROM %s WHERE %s = ?"):format(quote_ident(self.table), quote_ident(c.id))
  else
    self.sql_mark = ("UPDATE %s SET %s = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now') WHERE %s = ?")
      :format(quote_ident(self.table), quote_ident(c.sent), quote_ident(c.id))
  end
  return true
end

-- The rows are read in one statement (one snapshot); fn runs outside any transaction, since
-- it publishes and a publish may wait (on a PostgreSQL store the task waits for the store,
-- which no task may do inside db:tx); each row fn took is marked right after its publish,
-- in a write of its own, so the application's writers never wait for a publish.
function Sqlite:batch(after_id, limit, fn)
  local db = self.db
  local rows, err, code
  if after_id == nil then rows, err, code = db:rows(self.sql_first, limit)
  else rows, err, code = db:rows(self.sql_after, after_id, limit) end
  if not rows then return nil, err, code end
  local last
  for _, row in ipairs(rows) do
    local take = fn(row)
    if take == nil then break end
    last = row.id
    if take then
      local n, merr, mcode = db:exec(self.sql_mark, row.id)
      if not n then return nil, merr, mcode end
    end
  end
  return #rows, last
end

---------------------------------------------------------------------------- relay
local Relay = {}
Relay.__index = Relay

local function log(level, msg, fields)
  require("nimbus").log[level](msg, fields)
end

-- A row -> type, payload, opts | nil, why (a row that can never be published as it is)
local function prepare(self, row)
  local c = self.columns
  if type(row.type) ~= "string" or row.type == "" then
    return nil, ("column %s is empty: it must hold the event type"):format(c.type)
  end
  local text = row.payload
  if type(text) ~= "string" then
    return nil, ("column %s is NULL or not text: it must hold the payload as a JSON object"):format(c.payload)
  end
  if not text:find("^%s*{") then
    return nil, ("column %s must hold a JSON object, it holds: %s"):format(c.payload, text:sub(1, 60))
  end
  -- checked here, so a bad row waits (logged) instead of failing the poll in nimbus.publish;
  -- the text itself is published, byte for byte (no re-encoding: long integers and [] stay)
  local payload, err = cjson.decode(text)
  if type(payload) ~= "table" then
    return nil, ("column %s is not JSON: %s"):format(c.payload, tostring(err))
  end
  local mid = row.message_id
  if mid ~= nil then
    mid = tostring(mid)
    if #mid == 0 or #mid > 200 or not utf8.len(mid) then
      return nil, ("column %s must hold 1 to 200 bytes of UTF-8"):format(c.message_id)
    end
  end
  local session = row.session
  if session ~= nil then session = tostring(session) end
  return row.type, text, { session = session, message_id = mid }
end

function Relay:poll()
  if self.stopped then return 0 end
  local nimbus = require("nimbus")
  local stats = self.stats
  stats.polls = stats.polls + 1
  local blocked = {}          -- session -> the id of the row it waits behind, this poll
  local published, after = 0, nil
  local failure
  local function take(row)
    -- published by an earlier poll whose mark failed (the database was busy): mark it only
    if self.unmarked[row.id] then return true end
    local session = row.session ~= nil and tostring(row.session) or nil
    if session and blocked[session] then return false end
    local etype, payload, popts = prepare(self, row)
    if not etype then
      if session then blocked[session] = row.id end
      if not self.reported[row.id] then
        self.reported[row.id] = true
        log("error", "outbox row cannot be published; it stays unsent and its session waits behind it", {
          source = self.source:describe(), id = row.id, session = session, reason = payload })
      end
      return false
    end
    local ok, id, err = pcall(nimbus.publish, etype, payload, popts)
    if not ok or not id then
      failure = ("publishing outbox row %s failed: %s"):format(tostring(row.id), tostring(ok and err or id))
      return nil
    end
    self.unmarked[row.id] = true
    published = published + 1
    return true
  end
  while true do
    local seen, last, code = self.source:batch(after, self.batch, take)
    if seen ~= nil then self.unmarked = {} end   -- every row taken is marked
    if seen == nil and code == "SQLITE_BUSY" and not failure then
      stats.busy = stats.busy + 1
      log("warn", "outbox relay poll stopped: the outbox database is busy (a writer holds its lock); the next poll "
          .. "tries again", { source = self.source:describe(), reason = tostring(last) })
      break
    end
    if seen == nil then   -- the source failed: `last` is its message
      failure = failure or ("%s: %s"):format(self.source:describe(), tostring(last))
    end
    if failure then
      stats.failures = stats.failures + 1
      stats.last_error = failure
      log("error", "outbox relay poll stopped; the next poll starts again from the oldest unsent row",
          { source = self.source:describe(), reason = failure })
      break
    end
    if seen < self.batch then break end
    after = last
    nimbus.sleep(0)   -- a full batch: let other tasks run before the next one
    if self.stopped then break end
  end
  stats.published = stats.published + published
  return published
end

function Relay:stop()
  self.stopped = true
  if self.handle ~= nil and self.handle.cancel then self.handle:cancel() end   -- nimbus.every's handle
end

-- A periodic task of the host: stopped with the VM on reload or shutdown, and a run never
-- overlaps the previous one (so two polls of one relay never interleave).
local function every(secs, fn, label, timeout)
  return require("nimbus").every(secs, fn, { name = label, timeout = timeout })
end

function M.start(opts)
  local what = "outbox_relay.start"
  mw.check_options(opts, START_OPTS, what, 2)
  local src = opts.source
  if type(src) ~= "table" or type(src.batch) ~= "function" or type(src.check) ~= "function"
     or type(src.describe) ~= "function" then
    error(what .. ": `source` is required: outbox_relay.sqlite{ path = \"file.db\", table = \"outbox\" } (or a "
          .. "source with describe, check and batch)", 2)
  end
  local columns = {}
  for k, v in pairs(DEFAULT_COLUMNS) do columns[k] = v end
  if opts.columns ~= nil then
    if type(opts.columns) ~= "table" then error(what .. ": `columns` must be a table { id = ..., type = ... }", 2) end
    for k, v in pairs(opts.columns) do
      if not COLUMN_NAMES[k] then
        error(("%s: unknown column role %s (id, type, session, payload, sent, message_id)"):format(what, tostring(k)), 2)
      end
      if not ident_ok(v) then
        error(("%s: columns.%s must be a plain column name (letters, digits, _), got %s"):format(what, k, tostring(v)), 2)
      end
      columns[k] = v
    end
  end
  local mark = opts.mark or "sent"
  if mark ~= "sent" and mark ~= "delete" then
    error(what .. ": `mark` must be \"sent\" (set the sent column) or \"delete\" (remove the row)", 2)
  end
  local batch = opts.batch or 100
  if math.type(batch) ~= "integer" or batch < 1 then error(what .. ": `batch` must be a positive integer", 2) end
  local secs = opts.every or 1
  if type(secs) ~= "number" or not (secs > 0) then error(what .. ": `every` must be a number of seconds > 0", 2) end
  local timeout = opts.timeout or 60
  if type(timeout) ~= "number" or not (timeout > 0) then error(what .. ": `timeout` must be a number of seconds > 0", 2) end
  local name = opts.name or ("outbox relay " .. src:describe())
  if type(name) ~= "string" or name == "" then error(what .. ": `name` must be a non-empty string", 2) end
  local ok, err = src:check(columns, mark)
  if not ok then error(("%s: the outbox relay cannot start: %s"):format(what, tostring(err)), 2) end
  local relay = setmetatable({ source = src, columns = columns, batch = batch, reported = {}, unmarked = {},
                               stats = { polls = 0, published = 0, failures = 0, busy = 0 } }, Relay)
  relay.handle = every(secs, function() relay:poll() end, name, timeout)
  return relay
end

return M

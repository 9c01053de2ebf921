-- nimbus.sqlite: sqlite databases an adapter owns (its own tables, next to but never
-- inside the host's store). The work is done in C (host/src/lua/nh_lsqlite.c); this file
-- checks the options and is the reference for adapter authors.
--
--   local db = assert(nimbus.sqlite.open("erp.db", { busy_timeout = 5, readonly = false }))
--   db:exec("CREATE TABLE IF NOT EXISTS acct (id TEXT PRIMARY KEY, name TEXT NOT NULL)")
--   local changes, rowid = db:exec("INSERT INTO acct VALUES (?, ?)", id, name)
--   local rows = db:rows("SELECT id, name FROM acct WHERE name LIKE :p", { p = "A%" })
--   local row  = db:first("SELECT name FROM acct WHERE id = ?", id)    -- nil: no row
--   local ok, n = db:tx(function(db) db:exec(...); db:exec(...); return 2 end)
--   db:close()                -- or `local db <close> = ...`, or leave it to the GC
--
-- open(path [, opts]): path is relative to the process's working directory (not the
--   adapter's directory), or ":memory:". Files are put in WAL mode (readers and the one
--   writer do not block each other) with synchronous=NORMAL (a process crash loses
--   nothing; a power loss may lose the last commits); foreign keys are enforced.
--   opts.busy_timeout (seconds, default 5): how long a call waits for another handle's
--   write lock before failing with SQLITE_BUSY. opts.readonly: open without write access
--   (the file must exist). Returns the db, or nil, msg, code.
--
-- Statements: one per call (a second statement in the string raises), parameters bound,
--   never spliced: `?`, `?NNN`, `:name` / `@name` / `$name`. Pass one value per
--   parameter, or one table: its fields bind named parameters, its array part `?` and
--   `?NNN` (a missing field binds NULL). Values: nil -> NULL, true/false -> 1/0,
--   integers, floats, strings -> TEXT (a string with a zero byte -> BLOB),
--   nimbus.sqlite.blob(s) -> BLOB. Results: INTEGER -> integer, REAL -> float,
--   TEXT and BLOB -> string, NULL -> the key is absent. Rows are keyed by column name
--   (alias duplicate names: the last one wins).
--
-- db:exec(sql, ...)  -> changes (rows this statement changed), last_insert_rowid
-- db:rows(sql, ...)  -> array of row tables
-- db:first(sql, ...) -> the first row table, or nil when there is none
-- db:tx(fn)          -> BEGIN IMMEDIATE; fn(db); COMMIT. Returns true and fn's results.
--   If fn raises, the transaction is rolled back and the same error is raised again.
--   Transactions do not nest. fn must not wait: nimbus.sleep, nimbus.http.request and
--   other waiting calls raise inside a transaction, so the write lock is never held
--   across the event loop.
--
-- Failures sqlite reports (syntax errors, constraint violations, SQLITE_BUSY, I/O) are
-- returned as nil, "sqlite: <message> (in: <sql>)", "SQLITE_<CODE>" (the primary code:
-- SQLITE_CONSTRAINT, SQLITE_BUSY, ...). Misuse raises: wrong argument types, a wrong
-- number of parameters, two statements in one call, any call on a closed db.
--
-- Every call runs on the event loop thread and blocks it while it runs: keep statements
-- short and indexed. Prepared statements are cached per db (the 32 most recently used
-- SQL strings), so repeating a constant SQL string is cheap.
local core = require("nimbus.sqlite.core")

local M = { sqlite_version = core.sqlite_version }

local known_opts = { busy_timeout = true, readonly = true }

function M.open(path, opts)
  if type(path) ~= "string" or path == "" then
    error("nimbus.sqlite.open: path must be a non-empty string (a file path or \":memory:\")", 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error("nimbus.sqlite.open: options must be a table", 2) end
  opts = opts or {}
  for k in pairs(opts) do
    if not known_opts[k] then
      error(("nimbus.sqlite.open: unknown option %q (busy_timeout, readonly)"):format(tostring(k)), 2)
    end
  end
  local busy = opts.busy_timeout
  if busy == nil then busy = 5 end
  if type(busy) ~= "number" or busy < 0 or busy > 86400 then
    error("nimbus.sqlite.open: busy_timeout must be a number of seconds between 0 and 86400", 2)
  end
  if opts.readonly ~= nil and type(opts.readonly) ~= "boolean" then
    error("nimbus.sqlite.open: readonly must be a boolean", 2)
  end
  return core.open(path, busy, opts.readonly == true)
end

-- nimbus.sqlite.blob(s): binds s as a BLOB (a plain string binds as TEXT).
M.blob = core.blob

return M

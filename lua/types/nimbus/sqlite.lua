---@meta nimbus.sqlite
-- LuaLS definitions of nimbus.sqlite (lua/nimbus/sqlite.lua, host/src/lua/nh_lsqlite.c):
-- sqlite databases an adapter owns.
--
--   local db = assert(nimbus.sqlite.open("erp.db"))
--   db:exec("CREATE TABLE IF NOT EXISTS acct (id TEXT PRIMARY KEY, name TEXT)")
--   db:tx(function(tx) tx:exec("INSERT INTO acct VALUES (?, ?)", "A1", "Ada") end)
--   local row = db:first("SELECT name FROM acct WHERE id = ?", "A1")   -- { name = "Ada" }

---@class nimbus.sqlite
---@field sqlite_version string the linked sqlite's version
local sqlite = {}

---@class nimbus.sqlite.OpenOptions
---@field busy_timeout? number seconds to wait for another handle's write lock (default 5)
---@field readonly? boolean

---@alias nimbus.sqlite.Row table<string, integer|number|string>

---@class nimbus.sqlite.Blob

---@class nimbus.sqlite.Db
local Db = {}

-- One statement; parameters bound (?, ?NNN, :name, @name, $name), one value each or one table.
---@param sql string
---@param ... any
---@return integer|nil changes, integer|string last_insert_rowid_or_message, string? code
function Db:exec(sql, ...) end

---@param sql string
---@param ... any
---@return nimbus.sqlite.Row[]|nil rows, string? message, string? code
function Db:rows(sql, ...) end

---@param sql string
---@param ... any
---@return nimbus.sqlite.Row|nil row, string? message, string? code
function Db:first(sql, ...) end

-- BEGIN IMMEDIATE; fn(db); COMMIT. fn must not wait; an error rolls back and is raised again.
---@param fn fun(db: nimbus.sqlite.Db): ...
---@return boolean ok, any ...
function Db:tx(fn) end

function Db:close() end

-- path: a file (relative to the working directory) or ":memory:".
---@param path string
---@param opts? nimbus.sqlite.OpenOptions
---@return nimbus.sqlite.Db|nil db, string? message, string? code
function sqlite.open(path, opts) end

-- Binds s as a BLOB (a plain string binds as TEXT).
---@param s string
---@return nimbus.sqlite.Blob
function sqlite.blob(s) end

return sqlite

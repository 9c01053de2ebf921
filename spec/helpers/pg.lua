-- pg: the PostgreSQL cluster of the tests, for the specs. The cluster is scripts/postgres.sh's (the
-- ctest fixture "postgres" starts it; NH_PG_URL, NH_PG_ADMIN_URL, NH_PG_DIR and NH_PG_PORT come from
-- CMake's NH_PG_ENV). Every spec works in databases of its own, made fresh and dropped afterwards.
--
--   local pg = require("pg")
--   local name, url = pg.createdb("orders")      -- database orders_<hex>, owned by role nimbus
--   local rows = pg.psql(url, "SELECT 1, 'a'")    -- { { "1", "a" } }
--   pg.value(url, "SELECT count(*) FROM t")       -- "0": the first field of the first row
--   pg.dropdb(name)                                -- or, in teardown: pg.cleanup() drops every one made here
--
-- psql runs as `psql -X -A -t` (no ~/.psqlrc, unaligned, rows only) under a deadline (pg.DEADLINE).
-- Fields are text; NULL comes out as "". Results of several statements come out as one list of rows.
-- Plain lua5.4 like spec/helpers/nh.lua: processes through `sh -c`, output through files.
local nh = require("nh")

local M = {}

M.DEADLINE = 60   -- seconds for one psql or scripts/postgres.sh call

-- Fields are separated by US (psql -F), records end with a zero byte (psql -0, which PostgreSQL text
-- cannot hold): a value may span lines.
local FS = "\31"

local q = nh.q

local function source_dir()
  local src = os.getenv("NIMBUS_SOURCE_DIR")
  if src and src ~= "" then return src end
  local me = debug.getinfo(1, "S").source
  local dir = me:sub(1, 1) == "@" and me:sub(2):match("^(.*)/[^/]*$") or "."
  return dir .. "/../.."   -- spec/helpers -> the source tree
end

function M.script() return source_dir() .. "/scripts/postgres.sh" end

-- scripts/postgres.sh ARGS...; stdout, or an error with the command line and what it printed.
local function script(...)
  local args = { q(M.script()) }
  for _, a in ipairs({ ... }) do args[#args + 1] = q(a) end
  local cmd = table.concat(args, " ")
  local r = nh.capture(("timeout -k 5 %d %s"):format(M.DEADLINE, cmd))
  if r.code ~= 0 then
    error(("%s exited %d%s\nstdout: %s\nstderr: %s"):format(cmd, r.code,
      r.code == 124 and (" (killed after %d s)"):format(M.DEADLINE) or "", r.out, r.err), 3)
  end
  return r.out
end
M.run_script = script

local function last_line(s) return s:match("([^\n]+)\n*$") end

local cached = {}

-- The URL the tests connect with: role nimbus, database nimbus.
function M.url()
  local u = os.getenv("NH_PG_URL")
  if u and u ~= "" then return u end
  cached.url = cached.url or last_line(script("url"))
  return cached.url
end

-- The superuser's URL (role postgres over the cluster's unix socket).
function M.admin_url()
  local u = os.getenv("NH_PG_ADMIN_URL")
  if u and u ~= "" then return u end
  cached.admin = cached.admin or last_line(script("admin-url"))
  return cached.admin
end

-- Runs sql through psql at url; returns { code, out, err } as it ended (no error on failure).
-- The caller's PG* settings are kept out (a PGPASSWORD or ~/.pgpass would answer a password the URL
-- leaves out), and the connection attempt has its own timeout.
function M.run(url, sql)
  local cmd = ("env -u PGPASSWORD -u PGSERVICE -u PGOPTIONS PGPASSFILE=/nonexistent/.pgpass PGCONNECT_TIMEOUT=10 "
    .. "timeout -k 5 %d psql -X -q -A -t -v ON_ERROR_STOP=1 -F %s -0 -d %s -c %s"):format(M.DEADLINE, q(FS), q(url), q(sql))
  local r = nh.capture(cmd)
  r.cmd = cmd
  return r
end

local function split(s, sep)
  local out, at = {}, 1
  while true do
    local i = s:find(sep, at, true)
    if not i then out[#out + 1] = s:sub(at) return out end
    out[#out + 1] = s:sub(at, i - 1)
    at = i + #sep
  end
end

local function rows_of(out)
  local rows = {}
  -- every record ends with RS (the last one too, with -0)
  for record in out:gmatch("([^\0]*)\0") do rows[#rows + 1] = split(record, FS) end
  return rows
end

-- Runs sql at url; returns its rows (a list of lists of text fields). Raises with the command and
-- psql's stderr when psql fails (a refused connection, an SQL error, the deadline).
function M.psql(url, sql)
  local r = M.run(url, sql)
  if r.code ~= 0 then
    error(("psql exited %d%s: %s\n%s"):format(r.code,
      r.code == 124 and (" (killed after %d s)"):format(M.DEADLINE) or "", r.cmd, r.err), 2)
  end
  return rows_of(r.out)
end

-- The first field of the first row, or nil when there is no row.
function M.value(url, sql)
  local row = M.psql(url, sql)[1]
  return row and row[1]
end

---------------------------------------------------------------------------- databases

local created = {}   -- name -> true, the databases made here and not yet dropped

-- A fresh database named <prefix>_<random hex>, owned by role nimbus; returns its name and URL.
function M.createdb(prefix)
  prefix = prefix or "nh"
  if type(prefix) ~= "string" or not prefix:match("^[a-z_][a-z0-9_]*$") or #prefix > 40 then
    error(("pg.createdb(%q): the prefix must be 1 to 40 lower-case letters, digits and '_', not starting with a digit")
      :format(tostring(prefix)), 2)
  end
  local name = prefix .. "_" .. nh.random_hex(8)
  local url = last_line(script("createdb", name))
  created[name] = true
  return name, url
end

-- Drops a database (ending its connections); nothing happens when it is already gone.
function M.dropdb(name)
  script("dropdb", name)
  created[name] = nil
end

-- Drops every database pg.createdb made and pg.dropdb did not drop (a spec's teardown).
function M.cleanup()
  if os.getenv("NH_KEEP") then return end
  local names = {}
  for name in pairs(created) do names[#names + 1] = name end
  table.sort(names)
  local failures = {}
  for _, name in ipairs(names) do
    local ok, err = pcall(M.dropdb, name)
    if not ok then failures[#failures + 1] = tostring(err) end
  end
  if #failures > 0 then error("pg.cleanup: " .. table.concat(failures, "\n"), 2) end
end

return M

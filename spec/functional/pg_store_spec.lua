-- `--store postgresql://...` as a user meets it today (docs/store-backends.md): the host
-- reaches the database, brings its schema to this version and runs on it; the commands not
-- built on it yet say so; every problem on the way is said with what to do, the password
-- masked. Real host processes against the cluster of the fixture
-- "postgres". Runs as ctest functional_pg_store.
local nh = require("nh")
local pg = require("pg")

local q = nh.q

local function host() return nh.bin() end

-- nimbus-host ARGS with --store url (or with NIMBUS_STORE=url when env is true), stopped
-- with SIGTERM after `secs` seconds (a host that runs; 60 by default, a deadline)
local function run(url, args, env, secs)
  local cmd = ("%s %s %s"):format(q(host()), args, env and "" or "--store " .. q(url))
  if env then cmd = "env NIMBUS_STORE=" .. q(url) .. " " .. cmd end
  return nh.capture(("env -u PGPASSWORD PGPASSFILE=/nonexistent/.pgpass timeout -k 5 %d %s"):format(secs or 60, cmd))
end

-- `publish` creates and migrates the store, then finds no subscriber: a quick migration.
local function migrate(url)
  local r = run(url, "publish Tick")
  assert.truthy(r.err:find("no endpoint subscribes to Tick", 1, true), r.err)
  return r
end

local function adapter()
  return (os.getenv("NIMBUS_SOURCE_DIR") or ".") .. "/samples/hello/adapter.lua"
end

local function url_with(user_password, hostport, dbname)
  local u = nh.parse_url(pg.url())
  return ("postgresql://%s@%s/%s"):format(user_password, hostport or u.hostport, dbname)
end

local function refused(r, ...)
  assert.is_not.equal(0, r.code, "exit 0:\n" .. r.out .. r.err)
  for _, plain in ipairs({ ... }) do
    assert.truthy(r.err:find(plain, 1, true), ("no %q in:\n%s"):format(plain, r.err))
  end
  assert.is_nil(r.err:find(":nimbus@", 1, true), "the password is shown:\n" .. r.err)
end

describe("a PostgreSQL store URL", function()
  local roles = {}
  teardown(function()
    for _, role in ipairs(roles) do pg.run(pg.admin_url(), ('DROP ROLE IF EXISTS "%s"'):format(role)) end
    pg.cleanup()
  end)

  it("is reached and migrated, a host runs on it, a second start migrates nothing, and purge finds nothing old",
     function()
    local _, url = pg.createdb("store")
    -- a reader finds no store yet and creates nothing
    local r = run(url, "events")
    refused(r, "holds no nimbus-host store yet")
    assert.equal("0", pg.value(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))

    r = run(url, q(adapter()), false, 3)   -- runs until the SIGTERM, then stops cleanly
    assert.equal(124, r.code, r.err)
    assert.truthy(r.err:find("migrated from version 0 to 4", 1, true), r.err)
    assert.truthy(r.err:find("ready: store postgresql://nimbus:***@", 1, true), r.err)
    assert.truthy(r.err:find("[host] stopped", 1, true), r.err)
    assert.is_nil(r.err:find(":nimbus@", 1, true), "the password is shown:\n" .. r.err)
    assert.equal("4", pg.value(url, "SELECT version FROM nimbus_schema"))
    for _, t in ipairs({ "audit", "history", "sessions", "parked", "inbox", "operator_pending", "operator_log",
                         "queue", "session_locks", "subscriptions" }) do
      assert.equal("1", pg.value(url, ("SELECT count(*) FROM pg_tables WHERE tablename = '%s'"):format(t)), t)
    end

    r = run(url, q(adapter()), true, 3)   -- NIMBUS_STORE, the same way
    assert.equal(124, r.code, r.err)
    assert.truthy(r.err:find("ready:", 1, true), r.err)
    assert.is_nil(r.err:find("migrated", 1, true), r.err)

    -- (publishing through a broker on this store: functional_pgamqp_*, functional_pg_amqp)
    r = run(url, "purge --resolved-before 7d")   -- nothing old enough here
    assert.equal(0, r.code, r.err)
    assert.truthy(r.out:find("deleted 0 resolved events", 1, true), r.out)
  end)

  it("that is malformed, or where nothing listens, is refused with what to write or check", function()
    refused(run(url_with("nimbus:nimbus", "127.0.0.1:55432:5", "x"), "events"), "is not a number")
    -- a port nothing listens on: bind one, note it, close it
    local port = nh.free_port()
    refused(run(url_with("nimbus:nimbus", "127.0.0.1:" .. port, "x"), "events"), "no PostgreSQL server answers",
            "pg_isready")
  end)

  it("with a wrong password, or a missing database, says which and what to do", function()
    local name = pg.createdb("pw")
    refused(run(url_with("nimbus:wrong", nil, name), q(adapter())), "password authentication failed", "28P01",
            "PGPASSWORD")
    refused(run(url_with("nimbus:nimbus", nil, "nh_missing_db"), q(adapter())), 'database "nh_missing_db" does not exist',
            "createdb", "CREATE DATABASE")
  end)

  it("written by a newer nimbus-host is refused naming both versions", function()
    local _, url = pg.createdb("newer")
    migrate(url)
    pg.psql(url, "UPDATE nimbus_schema SET version = 99")
    local r = run(url, q(adapter()))
    refused(r, "99", "4")
    assert.is_nil(r.err:find("migrated", 1, true), r.err)
    assert.equal("99", pg.value(url, "SELECT version FROM nimbus_schema"))
  end)

  it("for a role that may not create tables names the GRANT it needs, and creates nothing", function()
    local name = pg.createdb("rights")
    local role = "nh_norights_" .. nh.random_hex(4)
    roles[#roles + 1] = role
    pg.psql(pg.admin_url(), ("CREATE ROLE %s LOGIN PASSWORD 'pw'"):format(role))
    -- PostgreSQL 15: CREATE on schema public belongs to the database owner (nimbus) only
    local r = run(url_with(role .. ":pw", nil, name), q(adapter()))
    refused(r, "GRANT", role)
    assert.equal("0", pg.value(pg.url():gsub("/nimbus$", "/" .. name),
                               "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))
  end)
end)

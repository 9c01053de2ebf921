-- The PostgreSQL cluster of the tests (scripts/postgres.sh) and spec/helpers/pg.lua, before any store
-- runs on it: the cluster the fixture "postgres" started answers as the store tests expect, databases
-- are made fresh and owned by role nimbus, passwords are checked, and the script itself starts, restarts
-- after a crash and stops a cluster of its own. Runs as ctest functional_pg_cluster.
local nh = require("nh")
local pg = require("pg")

local q = nh.q

-- scripts/postgres.sh with env (a table; false unsets a variable); returns { code, out, err }.
local function script(env, ...)
  local unset, set = {}, {}
  for k, v in pairs(env or {}) do
    if v == false then unset[#unset + 1] = "-u " .. k else set[#set + 1] = q(k .. "=" .. v) end
  end
  -- env takes its options before the first NAME=VALUE
  local parts = { "env", table.concat(unset, " "), table.concat(set, " ") }
  parts[#parts + 1] = "timeout -k 5 120"
  parts[#parts + 1] = q(pg.script())
  for _, a in ipairs({ ... }) do parts[#parts + 1] = q(a) end
  return nh.capture(table.concat(parts, " "))
end

local function url_with(user_password, dbname)
  local u = nh.parse_url(pg.url())
  return ("postgresql://%s@%s/%s"):format(user_password, u.hostport, dbname)
end

local function refused(url, pattern)
  local r = pg.run(url, "SELECT 1")
  assert.is_not.equal(0, r.code, "psql connected to " .. url .. " but should have been refused")
  assert.matches(pattern, r.err)
end

describe("the PostgreSQL cluster of the tests", function()
  teardown(function() pg.cleanup() end)

  it("answers at pg.url() as role nimbus on 127.0.0.1, with the settings the store tests rely on", function()
    local url = pg.url()
    assert.matches("^postgresql://nimbus:nimbus@127%.0%.0%.1:%d+/nimbus$", url)
    local row = pg.psql(url, "SELECT current_user, current_database(), host(inet_server_addr()), inet_server_port()")[1]
    assert.same("nimbus", row[1])
    assert.same("nimbus", row[2])
    assert.same("127.0.0.1", row[3])
    assert.same(nh.parse_url(url).hostport:match(":(%d+)$"), row[4])
    if os.getenv("NH_PG_PORT") then assert.same(os.getenv("NH_PG_PORT"), row[4]) end
    assert.same("on", pg.value(url, "SHOW fsync"))
    assert.same("on", pg.value(url, "SHOW synchronous_commit"))
    assert.same("200", pg.value(url, "SHOW max_connections"))
    assert.same("32MB", pg.value(url, "SHOW shared_buffers"))
    assert.same("UTF8", pg.value(url, "SHOW server_encoding"))
    assert.same("f", pg.value(url, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))

    local admin = pg.admin_url()
    assert.same({ { "postgres", "t" } }, pg.psql(admin, "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"))
    assert.same("127.0.0.1", pg.value(admin, "SHOW listen_addresses"))
  end)

  it("createdb gives a fresh database that role nimbus owns and can create tables in", function()
    local name, url = pg.createdb("cluster")
    assert.matches("^cluster_%x+$", name)
    assert.matches("/" .. name .. "$", url)
    assert.same({ { name, "nimbus" } },
      pg.psql(url, "SELECT current_database(), pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"))
    assert.same("0", pg.value(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))

    pg.psql(url, "CREATE TABLE t (id int PRIMARY KEY, body text NOT NULL)")
    pg.psql(url, "INSERT INTO t VALUES (1, 'one'), (2, E'two\\nlines|with a bar')")
    assert.same({ { "1", "one" }, { "2", "two\nlines|with a bar" } }, pg.psql(url, "SELECT id, body FROM t ORDER BY id"))
    assert.same("nimbus", pg.value(url, "SELECT tableowner FROM pg_tables WHERE tablename = 't'"))

    -- a name in use is refused, not reused
    local again = script(nil, "createdb", name)
    assert.is_not.equal(0, again.code)
    assert.matches("database " .. name .. " already exists", again.err)
    assert.matches("dropdb " .. name, again.err)
    assert.same("2", pg.value(url, "SELECT count(*) FROM t"), "the existing database was touched")
  end)

  it("refuses a wrong or missing password, and the superuser over TCP", function()
    local name = pg.createdb("auth")
    refused(url_with("nimbus:wrong", name), 'password authentication failed for user "nimbus"')
    refused(url_with("nimbus", name), "no password supplied")
    refused(url_with("postgres", "postgres"), "no password supplied")
    refused(url_with("postgres:postgres", "postgres"), 'password authentication failed for user "postgres"')
    -- the right password still gets in (the refusals above are about the password, not the database)
    assert.same("1", pg.value(url_with("nimbus:nimbus", name), "SELECT 1"))
  end)

  it("keeps two databases independent", function()
    local _, a = pg.createdb("indep")
    local _, b = pg.createdb("indep")
    assert.is_not.equal(a, b)
    pg.psql(a, "CREATE TABLE t (v text); INSERT INTO t VALUES ('in a'); CREATE TABLE only_a (x int)")
    pg.psql(b, "CREATE TABLE t (v text); INSERT INTO t VALUES ('in b'), ('also in b')")
    assert.same({ { "in a" } }, pg.psql(a, "SELECT v FROM t"))
    assert.same({ { "also in b" }, { "in b" } }, pg.psql(b, "SELECT v FROM t ORDER BY v"))
    local r = pg.run(b, "SELECT * FROM only_a")
    assert.is_not.equal(0, r.code)
    assert.matches('relation "only_a" does not exist', r.err)
    local ok, err = pcall(pg.psql, b, "SELECT * FROM only_a")
    assert.is_false(ok)
    assert.matches("psql exited", err)
    assert.matches("only_a", err)
  end)

  it("dropdb removes a database even while a client is connected to it; a second dropdb changes nothing", function()
    local name, url = pg.createdb("drop")
    pg.psql(url, "CREATE TABLE t (v int)")
    -- a client left connected, as a test that crashed half-way leaves one
    local sb = nh.sandbox()
    local client_pid
    finally(function()
      if client_pid then nh.sh("kill " .. client_pid .. " 2>/dev/null") end
      sb:cleanup()
    end)
    local started = nh.capture(("psql -X -q -d %s -c 'SELECT pg_sleep(600)' >%s 2>&1 </dev/null & echo $!")
      :format(q(url), q(sb:path("client.out"))))
    client_pid = assert(tonumber(started.out:match("%d+")), "no pid for the background psql: " .. started.err)
    nh.eventually(function()
      return pg.value(pg.admin_url(), ("SELECT count(*) FROM pg_stat_activity WHERE datname = '%s'"):format(name)) == "1"
    end, nil, "the background psql never showed up in pg_stat_activity: " .. (nh.read(sb:path("client.out")) or ""))

    pg.dropdb(name)
    assert.same("0", pg.value(pg.admin_url(), ("SELECT count(*) FROM pg_database WHERE datname = '%s'"):format(name)))
    refused(url, ('database "%s" does not exist'):format(name))
    nh.eventually(function() return nh.sh("kill -0 " .. client_pid .. " 2>/dev/null") ~= 0 end, nil,
      "the connected client was not ended")
    client_pid = nil
    assert.matches("terminat", nh.read(sb:path("client.out")))

    local again = script(nil, "dropdb", name)
    assert.same(0, again.code, again.err)
  end)

  it("says what is wrong with a bad command or database name, and changes nothing", function()
    -- by name: other suites make and drop their own databases meanwhile (ctest -j)
    local function count(name)
      return pg.value(pg.admin_url(), ("SELECT count(*) FROM pg_database WHERE datname = '%s'")
                                        :format((name:gsub("'", "''"))))
    end
    local cases = {
      { { "createdb", "Bad Name" }, "invalid database name 'Bad Name'" },
      { { "createdb", "1abc" }, "invalid database name '1abc'" },
      { { "createdb", ("x"):rep(64) }, "1 to 63" },
      { { "dropdb", "a;b" }, "invalid database name 'a;b'" },
      { { "dropdb", "nimbus" }, "'nimbus' is one of the cluster's own databases" },
      { { "dropdb", "template1" }, "'template1' is one of the cluster's own databases" },
      { { "createdb" }, "usage: .* createdb NAME" },
      { { "frobnicate" }, "usage: .*install|start|stop|status" },
    }
    for _, c in ipairs(cases) do
      local r = script(nil, table.unpack(c[1]))
      assert.same(2, r.code, table.concat(c[1], " ") .. " should exit 2: " .. r.out .. r.err)
      assert.matches(c[2], r.err)
    end
    local ok, err = pcall(pg.createdb, "Upper")
    assert.is_false(ok)
    assert.matches("prefix must be", err)
    for _, name in ipairs({ "Bad Name", "1abc", ("x"):rep(63), "a;b" }) do
      assert.same("0", count(name), name .. " was created")
    end
    for _, name in ipairs({ "nimbus", "template1" }) do assert.same("1", count(name), name .. " was dropped") end
    assert.same("1", pg.value(pg.url(), "SELECT 1"), "the nimbus database is still there")
  end)
end)

describe("scripts/postgres.sh on a cluster of its own", function()
  local sb, env, port, stand_in

  before_each(function()
    sb = nh.sandbox()
    -- the server runs as the OS user postgres when we are root: it must be able to enter the sandbox
    assert(nh.sh("chmod 755 " .. q(sb.dir)) == 0)
    port = nh.free_port()
    env = { NH_PG_DIR = sb:path("pg"), NH_PG_PORT = tostring(port), NH_PG_URL = false, NH_PG_ADMIN_URL = false }
  end)

  after_each(function()
    if stand_in then nh.sh("kill " .. stand_in .. " 2>/dev/null") stand_in = nil end
    script(env, "stop")
    sb:cleanup()
  end)

  local function url() return ("postgresql://nimbus:nimbus@127.0.0.1:%d/nimbus"):format(port) end
  local function postmaster_pid() return tonumber((nh.read(sb:path("pg/data/postmaster.pid")) or ""):match("^(%d+)")) end

  it("starts from nothing, again idempotently, restarts after a crash whose pid went to another process, stops twice", function()
    local st = script(env, "status")
    assert.same(1, st.code)
    assert.matches("not running", st.out)
    refused(url(), "Connection refused")

    local r = script(env, "start")
    assert.same(0, r.code, r.out .. r.err)
    assert.matches("initdb", r.out)
    assert.matches("ready in", r.out)
    assert.same(0, script(env, "status").code)
    assert.same(tostring(port), pg.value(url(), "SELECT inet_server_port()"))
    assert.same(url(), script(env, "url").out:match("[^\n]+"))
    local pid = postmaster_pid()

    r = script(env, "start")
    assert.same(0, r.code, r.out .. r.err)
    assert.matches("already running %(pid " .. pid, r.out)
    assert.same(pid, postmaster_pid())

    -- a second cluster on the same port is refused with the reason
    local other = script({ NH_PG_DIR = sb:path("other"), NH_PG_PORT = tostring(port), NH_PG_URL = false, NH_PG_ADMIN_URL = false },
      "start")
    assert.same(1, other.code)
    assert.matches("port " .. port .. " is already in use", other.err)

    -- committed before the crash, so it must be there after it
    local db_url = script(env, "createdb", "kept").out:match("[^\n]+")
    pg.psql(db_url, "CREATE TABLE t (v text); INSERT INTO t VALUES ('committed')")

    -- kill -9 the postmaster and wait for its backends to go, then hand its pid to another process:
    -- postgres alone would take the pid file for a live postmaster and refuse to start
    nh.sh("kill -9 " .. pid)
    nh.eventually(function() return script(env, "status").code ~= 0 end, nil, "the killed cluster still answers")
    -- (as the cluster's OS user: postgres takes a pid file whose pid belongs to another user for stale)
    local as_owner = nh.capture("id -u").out:match("^0%s") and "setpriv --reuid=postgres --regid=postgres --init-groups " or ""
    stand_in = tonumber(nh.capture(as_owner .. "sleep 600 >/dev/null 2>&1 & echo $!").out:match("%d+"))
    local pidfile = sb:path("pg/data/postmaster.pid")
    local text = assert(nh.read(pidfile))
    nh.write(pidfile, (text:gsub("^%d+", tostring(stand_in))))

    r = script(env, "start")
    assert.same(0, r.code, r.out .. r.err)
    assert.matches("removing the stale", r.out)
    assert.matches("ready in", r.out)
    assert.is_not.equal(pid, postmaster_pid())
    assert.same({ { "committed" } }, pg.psql(db_url, "SELECT v FROM t"))
    assert.same(0, nh.sh("kill -0 " .. stand_in), "the stand-in process was touched")

    r = script(env, "stop")
    assert.same(0, r.code, r.out .. r.err)
    assert.matches("stopped in", r.out)
    assert.same(1, script(env, "status").code)
    refused(url(), "Connection refused")
    assert.is_false(nh.exists(pidfile))
    r = script(env, "stop")
    assert.same(0, r.code, r.out .. r.err)
    assert.matches("not running", r.out)
  end)

  it("says the cluster is not running when createdb cannot reach it", function()
    local r = script(env, "createdb", "nowhere")
    assert.same(1, r.code)
    assert.matches("cannot connect as the superuser", r.err)
    assert.matches("postgres.sh start", r.err)
  end)
end)

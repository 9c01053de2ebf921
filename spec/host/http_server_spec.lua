-- nimbus.http.serve inside the host (nimbus-host -l busted). The clients are curl (or
-- bash's /dev/tcp for raw bytes) started in the background by the shell; each writes
-- its answer to files that the test polls from inside a task with nimbus.sleep, so the
-- loop keeps serving while the client waits.
local nimbus = require("nimbus")
local now = nimbus.now or require("nimbus.core").now   -- wall clock, seconds

local dir
local seq = 0

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function exists(p)
  local f = io.open(p)
  if f then f:close() end
  return f ~= nil
end

local function slurp(p)
  local f = io.open(p, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function spit(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end

-- Runs a shell command in the background; `base`.done appears when it has finished.
local function background(cmd)
  seq = seq + 1
  local base = ("%s/r%d"):format(dir, seq)
  os.execute(("( %s ; echo $? > %s.rc.tmp ; mv %s.rc.tmp %s.done ) >/dev/null 2>&1 &"):format(cmd, base, base, base))
  return base
end

-- curl in the background. opts: method, data (string, sent from a file), headers (list
-- of "Name: value"), args (extra raw arguments).
local function request(url, opts)
  opts = opts or {}
  local base = ("%s/r%d"):format(dir, seq + 1)
  local a = { "curl", "-s", "--max-time", "10", "-o", q(base .. ".body"), "-D", q(base .. ".hdr"),
              "-w", q("%{http_code}"), "-H", q("Expect:") }
  if opts.method then a[#a + 1] = "-X " .. q(opts.method) end
  if opts.data then
    spit(base .. ".in", opts.data)
    a[#a + 1] = "--data-binary " .. q("@" .. base .. ".in")
  end
  for _, h in ipairs(opts.headers or {}) do a[#a + 1] = "-H " .. q(h) end
  if opts.args then a[#a + 1] = opts.args end
  a[#a + 1] = q(url)
  local b = background(table.concat(a, " ") .. " > " .. q(base .. ".code"))
  assert(b == base)
  return base
end

local function is_done(base) return exists(base .. ".done") end

local function wait_done(base, timeout)
  local deadline = now() + (timeout or 15)
  while not is_done(base) do
    if now() > deadline then error("no answer within " .. (timeout or 15) .. " s for " .. base, 2) end
    nimbus.sleep(0.01)
  end
end

-- Waits (inside a task) for a request started with `request`; returns
-- { status, body, headers (lower-case names), curl_rc }.
local function await(base, timeout)
  wait_done(base, timeout)
  local res = { status = tonumber(slurp(base .. ".code") or "") or 0, body = slurp(base .. ".body") or "",
                curl_rc = tonumber(slurp(base .. ".done")), headers = {}, base = base }
  for line in (slurp(base .. ".hdr") or ""):gmatch("[^\r\n]+") do
    local k, v = line:match("^([^:]+):%s*(.*)$")
    if k then res.headers[k:lower()] = v end
  end
  return res
end

local function fetch(url, opts) return await(request(url, opts)) end

-- Raw bytes over TCP (printf escapes allowed); returns what the server sent.
local function raw(port, bytes)
  local base = background(("bash -c %s > %s"):format(
    q(("exec 3<>/dev/tcp/127.0.0.1/%d && printf %s >&3 && timeout 5 cat <&3"):format(port, q(bytes))),
    q(dir .. "/raw" .. (seq + 1))))
  wait_done(base)
  return slurp(dir .. "/raw" .. base:match("r(%d+)$")) or ""
end

local function serve(routes, opts)
  opts = opts or {}
  opts.port = opts.port or 0
  opts.routes = routes
  local srv = assert(nimbus.http.serve(opts))
  return srv, ("http://127.0.0.1:%d"):format(srv.port)
end

describe("nimbus.http.serve", function()
  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
  end)

  teardown(function()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  it("is exposed as nimbus.http.serve", function()
    assert.is_function(nimbus.http.serve)
  end)

  it("serves GET with path params, a decoded query and lower-cased headers", function()
    local srv, base = serve{
      ["GET /api/customers/{id}"] = function(req)
        return 200, { id = req.params.id, method = req.method, path = req.path, query = req.query,
                      trace = req.headers["x-trace-id"], body = req.body }
      end,
      ["GET /api/customers/{id}/orders/{order}"] = function(req)
        return 200, { id = req.params.id, order = req.params.order }
      end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/api/customers/C%2F42?name=Ada+L%C3%B6v&tag=a&tag=b&flag",
                      { headers = { "X-Trace-Id: t-1" } })
      assert.are.equal(200, r.status)
      assert.matches("^application/json", r.headers["content-type"])
      local b = nimbus.json.decode(r.body)
      assert.are.equal("C/42", b.id)           -- one segment, decoded after matching
      assert.are.equal("GET", b.method)
      assert.are.equal("/api/customers/C%2F42", b.path)
      assert.are.same({ name = "Ada Löv", tag = { "a", "b" }, flag = "" }, b.query)
      assert.are.equal("t-1", b.trace)
      assert.are.equal("", b.body)
      r = fetch(base .. "/api/customers/7/orders/99")
      assert.are.same({ id = "7", order = "99" }, nimbus.json.decode(r.body))
    end)
  end)

  it("prefers literal segments over parameters", function()
    local srv, base = serve{
      ["GET /items/{id}"] = function(req) return 200, "param " .. req.params.id end,
      ["GET /items/new"] = function() return 200, "literal" end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      assert.are.equal("literal", fetch(base .. "/items/new").body)
      assert.are.equal("param 5", fetch(base .. "/items/5").body)
    end)
  end)

  it("echoes a POSTed JSON body through req:json()", function()
    local srv, base = serve{
      ["POST /api/customers"] = function(req)
        local body, err = req:json()
        if not body then return 400, { error = err } end
        body.seen = true
        return 201, body, { ["X-Created"] = "yes" }
      end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/api/customers", { data = '{"name":"Ada","n":42,"tags":["x"]}',
                                                  headers = { "Content-Type: application/json" } })
      assert.are.equal(201, r.status)
      assert.are.equal("yes", r.headers["x-created"])
      local b = nimbus.json.decode(r.body)
      assert.are.same({ name = "Ada", n = 42, tags = { "x" }, seen = true }, b)
      assert.are.equal("integer", math.type(b.n))
    end)
  end)

  it("req:json() returns nil and a message on malformed or empty JSON", function()
    local srv, base = serve{
      ["POST /j"] = function(req)
        local v, err = req:json()
        return 200, { value_is_nil = v == nil, err = err }
      end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local b = nimbus.json.decode(fetch(base .. "/j", { data = '{"name": ' }).body)
      assert.is_true(b.value_is_nil)
      assert.matches("malformed JSON", b.err)
      b = nimbus.json.decode(fetch(base .. "/j", { method = "POST" }).body)
      assert.is_true(b.value_is_nil)
      assert.matches("empty", b.err)
    end)
  end)

  it("sends string bodies as text, honours custom headers, and empty bodies for nil", function()
    local srv, base = serve{
      ["GET /text"] = function() return 200, "hello\n" end,
      ["GET /csv"] = function()
        return 200, "a,b\n1,2\n", { ["Content-Type"] = "text/csv", ["X-Rows"] = 1, ["Set-Cookie"] = { "a=1", "b=2" } }
      end,
      ["DELETE /thing/{id}"] = function() return 204 end,
      ["GET /created"] = function() return 201, nil, { Location = "/thing/1" } end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/text")
      assert.are.equal(200, r.status)
      assert.are.equal("hello\n", r.body)
      assert.are.equal("text/plain; charset=utf-8", r.headers["content-type"])
      r = fetch(base .. "/csv")
      assert.are.equal("text/csv", r.headers["content-type"])
      assert.are.equal("1", r.headers["x-rows"])
      assert.are.equal("a,b\n1,2\n", r.body)
      assert.matches("Set%-Cookie: a=1\r\nSet%-Cookie: b=2\r\n", slurp(r.base .. ".hdr"))
      r = fetch(base .. "/thing/1", { method = "DELETE" })
      assert.are.equal(204, r.status)
      assert.are.equal("", r.body)
      r = fetch(base .. "/created")
      assert.are.equal(201, r.status)
      assert.are.equal("/thing/1", r.headers["location"])
      assert.are.equal("", r.body)
      assert.is_nil(r.headers["content-type"])
    end)
  end)

  it("answers HEAD from the GET route without a body", function()
    local srv, base = serve{ ["GET /h"] = function() return 200, "body" end }
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/h", { args = "-I" })   -- -I: curl writes the head as the body
      assert.are.equal(200, r.status)
      assert.are.equal("4", r.headers["content-length"])
      assert.are.equal("\r\n\r\n", r.body:sub(-4))
    end)
  end)

  it("answers 404 for an unknown path and 405 with Allow for a known path", function()
    local srv, base = serve{
      ["GET /api/customers/{id}"] = function() return 200, "x" end,
      ["PUT /api/customers/{id}"] = function() return 200, "x" end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/nope")
      assert.are.equal(404, r.status)
      assert.are.same({ error = "not found" }, nimbus.json.decode(r.body))
      r = fetch(base .. "/api/customers")
      assert.are.equal(404, r.status)
      r = fetch(base .. "/api/customers/1", { method = "POST", data = "{}" })
      assert.are.equal(405, r.status)
      assert.are.equal("GET, HEAD, PUT", r.headers["allow"])
    end)
  end)

  it("answers 413 for a body over max_body, announced or chunked, and keeps serving", function()
    local got
    local srv, base = serve({ ["POST /up"] = function(req) got = #req.body; return 200, tostring(#req.body) end },
                            { max_body = 1000 })
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/up", { data = string.rep("x", 1000) })
      assert.are.equal(200, r.status)
      assert.are.equal("1000", r.body)
      got = nil
      r = fetch(base .. "/up", { data = string.rep("x", 5000) })
      assert.are.equal(413, r.status)
      r = fetch(base .. "/up", { data = string.rep("y", 200000), headers = { "Transfer-Encoding: chunked" } })
      assert.are.equal(413, r.status)
      assert.is_nil(got)   -- the route never ran
      r = fetch(base .. "/up", { data = "small", headers = { "Transfer-Encoding: chunked" } })
      assert.are.equal("5", r.body)
    end)
  end)

  it("answers 431 for too many request headers", function()
    local srv, base = serve({ ["GET /h"] = function() return 200, "ok" end }, { max_headers = 20 })
    finally(function() srv:close() end)
    nimbus.run(function()
      local hs = {}
      for i = 1, 30 do hs[i] = ("X-H%d: v"):format(i) end
      assert.are.equal(431, fetch(base .. "/h", { headers = hs }).status)
      assert.are.equal(200, fetch(base .. "/h", { headers = { "X-One: 1" } }).status)
    end)
  end)

  it("answers 400 to a malformed request", function()
    local srv = serve{ ["GET /h"] = function() return 200, "ok" end }
    finally(function() srv:close() end)
    nimbus.run(function()
      assert.matches("^HTTP/1%.1 400", raw(srv.port, "GET / HTTP/1.1\\r\\nHost: x\\r\\nNoColonHere\\r\\n\\r\\n"))
      assert.matches("^HTTP/1%.1 400", raw(srv.port, "NOT A REQUEST\\r\\n\\r\\n"))
    end)
  end)

  it("answers 500 when a route raises, then serves the next request", function()
    local srv, base = serve{
      ["GET /boom"] = function() error("kaboom") end,
      ["GET /obj"] = function() error(nimbus.permanent("typed")) end,
      ["GET /ok"] = function() return 200, "fine" end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/boom")
      assert.are.equal(500, r.status)
      assert.are.same({ error = "internal error" }, nimbus.json.decode(r.body))
      assert.are.equal(500, fetch(base .. "/obj").status)
      r = fetch(base .. "/ok")
      assert.are.equal(200, r.status)
      assert.are.equal("fine", r.body)
    end)
  end)

  it("answers 500 for a non-integer status or an unencodable body", function()
    local srv, base = serve{
      ["GET /float"] = function() return 200.5, "x" end,
      ["GET /none"] = function() end,
      ["GET /str"] = function() return "200", "x" end,
      ["GET /range"] = function() return 42, "x" end,
      ["GET /fn"] = function() return 200, { f = print } end,
      ["GET /hdr"] = function() return 200, "x", { ["X-Bad"] = "a\r\nInjected: 1" } end,
      ["GET /intfloat"] = function() return 200.0, "ok" end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      for _, p in ipairs{ "/float", "/none", "/str", "/range", "/fn", "/hdr" } do
        local r = fetch(base .. p)
        assert.are.equal(500, r.status, p)
        assert.is_nil(r.headers["injected"])
      end
      assert.are.equal(200, fetch(base .. "/intfloat").status)
    end)
  end)

  it("serves other requests while a route sleeps", function()
    local order = {}
    local srv, base = serve{
      ["GET /slow"] = function() nimbus.sleep(0.5); order[#order + 1] = "slow"; return 200, "slow" end,
      ["GET /fast"] = function() order[#order + 1] = "fast"; return 200, "fast" end,
    }
    finally(function() srv:close() end)
    nimbus.run(function()
      local slow = request(base .. "/slow")
      nimbus.sleep(0.1)
      local fast = await(request(base .. "/fast"))
      assert.are.equal("fast", fast.body)
      assert.is_false(is_done(slow))
      assert.are.equal("slow", await(slow).body)
      assert.are.same({ "fast", "slow" }, order)
    end)
  end)

  it("answers 504 when a route passes its deadline and 500 when it exhausts its CPU budget", function()
    local srv, base = serve({
      ["GET /late"] = function() nimbus.sleep(5); return 200, "late" end,
      ["GET /spin"] = function() while true do end end,
      ["GET /ok"] = function() return 200, "ok" end,
    }, { timeout = 0.3, cpu_budget = 0.05 })
    finally(function() srv:close() end)
    nimbus.run(function()
      local r = fetch(base .. "/late")
      assert.are.equal(504, r.status)   -- the route's 5 s sleep was cut at its 0.3 s deadline
      assert.are.equal(500, fetch(base .. "/spin").status)
      assert.are.equal("ok", fetch(base .. "/ok").body)
    end)
  end)

  it("picks a free port for port = 0 and returns nil, message, code when the port is taken", function()
    local a = serve{ ["GET /a"] = function() return 200, "a" end }
    finally(function() a:close() end)
    assert.is_true(a.port > 0)
    local b, err, code = nimbus.http.serve{ port = a.port, routes = { ["GET /b"] = function() end } }
    assert.is_nil(b)
    assert.matches("in use", err)
    assert.are.equal("EADDRINUSE", code)
    b, err, code = nimbus.http.serve{ host = "not-an-address", port = 0, routes = { ["GET /b"] = function() end } }
    assert.is_nil(b)
    assert.matches("bad host", err)
    assert.are.equal("EINVAL", code)
    b, err, code = nimbus.http.serve{ host = "192.0.2.1", port = 0, routes = { ["GET /b"] = function() end } }
    assert.is_nil(b)
    assert.are.equal("EADDRNOTAVAIL", code)
  end)

  it("raises on bad route tables and options (misuse)", function()
    local f = function() end
    local function bad(routes, pat, opts)
      opts = opts or {}
      opts.port = opts.port or 0
      opts.routes = routes
      local ok, err = pcall(nimbus.http.serve, opts)
      assert.is_false(ok)
      assert.matches(pat, err)
    end
    bad({ ["/x"] = f }, "METHOD /path")
    bad({ ["GET"] = f }, "METHOD /path")
    bad({ ["get /x"] = f }, "upper case")
    bad({ ["GET x"] = f }, "start with /")
    bad({ ["GET /a/{id}"] = f, ["GET /a/{other}"] = f }, "duplicate route")
    bad({ ["GET /a/x{id}"] = f }, "whole segment")
    bad({ ["GET /a"] = "nope" }, "must map to a function")
    bad({}, "empty")
    bad(nil, "routes")
    bad({ ["GET /a"] = f }, "port", { port = 70000 })
    bad({ ["GET /a"] = f }, "max_body", { max_body = "big" })
    assert.has_error(function() nimbus.http.serve() end)
    assert.has_error(function() nimbus.http.serve{ routes = { ["GET /a"] = f } } end)   -- no port
  end)

  it("refuses connections after srv:close()", function()
    local srv, base = serve{ ["GET /a"] = function() return 200, "a" end }
    nimbus.run(function()
      assert.are.equal(200, fetch(base .. "/a").status)
      srv:close()
      srv:close()   -- idempotent
      assert.is_false(srv:listening())
      local r = fetch(base .. "/a")
      assert.are.equal(0, r.status)
      assert.are.equal(7, r.curl_rc)   -- CURLE_COULDNT_CONNECT
    end)
  end)

  it("closes a connection whose route is still running when the server closes", function()
    local started, finished = false, false
    local srv, base = serve{
      ["GET /slow"] = function() started = true; nimbus.sleep(0.3); finished = true; return 200, "late" end,
    }
    nimbus.run(function()
      local slow = request(base .. "/slow")
      local deadline = now() + 10
      while not started and now() < deadline do nimbus.sleep(0.01) end
      srv:close()
      local r = await(slow)
      assert.are_not.equal(200, r.status)
      assert.are_not.equal(0, r.curl_rc)
      nimbus.sleep(0.3)
      assert.is_true(finished)   -- the task ran to its end; its answer was dropped
    end)
  end)

  it("lets a route close its own server", function()
    local srv, base
    srv, base = serve{ ["POST /shutdown"] = function() srv:close(); return 200, "bye" end }
    nimbus.run(function()
      local r = fetch(base .. "/shutdown", { data = "" })
      assert.are_not.equal(200, r.status)
      assert.is_false(srv:listening())
      assert.are.equal(7, fetch(base .. "/shutdown").curl_rc)
    end)
  end)

  it("logs route errors with route, path and traceback; a script ends once requests in flight are answered", function()
    -- the host running this spec (its parent's parent, seen from io.popen's shell)
    local p = io.popen("readlink -f /proc/$PPID/exe")
    local exe = os.getenv("NIMBUS_HOST") or p:read("l")
    p:close()
    if not (exe or ""):match("nimbus%-host$") then
      print("# skipped: cannot locate the nimbus-host binary (running under valgrind?); set NIMBUS_HOST")
      return
    end
    local script = dir .. "/child.lua"
    spit(script, ([[
      local nimbus = require("nimbus")
      local now = nimbus.now or require("nimbus.core").now
      local srv = assert(nimbus.http.serve{ port = 0, routes = {
        ["GET /boom/{id}"] = function(req) error("child kaboom") end,
        ["GET /hang"] = function() HANGING = true; nimbus.sleep(1); return 200, "late" end,
      } })
      os.execute(("curl -s -o /dev/null http://127.0.0.1:%%d/boom/7 && touch %s/child.done &"):format(srv.port))
      os.execute(("(curl -s -o %s/hang.tmp --max-time 20 http://127.0.0.1:%%d/hang; mv %s/hang.tmp %s/hang.out) &")
        :format(srv.port))
      nimbus.run(function()
        local deadline = now() + 10
        while not (HANGING and io.open(%q)) and now() < deadline do nimbus.sleep(0.01) end
        -- /boom was answered and /hang is suspended in its route
      end)
      print("child done")
    ]]):format(dir, dir, dir, dir, dir .. "/child.done"))
    local base = background(("%s -l %s > %s/child.out 2> %s/child.err"):format(q(exe), q(script), dir, dir))
    nimbus.run(function()
      wait_done(base, 20)
      local deadline = now() + 10   -- the /hang client finishes on its own after the child
      while not exists(dir .. "/hang.out") and now() < deadline do nimbus.sleep(0.01) end
    end)
    local rc = tonumber(slurp(base .. ".done"))
    local out, err = slurp(dir .. "/child.out"), slurp(dir .. "/child.err")
    assert.are.equal(0, rc, err)
    assert.matches("child done", out)
    assert.matches('route "GET /boom/{id}" %(GET /boom/7%) raised an error', err)
    assert.matches("child kaboom", err)
    assert.matches("stack traceback", err)
    -- the script ended while /hang slept in its route: the loop ran on until it was answered
    assert.are.equal("late", slurp(dir .. "/hang.out"))
  end)
end)

-- nimbus.http.request against a real local server (nimbus.http.serve in the same host).
local nimbus = require("nimbus")

local function with_server(routes, fn)
  return nimbus.run(function()
    local srv = assert(nimbus.http.serve{ port = 0, routes = routes })
    local base = ("http://127.0.0.1:%d"):format(srv.port)
    local ok, a, b, c = pcall(fn, base)
    srv:close()
    if not ok then error(a, 0) end
    return a, b, c
  end)
end

describe("nimbus.http.request", function()
  it("GETs a JSON route and decodes it with res:json()", function()
    local res = with_server({
      ["GET /api/customers/{id}"] = function(req) return 200, { id = req.params.id, q = req.query.x } end,
    }, function(base) return nimbus.http.request{ url = base .. "/api/customers/42?x=1" } end)
    assert.are.equal(200, res.status)
    assert.matches("application/json", res.headers["content-type"])
    assert.are.same({ id = "42", q = "1" }, res:json())
  end)

  it("sends a json body with its content type and custom headers", function()
    local res = with_server({
      ["PUT /echo"] = function(req)
        return 201, { got = req:json(), ct = req.headers["content-type"], tag = req.headers["x-tag"] }
      end,
    }, function(base)
      return nimbus.http.request{ method = "PUT", url = base .. "/echo", json = { name = "Ada" },
                                  headers = { ["X-Tag"] = "t1" } }
    end)
    assert.are.equal(201, res.status)
    assert.are.same({ got = { name = "Ada" }, ct = "application/json", tag = "t1" }, res:json())
  end)

  it("returns HTTP error statuses as responses, not failures", function()
    local res = with_server({ ["GET /x"] = function() return 200, "x" end },
      function(base) return nimbus.http.request{ url = base .. "/missing" } end)
    assert.are.equal(404, res.status)
  end)

  it("times out with nil, message, ETIMEDOUT while the server is slow", function()
    local res, err, code = with_server({ ["GET /slow"] = function() nimbus.sleep(2) return 200, "late" end },
      function(base) return nimbus.http.request{ url = base .. "/slow", timeout = 0.2 } end)
    assert.is_nil(res)
    assert.is_string(err)
    assert.are.equal("ETIMEDOUT", code)
  end)

  it("reports a refused connection as ECONNREFUSED", function()
    local port = nimbus.run(function()
      local srv = assert(nimbus.http.serve{ port = 0, routes = { ["GET /"] = function() return 200 end } })
      local p = srv.port
      srv:close()
      return p
    end)
    local res, _, code = nimbus.run(function()
      return nimbus.http.request{ url = ("http://127.0.0.1:%d/"):format(port), timeout = 2 }
    end)
    assert.is_nil(res)
    assert.are.equal("ECONNREFUSED", code)
  end)

  it("reports an unknown host as ENOTFOUND", function()
    local res, _, code = nimbus.run(function()
      return nimbus.http.request{ url = "http://no-such-host.invalid/", timeout = 5 }
    end)
    assert.is_nil(res)
    assert.are.equal("ENOTFOUND", code)
  end)

  it("returns nil and a message from res:json() on a malformed body", function()
    local res = with_server({ ["GET /bad"] = function() return 200, "{not json" end },
      function(base) return nimbus.http.request{ url = base .. "/bad" } end)
    local v, err = res:json()
    assert.is_nil(v)
    assert.matches("malformed JSON", err)
  end)

  it("runs many requests concurrently from separate tasks", function()
    local statuses = with_server({ ["GET /n/{i}"] = function(req) nimbus.sleep(0.05) return 200, req.params.i end },
      function(base)
        local got = {}
        for i = 1, 20 do
          nimbus.spawn(function()
            local r = nimbus.http.request{ url = base .. "/n/" .. i }
            got[#got + 1] = r and r.body
          end)
        end
        while #got < 20 do nimbus.sleep(0.01) end
        return got
      end)
    table.sort(statuses, function(a, b) return tonumber(a) < tonumber(b) end)
    assert.are.equal(20, #statuses)
    assert.are.equal("1", statuses[1])
    assert.are.equal("20", statuses[20])
  end)

  it("raises for misuse: a non-http URL, body and json together, outside a task", function()
    assert.has_error(function() nimbus.run(function() nimbus.http.request{ url = "ftp://x" } end) end)
    assert.has_error(function()
      nimbus.run(function() nimbus.http.request{ url = "http://127.0.0.1:1/", body = "a", json = {} } end)
    end)
    local ok, err = pcall(nimbus.http.request, { url = "http://127.0.0.1:1/" })
    assert.is_false(ok)
    assert.matches("nimbus.http.request must be called from a task", err)
  end)
end)

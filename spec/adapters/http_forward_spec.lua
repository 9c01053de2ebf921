-- adapters/http_forward.lua under nimbus.testing: every status class and its outcome, the
-- outcome overrides, Retry-After in its forms, the 202 hand-off, redirects and redirect
-- loops, garbage answers, time-outs, request building, and bad options reported at the
-- caller's line. The API is nimbus.testing's fake HTTP (nothing listens).
local testing = require("nimbus.testing")
local cjson = require("cjson")

local NOW = 1764680000
local API = "http://api.test"
local ORDERS = API .. "/api/orders"
local SPEC = "http_forward_spec%.lua"

-- An adapter with one endpoint "Ep" whose "OrderPlaced" handler is forward.handler(opts).
local function load(opts, http)
  return testing.load(function()
    local nimbus = require("nimbus")
    local forward = require("adapters.http_forward")
    nimbus.endpoint("Ep"):on("OrderPlaced", forward.handler(opts))
  end, { now = NOW, http = http })
end

local function send(app, payload, ctx)
  return app:send("Ep", "OrderPlaced", payload or { OrderId = "O-1", total = 42 }, ctx)
end

-- A fake answering the same response to every request.
local function always(res) return function() return res end end

-- A fake answering the responses of `list` in turn (the last one again when it runs out).
local function seq(list)
  local i = 0
  return function()
    i = math.min(i + 1, #list)
    return list[i]
  end
end

local function logs_matching(out, pattern)
  local n = 0
  for _, l in ipairs(out.logs) do if l.message:find(pattern) then n = n + 1 end end
  return n
end

-- Runs fn inside an adapter's main chunk (so `require` gets the adapter's modules) and
-- returns what pcall gave.
local function within(fn)
  local r
  testing.load(function()
    local forward = require("adapters.http_forward")
    r = table.pack(pcall(fn, forward, require("nimbus")))
  end, { now = NOW })
  return table.unpack(r, 1, r.n)
end

describe("adapters.http_forward", function()
  describe("2xx", function()
    it("POSTs the event as JSON to the url and completes", function()
      local app = load({ url = ORDERS }, { ["POST " .. ORDERS] = { status = 201, json = { id = "X" } } })
      local out = testing.assert_completed(send(app))
      assert.equal(1, #out.http)
      local req = out.http[1]
      assert.equal("POST", req.method)
      assert.equal(ORDERS, req.url)
      assert.same({ OrderId = "O-1", total = 42 }, req.json)
      assert.equal("application/json", req.headers["Content-Type"])
    end)

    for _, status in ipairs({ 200, 201, 203, 204, 206 }) do
      it(("completes on %d"):format(status), function()
        testing.assert_completed(send(load({ url = ORDERS }, always(status))))
      end)
    end

    it("does not send the event as the body of a GET or DELETE", function()
      local app = load({ url = ORDERS .. "/{OrderId}", method = "delete" }, always(204))
      local out = testing.assert_completed(send(app))
      assert.equal("DELETE", out.http[1].method)
      assert.equal(ORDERS .. "/O-1", out.http[1].url)
      assert.is_nil(out.http[1].body)
    end)

    it("gives on_response the answer, with the decoded JSON under response = \"json\"", function()
      local seen
      local app = load({ url = ORDERS, response = "json",
                         on_response = function(res, event, ctx) seen = { res.data, event.OrderId, ctx.event_id, res.url } end },
                       always({ status = 200, json = { id = "ERP-9" } }))
      local out = testing.assert_completed(send(app))
      assert.same({ { id = "ERP-9" }, "O-1", out.ctx.event_id, ORDERS }, seen)
      assert.equal("application/json", out.http[1].headers.Accept)
    end)

    it("publishes from on_response with the event's outcome (kept on completion)", function()
      local app = testing.load(function()
        local nimbus = require("nimbus")
        local forward = require("adapters.http_forward")
        nimbus.endpoint("Ep"):on("OrderPlaced", forward.handler{ url = ORDERS, response = "json",
          on_response = function(res, _, ctx)
            nimbus.publish("OrderLinked", { erp = res.data.id }, { session = ctx.session_id })
          end })
      end, { now = NOW, http = always({ status = 201, json = { id = 7 } }) })
      local out = testing.assert_completed(send(app))
      assert.equal(1, #out.published)
      assert.same({ erp = 7 }, out.published[1].payload)
    end)
  end)

  describe("4xx", function()
    for _, status in ipairs({ 400, 403, 404, 409, 410, 422 }) do
      it(("dead-letters %d with method, URL, status, reason and the body"):format(status), function()
        local app = load({ url = ORDERS }, always({ status = status, json = { error = "no such customer C-7" } }))
        local out = testing.assert_dead_lettered(send(app))
        local reason = require("adapters.http_forward").REASONS[status]
        assert.truthy(out.error_text:find("POST " .. ORDERS .. " → " .. status .. " " .. reason, 1, true), out.error_text)
        assert.truthy(out.error_text:find('{"error":"no such customer C-7"}', 1, true), out.error_text)
        assert.truthy(out.error_text:find("resubmit", 1, true), "says what to do: " .. out.error_text)
        assert.equal("HttpStatus" .. status, out.error_type)
      end)
    end

    it("keeps the first 500 characters of a long body", function()
      local body = ("é"):rep(400) .. ("x"):rep(600)
      local out = testing.assert_dead_lettered(send(load({ url = ORDERS }, always({ status = 422, body = body }))))
      local kept = out.error_text:match("Body: (.*)$")
      assert.equal(("é"):rep(400) .. ("x"):rep(100) .. "…", kept)
    end)

    it("names the handler's API when `name` is given", function()
      local out = send(load({ url = ORDERS, name = "ERP API" }, always(404)))
      testing.assert_dead_lettered(out, "^ERP API: POST http://api%.test/api/orders → 404 Not Found")
    end)

    for _, status in ipairs({ 408, 429 }) do
      it(("makes %d transient"):format(status), function()
        local out = testing.assert_transient(send(load({ url = ORDERS }, always(status))))
        assert.truthy(out.error_text:find(tostring(status), 1, true))
        assert.equal("HttpStatus" .. status, out.error_type)
      end)
    end
  end)

  describe("5xx", function()
    for _, status in ipairs({ 500, 501, 502, 503, 504 }) do
      it(("makes %d transient, with the body in the text"):format(status), function()
        local out = send(load({ url = ORDERS }, always({ status = status, body = "upstream down" })))
        testing.assert_transient(out, "→ " .. status)
        assert.truthy(out.error_text:find("Body: upstream down", 1, true))
        assert.truthy(out.error_text:find("tried again later", 1, true))
      end)
    end
  end)

  describe("outcomes", function()
    it("an exact status overrides the defaults", function()
      testing.assert_completed(send(load({ url = ORDERS, outcomes = { [409] = "done" } }, always(409))))
      testing.assert_dead_lettered(send(load({ url = ORDERS, outcomes = { [503] = "permanent" } }, always(503))))
      testing.assert_transient(send(load({ url = ORDERS, outcomes = { [404] = "transient" } }, always(404))))
    end)

    it("a class overrides the defaults' classes and exact statuses, not the user's exact statuses", function()
      local app = load({ url = ORDERS, outcomes = { ["4xx"] = "failed", [404] = "done" } }, nil)
      app:set_http(always(429))
      testing.assert_failed(send(app), "→ 429 Too Many Requests")
      app:set_http(always(404))
      testing.assert_completed(send(app))
      local out = send(load({ url = ORDERS, outcomes = { ["2xx"] = "done" } }, always({ status = 202,
        headers = { Location = "/jobs/1" } })))
      testing.assert_completed(out)
    end)

    it("\"failed\" fails the event (retry policy, then the session blocks)", function()
      local out = send(load({ url = ORDERS, outcomes = { [401] = "failed" } }, always({ status = 401, body = "token expired" })))
      testing.assert_failed(out, "→ 401 Unauthorized%. Body: token expired")
      assert.equal("HttpStatus401", out.error_type)
    end)

    it("a function decides itself", function()
      local app = load({ url = ORDERS, outcomes = { [409] = function(res, event)
        if res:json().existing == event.OrderId then return end
        error(require("nimbus").permanent("a different order holds the number"))
      end } }, nil)
      app:set_http(always({ status = 409, json = { existing = "O-1" } }))
      testing.assert_completed(send(app))
      app:set_http(always({ status = 409, json = { existing = "O-2" } }))
      testing.assert_dead_lettered(send(app), "a different order")
    end)
  end)

  describe("Retry-After", function()
    it("waits for a short Retry-After in seconds inside the handler, then sends again", function()
      local app = load({ url = ORDERS }, seq({ { status = 503, headers = { ["Retry-After"] = "2" } }, 200 }))
      local out = testing.assert_completed(send(app))
      assert.equal(2, #out.http)
      assert.same({ 2 }, out.sleeps)
      assert.same(out.http[1].json, out.http[2].json)
      assert.equal(1, logs_matching(out, "retry later"))
    end)

    it("reads an HTTP-date (IMF-fixdate) against the host's clock", function()
      local date = os.date("!%a, %d %b %Y %H:%M:%S GMT", NOW + 3)
      local app = load({ url = ORDERS }, seq({ { status = 429, headers = { ["retry-after"] = date } }, 200 }))
      local out = testing.assert_completed(send(app))
      assert.same({ 3 }, out.sleeps)
    end)

    it("a date in the past means now", function()
      local date = os.date("!%a, %d %b %Y %H:%M:%S GMT", NOW - 60)
      local app = load({ url = ORDERS }, seq({ { status = 503, headers = { ["Retry-After"] = date } }, 200 }))
      assert.same({ 0 }, testing.assert_completed(send(app)).sleeps)
    end)

    it("leaves a Retry-After longer than retry_wait to the host, naming it in the error", function()
      local app = load({ url = ORDERS, retry_wait = 5 }, always({ status = 503, headers = { ["Retry-After"] = "120" } }))
      local out = testing.assert_transient(send(app), "Retry%-After: 120 s")
      assert.equal(1, #out.http)
      assert.same({}, out.sleeps)
    end)

    it("retry_wait = 0 never waits in the handler", function()
      local app = load({ url = ORDERS, retry_wait = 0 }, always({ status = 503, headers = { ["Retry-After"] = "1" } }))
      local out = testing.assert_transient(send(app))
      assert.equal(1, #out.http)
    end)

    it("waits three times at most, then ends transient", function()
      local app = load({ url = ORDERS }, always({ status = 503, headers = { ["Retry-After"] = "1" } }))
      local out = testing.assert_transient(send(app), "→ 503 Service Unavailable")
      assert.equal(4, #out.http)
      assert.same({ 1, 1, 1 }, out.sleeps)
    end)

    it("never waits past the delivery timeout", function()
      local app = load({ url = ORDERS, timeout = 5 },
                       always({ status = 503, headers = { ["Retry-After"] = "2" }, delay = 2 }))
      local out = testing.assert_transient(send(app))
      assert.equal("HttpTimeout", out.error_type)
      assert.same({ 2 }, out.sleeps)
      assert.is_true(app.clock - NOW <= 5, "the delivery took " .. (app.clock - NOW) .. " s")
    end)

    it("an unreadable Retry-After is reported, not waited for", function()
      local app = load({ url = ORDERS }, always({ status = 503, headers = { ["Retry-After"] = "soon-ish" } }))
      local out = testing.assert_transient(send(app), 'Retry%-After "soon%-ish" not understood')
      assert.equal(1, #out.http)
    end)

    it("parses the three HTTP-date forms and delta-seconds", function()
      local ok, r = within(function(forward)
        local at = 784111777 - 10   -- Sun, 06 Nov 1994 08:49:37 GMT, minus 10 s
        return {
          forward.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at),
          forward.retry_after("Sunday, 06-Nov-94 08:49:37 GMT", at),
          forward.retry_after("Sun Nov  6 08:49:37 1994", at),
          forward.retry_after(" 42 ", at),
          forward.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777 + 5),
          forward.retry_after("-3", at), forward.retry_after("1.5", at), forward.retry_after("", at),
          forward.retry_after("Sun, 32 Nov 1994 08:49:37 GMT", at),
          forward._parse_http_date("Thu, 29 Feb 2024 23:59:59 GMT"),
          forward._parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
        }
      end)
      assert.is_true(ok, tostring(r))
      assert.same({ 10, 10, 10, 42, 0 }, { r[1], r[2], r[3], r[4], r[5] })
      assert.is_nil(r[6]); assert.is_nil(r[7]); assert.is_nil(r[8]); assert.is_nil(r[9])
      assert.equal(1709251199, r[10])
      assert.equal(0, r[11])
    end)
  end)

  describe("202 Accepted", function()
    it("with a relative Location opens a hand-off whose job id is the absolute status URL", function()
      local app = load({ url = ORDERS }, always({ status = 202, headers = { Location = "/api/jobs/J-1" } }))
      local out = testing.assert_handoff(send(app), { external_job_id = API .. "/api/jobs/J-1" })
      assert.truthy(out.handoff.reason:find("POST " .. ORDERS, 1, true), out.handoff.reason)
    end)

    it("takes the reason and expected_by from `handoff`, and an absolute Location as is", function()
      local app = load({ url = ORDERS, handoff = { reason = "Awaiting the ERP import", expected_by = 600 } },
                       always({ status = 202, headers = { location = "http://jobs.test/j/9?x=1" } }))
      testing.assert_handoff(send(app), { reason = "Awaiting the ERP import", expected_by = 600,
                                          external_job_id = "http://jobs.test/j/9?x=1" })
    end)

    it("resolves a path-relative Location against the request URL", function()
      local app = load({ url = ORDERS .. "/batch?async=1" }, always({ status = 202, headers = { Location = "jobs/5" } }))
      testing.assert_handoff(send(app), { external_job_id = ORDERS .. "/jobs/5" })
    end)

    it("without a Location completes, with a warning", function()
      local out = testing.assert_completed(send(load({ url = ORDERS }, always(202))))
      assert.equal(1, logs_matching(out, "202 Accepted without a usable Location"))
    end)

    it("handoff = false completes", function()
      testing.assert_completed(send(load({ url = ORDERS, handoff = false },
                                         always({ status = 202, headers = { Location = "/jobs/1" } }))))
    end)
  end)

  describe("redirects", function()
    it("follows 307/308/301/302 with the same method and body", function()
      for _, status in ipairs({ 301, 302, 307, 308 }) do
        local app = load({ url = ORDERS }, {
          ["POST " .. ORDERS] = { status = status, headers = { Location = "/v2/orders" } },
          ["POST " .. API .. "/v2/orders"] = 201,
        })
        local out = testing.assert_completed(send(app))
        assert.equal(2, #out.http)
        assert.same(out.http[1].json, out.http[2].json)
      end
    end)

    it("follows 303 as a GET without a body", function()
      local app = load({ url = ORDERS }, {
        ["POST " .. ORDERS] = { status = 303, headers = { Location = API .. "/orders/O-1" } },
        ["GET " .. API .. "/orders/O-1"] = 200,
      })
      local out = testing.assert_completed(send(app))
      assert.equal("GET", out.http[2].method)
      assert.is_nil(out.http[2].body)
    end)

    it("drops the Authorization header when the redirect leaves the origin, keeps it inside", function()
      local app = load({ url = ORDERS, headers = { Authorization = "Bearer s3cret" } }, {
        ["POST " .. ORDERS] = { status = 307, headers = { Location = "/v2/orders" } },
        ["POST " .. API .. "/v2/orders"] = { status = 307, headers = { Location = "http://elsewhere.test/o" } },
        ["POST http://elsewhere.test/o"] = 201,
      })
      local out = testing.assert_completed(send(app))
      assert.equal("Bearer s3cret", out.http[2].headers.Authorization)
      assert.is_nil(out.http[3].headers.Authorization)
    end)

    it("a redirect loop ends transient, naming the hops", function()
      local app = load({ url = ORDERS }, {
        ["POST " .. ORDERS] = { status = 302, headers = { Location = API .. "/b" } },
        ["POST " .. API .. "/b"] = { status = 302, headers = { Location = "/api/orders" } },
      })
      local out = testing.assert_transient(send(app), "redirect loop")
      assert.equal("HttpRedirectLoop", out.error_type)
      assert.truthy(out.error_text:find(ORDERS .. " → " .. API .. "/b → " .. ORDERS, 1, true), out.error_text)
      assert.equal(2, #out.http)
    end)

    it("more than max_redirects hops end transient", function()
      local n = 0
      local app = load({ url = ORDERS, max_redirects = 3 }, function()
        n = n + 1
        return { status = 308, headers = { Location = "/hop/" .. n } }
      end)
      local out = testing.assert_transient(send(app), "more than 3 redirects")
      assert.equal(4, #out.http)
    end)

    it("max_redirects = 0 follows nothing: a 3xx is transient", function()
      local out = send(load({ url = ORDERS, max_redirects = 0 }, always({ status = 301, headers = { Location = "/x" } })))
      testing.assert_transient(out, "→ 301 Moved Permanently")
      assert.equal(1, #out.http)
    end)

    it("a Location that is not an http(s) URL is a bad answer", function()
      local out = send(load({ url = ORDERS }, always({ status = 302, headers = { Location = "ftp://files.test/x" } })))
      testing.assert_transient(out, "not an http%(s%) URL")
      assert.equal("HttpBadResponse", out.error_type)
    end)
  end)

  describe("garbage and silence", function()
    it("a 2xx that is not JSON under response = \"json\" is transient", function()
      local out = send(load({ url = ORDERS, response = "json" }, always({ status = 200, body = "<html>oops</html>" })))
      testing.assert_transient(out, "not JSON")
      assert.equal("HttpBadResponse", out.error_type)
      assert.truthy(out.error_text:find("<html>oops</html>", 1, true))
    end)

    it("an empty 200 under response = \"json\" is transient, a 204 is fine", function()
      testing.assert_transient(send(load({ url = ORDERS, response = "json" }, always(200))), "empty body")
      testing.assert_completed(send(load({ url = ORDERS, response = "json" }, always(204))))
    end)

    it("a status outside 200-599 is a malformed answer", function()
      for _, status in ipairs({ 99, 150, 600, 999 }) do
        local out = send(load({ url = ORDERS }, always({ status = status, body = "?" })))
        testing.assert_transient(out, "malformed answer: status " .. status)
      end
    end)

    it("no answer within the timeout is transient and takes no longer than it", function()
      local app = load({ url = ORDERS, timeout = 2 }, always({ status = 200, delay = 3600 }))
      local out = testing.assert_transient(send(app), "no answer within 2 s")
      assert.equal("HttpTimeout", out.error_type)
      assert.equal(2, out.http[1].timeout)
      assert.equal(NOW + 2, app.clock)
    end)

    it("an unreachable API is transient", function()
      for _, code in ipairs({ "ECONNREFUSED", "ENOTFOUND", "ECONNRESET", "ETLS" }) do
        local out = send(load({ url = ORDERS }, function() return nil, "cannot connect", code end))
        testing.assert_transient(out, "unreachable: cannot connect %(" .. code .. "%)")
        assert.equal("HttpUnreachable", out.error_type)
      end
    end)

    it("an answer too large to take is transient", function()
      local out = send(load({ url = ORDERS }, function() return nil, "response body larger than 67108864 bytes", "EMSGSIZE" end))
      testing.assert_transient(out, "too large")
    end)

    it("a URL the client refuses fails the event (an adapter bug)", function()
      local out = send(load({ url = ORDERS }, function() return nil, "URL rejected", "EINVAL" end))
      testing.assert_failed(out, "fix the adapter's url")
      assert.equal("ForwardConfigError", out.error_type)
    end)
  end)

  describe("building the request", function()
    it("fills {Field}, {a.b} and {ctx.session_id} in the url, percent-encoded", function()
      local app = load({ url = API .. "/c/{customer.id}/orders/{OrderId}?s={ctx.session_id}", method = "PUT" }, always(200))
      local out = testing.assert_completed(send(app, { OrderId = "O 1/2", customer = { id = 7 } }, { session_id = "s&1" }))
      assert.equal(API .. "/c/7/orders/O%201%2F2?s=s%261", out.http[1].url)
    end)

    it("dead-letters an event without a field of the url", function()
      local out = send(load({ url = ORDERS .. "/{OrderId}" }, always(200)), { total = 1 })
      testing.assert_dead_lettered(out, "the event has no OrderId for the URL")
      assert.equal("ForwardMissingField", out.error_type)
      assert.equal(0, #out.http)
    end)

    it("map builds the path, method, query, headers and body", function()
      local app = load({ url = API .. "/api/", headers = { ["X-Api-Key"] = "k1" },
                         map = function(e, ctx)
                           return { path = "/orders/" .. e.OrderId, method = "patch", query = { dry = "no", v = 2 },
                                    headers = { ["X-Session"] = ctx.session_id }, json = { total = e.total * 2 } }
                         end }, always(200))
      local out = testing.assert_completed(send(app, nil, { session_id = "S9" }))
      local req = out.http[1]
      assert.equal("PATCH", req.method)
      assert.equal(API .. "/api/orders/O-1?dry=no&v=2", req.url)
      assert.same({ total = 84 }, req.json)
      assert.equal("k1", req.headers["X-Api-Key"])
      assert.equal("S9", req.headers["X-Session"])
    end)

    it("map may return a url and a raw body", function()
      local app = load({ map = function(e) return { url = API .. "/raw/" .. e.OrderId, body = "id=" .. e.OrderId,
                                                     headers = { ["Content-Type"] = "text/plain" } } end }, always(200))
      local req = testing.assert_completed(send(app)).http[1]
      assert.equal(API .. "/raw/O-1", req.url)
      assert.equal("id=O-1", req.body)
      assert.equal("POST", req.method)
    end)

    it("map returning false completes without a request", function()
      local out = testing.assert_completed(send(load({ url = ORDERS, map = function() return false end }, always(500))))
      assert.equal(0, #out.http)
    end)

    it("a map that returns nonsense fails the event with what is wrong", function()
      testing.assert_failed(send(load({ url = ORDERS, map = function() return "x" end }, always(200))),
                            "map must return a request table")
      testing.assert_failed(send(load({ url = ORDERS, map = function() return { jsn = {} } end }, always(200))),
                            "unknown request field jsn")
      testing.assert_failed(send(load({ map = function() return { json = {} } end }, always(200))),
                            "no url")
      testing.assert_failed(send(load({ map = function() return { url = "ftp://x/y" } end }, always(200))),
                            "must be an http:// or https:// URL, got ftp://x/y")
    end)

    it("sends the event id in the idempotency header, the same on every attempt", function()
      local app = load({ url = ORDERS, idempotency_header = "Idempotency-Key" },
                       seq({ { status = 503, headers = { ["Retry-After"] = "0" } }, 200 }))
      local out = testing.assert_completed(send(app, nil, { event_id = "ev-42" }))
      assert.equal("ev-42", out.http[1].headers["Idempotency-Key"])
      assert.equal("ev-42", out.http[2].headers["Idempotency-Key"])
    end)

    it("headers may be a function of the event and context", function()
      local app = load({ url = ORDERS, headers = function(e, ctx) return { ["X-Order"] = e.OrderId, ["X-Type"] = ctx.event_type } end },
                       always(200))
      local req = testing.assert_completed(send(app)).http[1]
      assert.equal("O-1", req.headers["X-Order"])
      assert.equal("OrderPlaced", req.headers["X-Type"])
    end)
  end)

  describe("forward.endpoint", function()
    it("declares the endpoint with a handler on every type and attaches a job poller with `poll`", function()
      local app = testing.load(function()
        local forward = require("adapters.http_forward")
        forward.endpoint("ErpEndpoint", { types = { "OrderPlaced", "OrderChanged" }, url = ORDERS,
                                          endpoint = { concurrency = 5 }, poll = { every = 3 } })
      end, { now = NOW, http = always({ status = 202, headers = { Location = "/jobs/1" } }) })
      local ep = app.endpoints.ErpEndpoint
      assert.same({ concurrency = 5 }, ep.opts)
      testing.assert_handoff(app:send("ErpEndpoint", "OrderPlaced", { OrderId = "1" }))
      testing.assert_handoff(app:send("ErpEndpoint", "OrderChanged", { OrderId = "1" }))
      testing.assert_unsupported(app:send("ErpEndpoint", "OrderDeleted", { OrderId = "1" }))
      assert.equal(3, ep.checkers["job-poller"].every)
    end)
  end)

  describe("bad options are raised at the caller's line", function()
    -- Calls fn(forward); returns the error and the line fn starts at (where it calls).
    local function raised(fn)
      local ok, err = within(function(forward, nimbus) fn(forward, nimbus) end)
      assert.is_false(ok, "expected an error")
      return tostring(err), debug.getinfo(fn, "S").linedefined
    end

    local cases = {
      { "no url", {}, "http_forward.handler: give url" },
      { "a misspelled option", { url = ORDERS, timout = 3 }, "unknown option timout %(options: .*timeout" },
      { "a url that is not http", { url = "api.test/x" }, 'url must be an http:// or https:// URL, got "api.test/x"' },
      { "a malformed placeholder", { url = ORDERS .. "/{Order Id}" }, "malformed {placeholder}" },
      { "a bad method", { url = ORDERS, method = "FETCH" }, 'method "FETCH" is not one of' },
      { "a wrong type", { url = ORDERS, timeout = "10" }, "option timeout must be a number, got string" },
      { "timeout 0", { url = ORDERS, timeout = 0 }, "timeout must be > 0" },
      { "an outcome value", { url = ORDERS, outcomes = { [404] = "ignore" } }, 'outcomes%[404%] = "ignore": expected done' },
      { "an outcome key", { url = ORDERS, outcomes = { ["4XX"] = "done" } }, 'outcomes key "4XX" must be a status' },
      { "an outcome status", { url = ORDERS, outcomes = { [99] = "done" } }, "outcomes key 99 must be a status" },
      { "response", { url = ORDERS, response = "xml" }, 'response must be "json"' },
      { "handoff = true", { url = ORDERS, handoff = true }, "handoff must be a table" },
      { "a handoff option", { url = ORDERS, handoff = { expected = 3 } }, "unknown handoff option expected" },
      { "max_redirects", { url = ORDERS, max_redirects = -1 }, "max_redirects must be a whole number" },
      { "retry_wait", { url = ORDERS, retry_wait = -1 }, "retry_wait must be >= 0" },
      { "no_answer", { url = ORDERS, no_answer = "retry" }, 'no_answer must be "transient" %(tried again later%) or "failed", got "retry"' },
      { "error_text", { url = ORDERS, error_text = "x" }, "option error_text must be a function, got string" },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local err, line = raised(function(forward) forward.handler(c[2]) end)
        assert.truthy(err:find(c[3]), err)
        assert.truthy(err:find(SPEC .. ":" .. line .. ": "), "not at the caller's line " .. line .. ": " .. err)
      end)
    end

    it("not a table", function()
      local err, line = raised(function(forward) forward.handler("http://x") end)
      assert.truthy(err:find(SPEC .. ":" .. line .. ": http_forward.handler expects a table"), err)
    end)

    it("forward.endpoint without types, with a bad type, an unknown option, a bad endpoint name or option, or poll", function()
      local function check(opts, pattern, name)
        local err, line = raised(function(forward) forward.endpoint(name or "Ep", opts) end)
        assert.truthy(err:find(pattern), err)
        assert.truthy(err:find(SPEC .. ":" .. line .. ": http_forward.endpoint"), err)
      end
      check({ url = ORDERS }, "types must be a list of event types")
      check({ url = ORDERS, types = { "A", 3 } }, "types%[2%] must be a non%-empty string")
      check({ url = ORDERS, types = { "A" }, endpiont = {} }, "unknown option endpiont")
      check({ url = ORDERS, types = { "A" } }, "nimbus%.endpoint: .*name must be", "bad name!")
      check({ url = ORDERS, types = { "A" }, endpoint = { concurency = 5 } }, "unknown option concurency")
      check({ url = ORDERS, types = { "A" }, poll = { every = 0 } }, "poll: job_poller%.attach: every must be > 0")
    end)

    it("a second endpoint of the same name", function()
      local err, line = raised(function(forward)
        forward.endpoint("Twice", { url = ORDERS, types = { "A" } })
        forward.endpoint("Twice", { url = ORDERS, types = { "A" } })
      end)
      assert.truthy(err:find(SPEC .. ":" .. (line + 2) .. ": .*already defined"), err)
    end)
  end)

  it("sends the event as it was decoded (arrays, nulls) as JSON", function()
    local app = load({ url = ORDERS }, always(200))
    local out = testing.assert_completed(send(app, { list = { 1, 2, 3 }, flag = cjson.null }))
    assert.same({ 1, 2, 3 }, out.http[1].json.list)
  end)
  describe("no_answer and error_text", function()
    it("fails (not transient) when the API does not answer under no_answer = \"failed\"", function()
      local app = load({ url = ORDERS, no_answer = "failed" }, function() return nil, "Connection refused", "ECONNREFUSED" end)
      local out = testing.assert_failed(send(app), "unreachable: Connection refused")
      assert.equal("HttpUnreachable", out.error_type)
      app = load({ url = ORDERS }, function() return nil, "Connection refused", "ECONNREFUSED" end)
      testing.assert_transient(send(app))
    end)

    it("words refused and unanswered requests with error_text, keeping each outcome", function()
      local seen = {}
      local function text(f)
        seen[#seen + 1] = f
        if f.kind == "no_answer" then return ("%s %s %s gone: %s/%s"):format(f.name, f.method, f.path, f.message, f.code) end
        return ("%s %s %s said %d %s: %s"):format(f.name, f.method, f.path, f.status, tostring(f.reason), f.body)
      end
      local opts = { name = "Orders", url = ORDERS .. "/{OrderId}?v=1", method = "PUT", error_text = text,
                     outcomes = { [409] = "failed" } }
      local out = testing.assert_dead_lettered(send(load(opts, always({ status = 404, body = "nope" }))))
      assert.equal("Orders PUT /api/orders/O-1?v=1 said 404 Not Found: nope", out.error_text)
      assert.equal(ORDERS .. "/O-1?v=1", seen[1].url)
      out = testing.assert_failed(send(load(opts, always({ status = 409, body = "" }))))
      assert.equal("Orders PUT /api/orders/O-1?v=1 said 409 Conflict: ", out.error_text)
      out = testing.assert_transient(send(load(opts, always({ status = 503, body = "x" }))))
      assert.equal("Orders PUT /api/orders/O-1?v=1 said 503 Service Unavailable: x", out.error_text)
      testing.assert_transient(send(load(opts, always({ status = 599, body = "?" }))))
      assert.is_nil(seen[#seen].reason)
      out = testing.assert_transient(send(load(opts, function() return nil, "Timeout", "ETIMEDOUT" end)))
      assert.equal("Orders PUT /api/orders/O-1?v=1 gone: Timeout/ETIMEDOUT", out.error_text)
    end)

    it("fails the event, naming the option, when error_text returns no string", function()
      local app = load({ url = ORDERS, error_text = function() return 42 end }, always({ status = 500 }))
      local out = testing.assert_failed(send(app), "error_text must return the error text as a string, got number")
      assert.equal("ForwardConfigError", out.error_type)
    end)

  end)
end)

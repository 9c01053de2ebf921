-- adapters/cloudevents.lua: CloudEvents 1.0 out of a handler's event and ctx, over HTTP in
-- binary and structured mode, back in from a route's request, and into nimbus.publish.
local testing = require("nimbus.testing")
local cjson = require("cjson")

local HERE = debug.getinfo(1, "S").short_src
local NOW = 1764680000   -- 2025-12-02T12:53:20Z

-- A request as nimbus.http.serve gives it to a route: lower-case header names.
local function request(headers, body)
  local h = {}
  for k, v in pairs(headers) do h[k:lower()] = v end
  return { headers = h, body = body or "" }
end

-- The CloudEvent an "Orders" handler builds (from_event) for one event.
local function event_from_handler(payload, ctx_fields, opts)
  local got = {}
  local app = testing.load(function()
    local nimbus = require("nimbus")
    local ce = require("adapters.cloudevents")
    nimbus.endpoint("Orders"):on("OrderPlaced", function(event, ctx)
      got.ev = ce.from_event(event, ctx, opts or { source = "/shop/orders" })
    end)
  end, { now = NOW })
  testing.assert_completed(app:send("Orders", "OrderPlaced", payload, ctx_fields))
  return got.ev
end

describe("cloudevents out", function()
  local ce = require("adapters.cloudevents")

  it("maps a handler's event and ctx to the CloudEvent attributes", function()
    local ev = event_from_handler({ id = "o-1", total = 12 }, { message_id = "m-42", session_id = "c-7",
                                  traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" })
    assert.are.same({ specversion = "1.0", id = "m-42", source = "/shop/orders", type = "OrderPlaced",
                      subject = "c-7", time = "2025-12-02T12:53:20.000Z", datacontenttype = "application/json",
                      data = { id = "o-1", total = 12 },
                      traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }, ev)
  end)

  it("writes binary mode: ce-* headers (percent-encoded where the binding says) and the data as the body", function()
    local ev = { specversion = "1.0", id = "m-1", source = "/shop", type = "OrderPlaced", subject = "Café 100%",
                 datacontenttype = "application/json", data = { n = 1 }, tenant = "t1" }
    local headers, body = ce.to_http(ev, "binary")
    assert.are.same({ ["ce-specversion"] = "1.0", ["ce-id"] = "m-1", ["ce-source"] = "/shop",
                      ["ce-type"] = "OrderPlaced", ["ce-subject"] = "Caf%C3%A9%20100%25", ["ce-tenant"] = "t1",
                      ["Content-Type"] = "application/json" }, headers)
    assert.are.same({ n = 1 }, cjson.decode(body))
  end)

  it("writes structured mode, with data_base64 for bytes that are not text", function()
    local headers, body = ce.to_http({ specversion = "1.0", id = "1", source = "/s", type = "T",
                                       data = { a = "b" } }, "structured")
    assert.are.equal("application/cloudevents+json; charset=utf-8", headers["Content-Type"])
    assert.are.same({ specversion = "1.0", id = "1", source = "/s", type = "T", data = { a = "b" } },
                    cjson.decode(body))
    local bin = ce.encode({ specversion = "1.0", id = "2", source = "/s", type = "T",
                            datacontenttype = "application/octet-stream", data = "\0\1\2\255" })
    local t = cjson.decode(bin)
    assert.is_nil(t.data)
    assert.are.equal("AAEC/w==", t.data_base64)
  end)

  it("raises misuse at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() ce.to_http({ specversion = "1.0", id = "1", type = "T" }, "binary") end)
    assert.is_false(ok)
    assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
    assert.matches("not a valid CloudEvent: the required attribute `source` is missing", err, 1, true)
    ok, err = pcall(function() ce.to_http({ specversion = "1.0", id = "1", source = "/s", type = "T" }, "soap") end)
    assert.matches("mode must be \"binary\" or \"structured\"", err, 1, true)
  end)

  it("requires a source in from_event", function()
    local app = testing.load(function()
      local nimbus = require("nimbus")
      local ce2 = require("adapters.cloudevents")
      nimbus.endpoint("Orders"):on("OrderPlaced", function(event, ctx) ce2.from_event(event, ctx, {}) end)
    end)
    testing.assert_failed(app:send("Orders", "OrderPlaced", {}), "`source` is required: a URI%-reference")
  end)
end)

describe("cloudevents in", function()
  local ce = require("adapters.cloudevents")

  it("reads binary mode back to the same event (extensions come back as strings)", function()
    local ev = { specversion = "1.0", id = "m-1", source = "/shop", type = "OrderPlaced", subject = "Café 100%",
                 time = "2025-12-02T12:53:20.5+01:00", datacontenttype = "application/json",
                 data = { n = 1, list = { "a", "b" } }, priority = 5 }
    local headers, body = ce.to_http(ev, "binary")
    local list = assert(ce.from_http(request(headers, body)))
    assert.are.equal(1, #list)
    ev.priority = "5"
    assert.are.same(ev, list[1])
  end)

  it("reads structured mode and a batch, base64 data included", function()
    local one = { specversion = "1.0", id = "1", source = "/s", type = "T", data = { a = 1 } }
    local list = assert(ce.from_http(request({ ["Content-Type"] = "application/cloudevents+json" }, cjson.encode(one))))
    assert.are.same({ one }, list)
    local two = { specversion = "1.0", id = "2", source = "/s", type = "T", datacontenttype = "image/png",
                  data_base64 = "AAEC/w==" }
    list = assert(ce.from_http(request({ ["Content-Type"] = "application/cloudevents-batch+json" },
                                       cjson.encode({ one, two }))))
    assert.are.equal(2, #list)
    assert.are.equal("\0\1\2\255", list[2].data)
    assert.is_nil(list[2].data_base64)
  end)

  it("says what is wrong with a request that is not a valid CloudEvent", function()
    local function err_of(headers, body)
      local list, err = ce.from_http(request(headers, body))
      assert.is_nil(list)
      return err
    end
    local S = { ["Content-Type"] = "application/cloudevents+json" }
    assert.matches("no CloudEvent in this request: send Content-Type: application/cloudevents+json",
                   err_of({ ["Content-Type"] = "application/json" }, '{"a":1}'), 1, true)
    assert.are.equal("the required attribute `id` is missing",
                     err_of(S, '{"specversion":"1.0","source":"/s","type":"T"}'))
    assert.are.equal('specversion must be "1.0" (this is CloudEvents 1.0), got "0.3"',
                     err_of(S, '{"specversion":"0.3","id":"1","source":"/s","type":"T"}'))
    assert.matches("`time` must be an RFC 3339 timestamp",
                   err_of(S, '{"specversion":"1.0","id":"1","source":"/s","type":"T","time":"yesterday"}'), 1, true)
    assert.matches('"Tenant" is not a valid attribute name',
                   err_of(S, '{"specversion":"1.0","id":"1","source":"/s","type":"T","Tenant":"x"}'), 1, true)
    assert.matches("the body is not JSON", err_of(S, "{nope"), 1, true)
    assert.matches("has more than 14 significant digits",
                   err_of(S, '{"specversion":"1.0","id":"1","source":"/s","type":"T","data":{"n":123456789012345678}}'),
                   1, true)
    assert.are.equal("[2]: the attribute `type` must be a non-empty string, got 7 (number)",
                     err_of({ ["Content-Type"] = "application/cloudevents-batch+json" },
                            '[{"specversion":"1.0","id":"1","source":"/s","type":"T"},'
                            .. '{"specversion":"1.0","id":"2","source":"/s","type":7}]'))
    assert.matches("the body (application/json) is not JSON",
                   err_of({ ["ce-specversion"] = "1.0", ["ce-id"] = "1", ["ce-source"] = "/s", ["ce-type"] = "T",
                            ["Content-Type"] = "application/json" }, "{broken"), 1, true)
  end)
end)

describe("cloudevents to nimbus", function()
  local ce = require("adapters.cloudevents")

  it("gives the type, the data as payload, the session and a message id from id and source", function()
    local etype, payload, opts = ce.to_publish({ specversion = "1.0", id = "e-1", source = "/crm", type = "Moved",
                                                 subject = "acct-1", data = { x = 1 } })
    assert.are.equal("Moved", etype)
    assert.are.same({ x = 1 }, payload)
    assert.are.same({ session = "acct-1", message_id = "e-1@/crm" }, opts)
    local _, _, o2 = ce.to_publish({ specversion = "1.0", id = "e-1", source = ("s"):rep(300), type = "T",
                                     subject = "a", partitionkey = "p-9", data = {} })
    assert.are.same({ session = "p-9" }, o2)   -- too long for a message id: none
    local _, _, o3 = ce.to_publish({ specversion = "1.0", id = "e", source = "/s", type = "T", tenant = "t-3",
                                     data = {} }, { session = "tenant" })
    assert.are.equal("t-3", o3.session)
  end)

  it("refuses data that is not a JSON object", function()
    local base = { specversion = "1.0", id = "1", source = "/s", type = "T" }
    local function refusal(extra)
      local ev = {}
      for k, v in pairs(base) do ev[k] = v end
      for k, v in pairs(extra) do ev[k] = v end
      local etype, err = ce.to_publish(ev)
      assert.is_nil(etype)
      return err
    end
    assert.matches("must be a JSON object to become a nimbus event, got no data", refusal({}), 1, true)
    assert.matches("got an array", refusal({ data = { 1, 2 } }), 1, true)
    assert.matches("got data of content type text/plain", refusal({ datacontenttype = "text/plain", data = "hi" }),
                   1, true)
  end)

  it("publishes what a route receives, in order", function()
    local app = testing.load(function()
      local nimbus = require("nimbus")
      local ce2 = require("adapters.cloudevents")
      assert(nimbus.http.serve{ port = 0, routes = {
        ["POST /events"] = function(req)
          local events, err = ce2.from_http(req)
          if not events then return 400, { error = err } end
          for _, ev in ipairs(events) do assert(ce2.publish(ev)) end
          return 202, { accepted = #events }
        end,
      } })
    end)
    local batch = { { specversion = "1.0", id = "1", source = "/s", type = "A", subject = "k1", data = { n = 1 } },
                    { specversion = "1.0", id = "2", source = "/s", type = "B", subject = "k1", data = { n = 2 } } }
    local res = app:serve_request("POST", "/events", { headers = { ["Content-Type"] = "application/cloudevents-batch+json" },
                                                       body = cjson.encode(batch) })
    assert.are.equal(202, res.status)
    assert.are.equal(2, #res.published)
    assert.are.same({ "A", "B" }, { res.published[1].type, res.published[2].type })
    assert.are.same({ n = 2 }, res.published[2].payload)
    assert.are.equal("k1", res.published[2].opts.session)
    res = app:serve_request("POST", "/events", { json = { n = 1 } })
    assert.are.equal(400, res.status)
    assert.matches("no CloudEvent in this request", res.json.error, 1, true)
    assert.are.equal(0, #res.published)
  end)
end)

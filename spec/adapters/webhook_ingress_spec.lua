-- adapters/webhook_ingress.lua on nimbus.testing: the route is called without a socket
-- (app:serve_request); what it publishes is recorded.
local testing = require("nimbus.testing")
local cjson = require("cjson")

local HERE = debug.getinfo(1, "S").short_src

local crypto = require("nimbus").crypto   -- the host's (OpenSSL): these specs run inside it

-- Another digest, for signature.hmac (the override of nimbus.crypto.hmac_sha256).
local function fake_hmac(secret, body)
  local sum = 0
  for i = 1, #body do sum = (sum * 31 + body:byte(i)) % 0x7fffffff end
  return (secret .. "|" .. sum .. ("\0"):rep(32)):sub(1, 32)
end

local hex = crypto.hex

-- An app whose ingress (ingress.serve with opts) is on a fake server.
local function ingress(opts)
  return testing.load(function()
    local o = { port = 8085 }
    for k, v in pairs(opts) do o[k] = v end
    assert(require("adapters.webhook_ingress").serve(o))
  end)
end

local function post(app, body, headers, path)
  return app:serve_request("POST", path or "/hooks/orders", { body = body, headers = headers })
end

local ORDERS = {
  path = "/hooks/orders", event_type = "OrderPlaced", session = { field = "order.customer" },
  correlation_id = { header = "X-Correlation-Id" },
  fields = { "order.id", ["order.customer"] = "string", ["order.total"] = "number", note = "string?" },
  max_body = 200,
}

describe("webhook_ingress", function()
  it("publishes a valid body and answers 202 with the message id", function()
    local app = ingress(ORDERS)
    local res = post(app, '{"order":{"id":"o-1","customer":"c-7","total":12.5}}', { ["X-Correlation-Id"] = "corr-1" })
    assert.are.equal(202, res.status)
    assert.are.equal(1, #res.published)
    local p = res.published[1]
    assert.are.equal("OrderPlaced", p.type)
    assert.are.same({ order = { id = "o-1", customer = "c-7", total = 12.5 } }, p.payload)
    assert.are.equal("c-7", p.opts.session)
    assert.are.equal("corr-1", p.opts.correlation_id)
    assert.are.same({ accepted = 1, message_ids = { p.message_id }, duplicates = 0 }, res.json)
  end)

  it("refuses bad bodies with 400 and the reason, publishing nothing", function()
    local app = ingress(ORDERS)
    local cases = {
      { "{not json", "^the body is not JSON %(malformed JSON body: .*%): send one JSON object" },
      { "", "^the body is empty: send one JSON object" },
      { '"just a string"', "^the body must be a JSON object, got a string$" },
      { '[{"order":{}}]', "^the body is a JSON array, and this webhook takes one JSON object per request$" },
      { '{"order":{"customer":7,"total":"12"},"note":3}',
        "^the body does not match what this webhook takes: order%.id is required; note must be a string %(got "
        .. "number%); order%.customer must be a string %(got number%); order%.total must be a number %(got string%)$" },
      { '{"order":{"id":"o-1","customer":true,"total":1}}',
        "^the body does not match what this webhook takes: order%.customer must be a string %(got boolean%); "
        .. "session field order%.customer must be a string or an integer %(got boolean%)$" },
      { '{"order":{"id":"o-1","customer":9007199254740993,"total":1}}',
        "^the body does not match what this webhook takes: order%.customer must be a string %(got number%); "
        .. "session field order%.customer holds an integer too "
        .. "large for a Lua number to hold exactly %(more than 2%^53%): send it as a JSON string$" },
    }
    for _, c in ipairs(cases) do
      local res = post(app, c[1])
      assert.are.equal(400, res.status, c[1])
      assert.matches(c[2], res.json.error)
      assert.are.equal(0, #res.published)
      assert.matches("webhook refused", res.logs[#res.logs].message, 1, true)
    end
  end)

  it("refuses a body over max_body with 413 naming both sizes", function()
    local app = ingress(ORDERS)
    local body = '{"order":{"id":"' .. ("x"):rep(300) .. '","customer":"c","total":1}}'
    local res = post(app, body)
    assert.are.equal(413, res.status)
    assert.are.equal(("the body is %d bytes; this webhook takes at most 200 (max_body)"):format(#body), res.json.error)
    assert.are.equal(0, #res.published)
  end)

  it("takes the type and the session from headers, within an allow-list", function()
    local app = ingress{ path = "/hooks/crm", event_type = { header = "X-Event-Type" }, types = { "Created", "Deleted" },
                         session = { header = "X-Account" } }
    local res = post(app, '{"a":1}', { ["X-Event-Type"] = "Created", ["X-Account"] = "acct-9" }, "/hooks/crm")
    assert.are.equal(202, res.status)
    assert.are.equal("Created", res.published[1].type)
    assert.are.equal("acct-9", res.published[1].opts.session)
    res = post(app, '{"a":1}', { ["X-Event-Type"] = "Dropped", ["X-Account"] = "acct-9" }, "/hooks/crm")
    assert.are.equal(400, res.status)
    assert.matches('event type "Dropped" is not one this webhook takes (Created, Deleted)', res.json.error, 1, true)
    res = post(app, '{"a":1}', { ["X-Event-Type"] = "Created" }, "/hooks/crm")
    assert.are.equal(400, res.status)
    assert.matches("session header X-Account is missing", res.json.error, 1, true)
    assert.are.equal(0, #res.published)
  end)

  it("publishes the bytes the sender sent: long integers and empty arrays arrive unchanged", function()
    local app = ingress{ path = "/hooks/orders", event_type = "OrderPlaced", batch = true }
    local body = ' {"id":12345678901234567890,"tags":[],"n":{"x":[{}],"s":"a,]\\"}"}} '
    local res = post(app, body)
    assert.are.equal(202, res.status)
    assert.are.equal(body, res.published[1].body)

    local a, b = '{"id":-98765432109876543210, "list" : [ ]}', '{"s":"[x,\\"y\\"]","e":{}}'
    res = post(app, "[ " .. a .. " ,\n" .. b .. "\t]")
    assert.are.equal(202, res.status)
    assert.are.same({ a, b }, { res.published[1].body, res.published[2].body })
  end)

  it("refuses a long integer it would have to re-encode (transform's table) with 400", function()
    local app = ingress{ path = "/hooks/orders", event_type = "OrderPlaced", transform = function(body) return body end }
    local res = post(app, '{"id":12345678901234567}')
    assert.are.equal(400, res.status)
    assert.matches("^the number 12345678901234567 has more than 14 significant digits", res.json.error)
    assert.are.equal(0, #res.published)
  end)

  it("publishes a batch in order, or nothing when one element is bad", function()
    local app = ingress{ path = "/hooks/orders", event_type = { field = "kind" }, session = { field = "id" },
                         fields = { "id" }, batch = true, max_batch = 3 }
    local res = post(app, '[{"kind":"A","id":1},{"kind":"B","id":2},{"kind":"C","id":1}]')
    assert.are.equal(202, res.status)
    assert.are.same({ "A", "B", "C" }, { res.published[1].type, res.published[2].type, res.published[3].type })
    assert.are.same({ "1", "2", "1" }, { res.published[1].opts.session, res.published[2].opts.session,
                                         res.published[3].opts.session })
    assert.are.equal(3, res.json.accepted)
    assert.are.equal(3, #res.json.message_ids)

    res = post(app, '[{"kind":"B"},{"id":3},5]')
    assert.are.equal(400, res.status)
    assert.are.equal("the body does not match what this webhook takes: [1].id is required; [1].session field id is "
      .. "missing; [2].event_type field kind is missing; [3]: the body must be a JSON object, got number",
      res.json.error)
    assert.are.equal(0, #res.published)

    res = post(app, '[{"kind":"A","id":1},{"kind":"A","id":2},{"kind":"A","id":3},{"kind":"A","id":4}]')
    assert.are.equal(413, res.status)
    assert.matches("the batch holds 4 events; this webhook takes at most 3 per request (max_batch)", res.json.error, 1,
                   true)
    res = post(app, "[]")
    assert.are.equal(400, res.status)
    assert.matches("the batch is empty", res.json.error, 1, true)
  end)

  it("checks the signature before anything else: 401 and nothing published when it does not hold", function()
    local app = ingress{ path = "/hooks/orders", event_type = "OrderPlaced",
                         signature = { secret = { "new-secret", "old-secret" } } }
    local body = '{"order":{"id":"o-1"}}'
    local function sign(secret, b) return "sha256=" .. hex(crypto.hmac_sha256(secret, b or body)) end

    -- HMAC-SHA256 by nimbus.crypto, by default: digests made by `openssl dgst -sha256 -hmac`
    local res = post(app, body, { ["X-Signature"] =
      "sha256=62d6e01f169df709eea9df7c276e4d4b63033ce3bf2a69ccd84adbeff9a38a4d" })
    assert.are.equal(202, res.status)
    res = post(app, body, { ["X-Signature"] =
      "sha256=330FB4E255A09806AF683D105F9393FAE489FB7EEA8A207EBEC2507F065E48FB" })
    assert.are.equal(202, res.status)   -- the old secret, while rotating; upper-case hex

    local refusals = {
      { nil, "the X-Signature header is missing: sign the raw body and send X-Signature: sha256=<64 hex digits" },
      { "sha1=abc", "the X-Signature header is malformed: expected sha256=<64 hex digits" },
      { sign("wrong-secret"), "the X-Signature header does not match the body" },
      { sign("new-secret", body .. " "), "the X-Signature header does not match the body" },
    }
    for _, r in ipairs(refusals) do
      res = post(app, body, { ["X-Signature"] = r[1] })
      assert.are.equal(401, res.status)
      assert.matches(r[2], res.json.error, 1, true)
      assert.are.equal(0, #res.published)
    end
    res = post(app, "{not json", { ["X-Signature"] = sign("wrong") })
    assert.are.equal(401, res.status)   -- the signature is checked on the raw bytes, first
  end)

  it("compares in constant time: every byte is looked at", function()
    local same = require("adapters.webhook_ingress")._same
    assert.is_true(same("abcdef", "abcdef"))
    assert.is_false(same("abcdef", "abcdeg"))
    assert.is_false(same("abcdef", "bbcdef"))
    assert.is_false(same("abc", "abcd"))
  end)

  it("takes another digest from signature.hmac (raw bytes or hex), and says when it returns neither", function()
    local function app_with(hmac)
      return ingress{ path = "/hooks/orders", event_type = "T", signature = { secret = "s", hmac = hmac } }
    end
    local body = '{"id":1}'
    local good = "sha256=" .. hex(fake_hmac("s", body))
    assert.are.equal(202, post(app_with(fake_hmac), body, { ["X-Signature"] = good }).status)
    assert.are.equal(202, post(app_with(function(k, b) return hex(fake_hmac(k, b)) end), body,
                               { ["X-Signature"] = good }).status)
    -- the default would not take the override's signature
    assert.are.equal(401, post(ingress{ path = "/hooks/orders", event_type = "T", signature = { secret = "s" } }, body,
                               { ["X-Signature"] = good }).status)
    local res = post(app_with(function() return "short" end), body, { ["X-Signature"] = good })
    assert.are.equal(500, res.status)   -- the adapter's bug: logged, nothing published
    assert.matches("the HMAC function returned 5 bytes; expected the 32-byte HMAC-SHA256 digest or its 64 hex digits",
                   res.error, 1, true)
    assert.are.equal(0, #res.published)
  end)

  it("refuses a bad configuration at the caller's line", function()
    local ingress_mod = require("adapters.webhook_ingress")
    local function refusal(opts)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, err = pcall(function() ingress_mod.route(opts) end)
      assert.is_false(ok)
      assert.matches(HERE .. ":" .. line .. ":", err, 1, true)
      return err
    end
    assert.matches("`path` is required", refusal{ event_type = "T" }, 1, true)
    assert.matches("`event_type` is required", refusal{ path = "/h" }, 1, true)
    assert.matches("unknown option sesion", refusal{ path = "/h", event_type = "T", sesion = { field = "a" } }, 1, true)
    assert.matches("`session` must be { field = \"a.b\" } or { header = \"Name\" }, got string",
                   refusal{ path = "/h", event_type = "T", session = "a.b" }, 1, true)
    assert.matches("`signature.secret` is required",
                   refusal{ path = "/h", event_type = "T", signature = { hmac = fake_hmac } }, 1, true)
    assert.matches("`signature.secret`[1] must be a non-empty string (is the environment variable set?)",
                   refusal{ path = "/h", event_type = "T", signature = { secret = { "" }, hmac = fake_hmac } }, 1, true)
    assert.matches("the type must be one of", refusal{ path = "/h", event_type = "T", fields = { a = "text" } }, 1, true)
    assert.matches("`signature.hmac` must be a function(secret, body) returning the HMAC-SHA256 digest",
                   refusal{ path = "/h", event_type = "T", signature = { secret = "s", hmac = "sha256" } }, 1, true)
  end)

  it("reshapes with transform, whose nil, message is a 400", function()
    local app = ingress{ path = "/hooks/orders", event_type = "OrderPlaced", transform = function(body, req)
      if body.test then return nil, "test deliveries are not published" end
      return { id = body.id, via = req.headers["user-agent"] }
    end }
    local res = post(app, '{"id":"o-1","noise":true}', { ["User-Agent"] = "shop/1" })
    assert.are.equal(202, res.status)
    assert.are.same({ id = "o-1", via = "shop/1" }, res.published[1].payload)
    res = post(app, '{"id":"o-2","test":true}')
    assert.are.equal(400, res.status)
    assert.matches("test deliveries are not published", res.json.error, 1, true)
    assert.are.equal(0, #res.published)
  end)

  it("takes CloudEvents: type, session and data from the event; fields apply to the data", function()
    local app = ingress{ path = "/events", cloudevents = true, fields = { "id" }, batch = true }
    local res = post(app, '{"id":"o-1"}', { ["ce-specversion"] = "1.0", ["ce-id"] = "e-1", ["ce-source"] = "/shop",
                                            ["ce-type"] = "OrderPlaced", ["ce-subject"] = "c-7",
                                            ["Content-Type"] = "application/json" }, "/events")
    assert.are.equal(202, res.status)
    assert.are.equal("OrderPlaced", res.published[1].type)
    assert.are.equal("c-7", res.published[1].opts.session)
    assert.are.same({ id = "o-1" }, res.published[1].payload)

    local batch = cjson.encode({ { specversion = "1.0", id = "1", source = "/s", type = "A", data = { id = 1 } },
                                 { specversion = "1.0", id = "2", source = "/s", type = "B", data = { x = 1 } } })
    res = post(app, batch, { ["Content-Type"] = "application/cloudevents-batch+json" }, "/events")
    assert.are.equal(400, res.status)
    assert.matches("[2].id is required", res.json.error, 1, true)
    res = post(app, '{"id":"o-1"}', { ["Content-Type"] = "application/json" }, "/events")
    assert.are.equal(400, res.status)
    assert.matches("^not a valid CloudEvent: no CloudEvent in this request", res.json.error)
    assert.are.equal(0, #res.published)
  end)

  it("gives a route for a server of one's own", function()
    local app = testing.load(function()
      local nimbus = require("nimbus")
      local key, handler = require("adapters.webhook_ingress").route{ path = "/in", method = "PUT", event_type = "T" }
      assert(nimbus.http.serve{ port = 0, routes = { [key] = handler, ["GET /health"] = function() return 200, "ok" end } })
    end)
    assert.are.equal(202, app:serve_request("PUT", "/in", { json = { a = 1 } }).status)
    assert.are.equal(405, app:serve_request("POST", "/in", { json = { a = 1 } }).status)
    assert.are.equal(200, app:serve_request("GET", "/health").status)
  end)
end)

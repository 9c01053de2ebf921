-- adapters.webhook_ingress in a real host (spec/functional/fixtures/adapters_ingress/ingress.lua)
-- under a burst of parallel requests (one curl --parallel run) with bad signatures, bad
-- bodies, oversized bodies, batches and a redelivery mixed in: each request gets the right
-- status and reason, exactly the valid events are published and handled (events CLI and
-- the handler's own record), and nothing of a refused request is.
local nh = require("nh")

local FIXTURE = (os.getenv("NIMBUS_SOURCE_DIR") or ".") .. "/spec/functional/fixtures/adapters_ingress/ingress.lua"
local SECRET = "s3cret-" .. nh.random_hex(8)

local function order(customer, id, seq) return { order = { id = id, customer = customer }, seq = seq } end

-- The burst. sign: "ok" (HMAC with SECRET), "wrong" (another secret), "none" (no header).
-- events: what a 202 publishes, { message id, session, order id } each.
local function burst()
  local reqs = {}
  local function add(r)
    r.name = "r" .. (#reqs + 1)
    r.sign = r.sign or "ok"
    r.type = r.type or "OrderPlaced"
    reqs[#reqs + 1] = r
    return r
  end
  -- 24 valid single orders over 6 customers
  for i = 1, 24 do
    local customer, id = "cust-" .. (i % 6), "o-" .. i
    add{ body = nh.encode(order(customer, id, i)), delivery = "d-" .. i, status = 202,
         type = i % 5 == 0 and "OrderCancelled" or "OrderPlaced",
         events = { { mid = "d-" .. i, session = customer, order = id } } }
  end
  -- 3 batches of 3, each for a customer of its own (their order is checked)
  for b = 1, 3 do
    local list, events = {}, {}
    for j = 1, 3 do
      list[j] = order("batch-" .. b, ("b%d-%d"):format(b, j), j)
      events[j] = { mid = ("b-%d#%d"):format(b, j), session = "batch-" .. b, order = ("b%d-%d"):format(b, j) }
    end
    add{ body = nh.encode(list), delivery = "b-" .. b, status = 202, events = events }
  end
  -- a redelivery: the same delivery twice, published once
  local dup = nh.encode(order("cust-dup", "o-dup", 1))
  add{ body = dup, delivery = "d-dup", status = 202, dup = true, events = { { mid = "d-dup", session = "cust-dup",
                                                                             order = "o-dup" } } }
  add{ body = dup, delivery = "d-dup", status = 202, dup = true, events = {} }
  -- refused: nothing of these may be published
  for i = 1, 5 do
    add{ body = nh.encode(order("cust-1", "bad-sig-" .. i, 1)), delivery = "x-sig-" .. i, sign = "wrong", status = 401,
         error = "the X-Signature header does not match the body" }
  end
  for i = 1, 3 do
    add{ body = nh.encode(order("cust-2", "no-sig-" .. i, 1)), delivery = "x-nosig-" .. i, sign = "none", status = 401,
         error = "the X-Signature header is missing" }
  end
  for i = 1, 4 do
    add{ body = '{"order": {"id": "broken-' .. i .. '", ', delivery = "x-json-" .. i, status = 400,
         error = "the body is not JSON (malformed JSON body" }
  end
  for i = 1, 3 do
    add{ body = nh.encode({ order = { customer = "cust-3" }, seq = "one" }), delivery = "x-field-" .. i, status = 400,
         error = "order.id is required; seq must be an integer (got string)" }
  end
  add{ body = nh.encode(order("cust-4", "o-unknown", 1)), delivery = "x-type", type = "OrderShipped", status = 400,
       error = 'event type "OrderShipped" is not one this webhook takes (OrderPlaced, OrderCancelled)' }
  -- published as sent: a long integer and an empty array reach the store unchanged
  local big = '{"order":{"id":"o-big","customer":"cust-5"},"seq":1,"amount":123456789012345678,"tags":[]}'
  add{ body = big, delivery = "x-num", status = 202,
       events = { { mid = "x-num", session = "cust-5", order = "o-big", payload = big } } }
  add{ body = nh.encode({ order = { id = "o-pad", customer = "cust-5" }, seq = 1, pad = ("p"):rep(5000) }),
       delivery = "x-large", status = 413, error = "this webhook takes at most 4096 (max_body)" }
  add{ body = nh.encode({ order = { id = "o-huge", customer = "cust-5" }, seq = 1, pad = ("p"):rep(100000) }),
       delivery = "x-huge", status = 413, error = "request body too large", server = true }
  local batch6 = {}
  for j = 1, 6 do batch6[j] = order("cust-6", "o-b6-" .. j, j) end
  add{ body = nh.encode(batch6), delivery = "x-batch6", status = 413, error = "at most 5 per request (max_batch)" }
  add{ body = nh.encode({ order("cust-7", "o-ok", 1), { order = { id = "o-no-customer" }, seq = 2 } }),
       delivery = "x-batchbad", status = 400, error = "[2].order.customer is required; [2].session field order.customer "
                                                       .. "is missing" }
  -- shuffle the refusals in among the valid ones (a fixed seed: the same burst every run)
  local rng = 12345
  for i = #reqs, 2, -1 do
    rng = (rng * 1103515245 + 12345) % 2147483648
    local j = rng % i + 1
    reqs[i], reqs[j] = reqs[j], reqs[i]
  end
  return reqs
end

-- HMAC-SHA256 hex digests of files, by nimbus.crypto in a -l script of the host (the spec
-- runs under plain lua5.4), in one run: { [path] = hex }.
local SIGNER = [[
local crypto = require("nimbus").crypto
local secret = arg[1]
for i = 2, #arg do
  local f = assert(io.open(arg[i], "rb"))
  local body = f:read("a")
  f:close()
  print(crypto.hex(crypto.hmac_sha256(secret, body)) .. " " .. arg[i])
end
]]

local function hmacs(sb, secret, paths)
  local script = sb:path("sign.lua")
  nh.write(script, SIGNER)
  local args = { nh.bin(), "-l", script, secret }
  for _, p in ipairs(paths) do args[#args + 1] = p end
  local quoted = {}
  for i, a in ipairs(args) do quoted[i] = nh.q(a) end
  local r = nh.capture(table.concat(quoted, " "), sb.dir)
  assert(r.code == 0, "signing with nimbus.crypto failed: " .. r.err)
  local out = {}
  for hex, path in r.out:gmatch("(%x+) ([^\n]+)") do out[path] = hex end
  assert(#paths == 0 or next(out), "the signer printed no digest: " .. r.out)
  return out
end

describe("webhook_ingress in a real host", function()
  local sb, host, base

  before_each(function()
    sb = nh.sandbox()
    local port_file = sb:path("ingress.port")
    host = sb:start(FIXTURE, { env = { INGRESS_PORT_FILE = port_file, INGRESS_CALLS = sb:path("calls.jsonl"),
                                       INGRESS_SECRET = SECRET } })
    local port = nh.eventually(function()
      local s = nh.read(port_file)
      return s and tonumber(s:match("%d+"))
    end, nh.DEADLINE, "the ingress port file")
    base = ("http://127.0.0.1:%d/hooks/orders"):format(port)
  end)

  after_each(function() sb:cleanup() end)

  it("answers every request of a mixed burst rightly and publishes exactly the valid events", function()
    local reqs = burst()
    local paths = {}
    for i, r in ipairs(reqs) do
      r.file = sb:path(r.name .. ".body")
      nh.write(r.file, r.body)
      paths[i] = r.file
    end
    local good = hmacs(sb, SECRET, paths)
    local bad = hmacs(sb, "not-the-secret", paths)

    -- one curl, up to 16 requests in flight at once
    local conf = {}
    for _, r in ipairs(reqs) do
      r.out = sb:path(r.name .. ".response")
      conf[#conf + 1] = ("url = %q"):format(base .. "?r=" .. r.name)
      conf[#conf + 1] = ("data-binary = %q"):format("@" .. r.file)
      conf[#conf + 1] = 'header = "Content-Type: application/json"'
      conf[#conf + 1] = ("header = %q"):format("X-Event-Type: " .. r.type)
      conf[#conf + 1] = ("header = %q"):format("X-Delivery-Id: " .. r.delivery)
      if r.sign ~= "none" then
        local digest = assert((r.sign == "ok" and good or bad)[r.file], "no digest for " .. r.file)
        conf[#conf + 1] = ("header = %q"):format("X-Signature: sha256=" .. digest)
      end
      conf[#conf + 1] = ("output = %q"):format(r.out)
      conf[#conf + 1] = 'write-out = "%{http_code} %{url_effective}\\n"'
      conf[#conf + 1] = "next"
    end
    conf[#conf] = nil
    nh.write(sb:path("burst.curl"), table.concat(conf, "\n") .. "\n")
    local run = nh.capture(("curl -sS --max-time 60 --parallel --parallel-max 16 -K %s"):format(nh.q(sb:path("burst.curl"))),
                           sb.dir)
    assert(run.code == 0, "curl failed: " .. run.err .. "\n" .. run.out)

    local statuses = {}
    for status, name in run.out:gmatch("(%d+) [^\n]*%?r=(r%d+)") do statuses[name] = tonumber(status) end
    local expected_events, duplicates, refusals = {}, 0, 0
    for _, r in ipairs(reqs) do
      assert.are.equal(r.status, statuses[r.name], ("%s (%s): status; body %s"):format(r.name, r.delivery,
                       tostring(nh.read(r.out))))
      local answer = nh.decode(assert(nh.read(r.out)))
      if r.status == 202 then
        local want = {}
        for i, e in ipairs(r.events) do want[i] = e.mid end
        if r.dup then
          assert.are.same({ "d-dup" }, answer.message_ids)
          duplicates = duplicates + answer.duplicates
        else
          assert.are.same(want, answer.message_ids, r.name)
          assert.are.equal(0, answer.duplicates)
        end
        for _, e in ipairs(r.events) do expected_events[#expected_events + 1] = e end
      else
        assert.matches(r.error, answer.error, 1, true)
        if not r.server then refusals = refusals + 1 end
      end
    end
    assert.are.equal(1, duplicates)   -- the redelivery, whichever of the two came second

    -- every valid event handled, and nothing else: the audit trail and the handler's record
    local rows = sb:wait_rows(function(rows)
      return nh.count(rows, function(x) return x.status == "Completed" end) >= #expected_events
    end, ("%d completed events"):format(#expected_events))
    local by_mid = {}
    for _, row in ipairs(rows) do
      assert.are.equal("Orders", row.endpoint)
      assert.are.equal("Completed", row.status)
      assert.is_nil(by_mid[row.message_id], "message published twice: " .. row.message_id)
      by_mid[row.message_id] = row
    end
    assert.are.equal(#expected_events, #rows)
    local raw_checked = 0
    for _, e in ipairs(expected_events) do
      local row = assert(by_mid[e.mid], "no event for message " .. e.mid)
      assert.are.equal(e.session, row.session_id)
      if e.payload then
        assert.are.equal(e.payload, sb:show(row.event_id).payload)   -- the very bytes sent
        raw_checked = raw_checked + 1
      end
    end
    assert.are.equal(1, raw_checked)
    local calls = nh.json_lines(nh.read(sb:path("calls.jsonl")) or "")
    assert.are.equal(#expected_events, #calls)
    local handled = {}
    for _, c in ipairs(calls) do handled[c.message_id] = c end
    for _, e in ipairs(expected_events) do
      assert.are.equal(e.order, handled[e.mid].order)
      assert.are.equal(e.session, handled[e.mid].session)
    end
    -- the elements of a batch are handled in their order (each batch is a session)
    for b = 1, 3 do
      local seqs = {}
      for _, c in ipairs(calls) do if c.session == "batch-" .. b then seqs[#seqs + 1] = c.seq end end
      assert.are.same({ 1, 2, 3 }, seqs)
    end
    -- each refusal is in the log with its reason
    local logged = select(2, host:log():gsub("webhook refused", ""))
    assert.are.equal(refusals, logged)
  end)
end)

-- adapters/http_forward.lua + adapters/job_poller.lua in a real host, against a real local
-- HTTP server: a slow import API (spec/functional/fixtures/adapters_forward/import_api.lua,
-- nimbus.http.serve in the same host) that answers 202 with a Location and then reports
-- the job's states, refuses bad items with 422, is busy (503 + Retry-After), redirects in a
-- loop or never answers until the spec "fixes" it. The forwarder is fixtures/.../forwarder.lua.
-- Outcomes are read with the CLI (`events`, `show`, `sessions`), as an operator would.
local nh = require("nh")

local HERE = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
if HERE:sub(1, 1) ~= "/" then HERE = os.getenv("PWD") .. "/" .. HERE end
local FIXTURES = HERE .. "/fixtures/adapters_forward"

describe("adapters: http_forward + job_poller against a real import API", function()
  local sb, api

  -- The host: one adapter file that starts the import API on a free port and the forwarder
  -- pointed at it. Returns the API's base URL.
  local function start()
    local port_file = sb:path("api.port")
    local adapter = sb:adapter("import.lua", ([[
package.path = %q .. "/?.lua;" .. package.path
local srv = require("import_api").start{ port = 0, port_file = %q }
require("forwarder").setup("http://127.0.0.1:" .. srv.port)
]]):format(FIXTURES, port_file))
    sb:start(adapter)
    local port = nh.eventually(function()
      local s = nh.read(port_file)
      return s and tonumber(s:match("%d+"))
    end, nil, "the import API's port file")
    return "http://127.0.0.1:" .. port
  end

  local function import(item, session)
    return sb:publish("ImportRequested", item, { session = session or item.id })
  end

  local function calls(id)
    local status, body = nh.http_json(api .. "/api/calls/" .. id)
    assert.equal(200, status)
    return body
  end

  local function fix(id)
    local status = nh.capture(("curl -sS -o /dev/null -w '%%{http_code}' -X PUT %s"):format(nh.q(api .. "/api/admin/fix/" .. id)))
    assert.equal("204", status.out)
  end

  -- Waits until the event of message `mid` is Pending+Retrying with an error text that
  -- matches `pattern`; returns its row.
  local function wait_retrying(mid, pattern)
    local last
    return nh.eventually(function()
      for _, r in ipairs(sb:events()) do
        if r.message_id == mid then
          last = r
          if r.status == "Pending" and r.sub_status == "Retrying" and tostring(r.error_text):find(pattern) then
            return r
          end
        end
      end
    end, nil, function() return "no Pending+Retrying row matching " .. pattern .. "; last: " .. nh.encode(last or {}) end)
  end

  before_each(function()
    sb = nh.sandbox()
    api = start()
  end)
  after_each(function() sb:cleanup() end)

  it("a 202 hand-off is settled by the poller when the job succeeds: Completed with the job's result", function()
    local mid = import({ id = "item-1", scenario = "job", states = { "Queued", "Running", "Running", "Succeeded" } })
    local row = sb:wait_message(mid, "Completed")
    assert.is_nil(row.error_text)
    local shown = sb:show(row.event_id)
    assert.same({ imported = "item-1", rows = 3 }, nh.decode(shown.result))
    assert.equal(nh.count(shown.history, function(h) return h.status == "Pending" end) >= 1, true,
                 "the event was Pending+Handoff before it completed")
    local c = calls("item-1")
    assert.equal(1, c.posts)
    assert.equal(4, c.gets, "polled once per state, no more after Succeeded")
    nh.eventually(function() return sb:session("item-1") == nil end, nil, "the session is free")
  end)

  it("a failed job fails the event with the job's error and keeps its session blocked", function()
    local mid = import({ id = "item-2", scenario = "job", states = { "Running", "Failed" } })
    local later = import({ id = "item-2b" }, "item-2")   -- same session: parked behind the failure
    local row = sb:wait_message(mid, "Failed")
    assert.equal("ImportFailed", row.error_type)
    assert.matches("^job http://127%.0%.0%.1:%d+/api/imports/jobs/item%-2 ended Failed: line 2: unknown SKU in item item%-2$",
                   row.error_text)
    assert.equal("Deferred", sb:wait_message(later, "Deferred").status)
    local st = sb:session("item-2")
    assert.equal(row.event_id, st.blocked_by)
    assert.equal(1, st.parked)
    assert.equal(0, calls("item-2b").posts, "the parked event was not delivered")

    -- the operator skips the failed import: the parked one is delivered
    sb:cli_ok({ "skip", row.event_id })
    sb:wait_message(later, "Completed")
    assert.equal(1, calls("item-2b").posts)
  end)

  it("a 503 with a short Retry-After is waited for in the handler; a longer one is retried by the host; both complete", function()
    local short = import({ id = "item-3", scenario = "busy", busy_times = 1, retry_after = 1 })
    local long = import({ id = "item-4", scenario = "busy", busy_times = 1, retry_after = 2 })
    local r3 = sb:wait_message(short, "Completed")
    local r4 = sb:wait_message(long, "Completed")
    assert.equal(2, calls("item-3").posts)
    assert.equal(2, calls("item-4").posts)
    -- item-3: one handler run that waited; item-4: a transient failure naming the Retry-After, then a retry
    assert.equal(0, nh.count(sb:show(r3.event_id).history, function(h) return h.status == "Pending" end))
    local retried = nh.where(sb:show(r4.event_id).history, "status", "Pending")
    assert.is_true(#retried >= 1, "item-4 went through Pending+Retrying")
    assert.matches("Import API: POST http://127%.0%.0%.1:%d+/api/imports → 503 Service Unavailable", retried[1].error_text)
    assert.matches("Retry%-After: 2 s", retried[1].error_text)
  end)

  it("a 422 is dead-lettered with method, URL, status and body, and the session goes on", function()
    local mid = import({ id = "item-5", scenario = "reject" })
    local next_one = import({ id = "item-5b" }, "item-5")
    local row = sb:wait_message(mid, "DeadLettered")
    assert.equal("HttpStatus422", row.error_type)
    assert.matches("^Import API: POST http://127%.0%.0%.1:%d+/api/imports → 422 Unprocessable Content", row.error_text)
    assert.matches('Body: {"error":"SKU missing for item item%-5"}$', row.error_text)
    sb:wait_message(next_one, "Completed")
    assert.equal(1, calls("item-5").posts, "a permanent answer is not retried")
  end)

  it("a target that redirects in a loop is a transient retry, not lost: it completes once the loop is fixed", function()
    local mid = import({ id = "item-6", scenario = "loop" })
    local row = wait_retrying(mid, "redirect loop")
    assert.equal("HttpRedirectLoop", row.error_type)
    assert.matches("/api/imports → http://127%.0%.0%.1:%d+/api/imports/loop/item%-6 → http://127%.0%.0%.1:%d+/api/imports",
                   row.error_text)
    fix("item-6")
    sb:wait_message(mid, "Completed")
  end)

  it("a target that never answers is a transient retry bounded by the timeout, not lost", function()
    local mid = import({ id = "item-7", scenario = "hang" })
    local row = wait_retrying(mid, "no answer within 3 s")
    assert.equal("HttpTimeout", row.error_type)
    fix("item-7")
    sb:wait_message(mid, "Completed")
    assert.is_true(calls("item-7").posts >= 2)
  end)
end)

-- Host lifecycle: ready line, stop signals drain the running handler, state survives a restart.
local nh = require("nh")

describe("host lifecycle", function()
  local sb

  before_each(function() sb = nh.sandbox() end)
  after_each(function() sb:cleanup() end)

  it("logs ready: with the endpoints and the event types they handle", function()
    local host = sb:start(sb:recorder{ endpoint = "CrmEndpoint", types = { "AccountCreated", "AccountUpdated" } })
    local log = host:log()
    local ready = log:match("[^\n]*ready:[^\n]*")
    assert.is_string(ready)
    assert.matches("CrmEndpoint", ready)
    assert.matches("AccountCreated", ready)
    assert.matches("AccountUpdated", ready)
  end)

  for _, sig in ipairs({ "TERM", "INT" }) do
    it("SIG" .. sig .. " lets the running handler finish, records its outcome, then exits 0", function()
      local host = sb:start(sb:recorder{ types = { "Ok" } })
      local m = sb:publish("Ok", { tag = "slow", gate = "go" }, { session = "s1" })
      nh.eventually(function() return sb:call_count("slow") == 1 end, nil, "the handler started")
      host:signal(sig)
      sb:touch("go")
      assert.equal(0, host:wait_exit(30))
      local row = sb:wait_message(m, "Completed")
      assert.equal(1, sb:call_count("slow"))
      assert.is_nil(sb:session(row.session_id))
    end)
  end

  it("keeps blocked sessions and parked events across a restart", function()
    local adapter = sb:recorder{ types = { "Ok" } }
    local host = sb:start(adapter)
    local head = sb:publish("Ok", { tag = "head", fail_times = 1 }, { session = "s1" })
    local p1 = sb:publish("Ok", { tag = "p1" }, { session = "s1" })
    local blocker = sb:wait_message(head, "Failed")
    sb:wait_message(p1, "Deferred")
    assert.equal(0, host:stop())
    -- Published while no host runs: queued, and parked behind the blocker at the next start.
    local p2 = sb:publish("Ok", { tag = "p2" }, { session = "s1" })

    sb:start(adapter)
    sb:wait_message(p2, "Deferred")
    local st = sb:session("s1")
    assert.equal(blocker.event_id, st.blocked_by)
    assert.equal(2, st.parked)
    assert.same({ "head" }, sb:call_tags("s1"))

    sb:cli_ok({ "resubmit", blocker.event_id })
    sb:wait_message(p1, "Completed")
    sb:wait_message(p2, "Completed")
    assert.same({ "head", "head", "p1", "p2" }, sb:call_tags("s1"))
  end)
end)

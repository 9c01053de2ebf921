local testing = require("nimbus.testing")

describe("Greeter", function()
  local app
  before_each(function() app = testing.load("greeter.lua") end)   -- a fresh adapter per test

  it("welcomes a customer with an email", function()
    local out = app:send("Greeter", "CustomerSignedUp", { name = "Ada", email = "ada@example.com" },
                         { session_id = "ada" })
    testing.assert_completed(out)
    assert.matches("welcome mail sent .*to=ada@example.com", out.logs[1].message)
  end)

  it("fails, and so blocks the session, without an email", function()
    testing.assert_failed(app:send("Greeter", "CustomerSignedUp", { name = "Bob" }), "has no email")
  end)

  it("dead-letters a payload that is not JSON", function()
    testing.assert_dead_lettered(app:send("Greeter", "CustomerSignedUp", "{oops"), "malformed JSON")
  end)
end)

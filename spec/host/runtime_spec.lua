-- Runs inside nimbus-host -l: the nimbus module resolves from the project's lua/ dir.
describe("nimbus inside the host", function()
  local nimbus = require("nimbus")

  it("resolves require('nimbus') and its C core", function()
    assert.is_string(nimbus._VERSION)
    assert.is_function(nimbus.endpoint)
    assert.are.equal("Lua 5.4", _VERSION)
  end)

  it("keeps the runtime's internals off the public table (they are in nimbus.internal)", function()
    for _, k in ipairs({ "_run", "_subscriptions", "_hook", "_is_alive", "_decode", "_endpoints" }) do
      assert.is_nil(rawget(nimbus, k), k)
    end
    assert.is_function(require("nimbus.internal").run)
  end)

  it("rejects endpoint names that cannot be queue names", function()
    assert.has_error(function() nimbus.endpoint("bad name!") end)
  end)
end)

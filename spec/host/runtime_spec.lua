-- Runs inside nimbus-host -l: the nimbus module resolves from the project's lua/ dir.
describe("nimbus inside the host", function()
  local nimbus = require("nimbus")

  it("resolves require('nimbus') and its C core", function()
    assert.is_string(nimbus._VERSION)
    assert.is_function(nimbus.endpoint)
    assert.are.equal("Lua 5.4", _VERSION)
  end)

  it("refuses to publish outside a running host with a clear error", function()
    local ok, err = pcall(nimbus.publish, "X", {})
    assert.is_false(ok)
    assert.matches("inside a running host", err)
  end)

  it("rejects endpoint names that cannot be queue names", function()
    assert.has_error(function() nimbus.endpoint("bad name!") end)
  end)
end)

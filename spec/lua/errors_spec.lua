-- Pure-Lua specs for lua/nimbus/errors.lua (runs under stock lua5.4).
local errors = require("nimbus.errors")

describe("nimbus.errors.classify", function()
  it("maps nimbus.permanent to a dead-letter with its message", function()
    local kind, text, etype = errors.classify(errors.permanent("bad payload"))
    assert.are.same({ "deadletter", "bad payload", "PermanentFailure" }, { kind, text, etype })
  end)

  it("maps nimbus.transient to a transient outcome", function()
    local kind, text = errors.classify(errors.transient("ERP busy"))
    assert.are.same({ "transient", "ERP busy" }, { kind, text })
  end)

  it("keeps a caller-chosen error type", function()
    local _, _, etype = errors.classify(errors.permanent("x", "ValidationError"))
    assert.are.equal("ValidationError", etype)
  end)

  it("treats a plain string error as a failure with type LuaError", function()
    local kind, text, etype = errors.classify("adapter.lua:3: boom")
    assert.are.same({ "failed", "adapter.lua:3: boom", "LuaError" }, { kind, text, etype })
  end)

  it("uses message and type fields of table errors", function()
    local kind, text, etype = errors.classify({ message = "ERP said no", type = "ErpRejected" })
    assert.are.same({ "failed", "ERP said no", "ErpRejected" }, { kind, text, etype })
  end)

  it("describes nil and message-less error values instead of crashing", function()
    assert.are.equal("error raised with a nil value", select(2, errors.classify(nil)))
    assert.are.equal("error object without a message", select(2, errors.classify({})))
  end)

  it("prints permanent and transient errors readably", function()
    assert.are.equal("permanent: bad", tostring(errors.permanent("bad")))
  end)
end)

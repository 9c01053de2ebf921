-- nimbus.crypto (host/src/lua/nh_lcrypto.c, lua/nimbus/crypto.lua) inside the host: HMAC-SHA256
-- against the test vectors of RFC 4231, SHA-256 against FIPS 180-2's, hex, the constant-time
-- compare, argument errors at the caller's line, and the same functions under nimbus.testing.
local nimbus = require("nimbus")
local testing = require("nimbus.testing")
local crypto = nimbus.crypto

local HERE = debug.getinfo(1, "S").short_src

-- "0b0b..." -> the bytes
local function unhex(h) return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end

-- RFC 4231 section 4: { key, data, HMAC-SHA-256 } (case 5's is truncated to 128 bits there)
local RFC4231 = {
  { ("\x0b"):rep(20), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7" },
  { "Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843" },
  { ("\xaa"):rep(20), ("\xdd"):rep(50), "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe" },
  { unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), ("\xcd"):rep(50),
    "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b" },
  { ("\x0c"):rep(20), "Test With Truncation", "a3b6167473100ee06e0c796c2955552b", truncated = true },
  { ("\xaa"):rep(131), "Test Using Larger Than Block-Size Key - Hash Key First",
    "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54" },
  { ("\xaa"):rep(131), "This is a test using a larger than block-size key and a larger than block-size data. The key "
    .. "needs to be hashed before being used by the HMAC algorithm.",
    "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2" },
}

describe("nimbus.crypto", function()
  it("computes HMAC-SHA256 as RFC 4231's test cases 1 to 7 give it", function()
    for i, c in ipairs(RFC4231) do
      local mac = crypto.hmac_sha256(c[1], c[2])
      assert.are.equal(32, #mac, "case " .. i)
      local got = crypto.hex(mac)
      if c.truncated then got = got:sub(1, 32) end
      assert.are.equal(c[3], got, "RFC 4231 test case " .. i)
    end
    -- an empty key and message (keys of any length, zero bytes included)
    assert.are.equal("b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad",
                     crypto.hex(crypto.hmac_sha256("", "")))
    assert.are_not.equal(crypto.hmac_sha256("k\0a", "m"), crypto.hmac_sha256("k\0b", "m"))
  end)

  it("computes SHA-256 (FIPS 180-2's examples) over any bytes", function()
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", crypto.hex(crypto.sha256("abc")))
    assert.are.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
                     crypto.hex(crypto.sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")))
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", crypto.hex(crypto.sha256("")))
    assert.are_not.equal(crypto.sha256("a\0b"), crypto.sha256("a\0c"))
  end)

  it("writes bytes as lowercase hex, two digits each", function()
    assert.are.equal("", crypto.hex(""))
    assert.are.equal("00ff0a7f80", crypto.hex("\0\255\n\127\128"))
    local all = {}
    for b = 0, 255 do all[#all + 1] = string.char(b) end
    assert.are.equal(table.concat(all), unhex(crypto.hex(table.concat(all))))
  end)

  it("compares strings: equal bytes only, false on a length mismatch", function()
    assert.is_true(crypto.equal("", ""))
    assert.is_true(crypto.equal("sha256=ab\0cd", "sha256=ab\0cd"))
    assert.is_false(crypto.equal("abcdef", "abcdeg"))
    assert.is_false(crypto.equal("abcdef", "bbcdef"))
    assert.is_false(crypto.equal("abc", "abcd"))
    assert.is_false(crypto.equal("abc\0", "abc"))
    assert.is_false(crypto.equal("", "a"))
  end)

  it("refuses anything but strings, naming the function, the argument and the caller's line", function()
    local cases = {
      { function() return crypto.hmac_sha256(nil, "m") end, "nimbus.crypto.hmac_sha256: the key (argument 1) must be a string, got nil" },
      { function() return crypto.hmac_sha256("k", 42) end, "nimbus.crypto.hmac_sha256: the message (argument 2) must be a string, got number" },
      { function() return crypto.sha256({}) end, "nimbus.crypto.sha256: the input (argument 1) must be a string, got table" },
      { function() return crypto.hex(true) end, "nimbus.crypto.hex: the input (argument 1) must be a string, got boolean" },
      { function() return crypto.equal("a") end, "nimbus.crypto.equal: the second string (argument 2) must be a string, got no value" },
    }
    for _, c in ipairs(cases) do
      local line = debug.getinfo(c[1], "S").linedefined
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.are.equal(("%s:%d: %s"):format(HERE, line, c[2]), err)
    end
  end)

  it("is the same under nimbus.testing (and require(\"nimbus.crypto\"))", function()
    local got
    local app = testing.load(function()
      local n = require("nimbus")
      n.endpoint("Sign"):on("Body", function(ev)
        got = n.crypto.hex(require("nimbus.crypto").hmac_sha256(ev.key, ev.data))
      end)
    end)
    testing.assert_completed(app:send("Sign", "Body", { key = "Jefe", data = "what do ya want for nothing?" }))
    assert.are.equal(RFC4231[2][3], got)
  end)
end)

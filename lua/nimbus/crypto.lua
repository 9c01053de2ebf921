-- nimbus.crypto: the hashes adapters sign and verify with (webhook signatures, API
-- request signing, content digests). The work is done in C by OpenSSL
-- (host/src/lua/nh_lcrypto.c); this file is the reference for adapter authors.
--
--   local nimbus = require("nimbus")
--   local crypto = nimbus.crypto                         -- or require("nimbus.crypto")
--   local mac = crypto.hmac_sha256("key", "The quick brown fox jumps over the lazy dog")
--   assert(crypto.hex(mac) == "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8")
--   assert(crypto.hex(crypto.sha256("")) ==
--          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
--   -- a webhook's "X-Signature: sha256=<hex>" header against the raw body:
--   local function signed(header, secret, body)
--     return crypto.equal(header or "", "sha256=" .. crypto.hex(crypto.hmac_sha256(secret, body)))
--   end
--
-- hmac_sha256(key, message) -> the 32 raw bytes of HMAC-SHA256 (RFC 2104); any key length.
-- sha256(s) -> the 32 raw bytes of SHA-256.
-- hex(s) -> s as lowercase hex, two digits a byte.
-- equal(a, b) -> true when the strings are the same bytes. It takes the same time wherever
--   they differ (only the length shows), so use it, never ==, to compare a signature a
--   caller sent with the one you computed: == returns sooner the earlier they differ,
--   which lets an attacker find a valid signature a byte at a time.
--
-- Every argument must be a string (a number is refused, not converted); anything else
-- raises "nimbus.crypto.<fn>: the <arg> (argument n) must be a string, got <type>" at the
-- caller's line. None of them waits: call them anywhere, also from the main chunk.
-- Inside nimbus-host only (nimbus.testing inside the host too); plain lua5.4 has no C
-- side, and calling any of them there raises, saying so.
local ok, core = pcall(require, "nimbus.crypto.core")

if not ok then
  local MISSING = "nimbus.crypto is implemented in C by nimbus-host and this Lua has no nimbus.crypto.core: "
    .. "run the code (or the spec) inside the host: nimbus-host -l SCRIPT, or nimbus-host -l /usr/bin/busted SPEC"
  local function missing() error(MISSING, 2) end
  core = { hmac_sha256 = missing, sha256 = missing, hex = missing, equal = missing }
end

-- The C functions themselves, not wrappers: an argument error names the caller's line.
return {
  hmac_sha256 = core.hmac_sha256,
  sha256 = core.sha256,
  hex = core.hex,
  equal = core.equal,
}

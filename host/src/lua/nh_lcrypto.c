/* The C side of nimbus.crypto (lua/nimbus/crypto.lua): the hashes adapters need to sign
 * and verify webhooks, done by OpenSSL's libcrypto (already linked for the Service Bus
 * SAS tokens). Nothing here waits or allocates outside Lua strings, so every function may
 * be called anywhere: the main chunk, a handler, a route, a -l script. */
#include "nh_lmodules.h"

#include <lauxlib.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

/* The string at `arg`, or a usage error naming the function and the argument. Numbers are
 * refused rather than converted: a key or a body that is a number is the caller's mistake,
 * and hashing its decimal text would hide it. */
static const char *check_bytes(lua_State *L, int arg, const char *fn, const char *name, size_t *len)
{
  if (lua_type(L, arg) != LUA_TSTRING)
    luaL_error(L, "nimbus.crypto.%s: the %s (argument %d) must be a string, got %s", fn, name, arg,
               luaL_typename(L, arg));
  return lua_tolstring(L, arg, len);
}

/* hmac_sha256(key, message) -> 32 raw bytes */
static int l_hmac_sha256(lua_State *L)
{
  size_t klen, mlen;
  const char *key = check_bytes(L, 1, "hmac_sha256", "key", &klen);
  const char *msg = check_bytes(L, 2, "hmac_sha256", "message", &mlen);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int outlen = 0;
  /* HMAC() takes a non-NULL key even when it is empty (RFC 2104 allows an empty key) */
  static const unsigned char empty[1];
  if (!HMAC(EVP_sha256(), klen ? (const void *)key : empty, (int)klen, (const unsigned char *)msg, mlen, out,
            &outlen))
    return luaL_error(L, "nimbus.crypto.hmac_sha256: OpenSSL failed to compute the HMAC");
  lua_pushlstring(L, (const char *)out, outlen);
  return 1;
}

/* sha256(s) -> 32 raw bytes */
static int l_sha256(lua_State *L)
{
  size_t len;
  const char *s = check_bytes(L, 1, "sha256", "input", &len);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int outlen = 0;
  if (!EVP_Digest(s, len, out, &outlen, EVP_sha256(), NULL))
    return luaL_error(L, "nimbus.crypto.sha256: OpenSSL failed to compute the digest");
  lua_pushlstring(L, (const char *)out, outlen);
  return 1;
}

/* hex(s) -> lowercase hex, two digits a byte */
static int l_hex(lua_State *L)
{
  static const char digits[] = "0123456789abcdef";
  size_t len;
  const unsigned char *s = (const unsigned char *)check_bytes(L, 1, "hex", "input", &len);
  luaL_Buffer b;
  char *p = luaL_buffinitsize(L, &b, len * 2);
  for (size_t i = 0; i < len; i++) {
    p[2 * i] = digits[s[i] >> 4];
    p[2 * i + 1] = digits[s[i] & 15];
  }
  luaL_pushresultsize(&b, len * 2);
  return 1;
}

/* equal(a, b) -> boolean. The time taken depends on the length only, never on where the
 * strings differ, so comparing a received signature with the expected one leaks nothing
 * an attacker could use to guess it byte by byte. Lengths are public (a digest's is). */
static int l_equal(lua_State *L)
{
  size_t alen, blen;
  const char *a = check_bytes(L, 1, "equal", "first string", &alen);
  const char *b = check_bytes(L, 2, "equal", "second string", &blen);
  lua_pushboolean(L, alen == blen && (alen == 0 || CRYPTO_memcmp(a, b, alen) == 0));
  return 1;
}

int nh_lcrypto_open(lua_State *L)
{
  static const luaL_Reg fns[] = {
    { "hmac_sha256", l_hmac_sha256 }, { "sha256", l_sha256 }, { "hex", l_hex }, { "equal", l_equal }, { NULL, NULL },
  };
  luaL_newlib(L, fns);
  return 1;
}

/* JSON to Lua and Lua to JSON, the way a payload travels: the body decoded as the
 * dispatcher hands it to a handler (nimbus.internal.decode: cjson, integral numbers as
 * integers), then what the handler could send on encoded again (cjson.encode). A Lua
 * error raised by either (not a refusal returned as nil, err) aborts: that is a finding. */
#include "nh_fuzz.h"



static const char *const target =
  "local decode = require('nimbus.internal').decode\n"
  "local cjson = require('cjson.safe')\n"
  "function fuzz_json(s)\n"
  "  local v = decode(s)\n"
  "  if type(v) ~= 'table' then return end\n"
  "  local out = cjson.encode(v)\n"
  "  if out then\n"
  "    local back = decode(out)\n"
  "    assert(type(back) == 'table', 'a re-encoded payload does not decode')\n"
  "  end\n"
  "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  nh_fuzz_lua_run(target, "fuzz_json", data, size);
  return 0;
}

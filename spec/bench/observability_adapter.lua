-- The /metrics scrape bench's adapter, run by spec/bench/observability.lua (not by hand):
-- BENCH_OBS_ENDPOINTS endpoints (50) named ObsEp01.., each handling the two event types
-- ObsA and ObsB with a trivial handler. One publish of a type fans out to every endpoint,
-- so a few publishes make every series of the per-endpoint and per-type families exist.
local nimbus = require("nimbus")

local n = tonumber(os.getenv("BENCH_OBS_ENDPOINTS") or "") or 50
for i = 1, n do
  local ep = nimbus.endpoint(("ObsEp%02d"):format(i))
  ep:on("ObsA", function() end)
  ep:on("ObsB", function() end)
end

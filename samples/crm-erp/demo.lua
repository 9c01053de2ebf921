-- The CrmErpDemo in one host: the fake CRM and ERP APIs, the ERP, CRM, DataPlatform and
-- AgentZone adapters, the DMF and enrichment status checkers.
--
--   nimbus-host samples/crm-erp/demo.lua            (make demo does this)
--
-- Environment: CRM_API_PORT (5080), ERP_API_PORT (5090), DEMO_DATA_DIR (the directory of
-- the store, or the current one: crm.db and erp.db live there), DATAPLATFORM_DELAY (s, 10),
-- CHECKER_EVERY (s, 1), DEMO_QUIET=1 (no narrated run).
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. here .. "/?/init.lua;" .. package.path

local nimbus = require("nimbus")

local function env_num(name, default) return tonumber(os.getenv(name) or "") or default end
local CRM_PORT = math.tointeger(env_num("CRM_API_PORT", 5080))
local ERP_PORT = math.tointeger(env_num("ERP_API_PORT", 5090))
local store = os.getenv("NIMBUS_STORE") or "./nimbus.db"
local DATA = os.getenv("DEMO_DATA_DIR") or (store:match("^(.*)/[^/]*$") or ".")

local function publish(event_type, payload, session)
  local mid, err = nimbus.publish(event_type, payload, { session = session })
  if not mid then nimbus.log.error("publish failed", { type = event_type, err = err }) end
  return mid, err
end

local function started(api, err, what, var)
  if not api then error(("the fake %s API did not start: %s (set %s to use another port)"):format(what, err, var), 0) end
  return api
end
local crm, crm_err = require("fake.crm_api").start{
  port = CRM_PORT, db = DATA .. "/crm.db", publish = publish,
  request = function(t, payload, opts) return nimbus.request(t, payload, opts) end,
}
started(crm, crm_err, "CRM", "CRM_API_PORT")
-- Erp.Api publishes through its outbox (adapters.outbox_relay), not through `publish`
local erp, erp_err = require("fake.erp_api").start{ port = ERP_PORT, db = DATA .. "/erp.db" }
started(erp, erp_err, "ERP", "ERP_API_PORT")
-- port 0 picks free ports (tests); the adapters call the ports actually bound
local CRM_URL = ("http://127.0.0.1:%d"):format(crm.port)
local ERP_URL = ("http://127.0.0.1:%d"):format(erp.port)

require("erp_adapter").setup{ erp_url = ERP_URL, checker_every = env_num("CHECKER_EVERY", 1) }
local crm_adapter = require("crm_adapter")
crm_adapter.setup{ crm_url = CRM_URL }
require("dataplatform").setup{ delay = env_num("DATAPLATFORM_DELAY", 10) }
require("agentzone").setup{ every = env_num("CHECKER_EVERY", 1) }

nimbus.log.info(("CrmErpDemo: CRM API %s, ERP API %s, data in %s"):format(CRM_URL, ERP_URL, DATA))

-- DEMO_DEBUG_PORT: a loopback route reporting the CRM adapter's API call counts, so a
-- scenario can prove a handler was not called again (scenario 08)
if os.getenv("DEMO_DEBUG_PORT") then
  local dbg = assert(nimbus.http.serve{ port = math.tointeger(env_num("DEMO_DEBUG_PORT", 0)), routes = {
    ["GET /calls"] = function() return 200, crm_adapter.calls end,
  } })
  nimbus.log.info(("CrmErpDemo: debug routes on http://127.0.0.1:%d"):format(dbg.port))
end

if os.getenv("DEMO_QUIET") ~= "1" then
  require("narration").play{ crm_url = CRM_URL, erp_url = ERP_URL, store = store }
end

return { crm = crm, erp = erp }

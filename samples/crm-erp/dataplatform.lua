-- The DataPlatform adapter of the CrmErpDemo sample (docs/crm-erp-demo.md section 3.3): endpoint
-- `DataPlatformEndpoint`, a terminal sink that only logs.
--
--   require("dataplatform").setup{ delay = 10 }   -- seconds ErpCustomerCreated waits (0 in tests)
--
-- One session at a time (concurrency 1), so with the 10 s delay the endpoint handles
-- about one ErpCustomerCreated every 10 s. contracts.validation runs first: a
-- crm.contact.enriched.v1 without contactId or industry is dead-lettered.
local nimbus = require("nimbus")
local contracts = require("contracts")

local M = {}

function M.setup(conf)
  conf = conf or {}
  local delay = conf.delay
  if delay == nil then delay = 10 end
  local ep = nimbus.endpoint("DataPlatformEndpoint", { concurrency = 1 })
  ep:use(contracts.validation)

  ep:on("ErpCustomerCreated", function(e, ctx)
    if delay > 0 then nimbus.sleep(delay) end
    nimbus.log.info("DataPlatform received ErpCustomerCreated",
                    { accountId = e.AccountId, erpCustomerId = e.ErpCustomerId, customerNumber = e.CustomerNumber,
                      legalName = e.LegalName, session = ctx.session_id })
  end)

  ep:on("crm.contact.enriched.v1", function(e, ctx)
    nimbus.log.info("DataPlatform received enriched contact",
                    { contactId = e.contactId, industry = e.industry, leadScore = e.leadScore,
                      rationale = e.rationale, session = ctx.session_id })
  end)

  M.endpoint = ep
  return ep
end

return M

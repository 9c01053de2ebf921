-- The AgentZone of the CrmErpDemo sample (docs/crm-erp-demo.md sections 3.3 and 5, scenario 07):
-- endpoint `AgentZoneEndpoint` parks every CrmContactCreated as Pending+Handoff, and the
-- status checker "enrichment" plays the EnrichmentAgent: it classifies each parked contact
-- with the deterministic classifier, publishes crm.contact.enriched.v1 on the contact's
-- session and then completes the hand-off (which unblocks the session).
--
--   require("agentzone").setup{ every = 1 }     -- seconds between checker runs
--   require("agentzone").classify(payload)      -- { contactId, industry, leadScore, rationale }
local nimbus = require("nimbus")
local cjson = require("cjson")
local contracts = require("contracts")

local M = {}

M.ENRICHED = "crm.contact.enriched.v1"

-- Ordered: the first keyword found wins (DeterministicContactClassifier).
M.INDUSTRIES = {
  { "Technology", { "tech", "software", "dev", "cloud" } },
  { "Financial Services", { "finance", "bank", "capital", "invest" } },
  { "Healthcare", { "health", "medical", "pharma", "clinic" } },
  { "Retail", { "retail", "shop", "store" } },
  { "Logistics", { "logistics", "transport", "shipping" } },
  { "Education", { "edu", "university", "school" } },
  { "Media & Entertainment", { "media", "news", "studio" } },
}
M.DEFAULT_INDUSTRY = "General Business"

local function str(v)
  if v == nil or v == cjson.null then return "" end
  return tostring(v)
end

-- 32-bit unsigned rolling hash h = h * 31 + byte over the id, then mod 101 (0..100).
function M.lead_score(id)
  local h = 0
  for i = 1, #id do h = (h * 31 + id:byte(i)) & 0xffffffff end
  return h % 101
end

function M.industry_of(text)
  text = text:lower()
  for _, entry in ipairs(M.INDUSTRIES) do
    for _, kw in ipairs(entry[2]) do
      if text:find(kw, 1, true) then return entry[1] end
    end
  end
  return M.DEFAULT_INDUSTRY
end

-- classify(CrmContactCreated payload) -> { contactId, industry, leadScore, rationale }.
-- PascalCase fields (the contract) with camelCase accepted too; `id` overrides the
-- contact id (the hand-off's session when the payload has none).
function M.classify(p, id)
  p = type(p) == "table" and p or {}
  local contact_id = str(p.ContactId) ~= "" and str(p.ContactId) or str(p.contactId)
  if contact_id == "" then contact_id = str(id) end
  local text = table.concat({ str(p.Email or p.email), str(p.FirstName or p.firstName),
                              str(p.LastName or p.lastName) }, " ")
  return { contactId = contact_id, industry = M.industry_of(text), leadScore = M.lead_score(contact_id),
           rationale = ("Deterministic classification for contact %s."):format(contact_id) }
end

function M.setup(conf)
  conf = conf or {}
  local every = conf.every or 1
  local ep = nimbus.endpoint("AgentZoneEndpoint", conf.concurrency and { concurrency = conf.concurrency } or nil)
  ep:use(contracts.validation)

  -- AgentZoneParkHandler: no job id, no expectedBy; the agent settles it.
  ep:on("CrmContactCreated", function(_, ctx)
    ctx:mark_pending_handoff{ reason = "Awaiting agent pickup" }
  end)

  -- The EnrichmentAgent: one pass over the parked contacts.
  ep:checker("enrichment", { every = every }, function(chk)
    for _, h in ipairs(chk:pending_handoffs()) do
      if h.event_type == nil or h.event_type == "CrmContactCreated" then
        if type(h.payload) ~= "table" then
          chk:fail(h, "EnrichmentAgent: the hand-off's payload is not a CrmContactCreated object", "EnrichmentError")
        else
          local enriched = M.classify(h.payload, h.session_id)
          nimbus.publish(M.ENRICHED, enriched, { session = h.session_id })
          local ok, err = chk:complete(h, { industry = enriched.industry })
          if ok then
            nimbus.log.info("contact enriched", { contactId = enriched.contactId, industry = enriched.industry,
                                                  leadScore = enriched.leadScore, session = h.session_id })
          else
            nimbus.log.warn("enrichment hand-off not completed", { event = h.event_id, reason = err })
          end
        end
      end
    end
  end)

  M.endpoint = ep
  return ep
end

return M

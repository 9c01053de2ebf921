-- Lifecycle hooks (docs/observability.md): tell a team chat when an event fails, is
-- dead-lettered, blocks its session or when a hand-off is overdue. The "chat" here is a
-- local route this same adapter serves, so the sample runs anywhere; point CHAT_URL at
-- your chat's incoming-webhook URL (Slack, Teams, Mattermost take a JSON `text`) instead.
--
--   nimbus-host samples/chat-alerts/adapter.lua
--   nimbus-host publish PaymentCaptured '{"order_id":"A-1","amount":-5}' --session A-1
--   -> the host log shows the chat line "[chat] PaymentService: event ... failed: ..."
local nimbus = require("nimbus")

local CHAT_PORT = tonumber(os.getenv("CHAT_PORT") or "") or 0   -- 0: any free port
local chat_url = os.getenv("CHAT_URL")

if not chat_url then
  local srv = assert(nimbus.http.serve{ host = "127.0.0.1", port = CHAT_PORT, routes = {
    ["POST /chat"] = function(req)
      local msg = req:json()
      nimbus.log.warn("[chat] " .. tostring(msg and msg.text), { channel = "#integrations" })
      return 200, { ok = true }
    end,
  } })
  chat_url = ("http://127.0.0.1:%d/chat"):format(srv.port)
  nimbus.log.info("chat stand-in listening", { url = chat_url })
end

-- A hook runs after the outcome is recorded, as a task of its own: it may wait on HTTP.
-- If it fails, the host logs and counts it (nimbus_hook_runs_total); the event's outcome
-- stands either way.
local function say(text)
  local res, err = nimbus.http.request{ method = "POST", url = chat_url, json = { text = text }, timeout = 5 }
  if not res then error("chat webhook: " .. tostring(err)) end
  if res.status >= 300 then error("chat webhook answered " .. res.status) end
end

nimbus.on("event_failed", function(info)
  say(("%s: event %s (%s, session %s) failed: %s"):format(info.endpoint, info.event_id, info.event_type,
                                                          info.session_id, info.error or "?"))
end)

nimbus.on("session_blocked", function(info)
  say(("%s: session %s is blocked by %s; resubmit or skip it: nimbus-host show %s"):format(
    info.endpoint, info.session_id, info.blocked_by, info.blocked_by))
end)

nimbus.on("dead_lettered", function(info)
  say(("%s: event %s was dead-lettered: %s"):format(info.endpoint, info.event_id, info.error or "?"))
end)

nimbus.on("handoff_overdue", function(info)
  say(("%s: hand-off %s of event %s is overdue"):format(info.endpoint, info.external_job_id or "?",
                                                        info.event_id))
end)

-- The endpoint whose failures the hooks report: a negative amount is refused.
local payments = nimbus.endpoint("PaymentService", { retry = { max_retries = 0 } })
payments:on("PaymentCaptured", function(p, ctx)
  if type(p.amount) ~= "number" or p.amount <= 0 then
    error(("amount must be a positive number, got %s"):format(tostring(p.amount)))
  end
  nimbus.log.info("payment booked", { order = p.order_id, amount = p.amount })
end)

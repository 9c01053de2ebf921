-- A small sample adapter: an order endpoint that shows the three outcomes an
-- integration meets every day. Run it with `make demo`, or by hand:
--   nimbus-host samples/hello/adapter.lua
local nimbus = require("nimbus")

local orders = nimbus.endpoint("OrderService", {
  concurrency = 50,
  -- retry twice, 0.2 s then 0.4 s, before blocking the session for an operator
  retry = { max_retries = 2, strategy = "exponential", base = 0.2 },
})

-- middleware: every handler sees validated input
orders:use(function(event, ctx, next)
  if type(event.order_id) ~= "string" then
    error(nimbus.permanent("order_id is required"), 0)
  end
  return next()
end)

orders:on("OrderPlaced", function(order, ctx)
  if order.sku == "BROKEN" then
    error("warehouse rejected sku " .. order.sku)
  end
  if order.total and order.total > 1000 then
    -- a human approves big orders, hours later: park the session until then
    ctx:mark_pending_handoff{ reason = "Awaiting manager approval",
                              external_job_id = "APPROVAL-" .. order.order_id, expected_by = 3600 }
    return
  end
  nimbus.log.info("order accepted", { order = order.order_id, customer = ctx.session_id })
  nimbus.publish("OrderAccepted", { order_id = order.order_id }, { session = ctx.session_id })
end)

local shipping = nimbus.endpoint("ShippingService")
shipping:on("OrderAccepted", function(ev, ctx)
  nimbus.log.info("shipping label printed", { order = ev.order_id, customer = ctx.session_id })
end)

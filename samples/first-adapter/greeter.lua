local nimbus = require("nimbus")

local crm = nimbus.endpoint("Greeter")

crm:on("CustomerSignedUp", function(customer, ctx)
  if not customer.email then
    error("customer " .. tostring(customer.name) .. " has no email")
  end
  nimbus.log.info("welcome mail sent", { to = customer.email, session = ctx.session_id })
end)

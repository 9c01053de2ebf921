-- The narrated run `make demo` plays (skipped with DEMO_QUIET=1): an account round trip,
-- an error-mode failure and its resubmit, and a hand-off that a status checker settles.
-- It drives the demo the way a person would: over the fake APIs' REST routes and the
-- nimbus-host CLI (run through io.popen: a demo may block the loop for a few ms).
local nimbus = require("nimbus")
local cjson = require("cjson.safe")

local M = {}

local function say(fmt, ...) io.stdout:write("\n\27[1m== ", fmt:format(...), "\27[0m\n") io.stdout:flush() end
local function line(fmt, ...) io.stdout:write("   ", fmt:format(...), "\n") io.stdout:flush() end

local function self_exe()
  local p = io.popen("readlink /proc/" .. (io.open("/proc/self/stat"):read("n") or "self") .. "/exe")
  local exe = p and p:read("l")
  if p then p:close() end
  return exe or "nimbus-host"
end

local function call(method, url, body)
  local res, err = nimbus.http.request{ method = method, url = url, json = body, timeout = 5 }
  if not res then return nil, err end
  return res.status, res:json()
end

-- polls fn every 0.2 s until it returns a value or `secs` pass
local function wait(secs, fn)
  local deadline = nimbus.now() + secs
  repeat
    local v = fn()
    if v then return v end
    nimbus.sleep(0.2)
  until nimbus.now() > deadline
  return nil
end

function M.play(o)
  local exe, store = self_exe(), o.store
  local function cli(args)
    local p = io.popen(("%q %s --store %q 2>&1"):format(exe, args, store))
    local out = p:read("a")
    p:close()
    return out
  end
  local function events(filter)
    local rows = {}
    for l in cli("events --json " .. filter):gmatch("[^\n]+") do rows[#rows + 1] = cjson.decode(l) end
    return rows
  end
  nimbus.spawn(function()
    nimbus.sleep(0.5)
    say("CrmErpDemo running: CRM API %s, ERP API %s", o.crm_url, o.erp_url)

    say("1. an account created in the CRM reaches the ERP and is linked back")
    local _, acc = call("POST", o.crm_url .. "/api/accounts", { legalName = "Acme Robotics", countryCode = "US" })
    line("POST %s/api/accounts -> account %s", o.crm_url, acc and acc.id or "?")
    local cust = acc and wait(20, function()
      local st, c = call("GET", o.erp_url .. "/api/customers/by-crm/" .. acc.id)
      return st == 200 and c
    end)
    local linked = cust and wait(20, function()
      local _, a = call("GET", o.crm_url .. "/api/accounts/" .. acc.id)
      return a and a.erpCustomerId ~= nil and a.erpCustomerId ~= cjson.null and a
    end)
    line("ERP customer %s (%s); CRM account linked to it: %s", cust and cust.id or "?",
         cust and cust.customerNumber or "?", linked and "yes" or "no")

    say("2. error mode: the ERP handler fails, the session blocks; the operator resubmits")
    call("PUT", o.erp_url .. "/api/admin/error-mode", { enabled = true })
    local _, bad = call("POST", o.crm_url .. "/api/accounts", { legalName = "BadFlow Inc", countryCode = "GB" })
    local failed = bad and wait(20, function()
      return events("--endpoint ErpEndpoint --status failed --session " .. bad.id)[1]
    end)
    line("ErpEndpoint event %s is Failed: %s", failed and failed.event_id or "?", failed and failed.error_text or "?")
    call("PUT", o.erp_url .. "/api/admin/error-mode", { enabled = false })
    if failed then
      line("$ nimbus-host resubmit %s", failed.event_id)
      line("%s", (cli("resubmit " .. failed.event_id):gsub("\n$", "")))
      local ok = wait(20, function()
        local st = call("GET", o.erp_url .. "/api/customers/by-crm/" .. bad.id)
        return st == 200
      end)
      line("after the resubmit the ERP customer exists: %s", ok and "yes" or "no")
    end

    say("3. hand-off mode: the import finishes elsewhere; a status checker settles it")
    call("PUT", o.erp_url .. "/api/admin/handoff-mode", { enabled = true, durationSeconds = 3, failureRate = 0 })
    local _, ho = call("POST", o.crm_url .. "/api/accounts", { legalName = "Handoff Co", countryCode = "US" })
    local pending = ho and wait(20, function()
      return events("--endpoint ErpEndpoint --status pending --session " .. ho.id)[1]
    end)
    line("ErpEndpoint event is Pending+Handoff: %s (job %s)", pending and pending.handoff_reason or "?",
         pending and pending.external_job_id or "?")
    local settled = ho and wait(30, function()
      local st = call("GET", o.erp_url .. "/api/customers/by-crm/" .. ho.id)
      return st == 200
    end)
    line("the DMF job settled and the customer was imported: %s", settled and "yes" or "no")
    call("PUT", o.erp_url .. "/api/admin/handoff-mode", { enabled = false, durationSeconds = 10, failureRate = 0 })

    say("the demo keeps running (Ctrl-C stops it). Try:")
    line("curl -s -X POST %s/api/accounts -H 'content-type: application/json' -d '{\"legalName\":\"Initech\",\"countryCode\":\"US\"}'", o.crm_url)
    line("curl -s %s/api/customers", o.erp_url)
    line("curl -s -X PUT %s/api/admin/error-mode -H 'content-type: application/json' -d '{\"enabled\":true}'", o.erp_url)
    line("%s events --store %s", exe, store)
    if os.getenv("DEMO_EXIT") == "1" then
      local pid = io.open("/proc/self/stat"):read("n")
      os.execute("kill -TERM " .. pid)
    end
  end)
end

return M

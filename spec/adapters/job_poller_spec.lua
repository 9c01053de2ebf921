-- adapters/job_poller.lua under nimbus.testing: job states (done, failed, running,
-- unknown), field paths, 404 and other odd answers, the per-job backoff and Retry-After,
-- status URLs, and bad options reported at the caller's line. The job API is
-- nimbus.testing's fake HTTP; hand-offs are the rows app:run_checker is given.
local testing = require("nimbus.testing")

local NOW = 1764680000
local JOBS = "http://jobs.test/api/jobs/"
local SPEC = "job_poller_spec%.lua"

-- An adapter with endpoint "Ep" and poller.attach(ep, opts) (checker "job-poller").
local function load(opts, http)
  return testing.load(function()
    local nimbus = require("nimbus")
    local poller = require("adapters.job_poller")
    poller.attach(nimbus.endpoint("Ep"), opts)
  end, { now = NOW, http = http })
end

local function handoff(n, job)
  return { event_id = "e" .. n, session_id = "s" .. n, message_id = "m" .. n, event_type = "ImportRequested",
           reason = "Awaiting import", external_job_id = job or (JOBS .. n) }
end

local function run(app, pending)
  return app:run_checker("Ep", "job-poller", { pending = pending or { handoff(1) } })
end

local function always(res) return function() return res end end

local function warns(r, pattern)
  local n = 0
  for _, l in ipairs(r.logs) do
    if l.level == "warn" and (pattern == nil or l.message:find(pattern)) then n = n + 1 end
  end
  return n
end

local function assert_untouched(r)
  assert.same({}, r.completed)
  assert.same({}, r.failed)
  assert.is_nil(r.error, r.error)
end

describe("adapters.job_poller", function()
  describe("job states", function()
    it("GETs the hand-off's external job id and completes it on a done state, with the body as result", function()
      local app = load({}, { ["GET " .. JOBS .. "1"] = { json = { status = "Succeeded", rows = 12 } } })
      local r = run(app)
      assert.equal(1, #r.http)
      assert.equal("GET", r.http[1].method)
      assert.equal("application/json", r.http[1].headers.Accept)
      assert.equal(1, #r.completed)
      assert.equal("e1", r.completed[1].event_id)
      assert.same({ status = "Succeeded", rows = 12 }, r.completed[1].result)
      assert.same({}, r.failed)
    end)

    it("fails it on a failed state with the job's error text and the error type", function()
      local app = load({ error_type = "ImportFailed" },
                       always({ json = { status = "Failed", error = { code = "E7", message = "row 3: bad SKU" } } }))
      local r = run(app)
      assert.same({}, r.completed)
      assert.equal(1, #r.failed)
      assert.equal("job " .. JOBS .. "1 ended Failed: row 3: bad SKU", r.failed[1].text)
      assert.equal("ImportFailed", r.failed[1].type)
    end)

    it("keeps waiting on a running state, quietly", function()
      local r = run(load({}, always({ json = { status = "Running" } })))
      assert_untouched(r)
      assert.equal(0, warns(r))
    end)

    it("keeps waiting on an unknown state and says so, naming the job and the known states", function()
      local r = run(load({}, always({ json = { status = "Paused" } })))
      assert_untouched(r)
      assert.equal(1, warns(r, "unknown state"))
      local msg = r.logs[#r.logs].message
      assert.truthy(msg:find("state=Paused", 1, true), msg)
      assert.truthy(msg:find("job=" .. JOBS .. "1", 1, true), msg)
      assert.truthy(msg:find("Succeeded", 1, true), msg)
    end)

    it("reads dotted paths for the state, the result and the error", function()
      local app = load({ status_field = "job.state", result_field = "job.output", error_field = "job.problem.text",
                         done = { "Done" }, failed = { "Broken" } }, nil)
      app:set_http(always({ json = { job = { state = "Done", output = { id = "R-1" } } } }))
      assert.same({ id = "R-1" }, run(app).completed[1].result)
      app:set_http(always({ json = { job = { state = "Broken", problem = { text = "disk full" } } } }))
      assert.equal("job " .. JOBS .. "1 ended Broken: disk full", run(app).failed[1].text)
    end)

    it("takes functions for the state, the result and the error", function()
      local app = load({ status_field = function(body) return body.finished and "Succeeded" or "Running" end,
                         result_field = function(body, res, h) return { n = body.n, ev = h.event_id, st = res.status } end },
                       always({ json = { finished = true, n = 3 } }))
      assert.same({ n = 3, ev = "e1", st = 200 }, run(app).completed[1].result)
    end)

    it("compares states without case", function()
      local app = load({}, always({ json = { status = "SUCCEEDED" } }))
      assert.equal(1, #run(app).completed)
      app:set_http(always({ json = { status = "cancelled" } }))
      assert.equal("job " .. JOBS .. "1 ended cancelled", run(app).failed[1].text)
    end)

    it("settles several hand-offs in one run, each from its own job", function()
      local app = load({}, function(req)
        local n = tonumber(req.url:match("(%d+)$"))
        return { json = { status = ({ "Succeeded", "Running", "Failed" })[n] } }
      end)
      local r = run(app, { handoff(1), handoff(2), handoff(3) })
      assert.equal(3, #r.http)
      assert.equal("e1", r.completed[1].event_id)
      assert.equal("e3", r.failed[1].event_id)
      assert.equal(1, #r.completed)
      assert.equal(1, #r.failed)
    end)

    it("treats 303 See Other as done, with the absolute Location as result", function()
      local r = run(load({}, always({ status = 303, headers = { Location = "/api/results/77" } })))
      assert.same({ location = "http://jobs.test/api/results/77" }, r.completed[1].result)
    end)
  end)

  describe("unexpected answers", function()
    it("404 fails the event with the URL and the status", function()
      local r = run(load({}, always(404)))
      assert.equal(1, #r.failed)
      assert.equal("ExternalJobNotFound", r.failed[1].type)
      assert.truthy(r.failed[1].text:find("job status URL " .. JOBS .. "1 answered 404 Not Found", 1, true), r.failed[1].text)
      assert.truthy(r.failed[1].text:find("resubmit", 1, true))
    end)

    it("410 too; not_found = \"wait\" keeps polling instead", function()
      assert.equal(1, #run(load({}, always(410))).failed)
      local r = run(load({ not_found = "wait" }, always(404)))
      assert_untouched(r)
      assert.equal(1, warns(r, "404 Not Found"))
    end)

    local odd = {
      { "a 500", { status = 500, body = "db down" }, "unexpected answer 500 Internal Server Error" },
      { "a 401", { status = 401 }, "unexpected answer 401 Unauthorized" },
      { "a body that is not JSON", { body = "<html>" }, "not a JSON object" },
      { "a JSON array", { json = { 1, 2 } }, "not a JSON object" },
      { "no state field", { json = { progress = 50 } }, "no state in its status field" },
    }
    for _, c in ipairs(odd) do
      it(c[1] .. " leaves the job pending and warns", function()
        local r = run(load({}, always(c[2])))
        assert_untouched(r)
        assert.equal(1, warns(r, c[3]))
      end)
    end

    it("no answer (time-out, refused) leaves the job pending and warns", function()
      local r = run(load({ timeout = 2 }, always({ json = { status = "Succeeded" }, delay = 60 })))
      assert_untouched(r)
      assert.equal(1, warns(r, "did not answer"))
      assert.equal(2, r.http[1].timeout)
      r = run(load({}, function() return nil, "connection refused", "ECONNREFUSED" end))
      assert.equal(1, warns(r, "code=ECONNREFUSED"))
    end)

    it("a hand-off settled meanwhile is logged, not an error", function()
      local app = testing.load(function()
        local nimbus = require("nimbus")
        local poller = require("adapters.job_poller")
        local ep = nimbus.endpoint("Ep")
        local inner = poller.checker({})
        ep:checker("c", { every = 1 }, function(chk)
          -- an operator settles it between the listing and the poll's settlement
          local listed = chk:pending_handoffs()
          chk:complete(listed[1], { by = "operator" })
          inner(setmetatable({ pending_handoffs = function() return listed end }, { __index = chk }))
        end)
      end, { now = NOW, http = always({ json = { status = "Succeeded" } }) })
      local r = app:run_checker("Ep", "c", { pending = { handoff(1) } })
      assert.is_nil(r.error, r.error)
      assert.equal(1, #r.completed)
      local found = false
      for _, l in ipairs(r.logs) do if l.message:find("settled elsewhere already") then found = true end end
      assert.is_true(found)
    end)

    it("one job whose check raises does not stop the others", function()
      local app = load({ status_field = function(body) if body.boom then error("bad field function") end return body.status end },
                       function(req)
                         if req.url:find("1$") then return { json = { boom = true } } end
                         return { json = { status = "Succeeded" } }
                       end)
      local r = run(app, { handoff(1), handoff(2) })
      assert.is_nil(r.error)
      assert.equal("e2", r.completed[1].event_id)
      assert.equal(1, warns(r, "bad field function"))
    end)
  end)

  describe("backoff", function()
    it("polls each job at most once per backoff step, doubling up to the cap", function()
      local app = load({ backoff = { base = 1, factor = 2, max = 4 } }, always({ json = { status = "Running" } }))
      local polled = {}
      for t = 0, 16 do
        app.clock = NOW + t
        if #run(app).http > 0 then polled[#polled + 1] = t end
      end
      assert.same({ 0, 1, 3, 7, 11, 15 }, polled)
    end)

    it("keeps a separate backoff per job; a new hand-off is polled at once", function()
      local app = load({ backoff = { base = 10, max = 10 } }, always({ json = { status = "Running" } }))
      assert.equal(1, #run(app, { handoff(1) }).http)
      app:advance(1)
      local r = run(app, { handoff(1), handoff(2) })
      assert.equal(1, #r.http)
      assert.equal(JOBS .. "2", r.http[1].url)
      app:advance(9)
      assert.equal(1, #run(app, { handoff(1), handoff(2) }).http)
    end)

    it("backs off after odd answers too, and honours a longer Retry-After", function()
      local app = load({ backoff = { base = 1, max = 60 } }, always({ status = 503, headers = { ["Retry-After"] = "30" } }))
      assert.equal(1, #run(app).http)
      app:advance(29)
      assert.equal(0, #run(app).http)
      app:advance(1)
      assert.equal(1, #run(app).http)
    end)

    it("forgets a settled job: the same event handed off again is polled at once", function()
      local app = load({ backoff = { base = 60 } }, nil)
      app:set_http(always({ json = { status = "Running" } }))
      assert.equal(1, #run(app).http)
      app:set_http(always({ json = { status = "Succeeded" } }))
      assert.equal(0, #run(app).http)
      run(app, {})                          -- settled elsewhere: no longer pending
      assert.equal(1, #run(app).completed)  -- handed off again (resubmitted): polled now
    end)
  end)

  describe("status URLs", function()
    it("a job id that is not a URL is left to the operator, with one warning", function()
      local app = load({}, always({ json = { status = "Succeeded" } }))
      local r = run(app, { handoff(1, "DMF-42") })
      assert.equal(0, #r.http)
      assert.equal(1, warns(r, "no status URL"))
      assert.truthy(r.logs[1].message:find('"DMF%-42" is not an http%(s%) URL'), r.logs[1].message)
      app:advance(3600)
      r = run(app, { handoff(1, "DMF-42") })
      assert.equal(0, warns(r))
    end)

    it("url = function(h) builds it, and headers are sent", function()
      local app = load({ url = function(h) return "http://dmf.test/jobs/" .. h.external_job_id end,
                         headers = function(h) return { ["X-Event"] = h.event_id } end },
                       always({ json = { status = "Completed" } }))
      local r = run(app, { handoff(1, "DMF-42") })
      assert.equal("http://dmf.test/jobs/DMF-42", r.http[1].url)
      assert.equal("e1", r.http[1].headers["X-Event"])
      assert.equal(1, #r.completed)
    end)

    it("a url function that returns junk is reported", function()
      local r = run(load({ url = function() return "not a url" end }, always(200)))
      assert.equal(1, warns(r, 'the url function returned "not a url"'))
    end)

    it("a url function that raises is reported and backs off; the other jobs are polled", function()
      local app = load({ url = function(h)
        if h.event_id == "e1" then error("no mapping for " .. h.external_job_id) end
        return h.external_job_id
      end, backoff = { base = 5, max = 5 } }, always({ json = { status = "Succeeded" } }))
      local r = run(app, { handoff(1), handoff(2) })
      assert.is_nil(r.error, r.error)
      assert.equal(1, warns(r, "checking a job failed"))
      assert.equal(1, warns(r, "no mapping for"))
      assert.equal("e2", r.completed[1].event_id)
      app:advance(4)
      assert.equal(0, warns(run(app, { handoff(1) })), "not again before its backoff")
      app:advance(1)
      assert.equal(1, warns(run(app, { handoff(1) }), "no mapping for"))
    end)
  end)

  describe("ep:checker(name, opts, poller.checker{...})", function()
    it("runs as the function of a checker declared by hand", function()
      local app = testing.load(function()
        local nimbus = require("nimbus")
        local poller = require("adapters.job_poller")
        nimbus.endpoint("Ep"):checker("imports", { every = 5 }, poller.checker{ status_field = "state" })
      end, { now = NOW, http = always({ json = { state = "Succeeded" } }) })
      local r = app:run_checker("Ep", "imports", { pending = { handoff(1) } })
      assert.equal(1, #r.completed)
    end)

    it("attach takes name, every and run_timeout", function()
      local app = testing.load(function()
        local nimbus = require("nimbus")
        require("adapters.job_poller").attach(nimbus.endpoint("Ep"), { name = "jobs", every = 7, run_timeout = 30 })
      end, { now = NOW })
      local entry = app.endpoints.Ep.checkers.jobs
      assert.equal(7, entry.every)
      assert.equal(30, app._everies[1].timeout)
    end)
  end)

  describe("bad options are raised at the caller's line", function()
    local function raised(fn)
      local r
      testing.load(function()
        r = table.pack(pcall(fn, require("adapters.job_poller"), require("nimbus")))
      end, { now = NOW })
      assert.is_false(r[1], "expected an error")
      return tostring(r[2]), debug.getinfo(fn, "S").linedefined
    end

    local cases = {
      { "not a table", "x", "job_poller%.checker expects a table" },
      { "a misspelled option", { status_feild = "s" }, "unknown option status_feild %(options: .*status_field" },
      { "a wrong type", { done = "Succeeded" }, "option done must be a table, got string" },
      { "a list that is a map", { done = { a = "x" } }, "done must be a list of states" },
      { "an empty state", { failed = { "" } }, "failed%[1%] must be a non%-empty string" },
      { "a state both done and failed", { done = { "End" }, failed = { "end" } }, 'state "End" is both done and failed' },
      { "a backoff option", { backoff = { start = 1 } }, "unknown backoff option start" },
      { "backoff.base", { backoff = { base = 0 } }, "backoff%.base must be > 0" },
      { "backoff.max", { backoff = { base = 5, max = 1 } }, "backoff%.max must be >= backoff%.base" },
      { "not_found", { not_found = "ignore" }, 'not_found must be "fail" or "wait"' },
      { "timeout", { timeout = 0 }, "timeout must be > 0" },
      { "an empty field path", { status_field = "" }, "status_field must be a dotted path" },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local err, line = raised(function(poller) poller.checker(c[2]) end)
        assert.truthy(err:find(c[3]), err)
        assert.truthy(err:find(SPEC .. ":" .. line .. ": job_poller%.checker"), "not at the caller's line " .. line .. ": " .. err)
      end)
    end

    it("attach: not an endpoint, every, an attach-only option given to checker, a duplicate name", function()
      local function check(fn, pattern, offset)
        local err, line = raised(fn)
        assert.truthy(err:find(pattern), err)
        assert.truthy(err:find(SPEC .. ":" .. (line + (offset or 0)) .. ": job_poller%."), err)
      end
      check(function(poller) poller.attach("Ep", {}) end, "the first argument must be an endpoint")
      check(function(poller, nimbus) poller.attach(nimbus.endpoint("Ep"), { every = 0 }) end, "every must be > 0")
      check(function(poller) poller.checker{ every = 1 } end, "unknown option every")
      check(function(poller, nimbus)
        local ep = nimbus.endpoint("Ep")
        poller.attach(ep, {})
        poller.attach(ep, {})
      end, 'already has a checker "job%-poller"', 3)
    end)
  end)
  describe("error_text", function()
    it("words a failed job and a 404 in the adapter's own text and type", function()
      local seen = {}
      local app = load({ error_text = function(f)
        seen[#seen + 1] = f
        if f.kind == "not_found" then return "no such job " .. f.h.external_job_id, "Gone" end
        return "import " .. f.state .. ": " .. f.body.why
      end }, {
        ["GET " .. JOBS .. "1"] = { json = { status = "Failed", why = "bad row 7" } },
        ["GET " .. JOBS .. "2"] = { status = 404, body = "" },
      })
      local r = run(app, { handoff(1), handoff(2) })
      assert.equal(2, #r.failed)
      assert.same({ "import Failed: bad row 7", "ExternalJobFailed" }, { r.failed[1].text, r.failed[1].type })
      assert.same({ "no such job " .. JOBS .. "2", "Gone" }, { r.failed[2].text, r.failed[2].type })
      assert.matches("^job " .. JOBS:gsub("%p", "%%%0") .. "1 ended Failed", seen[1].text)
      assert.equal(JOBS .. "1", seen[1].url)
      assert.equal("ExternalJobNotFound", seen[2].type)
    end)

    it("logs and keeps polling when error_text returns no text", function()
      local app = load({ error_text = function() return nil end },
                       { ["GET " .. JOBS .. "1"] = { json = { status = "Failed" } } })
      local r = run(app)
      assert_untouched(r)
      assert.equal(1, warns(r, "checking a job failed"))
    end)

    it("refuses an error_text that is not a function at the caller's line", function()
      local ok, err = pcall(load, { error_text = "oops" })
      assert.is_false(ok)
      assert.matches("option error_text must be a function, got string", err)
    end)
  end)
end)

---@meta nimbus.testing
-- LuaLS definitions of nimbus.testing (lua/nimbus/testing.lua, whose header is the full
-- reference): an adapter's handlers under busted, without a broker or a store.
--
--   local testing = require("nimbus.testing")
--   local app = testing.load("greeter.lua", { now = 1764680000 })
--   local out = app:send("Greeter", "CustomerSignedUp", { name = "Ada" }, { session_id = "ada" })
--   testing.assert_completed(out)

---@class nimbus.testing
---@field max_waits integer a task is stopped after this many waits (default 1000)
local testing = {}

---@class nimbus.testing.FakeRequest
---@field method string
---@field url string
---@field headers table<string, string>
---@field body? string
---@field json? any the body, decoded
---@field timeout? number

---@class nimbus.testing.FakeResponse
---@field status? integer default 200
---@field headers? table<string, string>
---@field body? string
---@field json? any
---@field delay? number seconds on the fake clock (>= the request's timeout: ETIMEDOUT)

---@alias nimbus.testing.Responder nimbus.testing.FakeResponse|integer|fun(req: nimbus.testing.FakeRequest): (nimbus.testing.FakeResponse|integer|nil), string?, string?
---@alias nimbus.testing.Http fun(req: nimbus.testing.FakeRequest): (nimbus.testing.FakeResponse|integer|nil), string?, string?|table<string, nimbus.testing.Responder>

---@class nimbus.testing.LoadOptions
---@field http? nimbus.testing.Http "METHOD URL" = response, or one function
---@field now? number the fake clock's start, seconds

---@class nimbus.testing.Published
---@field type string
---@field payload table
---@field body string
---@field message_id string
---@field opts { session: string?, correlation_id: string?, to: string?, message_id: string? } message_id: the one given to nimbus.publish

---@class nimbus.testing.Log
---@field level "debug"|"info"|"warn"|"error"
---@field message string

---@class nimbus.testing.Outcome
---@field status "completed"|"failed"|"deadletter"|"transient"|"unsupported"|"handoff"
---@field error_text? string
---@field error_type? string
---@field retry_after? number transient: the seconds nimbus.transient(msg, { retry_after = s }) asked for
---@field error_stack? string
---@field handoff? { reason: string, external_job_id: string?, expected_by: number? }
---@field reply? any what an ep:reply handler returned
---@field published nimbus.testing.Published[] only when it completed or handed off
---@field discarded nimbus.testing.Published[] a failed handler's publishes
---@field http nimbus.testing.FakeRequest[]
---@field slept number
---@field sleeps number[]
---@field logs nimbus.testing.Log[]
---@field ctx nimbus.Ctx
---@field spawn_errors string[]
---@field stopped string[]
---@field settled { completed: table[], failed: table[] }

---@class nimbus.testing.Run
---@field completed? { h: nimbus.Handoff, result: any }[]
---@field failed? { h: nimbus.Handoff, text: string, type: string? }[]
---@field published nimbus.testing.Published[]
---@field http nimbus.testing.FakeRequest[]
---@field logs nimbus.testing.Log[]
---@field slept number
---@field error? string the run raised
---@field error_stack? string

---@class nimbus.testing.ServedResponse
---@field status integer
---@field headers table<string, string>
---@field body string
---@field json? any
---@field error? string what the host would log
---@field published nimbus.testing.Published[]
---@field logs nimbus.testing.Log[]

---@class nimbus.testing.App
---@field nimbus nimbus the adapter's own nimbus
---@field endpoints table<string, nimbus.Endpoint> declared endpoints by name
---@field startup nimbus.testing.Run what the main chunk did
---@field clock number the fake clock, seconds
---@field hooks table<string, integer> nimbus.on functions per hook
local App = {}

-- Runs the endpoint's handler of the type as the host would; payload: a table (sent as
-- JSON) or a string (sent as is).
---@param endpoint string
---@param event_type string
---@param payload table|string
---@param ctx? table context fields (session_id, event_id, retry_count, kind, ...)
---@return nimbus.testing.Outcome
function App:send(endpoint, event_type, payload, ctx) end

-- Runs a status checker once over the given pending hand-offs.
---@param endpoint string
---@param name string
---@param opts? { pending: nimbus.Handoff[] }
---@return nimbus.testing.Run
function App:run_checker(endpoint, name, opts) end

-- Runs a nimbus.every function once (its `name` option, else "nimbus.every at FILE:LINE").
---@param name string
---@return nimbus.testing.Run
function App:run_every(name) end

-- Calls a route of the adapter's nimbus.http.serve server (no socket).
---@param method string
---@param target string "/path?query"
---@param opts? { headers: table<string, string>?, body: string?, json: any?, port: integer? }
---@return nimbus.testing.ServedResponse
function App:serve_request(method, target, opts) end

---@param conf? nimbus.testing.Http
function App:set_http(conf) end

-- Moves the fake clock; returns it.
---@param seconds number
---@return number
function App:advance(seconds) end

-- Loads the adapter (a path, or a function that is the adapter) into a fresh nimbus.
---@param adapter string|function
---@param opts? nimbus.testing.LoadOptions
---@return nimbus.testing.App
function testing.load(adapter, opts) end

---@param out nimbus.testing.Outcome
---@return nimbus.testing.Outcome
function testing.assert_completed(out) end

---@param out nimbus.testing.Outcome
---@param pattern? string a Lua pattern the error text must match
---@return nimbus.testing.Outcome
function testing.assert_failed(out, pattern) end

---@param out nimbus.testing.Outcome
---@param pattern? string
---@return nimbus.testing.Outcome
function testing.assert_dead_lettered(out, pattern) end

---@param out nimbus.testing.Outcome
---@param pattern? string
---@return nimbus.testing.Outcome
function testing.assert_transient(out, pattern) end

---@param out nimbus.testing.Outcome
---@return nimbus.testing.Outcome
function testing.assert_unsupported(out) end

---@param out nimbus.testing.Outcome
---@param fields? { reason: string?, external_job_id: string?, expected_by: number? }
---@return nimbus.testing.Outcome
function testing.assert_handoff(out, fields) end

-- An outcome as readable text (what the assertions print).
---@param out nimbus.testing.Outcome
---@return string
function testing.describe(out) end

return testing

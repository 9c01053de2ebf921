---@meta nimbus
-- LuaLS definitions of `require("nimbus")`, the API adapters are written against
-- (lua/nimbus/init.lua is the implementation; docs/design.md section 4 the contract).
-- Editors find them through a .luarc.json whose workspace.library names this directory,
-- as `nimbus-host new NAME` writes it:
--
--   { "runtime.version": "Lua 5.4", "workspace.library": ["/usr/local/share/nimbus-host/lua/types"] }
--
-- and then, in an adapter, completion and checks work on everything below:
--
--   local nimbus = require("nimbus")
--   local ep = nimbus.endpoint("Greeter", { retry = { max_retries = 3 } })
--   ep:on("CustomerSignedUp", function(customer, ctx)
--     nimbus.log.info("hello", { name = customer.name, session = ctx.session_id })
--   end)
--
-- spec/host/types_spec.lua fails when a public function of the runtime has no definition
-- here, or a definition names a function the runtime does not have.

---@alias nimbus.JsonObject table<string, any>

---@class nimbus
---@field _VERSION string the host's version
local nimbus = {}

---------------------------------------------------------------------------- endpoints

---@class nimbus.LockOptions
---@field duration? number the session lock's length on the embedded transport, seconds (>= 0.1, default 30)
---@field renew_max? number how long the host keeps renewing a running handler's lock, seconds (default 300)

---@class nimbus.RetryPolicy
---@field max_retries? integer retries after the first failure (0..1000)
---@field strategy? "fixed"|"linear"|"exponential"
---@field base? number seconds: the first delay
---@field max_delay? number seconds: the longest delay
---@field jitter? "none"|"full"|"bounded"
---@field jitter_factor? number

---@class nimbus.RetryRule: nimbus.RetryPolicy
---@field match string matched in the error text (a plain substring)
---@field types? string[] event types the rule is limited to

---@class nimbus.RetryOptions: nimbus.RetryPolicy
---@field rules? nimbus.RetryRule[] the first rule whose `match` is in the error text wins
---@field types? table<string, nimbus.RetryPolicy> per event type

---@class nimbus.TransientOptions
---@field max_attempts? integer attempts of a nimbus.transient(...) error, the first included (default 20)
---@field base? number seconds (default 1)
---@field max_delay? number seconds (default 60)

---@class nimbus.EndpointOptions
---@field concurrency? integer sessions in flight at once (1..100000, default 100)
---@field partitions? integer RabbitMQ: spread the sessions over this many single-active-consumer queues (a power of two, 1..256, default 1)
---@field lock? nimbus.LockOptions
---@field retry? nimbus.RetryOptions failures: retried, then the session blocks
---@field transient? nimbus.TransientOptions nimbus.transient(...) errors: Pending+Retrying meanwhile
---@field inbox? boolean skip a MessageId the endpoint already handled (DuplicateDetected)
---@field timeout? number a handler's wall-clock deadline, seconds (default 60)
---@field cpu_budget? number a handler's CPU between two waits, seconds (default 1)

---@class nimbus.HandlerOptions
---@field is_alive? fun(ctx: nimbus.Ctx): boolean asked at every lock renewal; false cancels the handler

---@alias nimbus.Handler fun(event: nimbus.JsonObject, ctx: nimbus.Ctx): any
---@alias nimbus.Middleware fun(event: nimbus.JsonObject, ctx: nimbus.Ctx, next: fun(): any): any

---@class nimbus.Endpoint
---@field name string
---@field opts nimbus.EndpointOptions
---@field handlers table<string, nimbus.Handler>
---@field handler_opts table<string, nimbus.HandlerOptions>
---@field middleware nimbus.Middleware[]
---@field checkers? table<string, { every: number, fn: fun(chk: nimbus.Checker), chk: nimbus.Checker, where: string }>
local Endpoint = {}

-- The endpoint's handler of an event type (one per type).
---@param event_type string
---@param fn nimbus.Handler
---@param opts? nimbus.HandlerOptions
---@return nimbus.Endpoint self
function Endpoint:on(event_type, fn, opts) end

-- A command: exactly one endpoint may consume its type (the host refuses a second).
---@param command_type string
---@param fn nimbus.Handler
---@param opts? nimbus.HandlerOptions
---@return nimbus.Endpoint self
function Endpoint:command(command_type, fn, opts) end

-- A request handler: what fn returns is the reply nimbus.request gets.
---@param request_type string
---@param fn fun(request: nimbus.JsonObject, ctx: nimbus.Ctx): table?
---@param opts? nimbus.HandlerOptions
---@return nimbus.Endpoint self
function Endpoint:reply(request_type, fn, opts) end

-- Middleware around every handler of the endpoint, outermost first.
---@param fn nimbus.Middleware
---@return nimbus.Endpoint self
function Endpoint:use(fn) end

---@class nimbus.CheckerOptions
---@field every number seconds between two runs (a run never overlaps the previous one)
---@field timeout? number a run's deadline, seconds (default 60)

-- A status checker: fn(chk) runs as a task every `every` seconds and settles the
-- endpoint's pending hand-offs.
---@param name string
---@param opts nimbus.CheckerOptions
---@param fn fun(chk: nimbus.Checker)
---@return nimbus.Checker
function Endpoint:checker(name, opts, fn) end

-- Declares an endpoint: the queue, session ordering, retries and handlers of one
-- consumer. Misspelt options raise at your line, naming the valid ones.
---@param name string letters, digits, '_', '.', '-'
---@param opts? nimbus.EndpointOptions
---@return nimbus.Endpoint
function nimbus.endpoint(name, opts) end

---------------------------------------------------------------------------- the context

---@class nimbus.HandoffMark
---@field reason string why the event waits (shown by `events` and `show`)
---@field external_job_id? string the external work's id (a status checker finds it here)
---@field expected_by? number seconds from now after which the hand-off is overdue

---@class nimbus.Ctx
---@field endpoint string
---@field event_type string
---@field event_id string
---@field message_id string
---@field session_id string
---@field correlation_id string
---@field originating_message_id? string
---@field kind "event"|"retry"|"resubmit"|"replay"
---@field retry_count integer
---@field delivery_count integer
---@field enqueued_at string ISO-8601 UTC with milliseconds
---@field trace_id? string W3C trace id of this run
---@field traceparent? string W3C traceparent of this run
local Ctx = {}

-- After a normal return the event is Pending+Handoff and its session blocked until the
-- hand-off is settled (a status checker, nimbus.handoff, `nimbus-host handoff`).
---@param opts nimbus.HandoffMark
function Ctx:mark_pending_handoff(opts) end

---------------------------------------------------------------------------- status checkers

---@class nimbus.Handoff
---@field event_id string
---@field session_id? string
---@field message_id? string
---@field endpoint? string
---@field event_type? string
---@field reason? string
---@field external_job_id? string
---@field expected_by? string ISO-8601 UTC
---@field payload? nimbus.JsonObject the event's payload
---@field store? string (scripts) the store file to settle it in

---@class nimbus.Checker
---@field endpoint string
---@field name string
local Checker = {}

-- The endpoint's Pending+Handoff events, oldest first.
---@return nimbus.Handoff[]
function Checker:pending_handoffs() end

---@param h nimbus.Handoff
---@param result? table kept with the event
---@return boolean|nil ok, string? reason
function Checker:complete(h, result) end

---@param h nimbus.Handoff
---@param text string the error text, verbatim
---@param error_type? string
---@return boolean|nil ok, string? reason
function Checker:fail(h, text, error_type) end

---------------------------------------------------------------------------- tasks and time

---@class nimbus.Task
local Task = {}

-- Inside a task: waits until the spawned task ends; returns its results or raises its error.
---@return any ...
function Task:wait() end

-- Stops the task if it still runs (its waiters get an error). Returns whether it did.
---@return boolean
function Task:cancel() end

---@return "running"|"done"|"failed"|"cancelled"
function Task:status() end

---@class nimbus.EveryOptions
---@field timeout? number a run's deadline, seconds (default 60)
---@field name? string in the logs (and for nimbus.testing's app:run_every)

---@class nimbus.Every
local Every = {}

-- No more runs (a run going on finishes). Returns false if it was stopped already.
---@return boolean
function Every:cancel() end

-- Seconds since the epoch (a float, millisecond resolution); nimbus.testing's fake clock in tests.
---@return number
function nimbus.now() end

-- Waits (yields the task to the loop) for `seconds`.
---@param seconds number
function nimbus.sleep(seconds) end

-- Runs fn(...) as a task of its own from the next loop iteration.
---@param fn function
---@param ... any
---@return nimbus.Task
function nimbus.spawn(fn, ...) end

-- Runs fn() as a task every `seconds`, never two runs at once.
---@param seconds number
---@param fn fun()
---@param opts? nimbus.EveryOptions
---@return nimbus.Every
function nimbus.every(seconds, fn, opts) end

-- Plain scripts and tests: runs fn(...) as a task and drives the loop until it ends.
---@param fn function
---@param ... any
---@return any ...
function nimbus.run(fn, ...) end

---------------------------------------------------------------------------- messages

---@class nimbus.PublishOptions
---@field session? string|number the session (ordering key); default a fresh one
---@field correlation_id? string|number
---@field to? string one endpoint only
---@field message_id? string published once within 24 hours

-- Inside a handler: sent when its outcome commits (a failure publishes nothing).
-- Elsewhere (a task, a -l script) at once. Returns the MessageId and whether it was a
-- duplicate, or nil, message, code. payload: a table (encoded as JSON), or the JSON text of
-- an object, sent byte for byte (integers of any length, [] kept); other text raises.
---@param event_type string
---@param payload table|string
---@param opts? nimbus.PublishOptions
---@return string|nil message_id, boolean|string duplicate_or_message, string? code
function nimbus.publish(event_type, payload, opts) end

---@class nimbus.RequestOptions
---@field timeout? number seconds (default 10)
---@field session? string|number

-- Sends a request to the endpoint that replies to the type (ep:reply) and waits.
-- nil, message, code: "ETIMEDOUT", "EREPLY" (the responder failed), "ENOREPLIER".
---@param request_type string
---@param payload table
---@param opts? nimbus.RequestOptions
---@return any|nil reply, string? message, string? code
function nimbus.request(request_type, payload, opts) end

---@class nimbus.Error
---@field kind "permanent"|"transient"
---@field message string
---@field type string
---@field retry_after? number transient: the least wait before the next attempt, in seconds

---@class nimbus.TransientErrorOptions
---@field type? string the error type (default "TransientFailure")
---@field retry_after? number seconds >= 0: the next attempt waits at least this long (an API's Retry-After), up to the policy's max_delay (one hour without one)

-- error(nimbus.permanent("...")): the event is dead-lettered; its session is not blocked.
---@param message? string
---@param error_type? string default "PermanentFailure"
---@return nimbus.Error
function nimbus.permanent(message, error_type) end

-- error(nimbus.transient("...")): Pending+Retrying under the endpoint's `transient` policy.
-- error(nimbus.transient("throttled", { type = "Throttled", retry_after = 30 })): not before 30 s.
---@param message? string
---@param error_type? string|nimbus.TransientErrorOptions default "TransientFailure"
---@return nimbus.Error
function nimbus.transient(message, error_type) end

---------------------------------------------------------------------------- hand-offs, retention, hooks

nimbus.handoff = {}

-- Completes a Pending+Handoff event (its handler never runs again); the session replays.
---@param h nimbus.Handoff
---@param result? table
---@return boolean|nil ok, string? reason, string? code
function nimbus.handoff.complete(h, result) end

-- Fails it: Failed with `text` verbatim; the session stays blocked.
---@param h nimbus.Handoff
---@param text string
---@param error_type? string
---@return boolean|nil ok, string? reason, string? code
function nimbus.handoff.fail(h, text, error_type) end

---@class nimbus.RetentionOptions
---@field resolved? string|number age after which resolved events are deleted ("7d", "12h", seconds)
---@field inbox? string|number age after which inbox entries are deleted

---@param opts nimbus.RetentionOptions
function nimbus.retention(opts) end

---@alias nimbus.HookName "event_failed"|"dead_lettered"|"session_blocked"|"session_unblocked"|"handoff_overdue"

---@class nimbus.HookInfo
---@field hook nimbus.HookName
---@field endpoint string
---@field event_id? string
---@field session_id? string
---@field event_type? string
---@field message_id? string
---@field status? string
---@field error? string
---@field error_type? string
---@field blocked_by? string
---@field at string ISO-8601 UTC

-- fn(info) runs as a task of its own after the outcome committed.
---@param name nimbus.HookName
---@param fn fun(info: nimbus.HookInfo)
function nimbus.on(name, fn) end

---------------------------------------------------------------------------- logging

---@class nimbus.log
---@overload fun(message: any, fields?: table)
nimbus.log = {}

---@param message any
---@param fields? table
function nimbus.log.debug(message, fields) end

---@param message any
---@param fields? table
function nimbus.log.info(message, fields) end

---@param message any
---@param fields? table
function nimbus.log.warn(message, fields) end

---@param message any
---@param fields? table
function nimbus.log.error(message, fields) end

---------------------------------------------------------------------------- JSON

nimbus.json = {}

---@type lightuserdata JSON null, both ways
nimbus.json.null = nil

-- Integral numbers come back as integers, as in handler payloads.
---@param text string
---@return any|nil value, string? message
function nimbus.json.decode(text) end

---@param value any
---@return string|nil text, string? message
function nimbus.json.encode(value) end

---------------------------------------------------------------------------- HTTP

---@class nimbus.http.RequestOptions
---@field method? "GET"|"POST"|"PUT"|"PATCH"|"DELETE"|"HEAD"|"OPTIONS"
---@field url string http:// or https://
---@field headers? table<string, string>
---@field body? string
---@field json? any sent as JSON (Content-Type: application/json)
---@field timeout? number seconds (default 30)

---@class nimbus.http.Response
---@field status integer
---@field headers table<string, string> lower-case names
---@field body string
local Response = {}

-- The body as JSON (integral numbers as integers), or nil, message.
---@return any|nil value, string? message
function Response:json() end

---@class nimbus.http.Request
---@field method string
---@field path string as sent (percent-encoded)
---@field params table<string, string> the route's {name} segments, decoded
---@field query table<string, string|string[]>
---@field headers table<string, string> lower-case names
---@field body string
---@field route string the matched route key
local Request = {}

-- The body as JSON (integral numbers as integers), or nil, message.
---@return any|nil value, string? message
function Request:json() end

---@alias nimbus.http.Route fun(req: nimbus.http.Request): integer, (table|string)?, table<string, string|string[]>?

---@class nimbus.http.ServeOptions
---@field host? string default 127.0.0.1
---@field port integer 0 picks a free port
---@field routes table<string, nimbus.http.Route> "METHOD /path/{param}" = function(req)
---@field max_body? integer bytes
---@field max_headers? integer
---@field timeout? number a request's deadline, seconds (default 30)
---@field cpu_budget? number
---@field idle_timeout? integer seconds
---@field max_connections? integer

---@class nimbus.http.Server
---@field port integer
---@field host string
local Server = {}

function Server:close() end

---@return boolean
function Server:listening() end

nimbus.http = {}

-- Waits for the response. An HTTP error status is a response; nil, message, code
-- ("ETIMEDOUT", "ECONNREFUSED", "ENOTFOUND", ...) is a failure to get one.
---@param opts nimbus.http.RequestOptions
---@return nimbus.http.Response|nil response, string? message, string? code
function nimbus.http.request(opts) end

-- Serves routes; each request runs as a task of its own.
---@param opts nimbus.http.ServeOptions
---@return nimbus.http.Server|nil server, string? message, string? code
function nimbus.http.serve(opts) end

---------------------------------------------------------------------------- sqlite

nimbus.sqlite = require("nimbus.sqlite")

---------------------------------------------------------------------------- crypto

-- Hashes done by OpenSSL (lua/nimbus/crypto.lua), e.g. a webhook signature:
--   crypto.equal(header, "sha256=" .. crypto.hex(crypto.hmac_sha256(secret, body)))
-- Every argument must be a string; anything else raises at the caller's line.
---@class nimbus.crypto
nimbus.crypto = {}

-- HMAC-SHA256 (RFC 2104) of message with key: 32 raw bytes (nimbus.crypto.hex for text).
---@param key string
---@param message string
---@return string digest
function nimbus.crypto.hmac_sha256(key, message) end

-- SHA-256 of s: 32 raw bytes.
---@param s string
---@return string digest
function nimbus.crypto.sha256(s) end

-- s as lowercase hex, two digits a byte.
---@param s string
---@return string hex
function nimbus.crypto.hex(s) end

-- Whether a and b are the same bytes, in a time that does not depend on where they differ
-- (only on the length): compare signatures with it, never with ==.
---@param a string
---@param b string
---@return boolean
function nimbus.crypto.equal(a, b) end

return nimbus

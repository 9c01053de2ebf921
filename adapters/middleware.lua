-- adapters.middleware: ready `ep:use(...)` functions: required-field validation, service
-- mode and processing delay; plus the payload checks webhook_ingress and outbox_relay share.
--
--   local nimbus = require("nimbus")
--   local mw = require("adapters.middleware")
--
--   local ep = nimbus.endpoint("ErpEndpoint")
--   -- outermost first: validate, then wait out maintenance, then slow down
--   ep:use(mw.required_fields{
--     CrmAccountCreated = { "AccountId", "LegalName", ["Address.CountryCode"] = "string", Credit = "number?" },
--     ["*"] = { "AccountId" },                 -- every type this endpoint handles
--   })
--   ep:use(mw.service_mode{ url = "http://127.0.0.1:5090/api/admin/service-mode" })   -- {"enabled": true}
--   ep:use(mw.processing_delay{ seconds = 0.2 })
--   ep:on("CrmAccountCreated", function(account, ctx)
--     nimbus.log.info("account", { id = account.AccountId })
--   end)
--
-- mw.required_fields{ [event type | "*"] = fields }: an event that lacks a field (nil, JSON
--   null or "") or holds one of the wrong type is dead-lettered (nimbus.permanent, error type
--   ValidationError; its session is not blocked) with every problem named:
--   "Validation failed: CrmAccountCreated.LegalName is required; CrmAccountCreated.Credit
--   must be a number (got string)". `fields`: names in the array part are required, of any
--   type; `["name"] = "type"` entries give a type: string, number, integer, boolean, object,
--   array or any, with a trailing "?" when the field may be absent ("string?"). A name is a
--   dotted path into nested objects ("Address.CountryCode"; a key with a dot in it cannot be
--   reached). Types without an entry (and no "*") pass unchecked.
--
-- mw.service_mode{ is_on = fn | url = ..., action = "retry" | "deadletter", message = ... }:
--   while the switch is on, events do not reach the handler. action "retry" (default) raises
--   nimbus.transient: the event is Pending+Retrying and tried again under the endpoint's
--   `transient` policy ({ max_attempts, base, max_delay }), its session waits, order is kept;
--   give the endpoint a policy that outlasts your maintenance windows (when the attempts are
--   used up the event is Failed and its session blocks until an operator resubmits it).
--   action "deadletter" raises nimbus.permanent (NimBus's ServiceModeMiddleware). The switch:
--   is_on(event, ctx) -> on[, reason], or url: a GET answering a JSON object whose `field`
--   (default "enabled") is true when on; `timeout` (default 2 s), `cache` (seconds to reuse
--   an answer, default 0), `when_unknown` ("off" default, or "on": what an unreachable or
--   garbled switch means). The error text is `message` (default "<endpoint> is in service
--   mode") plus the reason is_on gave; the error type is ServiceMode.
--
-- mw.processing_delay{ seconds = n | fn(event, ctx) -> n }: nimbus.sleep before the handler
--   (the task yields; other sessions run). The delay counts toward the handler's deadline
--   (endpoint option `timeout`, 60 s by default).
--
-- mw.http_knob{ url = ..., timeout = 2, cache = 0 } -> fn() -> decoded JSON object or nil, why:
--   the switch reader service_mode uses, for knobs of your own (a delay an admin API sets).
--
-- Shared checks (used by webhook_ingress, outbox_relay):
--   mw.compile_fields(fields, what, level) -> compiled (raises at the caller's caller on a
--     bad spec); mw.check_fields(value, compiled, prefix) -> list of problems ({} when fine).
--   mw.get(value, "a.b.c") -> the value at a dotted path, or nil.
--   mw.decode_json(text) -> value (integral numbers as integers, as in payloads) | nil, message.
--   mw.check_options(opts, { name = true, ... }, what, level): raises on a non-table or an
--     unknown option, naming the valid ones, at `level` as error() counts it.
--   mw.lossy_number(json_text) -> the first integer literal the host cannot carry exactly, or
--     nil. nimbus-host encodes JSON with lua-cjson, which prints numbers with 14 significant
--     digits: 12345678901234567 would be published as 1.2345678901235e+16. The modules that
--     take JSON from outside refuse such a payload (the sender can send the number as a
--     string) rather than change it.
local cjson = require("cjson.safe")

local M = {}

local NULL = cjson.null

---------------------------------------------------------------------------- paths and types
local function split_path(path)
  local parts = {}
  for part in path:gmatch("[^.]+") do parts[#parts + 1] = part end
  return parts
end

local function get_parts(value, parts)
  for i = 1, #parts do
    if type(value) ~= "table" then return nil end
    value = value[parts[i]]
  end
  return value
end

function M.get(value, path)
  return get_parts(value, split_path(path))
end

-- A JSON array decodes to a table with [1]; an object to one with string keys. An empty
-- table is both (cjson cannot tell `[]` from `{}`).
local function is_array(t)
  if next(t) == nil then return true end
  local n = #t
  if n == 0 then return false end
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

local function json_type(v)
  local t = type(v)
  if v == NULL then return "null" end
  if t == "table" then
    if next(v) == nil then return "empty" end
    return is_array(v) and "array" or "object"
  end
  if t == "number" then
    if math.type(v) == "integer" or (v == math.floor(v) and v > -2^63 and v < 2^63) then return "integer" end
    return "number"
  end
  return t
end

-- type name -> predicate on the JSON type of a present value
local TYPES = {
  any = function() return true end,
  string = function(jt) return jt == "string" end,
  number = function(jt) return jt == "number" or jt == "integer" end,
  integer = function(jt) return jt == "integer" end,
  boolean = function(jt) return jt == "boolean" end,
  object = function(jt) return jt == "object" or jt == "empty" end,
  array = function(jt) return jt == "array" or jt == "empty" end,
}
local TYPE_NAMES = "string, number, integer, boolean, object, array, any"

local function article(name)
  return (name:match("^[aeiou]") and "an " or "a ") .. name
end

local function got(jt)
  if jt == "empty" then return "an empty object or array" end
  if jt == "integer" then return "number" end
  return jt
end

local function missing(v)
  return v == nil or v == NULL or v == ""
end

---------------------------------------------------------------------------- field specs
local function bad_spec(what, msg, level)
  error(("%s: %s"):format(what, msg), level + 1)
end

local function compile_path(path, what, level)
  if type(path) ~= "string" or path == "" or path:find("^%.") or path:find("%.$") or path:find("%.%.") then
    bad_spec(what, ("field names must be non-empty strings or dotted paths like \"order.id\", got %s")
      :format(type(path) == "string" and ("%q"):format(path) or type(path)), level + 1)
  end
  return split_path(path)
end

-- fields: { "a", "b.c", d = "string", e = "integer?" } -> { { path, parts, type, optional }, ... }
-- Array entries first, in order; typed entries sorted by name, so messages are stable.
function M.compile_fields(fields, what, level)
  level = (level or 1) + 1
  if type(fields) ~= "table" then
    bad_spec(what, ("fields must be a table like { \"id\", amount = \"number\" }, got %s"):format(type(fields)), level)
  end
  local out, seen = {}, {}
  local n = #fields
  for i = 1, n do
    local path = fields[i]
    out[#out + 1] = { path = path, parts = compile_path(path, what, level), type = "any", optional = false }
    seen[path] = true
  end
  local typed = {}
  for k, v in pairs(fields) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then typed[#typed + 1] = k end
  end
  table.sort(typed, function(a, b) return tostring(a) < tostring(b) end)
  for _, path in ipairs(typed) do
    local parts = compile_path(path, what, level)
    local spec = fields[path]
    local tname, opt
    if type(spec) == "string" then tname, opt = spec:match("^(%a+)(%??)$") end
    if not tname or not TYPES[tname] then
      bad_spec(what, ("field %s: the type must be one of %s (with a trailing ? when it may be absent), got %s")
        :format(path, TYPE_NAMES, type(spec) == "string" and ("%q"):format(spec) or type(spec)), level)
    end
    if seen[path] then bad_spec(what, ("field %s is listed twice"):format(path), level) end
    seen[path] = true
    out[#out + 1] = { path = path, parts = parts, type = tname, optional = opt == "?" }
  end
  return out
end

-- Every problem of `value` against compiled fields, each prefixed with `prefix`.
function M.check_fields(value, compiled, prefix)
  prefix = prefix or ""
  local problems = {}
  for _, f in ipairs(compiled) do
    local v = get_parts(value, f.parts)
    if missing(v) then
      if not f.optional then problems[#problems + 1] = prefix .. f.path .. " is required" end
    else
      local jt = json_type(v)
      if not TYPES[f.type](jt) then
        problems[#problems + 1] = ("%s%s must be %s (got %s)"):format(prefix, f.path, article(f.type), got(jt))
      end
    end
  end
  return problems
end

---------------------------------------------------------------------------- number precision
-- Integer literals with more digits than this change on their way through lua-cjson
-- (it formats with %.14g).
local MAX_DIGITS = 14

-- Skips a JSON string starting at i (the opening quote); returns the index after it.
local function skip_string(s, i)
  local j = i + 1
  while true do
    local k = s:find('["\\]', j)
    if not k then return #s + 1 end
    if s:byte(k) == 92 then j = k + 2 else return k + 1 end   -- 92: backslash
  end
end

function M.lossy_number(text)
  if type(text) ~= "string" then return nil end
  local i, len = 1, #text
  while i <= len do
    local k = text:find('["%-%d]', i)
    if not k then return nil end
    if text:byte(k) == 34 then   -- a string: numbers inside it are text
      i = skip_string(text, k)
    else
      local lit = text:match("^%-?%d+[%.eE]?[%d%.eE+%-]*", k)
      if not lit then return nil end
      if not lit:find("[%.eE]") then
        local digits = lit:gsub("^%-", ""):gsub("^0+", "")
        if #digits > MAX_DIGITS then return lit end
      end
      i = k + #lit
    end
  end
  return nil
end

-- JSON text -> value with integral numbers as integers (lua-cjson gives floats: 42.0),
-- as handlers see their payloads; nil, message when malformed.
local function integralize(t, depth)
  if depth > 100 then return end
  for k, v in pairs(t) do
    if type(v) == "number" then
      local i = math.tointeger(v)
      if i then t[k] = i end
    elseif type(v) == "table" then
      integralize(v, depth + 1)
    end
  end
end

function M.decode_json(text)
  local v, err = cjson.decode(text)
  if v == nil then return nil, err end
  if type(v) == "table" then integralize(v, 0) end
  return v
end

-- The message the ingress modules give for a lossy number.
function M.lossy_number_message(lit)
  return ("the number %s has more than %d significant digits, and nimbus-host's JSON encoder (lua-cjson) keeps "
          .. "only %d: it would be published as a different number. Send it as a JSON string (\"%s\")")
    :format(lit, MAX_DIGITS, MAX_DIGITS, lit)
end

---------------------------------------------------------------------------- option checks
local function check_options(opts, known, what, level)
  if type(opts) ~= "table" then error(("%s expects a table of options"):format(what), level + 1) end
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(("%s: unknown option %s (options: %s)"):format(what, tostring(k), table.concat(names, ", ")), level + 1)
    end
  end
end
M.check_options = check_options

local function positive(v, name, what, level, allow_zero)
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= v or v < 0 or (v == 0 and not allow_zero) then
    error(("%s: `%s` must be a number of seconds%s"):format(what, name, allow_zero and " (>= 0)" or " (> 0)"), level + 1)
  end
  return v
end

---------------------------------------------------------------------------- required fields
-- required_fields{ [event type | "*"] = fields } -> middleware
function M.required_fields(by_type)
  local what = "middleware.required_fields"
  if type(by_type) ~= "table" or next(by_type) == nil then
    error(what .. " expects a table { EventType = { \"Field\", Other = \"string\" }, [\"*\"] = {...} }", 2)
  end
  local compiled = {}
  for event_type, fields in pairs(by_type) do
    if type(event_type) ~= "string" or event_type == "" then
      error(what .. ": keys must be event types (or \"*\" for every type), got " .. type(event_type), 2)
    end
    compiled[event_type] = M.compile_fields(fields, ("%s(%s)"):format(what, event_type), 2)
  end
  local all = compiled["*"]
  return function(event, ctx, next)
    local own = compiled[ctx.event_type]
    if own or all then
      local prefix = ctx.event_type .. "."
      local problems = all and M.check_fields(event, all, prefix) or {}
      if own then
        for _, p in ipairs(M.check_fields(event, own, prefix)) do problems[#problems + 1] = p end
      end
      if #problems > 0 then
        local nimbus = require("nimbus")   -- at call time: nimbus.testing gives each app its own
        error(nimbus.permanent("Validation failed: " .. table.concat(problems, "; "), "ValidationError"), 0)
      end
    end
    return next()
  end
end

---------------------------------------------------------------------------- clock
-- The host's clock (the fake one under nimbus.testing), looked up at call time: nimbus.testing
-- gives each app its own.
local function now() return require("nimbus").now() end

---------------------------------------------------------------------------- http knobs
-- A reader of a JSON switch behind a URL, its answer reused for `cache` seconds.
local function make_knob(url, timeout, cache)
  local last, last_at
  return function()
    if last ~= nil and cache > 0 and now() - last_at < cache then return last end
    local nimbus = require("nimbus")
    local res, err = nimbus.http.request{ method = "GET", url = url, timeout = timeout }
    if not res then return nil, ("GET %s failed: %s"):format(url, tostring(err)) end
    if res.status < 200 or res.status > 299 then return nil, ("GET %s answered %d"):format(url, res.status) end
    local v, jerr = res:json()
    if type(v) ~= "table" then
      return nil, ("GET %s answered a body that is not a JSON object: %s"):format(url, tostring(jerr or type(v)))
    end
    last, last_at = v, now()
    return v
  end
end

local function check_url(url, what, level)
  if type(url) ~= "string" or not url:match("^https?://") then
    error(what .. ": `url` must be an http:// or https:// URL, got " .. tostring(url), level + 1)
  end
end

-- http_knob{ url, timeout, cache } -> function() -> table | nil, why
function M.http_knob(opts)
  local what = "middleware.http_knob"
  check_options(opts, { url = true, timeout = true, cache = true }, what, 2)
  check_url(opts.url, what, 2)
  return make_knob(opts.url, positive(opts.timeout, "timeout", what, 2) or 2,
                   positive(opts.cache, "cache", what, 2, true) or 0)
end

---------------------------------------------------------------------------- service mode
local ACTIONS = { retry = true, deadletter = true }

function M.service_mode(opts)
  local what = "middleware.service_mode"
  check_options(opts, { is_on = true, url = true, field = true, timeout = true, cache = true,
                        when_unknown = true, action = true, message = true }, what, 2)
  if (opts.is_on == nil) == (opts.url == nil) then
    error(what .. ": give either is_on = function(event, ctx) return on, reason end or url = \"http://...\"", 2)
  end
  local action = opts.action or "retry"
  if not ACTIONS[action] then
    error(what .. ": `action` must be \"retry\" (wait for the target) or \"deadletter\", got " .. tostring(action), 2)
  end
  if opts.message ~= nil and type(opts.message) ~= "string" then error(what .. ": `message` must be a string", 2) end
  local is_on = opts.is_on
  if is_on ~= nil then
    if type(is_on) ~= "function" then error(what .. ": `is_on` must be a function(event, ctx)", 2) end
    for _, k in ipairs({ "field", "timeout", "cache", "when_unknown" }) do
      if opts[k] ~= nil then error(("%s: `%s` goes with url, not with is_on"):format(what, k), 2) end
    end
  else
    local unknown = opts.when_unknown or "off"
    if unknown ~= "off" and unknown ~= "on" then
      error(what .. ": `when_unknown` must be \"off\" or \"on\", got " .. tostring(unknown), 2)
    end
    local field = opts.field or "enabled"
    if type(field) ~= "string" or field == "" then error(what .. ": `field` must be a dotted path string", 2) end
    check_url(opts.url, what, 2)
    local knob = make_knob(opts.url, positive(opts.timeout, "timeout", what, 2) or 2,
                           positive(opts.cache, "cache", what, 2, true) or 0)
    is_on = function()
      local v, why = knob()
      if v == nil then
        if unknown == "on" then return true, "the switch cannot be read (" .. why .. ")" end
        return false
      end
      return M.get(v, field) == true
    end
  end
  local message = opts.message
  return function(event, ctx, next)
    local on, reason = is_on(event, ctx)
    if on then
      local nimbus = require("nimbus")
      local text = message or ((ctx.endpoint or "the target") .. " is in service mode")
      if reason ~= nil then text = text .. ": " .. tostring(reason) end
      if action == "retry" then error(nimbus.transient(text, "ServiceMode"), 0) end
      error(nimbus.permanent(text, "ServiceMode"), 0)
    end
    return next()
  end
end

---------------------------------------------------------------------------- processing delay
function M.processing_delay(opts)
  local what = "middleware.processing_delay"
  check_options(opts, { seconds = true }, what, 2)
  local s = opts.seconds
  if type(s) == "number" then
    positive(s, "seconds", what, 2, true)
  elseif type(s) ~= "function" then
    error(what .. ": `seconds` must be a number or a function(event, ctx) returning one", 2)
  end
  return function(event, ctx, next)
    local secs = s
    if type(s) == "function" then
      secs = s(event, ctx)
      if secs == nil then secs = 0 end
      if type(secs) ~= "number" or secs ~= secs or secs < 0 then
        error(("%s: the seconds function returned %s; it must return a number >= 0 (or nil for none)")
          :format(what, tostring(secs)), 0)
      end
    end
    if secs > 0 then require("nimbus").sleep(secs) end
    return next()
  end
end

return M

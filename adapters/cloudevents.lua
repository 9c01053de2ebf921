-- adapters.cloudevents: CloudEvents 1.0 in and out over HTTP, in structured mode
-- (Content-Type: application/cloudevents+json, and its -batch+json form) and binary mode
-- (ce-* headers, the data as the body).
--
--   local nimbus = require("nimbus")
--   local ce = require("adapters.cloudevents")
--
--   -- out: forward every OrderPlaced to a CloudEvents consumer, in binary mode
--   local ep = nimbus.endpoint("Orders")
--   ep:on("OrderPlaced", function(order, ctx)
--     local ev = ce.from_event(order, ctx, { source = "/shop/orders" })
--     local headers, body = ce.to_http(ev, "binary")      -- or "structured"
--     local res, err = nimbus.http.request{ method = "POST", url = "http://127.0.0.1:9000/events",
--                                           headers = headers, body = body, timeout = 5 }
--     if not res then error(nimbus.transient("events endpoint unreachable: " .. err)) end
--     if res.status >= 300 then error("events endpoint answered " .. res.status .. ": " .. res.body) end
--   end)
--
--   -- in: publish the CloudEvents POSTed to /events (either mode, or a batch)
--   assert(nimbus.http.serve{ port = 9001, routes = {
--     ["POST /events"] = function(req)
--       local events, err = ce.from_http(req)
--       if not events then return 400, { error = err } end
--       local ids = {}
--       for i, ev in ipairs(events) do
--         local id, perr = ce.publish(ev)
--         if not id then return 503, { error = perr } end
--         ids[i] = id
--       end
--       return 202, { message_ids = ids }
--     end,
--   } })
--   -- adapters.webhook_ingress{ cloudevents = true, ... } does the same with its checks.
--
-- An event is a flat table of its attributes plus `data`, as in structured JSON:
--   { specversion = "1.0", id, source, type, subject, time, datacontenttype, dataschema,
--     data = table | string, <extension> = string | number | boolean }
-- In binary mode and on the way in, a data of a JSON content type (application/json,
-- */*+json, or none) is the decoded value; other data are the body's bytes (a Lua
-- string), sent in structured mode as `data` when they are UTF-8 text, else `data_base64`.
-- Extensions read from ce-* headers are strings (HTTP carries no types).
--
-- ce.validate(ev) -> ev | nil, message: specversion "1.0"; id, source, type non-empty
--   strings; subject, datacontenttype, dataschema strings; time RFC 3339; extension names
--   of a-z and 0-9, values strings, numbers or booleans.
-- ce.from_event(event, ctx, { source = ..., type = ctx.event_type, datacontenttype }) -> ev:
--   id = ctx.message_id, subject = ctx.session_id, time = ctx.enqueued_at, data = event, and
--   the extension traceparent = ctx.traceparent (CloudEvents distributed tracing). Raises
--   on misuse (no source, a ctx without message_id).
-- ce.to_http(ev, "binary" | "structured") -> headers, body (raises when ev is invalid).
-- ce.encode(ev) -> JSON text (structured); ce.decode(text) -> ev | nil, message.
-- ce.from_http(req) -> list of events | nil, message: req.headers (lower-case names, as
--   nimbus.http.serve gives them) and req.body. application/cloudevents+json: one event;
--   application/cloudevents-batch+json: a JSON array of them; otherwise binary mode
--   (ce-specversion required). Every event is validated.
-- ce.to_publish(ev, { session = "subject" }) -> event type, payload, publish options | nil, message:
--   type = ev.type, payload = ev.data (a JSON object: nimbus events are objects), session
--   = the extension partitionkey when set, else ev.subject (opts.session names another
--   attribute), message_id = "<id>@<source>" (the pair CloudEvents makes unique, so a
--   redelivered event is published once within 24 h; left out when it is longer than the
--   200 bytes a message id may have).
-- ce.publish(ev, opts) -> message_id, duplicate | nil, message (nimbus.publish).
--
-- AMQP binary mode (`cloudEvents:`-prefixed application properties) is not offered:
-- nimbus-host does not show a handler the application properties of the message it
-- handles, nor let nimbus.publish set any. Structured JSON works on any transport.
local cjson = require("cjson.safe")
local mw = require("adapters.middleware")

local M = {}

local NULL = cjson.null
local SPECVERSION = "1.0"
local STRUCTURED_CT = "application/cloudevents+json"
local BATCH_CT = "application/cloudevents-batch+json"

-- The context attributes the spec names; everything else (but data) is an extension.
local CORE = { specversion = true, id = true, source = true, type = true, subject = true, time = true,
               datacontenttype = true, dataschema = true }
local REQUIRED = { "specversion", "id", "source", "type" }
local OPTIONAL_STRINGS = { "subject", "datacontenttype", "dataschema" }

---------------------------------------------------------------------------- small helpers
local function quote(v)
  if type(v) == "string" then return ("%q"):format(#v > 60 and v:sub(1, 60) .. "..." or v) end
  if v == NULL then return "null" end
  if type(v) == "table" then return "a JSON object or array" end
  return tostring(v) .. " (" .. type(v) .. ")"
end

-- RFC 3339: 2025-12-02T10:00:00Z, 2025-12-02T10:00:00.123+02:00
local function is_rfc3339(s)
  local rest = s:match("^%d%d%d%d%-%d%d%-%d%d[Tt]%d%d:%d%d:%d%d(.*)$")
  if not rest then return false end
  rest = rest:gsub("^%.%d+", "")
  return rest == "Z" or rest == "z" or rest:match("^[+-]%d%d:%d%d$") ~= nil
end

local function is_json_ct(ct)
  if ct == nil then return true end
  local media = ct:match("^%s*([^;%s]+)"):lower()
  return media == "application/json" or media == "text/json" or media:match("%+json$") ~= nil
end

local function media_type(ct)
  return ct and (ct:match("^%s*([^;%s]+)") or ""):lower() or nil
end

---------------------------------------------------------------------------- base64
local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local B64_INDEX = {}
for i = 1, 64 do B64_INDEX[B64:byte(i)] = i - 1 end

local function b64_encode(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = (a << 16) | ((b or 0) << 8) | (c or 0)
    local chunk = { B64:sub((n >> 18) + 1, (n >> 18) + 1), B64:sub(((n >> 12) & 63) + 1, ((n >> 12) & 63) + 1),
                    b and B64:sub(((n >> 6) & 63) + 1, ((n >> 6) & 63) + 1) or "=",
                    c and B64:sub((n & 63) + 1, (n & 63) + 1) or "=" }
    out[#out + 1] = table.concat(chunk)
  end
  return table.concat(out)
end

local function b64_decode(s)
  s = s:gsub("%s", "")
  if #s % 4 ~= 0 or s:find("[^%w+/=]") or s:find("=[^=]") then return nil end
  local out = {}
  for i = 1, #s, 4 do
    local n, pad = 0, 0
    for j = i, i + 3 do
      local c = s:byte(j)
      if c == 61 then pad = pad + 1; n = n << 6 else n = (n << 6) | B64_INDEX[c] end
    end
    local bytes = string.char((n >> 16) & 255, (n >> 8) & 255, n & 255)
    out[#out + 1] = bytes:sub(1, 3 - pad)
  end
  return table.concat(out)
end

---------------------------------------------------------------------------- header values
-- CloudEvents HTTP binding 3.1.3.2: space, '"', '%' and anything outside printable ASCII
-- are percent-encoded (as UTF-8 bytes).
local function pct_encode(s)
  return (s:gsub('[^\33\35\36\38-\126]', function(c) return ("%%%02X"):format(c:byte()) end))
end

local function pct_decode(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

---------------------------------------------------------------------------- validation
function M.validate(ev)
  if type(ev) ~= "table" then return nil, "a CloudEvent must be a JSON object, got " .. type(ev) end
  for _, name in ipairs(REQUIRED) do
    local v = ev[name]
    if v == nil or v == NULL then
      return nil, ("the required attribute `%s` is missing"):format(name)
    end
    if type(v) ~= "string" or v == "" then
      return nil, ("the attribute `%s` must be a non-empty string, got %s"):format(name, quote(v))
    end
  end
  if ev.specversion ~= SPECVERSION then
    return nil, ("specversion must be %q (this is CloudEvents 1.0), got %s"):format(SPECVERSION, quote(ev.specversion))
  end
  for _, name in ipairs(OPTIONAL_STRINGS) do
    local v = ev[name]
    if v ~= nil and v ~= NULL and type(v) ~= "string" then
      return nil, ("the attribute `%s` must be a string, got %s"):format(name, quote(v))
    end
  end
  if ev.time ~= nil and ev.time ~= NULL and (type(ev.time) ~= "string" or not is_rfc3339(ev.time)) then
    return nil, ("the attribute `time` must be an RFC 3339 timestamp like 2025-12-02T10:00:00Z, got %s")
      :format(quote(ev.time))
  end
  local names = {}
  for k in pairs(ev) do names[#names + 1] = tostring(k) end
  table.sort(names)
  for _, k in ipairs(names) do
    local v = ev[k]
    if not CORE[k] and k ~= "data" and k ~= "data_base64" then
      if not k:match("^[a-z0-9]+$") then
        return nil, ("%q is not a valid attribute name: CloudEvents attribute names are lower-case letters and "
                     .. "digits"):format(k)
      end
      local tv = type(v)
      if v ~= NULL and tv ~= "string" and tv ~= "number" and tv ~= "boolean" then
        return nil, ("the extension attribute `%s` must be a string, number or boolean, got %s"):format(k, tv)
      end
    end
  end
  if ev.data ~= nil and ev.data_base64 ~= nil then
    return nil, "an event has `data` or `data_base64`, not both"
  end
  return ev
end

local function check(ev, what, level)
  local ok, err = M.validate(ev)
  if not ok then error(("%s: not a valid CloudEvent: %s"):format(what, err), level + 1) end
end

---------------------------------------------------------------------------- out
local FROM_EVENT_OPTS = { source = true, type = true, datacontenttype = true }

function M.from_event(event, ctx, opts)
  local what = "cloudevents.from_event"
  if type(event) ~= "table" then error(what .. ": the event must be a table (the handler's payload)", 2) end
  if type(ctx) ~= "table" or type(ctx.message_id) ~= "string" then
    error(what .. ": ctx must be the handler's ctx (it gives the id: ctx.message_id)", 2)
  end
  mw.check_options(opts, FROM_EVENT_OPTS, what, 2)
  if type(opts.source) ~= "string" or opts.source == "" then
    error(what .. ": `source` is required: a URI-reference naming the producer, like \"/shop/orders\" or "
          .. "\"https://crm.example.com\"", 2)
  end
  local etype = opts.type or ctx.event_type
  if type(etype) ~= "string" or etype == "" then
    error(what .. ": no event type: ctx.event_type is not set; give opts.type", 2)
  end
  local ev = { specversion = SPECVERSION, id = ctx.message_id, source = opts.source, type = etype,
               subject = ctx.session_id, datacontenttype = opts.datacontenttype or "application/json",
               data = event, traceparent = ctx.traceparent }
  if ctx.enqueued_ms ~= nil or rawget(ctx, "enqueued_at") ~= nil then ev.time = ctx.enqueued_at end
  check(ev, what, 2)
  return ev
end

-- data -> bytes for a body: JSON for a JSON content type, the string as is otherwise.
local function data_bytes(ev, what, level)
  local data = ev.data
  if data == nil then return "" end
  if is_json_ct(ev.datacontenttype) then
    local s, err = cjson.encode(data)
    if not s then error(("%s: data cannot be encoded as JSON: %s"):format(what, tostring(err)), level + 1) end
    return s
  end
  if type(data) ~= "string" then
    error(("%s: data of content type %s must be a string (its bytes), got %s"):format(what, ev.datacontenttype,
          type(data)), level + 1)
  end
  return data
end

-- The structured form as a table ready for cjson (data_base64 for bytes that are not text).
local function structured_table(ev, what, level)
  local t = {}
  for k, v in pairs(ev) do t[k] = v end
  if ev.data ~= nil and not is_json_ct(ev.datacontenttype) then
    if type(ev.data) ~= "string" then
      error(("%s: data of content type %s must be a string (its bytes), got %s"):format(what, ev.datacontenttype,
            type(ev.data)), level + 1)
    end
    if not utf8.len(ev.data) then
      t.data = nil
      t.data_base64 = b64_encode(ev.data)
    end
  end
  return t
end

function M.encode(ev)
  check(ev, "cloudevents.encode", 2)
  local s, err = cjson.encode(structured_table(ev, "cloudevents.encode", 2))
  if not s then error("cloudevents.encode: the event cannot be encoded as JSON: " .. tostring(err), 2) end
  return s
end

function M.to_http(ev, mode)
  local what = "cloudevents.to_http"
  check(ev, what, 2)
  mode = mode or "binary"
  if mode == "structured" then
    local s, err = cjson.encode(structured_table(ev, what, 2))
    if not s then error(what .. ": the event cannot be encoded as JSON: " .. tostring(err), 2) end
    return { ["Content-Type"] = STRUCTURED_CT .. "; charset=utf-8" }, s
  end
  if mode ~= "binary" then error(what .. ": mode must be \"binary\" or \"structured\", got " .. tostring(mode), 2) end
  local headers = {}
  for k, v in pairs(ev) do
    if k ~= "data" and k ~= "datacontenttype" and v ~= NULL then
      headers["ce-" .. k] = pct_encode(tostring(v))
    end
  end
  if ev.data ~= nil then headers["Content-Type"] = ev.datacontenttype or "application/json" end
  return headers, data_bytes(ev, what, 2)
end

---------------------------------------------------------------------------- in
-- A decoded structured event (a table): data_base64 becomes data (bytes); validated.
local function from_structured(t, where)
  if type(t) ~= "table" or t == NULL then
    return nil, ("%sa structured CloudEvent must be a JSON object"):format(where)
  end
  local ev = {}
  for k, v in pairs(t) do ev[k] = v end
  local ok, err = M.validate(ev)
  if not ok then return nil, where .. err end
  if ev.data_base64 ~= nil then
    local raw = type(ev.data_base64) == "string" and b64_decode(ev.data_base64)
    if not raw then return nil, where .. "data_base64 is not valid base64" end
    ev.data_base64 = nil
    ev.data = raw
  end
  if ev.data == NULL then ev.data = nil end
  return ev
end

local decode_json = mw.decode_json

function M.decode(text)
  if type(text) ~= "string" or text == "" then return nil, "the body is empty: expected a CloudEvent in JSON" end
  local lossy = mw.lossy_number(text)
  if lossy then return nil, mw.lossy_number_message(lossy) end
  local t, err = decode_json(text)
  if t == nil then return nil, "the body is not JSON: " .. tostring(err) end
  return from_structured(t, "")
end

local function from_binary(headers, body)
  local ev = {}
  for name, value in pairs(headers) do
    local attr = name:lower():match("^ce%-(.+)$")
    if attr then
      local v = pct_decode(value)
      if not utf8.len(v) then return nil, ("header ce-%s is not UTF-8 once percent-decoded"):format(attr) end
      ev[attr] = v
    end
  end
  if ev.specversion == nil then
    return nil, ("no CloudEvent in this request: send Content-Type: %s (structured mode) or the ce-specversion, "
                 .. "ce-id, ce-source and ce-type headers (binary mode)"):format(STRUCTURED_CT)
  end
  if ev.datacontenttype ~= nil or ev.data ~= nil or ev.data_base64 ~= nil then
    return nil, "binary mode carries data in the body and its type in Content-Type, not in ce- headers"
  end
  local ct = headers["content-type"]
  ev.datacontenttype = ct
  local ok, err = M.validate(ev)
  if not ok then return nil, err end
  if body ~= nil and body ~= "" then
    if is_json_ct(ct) then
      local lossy = mw.lossy_number(body)
      if lossy then return nil, mw.lossy_number_message(lossy) end
      local data, jerr = decode_json(body)
      if data == nil then return nil, ("the body (%s) is not JSON: %s"):format(ct or "no Content-Type", tostring(jerr)) end
      ev.data = data
    else
      ev.data = body
    end
  end
  return ev
end

function M.from_http(req)
  if type(req) ~= "table" or type(req.headers) ~= "table" then
    error("cloudevents.from_http expects the request of a nimbus.http.serve route (req.headers, req.body)", 2)
  end
  local headers, body = req.headers, req.body or ""
  local ct = media_type(headers["content-type"])
  if ct == STRUCTURED_CT then
    local ev, err = M.decode(body)
    if not ev then return nil, err end
    return { ev }
  end
  if ct == BATCH_CT then
    if body == "" then return nil, "the body is empty: expected a JSON array of CloudEvents" end
    local lossy = mw.lossy_number(body)
    if lossy then return nil, mw.lossy_number_message(lossy) end
    if not body:find("^%s*%[") then return nil, "a CloudEvents batch must be a JSON array" end
    local list, err = decode_json(body)
    if list == nil then return nil, "the body is not JSON: " .. tostring(err) end
    if #list == 0 then return nil, "the batch is empty: nothing to publish" end
    local out = {}
    for i, t in ipairs(list) do
      local ev, verr = from_structured(t, ("[%d]: "):format(i))
      if not ev then return nil, verr end
      out[i] = ev
    end
    return out
  end
  local ev, err = from_binary(headers, body)
  if not ev then return nil, err end
  return { ev }
end

---------------------------------------------------------------------------- to nimbus
local TO_PUBLISH_OPTS = { session = true }

function M.to_publish(ev, opts)
  opts = opts or {}
  mw.check_options(opts, TO_PUBLISH_OPTS, "cloudevents.to_publish", 2)
  local ok, err = M.validate(ev)
  if not ok then return nil, err end
  if type(ev.data) ~= "table" or not is_json_ct(ev.datacontenttype) then
    return nil, ("the event's data must be a JSON object to become a nimbus event, got %s"):format(
      ev.data == nil and "no data" or is_json_ct(ev.datacontenttype) and type(ev.data)
      or ("data of content type " .. tostring(ev.datacontenttype)))
  end
  if ev.data[1] ~= nil then return nil, "the event's data must be a JSON object to become a nimbus event, got an array" end
  local session
  if opts.session ~= nil then
    session = ev[opts.session]
  else
    session = ev.partitionkey
    if session == nil then session = ev.subject end
  end
  if session ~= nil then session = tostring(session) end
  local mid = ev.id .. "@" .. ev.source
  if #mid > 200 then mid = nil end
  return ev.type, ev.data, { session = session, message_id = mid }
end

function M.publish(ev, opts)
  local etype, payload, popts = M.to_publish(ev, opts)
  if not etype then return nil, payload end
  return require("nimbus").publish(etype, payload, popts)
end

M.STRUCTURED = STRUCTURED_CT
M.BATCH = BATCH_CT
return M

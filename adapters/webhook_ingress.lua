-- adapters.webhook_ingress: an HTTP route that takes webhooks (JSON bodies), checks them,
-- publishes each as a nimbus event and answers 202 with the message ids.
--
--   local nimbus = require("nimbus")
--   local ingress = require("adapters.webhook_ingress")
--
--   local srv = assert(ingress.serve{
--     port = 8085,                                    -- 0: a free port (srv.port)
--     path = "/hooks/orders",
--     event_type = "OrderPlaced",                     -- or { field = "kind" } / { header = "X-Event-Type" }
--     session = { field = "order.customer_id" },      -- or { header = "X-Customer-Id" }
--     message_id = { header = "X-Delivery-Id" },      -- a redelivered webhook is published once (24 h)
--     fields = { "order.id", ["order.customer_id"] = "string", ["order.total"] = "number", note = "string?" },
--     max_body = 256 * 1024,
--     batch = true,                                   -- a JSON array: one event per element
--   })
--
--   local ep = nimbus.endpoint("Orders")
--   ep:on("OrderPlaced", function(body, ctx)
--     nimbus.log.info("order", { id = body.order.id, customer = ctx.session_id })
--   end)
--
--   $ curl -s localhost:8085/hooks/orders -H 'X-Delivery-Id: d-1' \
--          -d '{"order":{"id":"o-1","customer_id":"c-7","total":12.5}}'
--   {"accepted":1,"message_ids":["d-1"],"duplicates":0}
--
-- ingress.serve(opts) -> server | nil, message, code (nimbus.http.serve's answer): its own
--   server on opts.port (opts.host, default 127.0.0.1). ingress.route(opts) -> key, handler
--   for a server of yours: `routes[key] = handler` ("POST /hooks/orders").
--
-- Options:
--   path (required), method ("POST").
--   event_type: a string, or { field = "a.b" } / { header = "Name" } to take it from each
--     body; types = { "A", "B" }: the only types accepted (400 for another).
--   session, message_id, correlation_id: { field = "a.b" } or { header = "Name" } (a field
--     holds a string or an integer). Without session each event is a session of its own.
--     A request without the configured session or message id is refused (400); one
--     without its correlation id gets a fresh one.
--     A header message id on a batch becomes "<id>#<n>" for its n-th element.
--   fields: what a body must hold, as in adapters.middleware's required_fields
--     ({ "id", amount = "number", note = "string?" }; dotted paths reach nested objects).
--   max_body: bytes (default 1 MiB) -> 413 naming the size and the limit. ingress.serve's
--     server reads at most max_body + max(max_body, 64 KiB); a bigger body gets the
--     server's own 413 {"error":"request body too large"} without being read.
--   batch (false): accept a JSON array of bodies, at most max_batch (default 100); they are
--     all checked before any is published.
--   transform: function(body, req) -> payload table | nil, message (-> 400): runs after the
--     checks, before publishing (reshape, enrich, check more).
--   signature = { secret = "..." | { "new", "old" }, header = "X-Signature", prefix = "sha256=",
--     hmac = function(secret, body) -> digest }: the header must carry prefix .. the hex
--     HMAC-SHA256 of the raw body with one of the secrets (compared in constant time,
--     nimbus.crypto.equal), else 401. The digest comes from nimbus.crypto.hmac_sha256;
--     `hmac` overrides it (another digest scheme: return raw 32 bytes or 64 hex digits).
--   cloudevents = true: the request is a CloudEvent (structured, batch or binary mode; see
--     adapters.cloudevents): type from the event, session from its partitionkey or subject,
--     message id "<id>@<source>", payload = its data (a JSON object; `fields` apply to it).
--     event_type / session / ... given here win; their `field`s read the data.
--
-- Answers: 202 {"accepted": n, "message_ids": [...], "duplicates": k} (k: ids already
-- published within 24 h, not published again). Refused, nothing published, a JSON
-- {"error": "..."} saying what is wrong and where: 400 (not JSON, not an object, a field
-- missing or of the wrong type, a bad type/session/id), 401 (signature),
-- 413 (too large), 503 + Retry-After when publishing fails (the store or broker is down;
-- the ids published before the failure are in the answer: with a message_id source the
-- sender's retry publishes the rest once). Each refusal is logged (warn) with its reason.
--
-- Numbers: each event is published as the very bytes the sender sent (the body, or its
-- element of a batch), so 12345678901234567 and [] arrive unchanged. Where the payload is
-- a table this module built instead -- `transform`'s result, a CloudEvent's data -- it is
-- encoded by lua-cjson, which keeps 14 significant digits: such a request with a longer
-- integer is refused (400: send it as a string) rather than changed. So is a session,
-- message or correlation id `field` holding an integer past 2^53, which no Lua number holds
-- exactly.
local cjson = require("cjson.safe")
local mw = require("adapters.middleware")

local M = {}

local DEFAULT_MAX_BODY = 1024 * 1024
local DEFAULT_MAX_BATCH = 100

local ROUTE_OPTS = { path = true, method = true, event_type = true, types = true, session = true,
                     message_id = true, correlation_id = true, fields = true, max_body = true, batch = true,
                     max_batch = true, transform = true, signature = true, cloudevents = true }
local SERVE_OPTS = { port = true, host = true }
for k in pairs(ROUTE_OPTS) do SERVE_OPTS[k] = true end

local SIGNATURE_OPTS = { secret = true, header = true, prefix = true, hmac = true }

---------------------------------------------------------------------------- configuration
-- { field = "a.b" } | { header = "Name" } -> { field = parts/path } | { header = lower-case name }
local function compile_source(v, name, what, level, allow_string)
  if allow_string and type(v) == "string" then
    if v == "" then error(("%s: `%s` must not be empty"):format(what, name), level + 1) end
    return { fixed = v }
  end
  local shape = allow_string and "a string, { field = \"a.b\" } or { header = \"Name\" }"
                or "{ field = \"a.b\" } or { header = \"Name\" }"
  if type(v) ~= "table" then
    error(("%s: `%s` must be %s, got %s"):format(what, name, shape, type(v)), level + 1)
  end
  local n = 0
  for k in pairs(v) do
    n = n + 1
    if k ~= "field" and k ~= "header" then
      error(("%s: `%s` must be %s; unknown key %s"):format(what, name, shape, tostring(k)), level + 1)
    end
  end
  if n ~= 1 then error(("%s: `%s` must be %s (exactly one of them)"):format(what, name, shape), level + 1) end
  if v.field ~= nil then
    if type(v.field) ~= "string" or v.field == "" or v.field:find("%.%.") or v.field:find("^%.") or v.field:find("%.$") then
      error(("%s: `%s.field` must be a field name or dotted path like \"order.id\""):format(what, name), level + 1)
    end
    return { field = v.field }
  end
  if type(v.header) ~= "string" or not v.header:match("^[!#$%%&'*+.^_`|~%w-]+$") then
    error(("%s: `%s.header` must be an HTTP header name like \"X-Customer-Id\""):format(what, name), level + 1)
  end
  return { header = v.header:lower(), header_name = v.header }
end

local function describe_source(src, name)
  if src.field then return ("%s field %s"):format(name, src.field) end
  return ("%s header %s"):format(name, src.header_name)
end

-- The HMAC provider: opts.hmac (an override), else the host's nimbus.crypto.hmac_sha256.
local function hmac_provider(sig, what, level)
  if sig.hmac ~= nil then
    if type(sig.hmac) ~= "function" then
      error(what .. ": `signature.hmac` must be a function(secret, body) returning the HMAC-SHA256 digest", level + 1)
    end
    return sig.hmac
  end
  return require("nimbus").crypto.hmac_sha256
end

local function compile_signature(sig, what, level)
  if type(sig) ~= "table" then error(what .. ": `signature` must be a table { secret = ... }", level + 1) end
  mw.check_options(sig, SIGNATURE_OPTS, what .. " signature", level + 1)
  local secrets = sig.secret
  if type(secrets) == "string" then secrets = { secrets } end
  if type(secrets) ~= "table" or #secrets == 0 then
    error(what .. ": `signature.secret` is required: the shared secret (a string, or a list of them while you "
          .. "rotate it)", level + 1)
  end
  for i, s in ipairs(secrets) do
    if type(s) ~= "string" or s == "" then
      error(("%s: `signature.secret`[%d] must be a non-empty string (is the environment variable set?)")
        :format(what, i), level + 1)
    end
  end
  local header = sig.header or "X-Signature"
  if type(header) ~= "string" or not header:match("^[!#$%%&'*+.^_`|~%w-]+$") then
    error(what .. ": `signature.header` must be an HTTP header name", level + 1)
  end
  local prefix = sig.prefix
  if prefix == nil then prefix = "sha256=" end
  if type(prefix) ~= "string" then error(what .. ": `signature.prefix` must be a string (\"\" for none)", level + 1) end
  return { secrets = secrets, header = header:lower(), header_name = header, prefix = prefix,
           hmac = hmac_provider(sig, what, level + 1) }
end

-- level: as error()'s, seen from the public function that calls compile (2: its caller)
local function compile(opts, what, level, known)
  level = level + 1
  mw.check_options(opts, known, what, level)
  local cfg = { what = what }
  if type(opts.path) ~= "string" or opts.path:sub(1, 1) ~= "/" then
    error(what .. ": `path` is required: the route's path, like \"/hooks/orders\"", level)
  end
  cfg.path = opts.path
  cfg.method = opts.method or "POST"
  if type(cfg.method) ~= "string" or not cfg.method:match("^[A-Z]+$") then
    error(what .. ": `method` must be an upper-case HTTP method like \"POST\"", level)
  end
  cfg.cloudevents = opts.cloudevents == true
  if opts.cloudevents ~= nil and type(opts.cloudevents) ~= "boolean" then
    error(what .. ": `cloudevents` must be true or false", level)
  end
  if opts.event_type == nil then
    if not cfg.cloudevents then
      error(what .. ": `event_type` is required: a type name, { field = \"a.b\" } or { header = \"Name\" }", level)
    end
  else
    cfg.event_type = compile_source(opts.event_type, "event_type", what, level, true)
  end
  if opts.types ~= nil then
    if type(opts.types) ~= "table" or #opts.types == 0 then
      error(what .. ": `types` must be a list of the event types this webhook accepts", level)
    end
    cfg.types = {}
    for i, t in ipairs(opts.types) do
      if type(t) ~= "string" or t == "" then error(("%s: `types`[%d] must be a non-empty string"):format(what, i), level) end
      cfg.types[t] = true
    end
    cfg.types_list = table.concat(opts.types, ", ")
  end
  for _, name in ipairs({ "session", "message_id", "correlation_id" }) do
    if opts[name] ~= nil then cfg[name] = compile_source(opts[name], name, what, level, false) end
  end
  if opts.fields ~= nil then cfg.fields = mw.compile_fields(opts.fields, what, level) end
  local max_body = opts.max_body or DEFAULT_MAX_BODY
  if math.type(max_body) ~= "integer" or max_body < 1 then
    error(what .. ": `max_body` must be a positive integer (bytes)", level)
  end
  cfg.max_body = max_body
  if opts.batch ~= nil and type(opts.batch) ~= "boolean" then error(what .. ": `batch` must be true or false", level) end
  cfg.batch = opts.batch == true
  local max_batch = opts.max_batch or DEFAULT_MAX_BATCH
  if math.type(max_batch) ~= "integer" or max_batch < 1 then
    error(what .. ": `max_batch` must be a positive integer", level)
  end
  cfg.max_batch = max_batch
  if opts.transform ~= nil and type(opts.transform) ~= "function" then
    error(what .. ": `transform` must be a function(body, req) returning the payload table", level)
  end
  cfg.transform = opts.transform
  if opts.signature ~= nil then cfg.signature = compile_signature(opts.signature, what, level) end
  return cfg
end

---------------------------------------------------------------------------- signature
local function crypto() return require("nimbus").crypto end

-- Compared in constant time (no early exit), so the time taken says nothing about how much
-- of a guessed signature was right.
local function same(a, b) return crypto().equal(a, b) end

local function digest_hex(sig, secret, body)
  local d = sig.hmac(secret, body)
  if type(d) == "string" and #d == 32 then return crypto().hex(d) end
  if type(d) == "string" and #d == 64 and d:match("^%x+$") then return d:lower() end
  error(("webhook_ingress: the HMAC function returned %s; expected the 32-byte HMAC-SHA256 digest or its 64 hex "
         .. "digits"):format(type(d) == "string" and (#d .. " bytes") or type(d)), 0)
end

-- nil when the signature holds, else the reason for the 401
local function verify(sig, req, body)
  local given = req.headers[sig.header]
  local expect = ("%s<64 hex digits of HMAC-SHA256(secret, body)>"):format(sig.prefix)
  if given == nil or given == "" then
    return ("the %s header is missing: sign the raw body and send %s: %s"):format(sig.header_name, sig.header_name, expect)
  end
  local p = #sig.prefix
  if given:sub(1, p):lower() ~= sig.prefix:lower() or not given:sub(p + 1):match("^%x+$") or #given - p ~= 64 then
    return ("the %s header is malformed: expected %s"):format(sig.header_name, expect)
  end
  local theirs = given:sub(p + 1):lower()
  local ok = false
  for _, secret in ipairs(sig.secrets) do
    if same(digest_hex(sig, secret, body), theirs) then ok = true end   -- no early exit either
  end
  if not ok then
    return ("the %s header does not match the body: it is not the HMAC-SHA256 of these bytes with the shared "
            .. "secret (was the body changed, or is the secret different?)"):format(sig.header_name)
  end
  return nil
end

---------------------------------------------------------------------------- items
-- A value from a source: string (non-empty) | nil, problem
local function resolve(src, name, body, req)
  local v
  if src.fixed then return src.fixed end
  if src.field then v = mw.get(body, src.field) else v = req.headers[src.header] end
  if v == nil or v == cjson.null or v == "" then return nil, describe_source(src, name) .. " is missing" end
  if type(v) == "number" and (v >= 2^53 or v <= -2^53) then
    return nil, ("%s holds an integer too large for a Lua number to hold exactly (more than 2^53): send it as a "
                 .. "JSON string"):format(describe_source(src, name))
  end
  if type(v) == "number" and math.tointeger(v) then return tostring(math.tointeger(v)) end
  if type(v) ~= "string" then
    return nil, ("%s must be a string or an integer (got %s)"):format(describe_source(src, name), type(v))
  end
  return v
end

local function valid_id(v)
  return #v <= 200 and utf8.len(v) ~= nil
end

-- One element's event: { type, payload, session, message_id, correlation_id } | nil, problems
-- base: what the body itself (a CloudEvent) gave; index: its place in a batch (or nil).
local function item(cfg, req, payload, base, index)
  local problems = {}
  local prefix = index and ("[%d]."):format(index) or ""
  if type(payload) ~= "table" or payload == cjson.null or (payload[1] ~= nil) then
    local got = payload == cjson.null and "null" or type(payload) == "table" and "an array" or type(payload)
    return nil, { ("%sthe body must be a JSON object, got %s"):format(index and ("[%d]: "):format(index) or "", got) }
  end
  if cfg.fields then
    for _, p in ipairs(mw.check_fields(payload, cfg.fields, prefix)) do problems[#problems + 1] = p end
  end
  local out = { payload = payload }
  for _, name in ipairs({ "event_type", "session", "message_id", "correlation_id" }) do
    local src = cfg[name]
    if src then
      local v, why = resolve(src, name, payload, req)
      if v == nil then
        -- an absent correlation id is no fault: the host makes one
        if not (name == "correlation_id" and why:find(" is missing$")) then problems[#problems + 1] = prefix .. why end
      else
        if name == "message_id" and src.header and index then v = v .. "#" .. index end
        out[name] = v
      end
    elseif base then
      out[name] = base[name]
    end
  end
  if out.event_type and cfg.types and not cfg.types[out.event_type] then
    problems[#problems + 1] = ("%sevent type %q is not one this webhook takes (%s)")
      :format(prefix, out.event_type, cfg.types_list)
  end
  if out.message_id and not valid_id(out.message_id) then
    problems[#problems + 1] = prefix .. "the message id must be 1 to 200 bytes of UTF-8"
  end
  if #problems > 0 then return nil, problems end
  if cfg.transform then
    local p, why = cfg.transform(payload, req)
    if type(p) ~= "table" then
      local where = index and ("[%d]: "):format(index) or ""
      return nil, { where .. (why and tostring(why) or "transform returned no payload table") }
    end
    out.payload = p
  end
  return out
end

-- The texts of a JSON array's elements, in order, as the bytes they are in `text` (already
-- checked to be a valid JSON array): each event of a batch is published unchanged.
local function array_elements(text)
  local out, depth, start = {}, 0, nil
  local i, len = text:find("[", 1, true) + 1, #text
  while i <= len do
    local c = text:sub(i, i)
    if c == '"' then
      start = start or i
      i = i + 1
      while true do   -- to the closing quote, past escapes
        local q = text:find('["\\]', i)
        if text:sub(q, q) == "\\" then i = q + 2 else i = q; break end
      end
    elseif c == "{" or c == "[" then
      start = start or i
      depth = depth + 1
    elseif (c == "}" or c == "]") and depth > 0 then
      depth = depth - 1
    elseif (c == "," or c == "]") and depth == 0 then
      if start then out[#out + 1] = text:sub(start, i - 1):match("^(.-)%s*$") end
      start = nil
      if c == "]" then break end
    elseif not c:find("%s") then
      start = start or i
    end
    i = i + 1
  end
  return out
end

-- The request's events, or nil, status, message.
local function items_of(cfg, req, body)
  local bodies, bases, raws = {}, {}, {}   -- raws[i]: the JSON text of bodies[i], published as is
  local batch = false
  if cfg.cloudevents then
    local ce = require("adapters.cloudevents")
    local events, err = ce.from_http(req)
    if not events then return nil, 400, "not a valid CloudEvent: " .. err end
    batch = #events > 1 or (req.headers["content-type"] or ""):lower():find(ce.BATCH, 1, true) ~= nil
    if batch and not cfg.batch then
      return nil, 400, "a CloudEvents batch came, and this webhook takes one event per request"
    end
    for i, ev in ipairs(events) do
      local etype, payload, popts = ce.to_publish(ev)
      if not etype then
        return nil, 400, (batch and ("[%d]: "):format(i) or "") .. payload
      end
      bodies[i] = payload
      bases[i] = { event_type = etype, session = popts.session, message_id = popts.message_id }
    end
  else
    if body == "" then return nil, 400, "the body is empty: send one JSON object (Content-Type: application/json)" end
    -- transform's table is encoded by lua-cjson: refuse what that would change
    local lossy = cfg.transform and mw.lossy_number(body)
    if lossy then return nil, 400, mw.lossy_number_message(lossy) end
    local v, err = mw.decode_json(body)
    if v == nil then
      return nil, 400, ("the body is not JSON (malformed JSON body: %s): send one JSON object (Content-Type: "
                        .. "application/json)"):format(err)
    end
    if body:find("^%s*%[") then
      if not cfg.batch then
        return nil, 400, "the body is a JSON array, and this webhook takes one JSON object per request"
      end
      batch = true
      for i, x in ipairs(v) do bodies[i] = x end
      if not cfg.transform then raws = array_elements(body) end
    elseif type(v) ~= "table" then
      return nil, 400, ("the body must be a JSON object, got a %s"):format(type(v) == "userdata" and "null" or type(v))
    else
      bodies[1] = v
      if not cfg.transform then raws = { body } end
    end
  end
  if batch and #bodies == 0 then return nil, 400, "the batch is empty: nothing to publish" end
  if batch and #bodies > cfg.max_batch then
    return nil, 413, ("the batch holds %d events; this webhook takes at most %d per request (max_batch)")
      :format(#bodies, cfg.max_batch)
  end
  local out, problems = {}, {}
  for i, b in ipairs(bodies) do
    local it, why = item(cfg, req, b, bases[i], batch and i or nil)
    if it then
      it.raw = raws[i]
      out[i] = it
    else for _, p in ipairs(why) do problems[#problems + 1] = p end end
  end
  if #problems > 0 then
    return nil, 400, "the body does not match what this webhook takes: " .. table.concat(problems, "; ")
  end
  return out
end

---------------------------------------------------------------------------- the route
local function refuse(cfg, req, status, msg, headers)
  require("nimbus").log.warn("webhook refused", { route = cfg.method .. " " .. cfg.path, status = status, reason = msg })
  return status, { error = msg }, headers
end

local function handle(cfg, req)
  local nimbus = require("nimbus")
  local body = req.body or ""
  if #body > cfg.max_body then
    return refuse(cfg, req, 413, ("the body is %d bytes; this webhook takes at most %d (max_body)")
      :format(#body, cfg.max_body))
  end
  if cfg.signature then
    local why = verify(cfg.signature, req, body)
    if why then return refuse(cfg, req, 401, why) end
  end
  local items, status, msg = items_of(cfg, req, body)
  if not items then return refuse(cfg, req, status, msg) end
  local ids, dups = {}, 0
  for i, it in ipairs(items) do
    local id, dup_or_err = nimbus.publish(it.event_type, it.raw or it.payload, { session = it.session,
      message_id = it.message_id, correlation_id = it.correlation_id })
    if not id then
      local text = ("publishing failed after %d of %d events: %s; retry later"):format(i - 1, #items,
        tostring(dup_or_err))
      nimbus.log.error("webhook not fully published", { route = cfg.method .. " " .. cfg.path, reason = text })
      return 503, { error = text, message_ids = ids }, { ["Retry-After"] = "5" }
    end
    ids[i] = id
    if dup_or_err == true then dups = dups + 1 end
  end
  return 202, { accepted = #ids, message_ids = ids, duplicates = dups }
end

-- ingress.route(opts) -> "METHOD /path", handler(req)
function M.route(opts)
  local cfg = compile(opts, "webhook_ingress.route", 2, ROUTE_OPTS)
  return cfg.method .. " " .. cfg.path, function(req) return handle(cfg, req) end
end

-- ingress.serve(opts) -> server | nil, message, code
function M.serve(opts)
  local what = "webhook_ingress.serve"
  local cfg = compile(opts, what, 2, SERVE_OPTS)
  if opts.port == nil then error(what .. ": `port` is required (0 picks a free port: srv.port)", 2) end
  local key = cfg.method .. " " .. cfg.path
  local handler = function(req) return handle(cfg, req) end
  -- Headroom over max_body, so a body somewhat too large gets this module's 413 naming
  -- the limit; a far larger one is refused by the server before it is read.
  local server_max = math.max(cfg.max_body * 2, cfg.max_body + 65536)
  local ok, srv, err, code = pcall(require("nimbus").http.serve, { host = opts.host, port = opts.port,
    max_body = server_max, routes = { [key] = handler } })
  if not ok then error(what .. ": " .. tostring(srv), 2) end   -- a bad host or port
  return srv, err, code
end

M._same = same
M._array_elements = array_elements
return M

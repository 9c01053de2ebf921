-- nimbus.http.request: an HTTP client call that yields the running task until the
-- response arrives (libcurl's multi interface on the host's loop).
local core = require("nimbus.http.core")
local cjson = require("cjson.safe")

local M = {}

local Response = {}
Response.__index = Response

-- Decodes a JSON body; returns nil, message for an empty or malformed one.
function Response:json()
  if self.body == nil or self.body == "" then return nil, "empty body" end
  -- the runtime's decoder: integral numbers come back as integers, as in payloads
  local v, err = require("nimbus.internal").decode(self.body)
  if v == nil then return nil, "malformed JSON: " .. tostring(err) end
  return v
end

local methods = { GET = true, POST = true, PUT = true, PATCH = true, DELETE = true, HEAD = true, OPTIONS = true }

-- res = nimbus.http.request{ method = "PUT", url = ..., headers = {...}, body = "..." | json = {...},
--                            timeout = seconds (default 30) }
-- Returns { status, headers, body } (res:json() decodes), or nil, message, code for an
-- expected failure: "ETIMEDOUT", "ECONNREFUSED", "ENOTFOUND", "ECONNRESET", "ETLS", "EINVAL", ...
-- An HTTP error status (404, 500) is a response, not a failure.
function M.request(opts)
  if type(opts) ~= "table" then error("nimbus.http.request expects a table { method, url, ... }", 2) end
  local method = (opts.method or "GET"):upper()
  if not methods[method] then error("nimbus.http.request: unsupported method " .. tostring(opts.method), 2) end
  if type(opts.url) ~= "string" or not opts.url:match("^https?://") then
    error("nimbus.http.request: url must be an http:// or https:// URL, got " .. tostring(opts.url), 2)
  end
  if opts.body ~= nil and opts.json ~= nil then error("nimbus.http.request: give body or json, not both", 2) end
  if opts.headers ~= nil and type(opts.headers) ~= "table" then error("nimbus.http.request: headers must be a table", 2) end
  if opts.timeout ~= nil and (type(opts.timeout) ~= "number" or opts.timeout <= 0) then
    error("nimbus.http.request: timeout must be a positive number of seconds", 2)
  end
  local headers, body = {}, opts.body
  for k, v in pairs(opts.headers or {}) do headers[k] = v end
  if opts.json ~= nil then
    local err
    body, err = cjson.encode(opts.json)
    if not body then error("nimbus.http.request: json cannot be encoded: " .. tostring(err), 2) end
    local has_ct = false
    for k in pairs(headers) do if k:lower() == "content-type" then has_ct = true end end
    if not has_ct then headers["Content-Type"] = "application/json" end
  elseif body ~= nil and type(body) ~= "string" then
    error("nimbus.http.request: body must be a string (use json = {...} for tables)", 2)
  end
  local status, resp_headers, resp_body = core.request(method, opts.url, headers, body, opts.timeout)
  if not status then return nil, resp_headers, resp_body end
  return setmetatable({ status = status, headers = resp_headers, body = resp_body }, Response)
end

return M

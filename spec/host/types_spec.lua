-- lua/types (the LuaLS ---@meta definitions editors use) against the runtime itself,
-- inside the host: every public function of nimbus, its classes (endpoint, ctx, checker,
-- task, HTTP request/response/server, sqlite db) and nimbus.testing has a definition, and
-- every definition names a function that exists. "Public": a function-valued field whose
-- name does not start with "_".
local nimbus = require("nimbus")
local internal = require("nimbus.internal")
local testing = require("nimbus.testing")

local root = debug.getinfo(1, "S").source:match("^@(.-)/?spec/host/[^/]*$")
if root == nil or root == "" then root = "." end
local TYPES = root .. "/lua/types"
local FILES = { "nimbus.lua", "nimbus/sqlite.lua", "nimbus/testing.lua" }

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Definitions in a ---@meta file: "Class.fn" / "Class:method" for every `function V.x(`
-- or `function V:x(` where V is the local a `---@class Class` annotation names.
local function definitions(text, into)
  into = into or {}
  local class_of, pending = {}, nil
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local class = line:match("^%-%-%-@class%s+([%w_.]+)")
    if class then pending = class end
    local var = line:match("^local%s+([%w_]+)%s*=%s*{}")
    if var and pending then
      class_of[var] = pending
      pending = nil
    elseif not line:match("^%-%-%-") then
      local assigned = line:match("^([%w_.]+)%s*=%s*{}")
      if assigned and pending then class_of[assigned] = pending end
      if not line:match("^%s*$") then pending = nil end
    end
    local var_path, sep, name = line:match("^function%s+([%w_.]+)([.:])([%w_]+)%s*%(")
    if var_path then
      local head, rest = var_path:match("^([%w_]+)(.*)$")
      local class_name = class_of[head] or head
      into[class_name .. rest .. sep .. name] = true
    end
  end
  return into
end

-- Runtime functions of table t as "prefix.name" (or "prefix:name" for methods),
-- descending into plain sub-tables.
local function functions_of(t, prefix, sep, into, seen)
  into, seen = into or {}, seen or {}
  if seen[t] then return into end
  seen[t] = true
  for k, v in pairs(t) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" then
      if type(v) == "function" then
        into[prefix .. sep .. k] = true
      elseif type(v) == "table" then
        functions_of(v, prefix .. sep .. k, ".", into, seen)
      end
    end
  end
  return into
end

local function compare(runtime, defined)
  local missing, extra = {}, {}
  for k in pairs(runtime) do if not defined[k] then missing[#missing + 1] = k end end
  for k in pairs(defined) do if not runtime[k] then extra[#extra + 1] = k end end
  table.sort(missing)
  table.sort(extra)
  return missing, extra
end

-- The runtime's classes: method tables reached the way an adapter reaches their objects.
local function runtime_functions()
  local out = functions_of(nimbus, "nimbus", ".", {})
  local reg = debug.getregistry()
  functions_of(internal.classes.Endpoint, "nimbus.Endpoint", ":", out)
  functions_of(internal.classes.Ctx, "nimbus.Ctx", ":", out)
  functions_of(internal.classes.Checker, "nimbus.Checker", ":", out)
  functions_of(reg["nimbus.task"].__index, "nimbus.Task", ":", out)
  functions_of(reg["nimbus.every"].__index, "nimbus.Every", ":", out)
  functions_of(reg["nimbus.sqlite.db"].__index, "nimbus.sqlite.Db", ":", out)
  -- a real round trip for the HTTP objects: a server, a request to it, its response
  nimbus.run(function()
    local seen_req
    local srv = assert(nimbus.http.serve{ port = 0, routes = {
      ["GET /t"] = function(req) seen_req = req; return 200, { ok = true } end } })
    local res = assert(nimbus.http.request{ url = ("http://127.0.0.1:%d/t"):format(srv.port), timeout = 5 })
    srv:close()
    functions_of(getmetatable(res).__index, "nimbus.http.Response", ":", out)
    functions_of(getmetatable(seen_req).__index, "nimbus.http.Request", ":", out)
    functions_of(getmetatable(srv).__index, "nimbus.http.Server", ":", out)
  end)
  functions_of(testing, "nimbus.testing", ".", out)
  functions_of(getmetatable(testing.load(function() end)).__index, "nimbus.testing.App", ":", out)
  return out
end

describe("lua/types (LuaLS definitions)", function()
  it("finds what is missing and what is extra (the comparison can fail)", function()
    local defined = definitions([[
---@class nimbus.Thing
local Thing = {}
function Thing:kept() end
function Thing:gone() end
]])
    local missing, extra = compare({ ["nimbus.Thing:kept"] = true, ["nimbus.Thing:new"] = true }, defined)
    assert.are.same({ "nimbus.Thing:new" }, missing)
    assert.are.same({ "nimbus.Thing:gone" }, extra)
  end)

  it("defines every public function of the runtime, and nothing else", function()
    local defined = {}
    for _, f in ipairs(FILES) do definitions(read(TYPES .. "/" .. f), defined) end
    local runtime = runtime_functions()
    local missing, extra = compare(runtime, defined)
    assert(#missing == 0, "no definition in lua/types for: " .. table.concat(missing, ", "))
    assert(#extra == 0, "lua/types defines functions the runtime does not have: " .. table.concat(extra, ", "))
    -- the walk saw the classes it had to see (a wrong registry name would make it vacuous)
    for _, k in ipairs({ "nimbus.endpoint", "nimbus.Endpoint:on", "nimbus.Ctx:mark_pending_handoff",
                         "nimbus.Checker:complete", "nimbus.Task:wait", "nimbus.Task:cancel", "nimbus.Every:cancel",
                         "nimbus.http.Response:json", "nimbus.http.Request:json", "nimbus.http.Server:close",
                         "nimbus.sqlite.open", "nimbus.sqlite.Db:tx", "nimbus.testing.load",
                         "nimbus.testing.App:send", "nimbus.now", "nimbus.json.decode", "nimbus.log.info" }) do
      assert(runtime[k], "the runtime walk did not see " .. k)
    end
  end)

  it("marks every file as ---@meta, the module files with the name require() uses", function()
    assert.matches("^%-%-%-@meta nimbus\n", read(TYPES .. "/nimbus.lua"))
    assert.matches("^%-%-%-@meta nimbus%.sqlite\n", read(TYPES .. "/nimbus/sqlite.lua"))
    assert.matches("^%-%-%-@meta nimbus%.testing\n", read(TYPES .. "/nimbus/testing.lua"))
  end)
end)

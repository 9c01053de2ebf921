-- nimbus.options: the option schemas of the nimbus API and their checking, with "did you
-- mean" for a misspelt name. lua/nimbus/init.lua raises (or, under `nimbus-host check`,
-- records) what validate reports, at the adapter's own line. The endpoint schema mirrors
-- the host's own parser (host/src/dispatch/nh_endpoint.c), which checks again at start.
--
--   local options = require("nimbus.options")
--   local problems = {}
--   options.validate({ concurency = 5 }, options.ENDPOINT, "nimbus.endpoint(Erp)", "",
--                    function(msg) problems[#problems + 1] = msg end)
--   -- problems[1]: 'nimbus.endpoint(Erp): unknown option concurency (did you mean concurrency?);
--   --              the valid options are: concurrency, lock, retry, ...'
--   options.suggest("retyr", { "retry", "lock" })   -- "retry"
local M = {}

-- Edit distance with transpositions (optimal string alignment), for "did you mean":
-- option names are short, and a swapped pair of letters is the commonest typo.
local function distance(a, b)
  local d = {}
  for i = 0, #a do d[i] = { [0] = i } end
  for j = 0, #b do d[0][j] = j end
  for i = 1, #a do
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local v = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        v = math.min(v, d[i - 2][j - 2] + 1)
      end
      d[i][j] = v
    end
  end
  return d[#a][#b]
end

-- Whether every part of a snake_case word is a part of name ("external_id" and
-- "external_job_id"): a word left out is the other common slip.
local function parts_of(name)
  local set, n = {}, 0
  for p in name:gmatch("[^_]+") do set[p], n = true, n + 1 end
  return set, n
end

local function parts_in(word, name)
  local have = parts_of(name)
  local want, n = parts_of(word)
  if n < 2 then return false end
  for p in pairs(want) do if not have[p] then return false end end
  return true
end

-- The closest of `names` to `word` when it is close enough to be a typo of it.
function M.suggest(word, names)
  if type(word) ~= "string" or word == "" then return nil end
  local lw, best, best_d = word:lower(), nil, math.huge
  for _, n in ipairs(names) do
    local d = distance(lw, n:lower())
    if d < best_d then best, best_d = n, d end
  end
  local allowed = #word <= 3 and 1 or #word <= 8 and 2 or 3
  if best and best_d <= allowed then return best end
  for _, n in ipairs(names) do
    if parts_in(lw, n:lower()) then return n end
  end
  return nil
end

-- "what: unknown option retry.max_retires (did you mean retry.max_retries?); the valid
-- options of retry are: ..."
function M.unknown_option(what, path, key, names)
  local name = type(key) == "string" and key or ("[" .. tostring(key) .. "]")
  local hint = M.suggest(key, names)
  return ("%s: unknown option %s%s%s; the valid options%s are: %s"):format(what, path, name,
    hint and (" (did you mean " .. path .. hint .. "?)") or "",
    path == "" and "" or (" of " .. path:sub(1, -2)), table.concat(names, ", "))
end

-- Option schemas: an ordered list of { name, check } where check(value) returns nil or
-- what the value must be. Nested tables are { name, schema = {...} }.
local function seconds(min)
  return function(v)
    if type(v) ~= "number" or v < min or v ~= v then return ("a number of seconds >= %g"):format(min) end
  end
end
local function integer(min, max)
  return function(v)
    if math.type(v) ~= "integer" or v < min or v > max then return ("an integer from %d to %d"):format(min, max) end
  end
end
local function power_of_two(max)
  return function(v)
    if math.type(v) ~= "integer" or v < 1 or v > max or v & (v - 1) ~= 0 then
      return ("a power of two from 1 to %d (1, 2, 4, ...)"):format(max)
    end
  end
end
local function one_of(...)
  local names = { ... }
  return function(v)
    for _, n in ipairs(names) do if v == n then return nil end end
    return "one of " .. table.concat(names, ", ")
  end
end
local function of_type(t, what)
  return function(v) if type(v) ~= t then return what end end
end
local function strings(v)
  if type(v) ~= "table" then return "a list of event types" end
  for _, s in ipairs(v) do if type(s) ~= "string" then return "a list of event types (strings)" end end
end

local POLICY = {
  { "max_retries", integer(0, 1000) }, { "strategy", one_of("fixed", "linear", "exponential") },
  { "base", seconds(0) }, { "max_delay", seconds(0) }, { "jitter", one_of("none", "full", "bounded") },
  { "jitter_factor", of_type("number", "a number") },
}
local function with(base, more)
  local out = {}
  for _, f in ipairs(base) do out[#out + 1] = f end
  for _, f in ipairs(more) do out[#out + 1] = f end
  return out
end

M.ENDPOINT = {
  { "concurrency", integer(1, 100000) },
  { "lock", schema = { { "duration", seconds(0.1) }, { "renew_max", seconds(0) } } },
  { "retry", schema = with(POLICY, {
      { "rules", list = with(POLICY, { { "match", of_type("string", "a string (matched in the error text)"),
                                         required = true }, { "types", strings } }) },
      { "types", map = POLICY } }) },
  { "transient", schema = { { "max_attempts", integer(1, 100000) }, { "base", seconds(0) }, { "max_delay", seconds(0) } } },
  { "inbox", of_type("boolean", "true or false") },
  { "timeout", seconds(0.001) },
  { "cpu_budget", seconds(0.001) },
  { "partitions", power_of_two(256) },
  { "sessions", integer(0, 256) },
}
M.HANDLER = { { "is_alive", of_type("function", "a function(ctx) returning true while the work progresses") } }
M.CHECKER = { { "every", seconds(0.001), required = true }, { "timeout", seconds(0.001) } }
M.EVERY = { { "timeout", seconds(0.001) }, { "name", of_type("string", "a string") } }
M.PUBLISH = { { "session" }, { "correlation_id" }, { "to" }, { "message_id" } }
M.REQUEST = { { "timeout" }, { "session" } }
M.HANDOFF = { { "reason" }, { "external_job_id" }, { "expected_by" } }

function M.names_of(schema)
  local names = {}
  for i, f in ipairs(schema) do names[i] = f[1] end
  return names
end

-- Checks table t against schema; report(msg) is called for every problem found (unknown
-- keys first, in a stable order). Returns how many there were.
function M.validate(t, schema, what, path, report)
  local n, by = 0, {}
  for _, f in ipairs(schema) do by[f[1]] = f end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    if not by[k] then
      report(M.unknown_option(what, path, k, M.names_of(schema)))
      n = n + 1
    end
  end
  for _, f in ipairs(schema) do
    local name, v = f[1], t[f[1]]
    local at = path .. name
    if v == nil then
      if f.required then
        report(("%s: %s is required"):format(what, at))
        n = n + 1
      end
    elseif f.schema or f.list or f.map then
      if type(v) ~= "table" then
        report(("%s: %s must be a table"):format(what, at))
        n = n + 1
      elseif f.schema then
        n = n + M.validate(v, f.schema, what, at .. ".", report)
      elseif f.list then
        for i, item in ipairs(v) do
          if type(item) ~= "table" then
            report(("%s: %s[%d] must be a table { match = ..., max_retries = ... }"):format(what, at, i))
            n = n + 1
          else
            n = n + M.validate(item, f.list, what, ("%s[%d]."):format(at, i), report)
          end
        end
      else
        for k, item in pairs(v) do
          if type(k) ~= "string" or type(item) ~= "table" then
            report(("%s: %s entries must be EventType = { max_retries = ... }"):format(what, at))
            n = n + 1
          else
            n = n + M.validate(item, f.map, what, ("%s.%s."):format(at, k), report)
          end
        end
      end
    elseif f[2] then
      local want = f[2](v)
      if want then
        report(("%s: %s must be %s, got %s"):format(what, at, want,
          type(v) == "string" and ("%q"):format(v) or tostring(v)))
        n = n + 1
      end
    end
  end
  return n
end

-- nimbus.retention{...}
M.RETENTION = { { "resolved" }, { "inbox" } }

return M

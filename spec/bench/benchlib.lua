-- Helpers shared by the benches in spec/bench (run as `nimbus-host -l spec/bench/X.lua ...`):
--   local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local B = {}

-- An integer from the environment, or the default.
function B.env_int(name, default)
  local v = tonumber(os.getenv(name) or "")
  return v and math.tointeger(v) or default
end

-- Quotes one word for sh.
function B.sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs a shell command; returns its output and exit status.
function B.sh(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end

function B.read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function B.write_file(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

-- Ends the bench with a failure the main loop reports (and cleans up after).
function B.die(msg)
  error({ bench_failure = msg }, 0)
end

-- The process runs (a zombie does not count).
function B.alive(pid)
  local st = B.read_file("/proc/" .. pid .. "/status")
  if not st then return false end
  return not st:match("\nState:%s+Z")
end

function B.mb(kb) return kb and ("%.1f MB"):format(kb / 1024) or "n/a" end

return B

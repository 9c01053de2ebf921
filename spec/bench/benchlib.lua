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

-- Runs main(), then cleanup() whatever happened; exits with main's status, or 1 with the
-- failure (a B.die message, or any error with its traceback).
function B.run(main, cleanup)
  local ok, res = xpcall(main, function(err)
    if type(err) == "table" and err.bench_failure then return err end
    return debug.traceback(tostring(err), 2)
  end)
  cleanup()
  if not ok then
    io.stderr:write("bench FAILED: " .. (type(res) == "table" and res.bench_failure or tostring(res)) .. "\n")
    os.exit(1)
  end
  os.exit(res)
end

return B

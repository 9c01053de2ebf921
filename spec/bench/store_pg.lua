-- make bench: a pump's store work through the unit of work, sqlite against PostgreSQL
-- (docs/store-backends.md), measured before hosts run on PostgreSQL.
--   nimbus-host -l spec/bench/store_pg.lua BUILD_DIR
-- Starts the project's PostgreSQL cluster (scripts/postgres.sh, under BUILD_DIR/postgres),
-- makes a fresh database, and runs BUILD_DIR/bench/nh-uow-pg-bench on it and on a fresh
-- sqlite file, alternating, BENCH_PG_ROUNDS times (default 3) per batch size: per event the
-- session's state read, the audit row and the history row, in pumps of B events. Prints each store's median rate, the round trips per pump on PostgreSQL and the
-- ratio. BENCH_PG_N events (default 20000) over 1,000 sessions.
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/benchlib.lua")
local build = assert(arg[1], "usage: store_pg.lua BUILD_DIR")
local N = B.env_int("BENCH_PG_N", 20000)
local ROUNDS = B.env_int("BENCH_PG_ROUNDS", 3)
local json = require("cjson")

local root = B.dir .. "/../.."
local pgenv = "NH_PG_DIR=" .. B.sh_quote(build .. "/postgres") .. " "
local pgsh = pgenv .. B.sh_quote(root .. "/scripts/postgres.sh")
local tool = build .. "/bench/nh-uow-pg-bench"
local db = "nh_bench_store_pg"
local dir = B.tmpdir("store-pg")

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end

local function run(store, batch)
  local out, code = B.sh(("%s --store %s --events %d --batch %d 2>&1"):format(B.sh_quote(tool), B.sh_quote(store), N, batch))
  if code ~= 0 then B.die("nh-uow-pg-bench failed: " .. out) end
  return json.decode(out:match("{.*}"))
end

local function main()
  local out, code = B.sh(pgsh .. " start 2>&1")
  if code ~= 0 then B.die("scripts/postgres.sh start failed: " .. out) end
  print(("store work per event through the unit of work: %d events over 1,000 sessions, medians of %d"):format(N, ROUNDS))
  print(("%-7s %14s %14s %8s %18s"):format("batch", "sqlite ev/s", "postgres ev/s", "ratio", "pg trips per pump"))
  for _, batch in ipairs({ 64, 256, 1024 }) do
    local lite, pg, trips = {}, {}, nil
    for round = 1, ROUNDS do
      B.sh(pgsh .. " dropdb " .. db .. " >/dev/null 2>&1")
      local url, rc = B.sh(pgsh .. " createdb " .. db .. " 2>&1")
      if rc ~= 0 then B.die("scripts/postgres.sh createdb failed: " .. url) end
      url = url:match("(postgres%S+)")
      local file = ("%s/s%d-%d.db"):format(dir, batch, round)
      local a = run(file, batch)
      local p = run(url, batch)
      lite[#lite + 1] = a.events_per_s
      pg[#pg + 1] = p.events_per_s
      trips = p.round_trips / p.pumps
    end
    local l, p = median(lite), median(pg)
    print(("%-7d %14.0f %14.0f %7.2fx %18.1f"):format(batch, l, p, p / l, trips))
  end
  return 0
end

B.run(main, function()
  B.sh(pgsh .. " dropdb " .. db .. " >/dev/null 2>&1")
  B.sh("rm -rf " .. B.sh_quote(dir))
end)

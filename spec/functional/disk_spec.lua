-- A full disk and a read-only store (issue 11, item 12): the cause is named, the advice
-- never sends the operator to another (new, empty) store, nothing is half-written, and
-- the reading commands work on a read-only store. Real file systems: a small tmpfs
-- mounted in the sandbox (the suites run as root, as CI does).
local nh = require("nh")

describe("the store's disk", function()
  local sb, mnt

  before_each(function()
    sb = nh.sandbox()
    mnt = sb:path("mnt")
    assert(nh.sh("mkdir -p " .. nh.q(mnt)) == 0)
  end)

  after_each(function()
    for _, h in ipairs(sb.hosts) do
      if h:exit_code() == nil then h:signal("KILL"); pcall(h.wait_exit, h, 10) end
    end
    nh.sh("umount " .. nh.q(mnt) .. " 2>/dev/null")
    sb:cleanup()
  end)

  local function mount(size)
    local r = nh.capture(("mount -t tmpfs -o size=%s tmpfs %s"):format(size, nh.q(mnt)))
    assert(r.code == 0, "cannot mount a tmpfs (the functional specs run as root): " .. r.err)
  end

  -- A store on the mount with one Completed event, written by a host that then stopped.
  local function store_with_one_event()
    local store = mnt .. "/store.db"
    sb:start(sb:recorder{ types = { "Ok" } }, { store = store })
    sb:cli_ok({ "publish", "Ok", '{"tag":"a"}', "--session", "s1" }, { store = store })
    nh.eventually(function()
      local rows = nh.json_lines(sb:cli_ok({ "events", "--json" }, { store = store }))
      return #rows == 1 and rows[1].status == "Completed"
    end, nh.DEADLINE, "the event to complete")
    for _, h in ipairs(sb.hosts) do h:stop() end
    return store
  end

  it("a read-only store can be read; a write names the cause and suggests no other store", function()
    mount("4m")
    local store = store_with_one_event()
    assert(nh.sh("mount -o remount,ro " .. nh.q(mnt)) == 0)
    local rows = nh.json_lines(sb:cli_ok({ "events", "--json" }, { store = store }))
    assert.equal(1, #rows)
    assert.equal("Completed", rows[1].status)
    assert.equal("0", (sb:cli_ok({ "events", "--count", "--status", "failed" }, { store = store }):match("%d+")))
    sb:cli_ok({ "show", rows[1].event_id }, { store = store })
    sb:cli_ok({ "sessions" }, { store = store })
    sb:cli_ok({ "failures" }, { store = store })
    local r = sb:cli({ "publish", "Ok", "{}" }, { store = store, transport = false })
    assert.equal(1, r.code)
    assert.matches("read%-only", r.err)
    assert.is_nil(r.err:find("another path", 1, true), r.err)
  end)

  it("a full disk names the cause, queues nothing, and the store works once space is freed", function()
    mount("1m")
    local store = store_with_one_event()
    local fill = mnt .. "/fill"
    nh.sh(("dd if=/dev/zero of=%s bs=1k count=4000 2>/dev/null"):format(nh.q(fill)))
    local big = nh.encode({ pad = string.rep("x", 60000) })
    local r
    for _ = 1, 20 do   -- the store's free pages absorb the first few
      r = sb:cli({ "publish", "Ok", big, "--session", "s2" }, { store = store, transport = false })
      if r.code ~= 0 then break end
    end
    assert.equal(1, r.code, "the disk never filled")
    -- sqlite meets the full disk either writing pages ("database or disk is full") or
    -- growing its WAL index while it opens the file (an I/O error): both name the space
    assert.truthy(r.err:find("the disk is full", 1, true) or r.err:find("check the disk and its free space", 1, true),
                  r.err)
    assert.is_nil(r.err:find("another path", 1, true), r.err)
    assert(os.remove(fill))
    local mid = sb:cli_ok({ "publish", "Ok", "{}", "--session", "s3" }, { store = store, transport = false })
    assert.truthy(mid:match("%S"))
    assert.equal(1, #nh.json_lines(sb:cli_ok({ "events", "--json" }, { store = store })), "still readable, intact")
  end)
end)

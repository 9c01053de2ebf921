-- Field-level audit rows for the fake CRM and ERP APIs (docs/crm-erp-demo.md section 1.2):
-- an insert writes one "Created" row with a JSON snapshot, a modify one "Updated" row per
-- field that really changed, isDeleted going false -> true one "Deleted" row. The
-- bookkeeping fields (id, createdAt, updatedAt, isDeleted) are never audited, and writing
-- identical values writes nothing. Call these inside the same db:tx as the entity write.
local cjson = require("cjson")

local M = {}

local SKIP = { id = true, createdAt = true, updatedAt = true, isDeleted = true }

local now_iso = require("contracts").now_iso
M.now_iso = now_iso

function M.schema(db)
  assert(db:exec([[CREATE TABLE IF NOT EXISTS audits (
    id INTEGER PRIMARY KEY, entity_type TEXT NOT NULL, entity_id TEXT NOT NULL, action TEXT NOT NULL,
    field_name TEXT, old_value TEXT, new_value TEXT, timestamp TEXT NOT NULL, origin TEXT)]]))
  assert(db:exec("CREATE INDEX IF NOT EXISTS audits_entity ON audits(entity_type, entity_id)"))
end

local function str(v)
  if v == nil or v == cjson.null then return nil end
  if type(v) == "boolean" then return v and "true" or "false" end
  return tostring(v)
end

local function insert(db, etype, id, action, field, old, new, origin)
  assert(db:exec("INSERT INTO audits(entity_type, entity_id, action, field_name, old_value, new_value, timestamp, origin)"
    .. " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", etype, id, action, field, old, new, now_iso(), origin))
end

-- fields: the ordered list of audited field names of this entity type
function M.created(db, etype, entity, fields, origin)
  local snap = {}
  for _, f in ipairs(fields) do
    if not SKIP[f] and entity[f] ~= nil then snap[f] = entity[f] end
  end
  insert(db, etype, entity.id, "Created", nil, nil, cjson.encode(snap), origin)
end

function M.updated(db, etype, old, new, fields, origin)
  local n = 0
  for _, f in ipairs(fields) do
    if not SKIP[f] and str(old[f]) ~= str(new[f]) then
      insert(db, etype, new.id, "Updated", f, str(old[f]), str(new[f]), origin)
      n = n + 1
    end
  end
  if not old.isDeleted and new.isDeleted then
    insert(db, etype, new.id, "Deleted", nil, nil, nil, origin)
    n = n + 1
  end
  return n
end

-- Audit rows of one entity, newest first (timestamp, then id, descending), camelCase.
function M.list(db, etype, id)
  local rows = assert(db:rows("SELECT id, entity_type, entity_id, action, field_name, old_value, new_value, timestamp,"
    .. " origin FROM audits WHERE entity_type = ? AND entity_id = ? ORDER BY timestamp DESC, id DESC", etype, id))
  local out = {}
  for i, r in ipairs(rows) do
    out[i] = { id = r.id, entityType = r.entity_type, entityId = r.entity_id, action = r.action,
               fieldName = r.field_name or cjson.null, oldValue = r.old_value or cjson.null,
               newValue = r.new_value or cjson.null, timestamp = r.timestamp, origin = r.origin or cjson.null }
  end
  return out
end

return M

#!lua
-- queue_group_start.lua: create a consumer group on every shard of a queue, together with the group's
-- start after a load (DESIGN §4 `g:<group>:start`, docs/queue.md "Load, then follow"), atomically:
-- a group either starts at the positions of its start or it existed before, never half of each.
--
-- KEYS: 1 the group's start hash (<prefix>:{q}:g:<group>:start), 2.. the shard streams in shard order
-- ARGV: 1 group, 2 where a group without a start begins on a shard ('0' or '$'),
--       3 positions ("id@added,..." one per shard, @added optional), 4 snapshot, 5 lsn (all three '' when the caller
--       brings no start), 6 now (Unix ms)
-- A start hash left by a group that no longer exists on any shard is deleted: a new group of that
-- name starts afresh. Shards missing the group (a stream deleted since) get it at the start's
-- position, or at ARGV[2] when the group has no start.
-- Reply: {'ok', positions, snapshot, lsn}: the group's start ('' fields when it has none);
--        {'conflict', positions, snapshot, lsn}: ARGV brings a start but the group exists with another
--          one ('' fields: it exists without one); nothing is written;
--        {'trimmed', shard}: entries added to that shard after its start position were removed (or the
--          stream is gone, or, for a position without @added, its entry is); {'ahead', shard}: the
--          position is past what the shard ever held. Nothing is written.
local group, plain = ARGV[1], ARGV[2]
local want = {ARGV[3], ARGV[4], ARGV[5]}

local function has_group(stream)
  if redis.call('EXISTS', stream) == 0 then
    return false
  end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    for j = 1, #g, 2 do
      if g[j] == 'name' and g[j + 1] == group then
        return true
      end
    end
  end
  return false
end

-- stream ids "ms-seq" compare as two numbers (ms fits a double exactly)
local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  if am ~= bm then
    return am < bm
  end
  return as < bs
end

local function stream_info(stream)
  local info, out = redis.call('XINFO', 'STREAM', stream), {}
  for j = 1, #info, 2 do
    out[info[j]] = info[j + 1]
  end
  return out
end

-- a position is "id" or "id@added" (entries ever added to the shard up to id)
local function split_position(p)
  local id, added = string.match(p, '^(%d+%-%d+)@(%d+)$')
  if id then
    return id, tonumber(added)
  end
  return p, nil
end

local have, any = {}, false
for i = 2, #KEYS do
  have[i] = has_group(KEYS[i])
  any = any or have[i]
end

local st = redis.call('HMGET', KEYS[1], 'positions', 'snapshot', 'lsn')
local create = false
if want[1] ~= '' then
  if st[1] then
    if st[1] ~= want[1] or st[2] ~= want[2] or st[3] ~= want[3] then
      return {'conflict', st[1], st[2] or '', st[3] or ''}
    end
  elseif any then
    return {'conflict', '', '', ''}
  else
    st, create = want, true
  end
elseif st[1] and not any then
  redis.call('DEL', KEYS[1])
  st = {false, false, false}
end

local pos = {}
if st[1] then
  for id in string.gmatch(st[1], '[^,]+') do
    pos[#pos + 1] = id
  end
end

if create then
  -- every entry added after a position must still be there (retention trims only a prefix of a
  -- shard, so when the position's entry is kept all later ones are; when it is gone, the entries
  -- kept must be all those added since), and a position must be one of this stream's
  for i = 2, #KEYS do
    local id, added = split_position(pos[i - 1])
    if redis.call('EXISTS', KEYS[i]) == 0 then
      if id ~= '0-0' or (added or 0) > 0 then
        return {'trimmed', tostring(i - 2)}
      end
    else
      local info = stream_info(KEYS[i])
      if id_less(info['last-generated-id'], id) or (added and info['entries-added'] < added) then
        return {'ahead', tostring(i - 2)}
      end
      if #redis.call('XRANGE', KEYS[i], id, id) == 0 then
        if added then
          if info['length'] < info['entries-added'] - added then
            return {'trimmed', tostring(i - 2)}
          end
        elseif id ~= '0-0' or info['entries-added'] > info['length'] then
          return {'trimmed', tostring(i - 2)}
        end
      end
    end
  end
  redis.call('HSET', KEYS[1], 'positions', want[1], 'snapshot', want[2], 'lsn', want[3], 'created_at', ARGV[6])
end

for i = 2, #KEYS do
  if not have[i] then
    if st[1] and pos[i - 1] then
      local id, added = split_position(pos[i - 1])
      if added and create then
        redis.call('XGROUP', 'CREATE', KEYS[i], group, id, 'MKSTREAM', 'ENTRIESREAD', added)
      else
        redis.call('XGROUP', 'CREATE', KEYS[i], group, id, 'MKSTREAM')
      end
    else
      redis.call('XGROUP', 'CREATE', KEYS[i], group, plain, 'MKSTREAM')
    end
  end
end
if st[1] then
  return {'ok', st[1], st[2], st[3]}
end
return {'ok', '', '', ''}

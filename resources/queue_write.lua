#!lua
-- queue_write.lua: write one batch to a pgrelay queue atomically (DESIGN §4, docs/batch-contract.md).
-- Every check runs before the first write (Lua has no rollback), so a refused call writes nothing.
--
-- KEYS, in this order:
--   [lease key]      only when ARGV[1] (the fence) is not empty
--   [pointer key]    only when ARGV[2] (the cover's pos) is not empty
--   meta keys        ARGV[4] of them: <prefix>:{q}:meta, one per queue of the batch
--   stream keys      ARGV[5] of them: <prefix>:{q}:s:<n>, one per (queue, shard) the batch touches
-- ARGV:
--   1 fence: the lease token that KEYS' lease key must hold ('' = not fenced)
--   2 pos: the cover's position ('' = no cover); the stored pointer's pos must be strictly below it
--   3 pointer: the new pointer JSON to SET ('' = check only, e.g. the first pieces of a split batch)
--   4 Q: number of meta keys
--   5 K: number of stream keys
--   6 N: number of messages
--   7 touch: '1' = on duplicate, rewrite the stored pointer unchanged (a write for WAIT to wait for)
--   [8 prev]: optional (the argument count says whether it is there): the pos of the batch written
--     just before this one; unless the stored pointer's pos is at or past it, nothing is written
--   then Q pairs, per meta key: the shard count the caller computed shards with, and the layout
--     version (1, 2 or 3) to create the queue with when it does not exist
--   then K pairs: meta index (1..Q), shard number n
--   then N groups of 8: stream index (1..K), p, id, tx, ts, h, d, and m's tail: the layout-2 `m` object
--     after its offset (`,"p":...}`, the writer's one encoding of it); each entry is written in its
--     queue's layout version (1: the seven fields; 2: m = '{"off":<offset>' .. tail, and d; 3: the
--     messages of each shard in order, up to 64 an entry and 64 KiB of payloads unless one alone is
--     larger (the writer's PackMessages and PackBytes), m = '[' .. the objects
--     '{"off":<offset>,"len":<payload bytes>' .. tail joined by ',' .. ']', d = the payloads)
-- Reply: 'ok', 'duplicate' (the pointer is already at or past the cover: nothing written),
-- 'fenced' (the lease key does not hold the fence: nothing written), 'behind' (prev given and the
-- stored pointer below it: the batch before is not in, nothing written).
-- Errors: 'pgrelay_shards_mismatch <meta key> <stored> <given>', 'pgrelay_layout_version <meta key> <v>'
-- (also '<meta key> off:<n> <v>' for an offset that is not one, '<stream key> <type>' for a shard key
-- that is not a stream),
-- 'pgrelay_pointer_corrupt <pointer key>', 'pgrelay_bad_args <what>'.

local fence, pos, pointer = ARGV[1], ARGV[2], ARGV[3]
local nq, nk, nm = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local touch = ARGV[7]
local k = 0
local leaseKey, pointerKey
if fence ~= '' then
  k = k + 1
  leaseKey = KEYS[k]
end
if pos ~= '' then
  k = k + 1
  pointerKey = KEYS[k]
end
local metaBase, streamBase = k, k + nq
local fixed = 7 -- ARGV before the per-queue values: 7, or 8 with prev
if #ARGV == 8 + 2 * nq + 2 * nk + 8 * nm then
  fixed = 8
end
local prev = fixed == 8 and ARGV[8] or ''
if #KEYS ~= k + nq + nk or #ARGV ~= fixed + 2 * nq + 2 * nk + 8 * nm then
  return redis.error_reply('pgrelay_bad_args key or argument count')
end

-- byte-wise a < b (Lua's < follows the locale)
local function less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- 1. the fence
if leaseKey then
  if redis.call('GET', leaseKey) ~= fence then
    return 'fenced'
  end
end

-- 2. the cover: only a strictly greater position moves the pointer
if pointerKey then
  local stored = redis.call('GET', pointerKey)
  if stored then
    local ok, doc = pcall(cjson.decode, stored)
    -- the member pos as the writer reads it (encoding/json: its name in any case); members that
    -- differ only in case must agree, as a table keeps no order for the last to win
    local sp
    if ok and type(doc) == 'table' then
      for name, v in pairs(doc) do
        if type(name) == 'string' and #name == 3 and string.lower(name) == 'pos' then
          if sp ~= nil and sp ~= v then
            sp = false
            break
          end
          sp = v
        end
      end
    end
    if type(sp) ~= 'string' then
      return redis.error_reply('pgrelay_pointer_corrupt ' .. pointerKey)
    end
    doc = {pos = sp}
    if not less(doc.pos, pos) then
      if touch == '1' then
        redis.call('SET', pointerKey, stored, 'KEEPTTL')
      end
      return 'duplicate'
    end
    if prev ~= '' and less(doc.pos, prev) then
      return 'behind'
    end
  elseif prev ~= '' then
    return 'behind'
  end
end

-- 3. each queue's layout: shard count fixed at creation, layout version 1, 2 or 3 (a new queue: the
-- version given)
local a = fixed
local create, version = {}, {}
for i = 1, nq do
  local want, wantVersion = ARGV[a + 2 * i - 1], ARGV[a + 2 * i]
  if wantVersion ~= '1' and wantVersion ~= '2' and wantVersion ~= '3' then
    return redis.error_reply('pgrelay_bad_args layout version')
  end
  local meta = KEYS[metaBase + i]
  local cur = redis.call('HMGET', meta, 'shards', 'version')
  if cur[1] then
    if cur[1] ~= want then
      return redis.error_reply('pgrelay_shards_mismatch ' .. meta .. ' ' .. cur[1] .. ' ' .. want)
    end
    if cur[2] and cur[2] ~= '1' and cur[2] ~= '2' and cur[2] ~= '3' then
      return redis.error_reply('pgrelay_layout_version ' .. meta .. ' ' .. cur[2])
    end
    version[i] = cur[2] or '1'
  else
    create[i] = want
    version[i] = wantVersion
  end
end
a = a + 2 * nq

-- 4. the next offset of every shard touched
local off, metaOf, shardOf, versionOf = {}, {}, {}, {}
for j = 1, nk do
  local mi, n = tonumber(ARGV[a + 2 * j - 1]), ARGV[a + 2 * j]
  if not mi or mi < 1 or mi > nq then
    return redis.error_reply('pgrelay_bad_args meta index')
  end
  metaOf[j], shardOf[j], versionOf[j] = KEYS[metaBase + mi], n, version[mi]
  -- as the transaction: a non-negative decimal offset (at most 18 digits), and a stream (or no key)
  local cur = redis.call('HGET', metaOf[j], 'off:' .. n) or '0'
  if #cur > 18 or not string.match(cur, '^%d+$') then
    return redis.error_reply('pgrelay_layout_version ' .. metaOf[j] .. ' off:' .. n .. ' ' .. cur)
  end
  local t = redis.call('TYPE', KEYS[streamBase + j]).ok
  if t ~= 'stream' and t ~= 'none' then
    return redis.error_reply('pgrelay_layout_version ' .. KEYS[streamBase + j] .. ' ' .. t)
  end
  off[j] = tonumber(cur)
end
a = a + 2 * nk
for m = 0, nm - 1 do
  local j = tonumber(ARGV[a + 8 * m + 1])
  if not j or j < 1 or j > nk then
    return redis.error_reply('pgrelay_bad_args stream index')
  end
end

-- writes: meta, entries, offsets, pointer
for i = 1, nq do
  if create[i] then
    redis.call('HSET', KEYS[metaBase + i], 'shards', create[i], 'version', version[i])
  end
end
-- version 3: the entry being filled per stream, written once full and at the end
local packs = {}
local function flush(j)
  local pk = packs[j]
  redis.call('XADD', KEYS[streamBase + j], '*', 'm', '[' .. table.concat(pk.m, ',') .. ']', 'd', table.concat(pk.d))
  packs[j] = nil
end
for m = 0, nm - 1 do
  local b = a + 8 * m
  local j = tonumber(ARGV[b + 1])
  off[j] = off[j] + 1
  if versionOf[j] == '3' then
    local d = ARGV[b + 7]
    local pk = packs[j]
    if pk and (#pk.m >= 64 or pk.size + #d > 65536) then
      flush(j)
      pk = nil
    end
    if not pk then
      pk = {m = {}, d = {}, size = 0}
      packs[j] = pk
    end
    pk.m[#pk.m + 1] = '{"off":' .. string.format('%d', off[j]) .. ',"len":' .. string.format('%d', #d) .. ARGV[b + 8]
    pk.d[#pk.d + 1] = d
    pk.size = pk.size + #d
  elseif versionOf[j] == '2' then
    redis.call('XADD', KEYS[streamBase + j], '*',
      'm', '{"off":' .. string.format('%d', off[j]) .. ARGV[b + 8], 'd', ARGV[b + 7])
  else
    redis.call('XADD', KEYS[streamBase + j], '*',
      'off', string.format('%d', off[j]), 'p', ARGV[b + 2], 'id', ARGV[b + 3], 'tx', ARGV[b + 4],
      'ts', ARGV[b + 5], 'h', ARGV[b + 6], 'd', ARGV[b + 7])
  end
end
for j = 1, nk do
  if packs[j] then
    flush(j)
  end
end
for j = 1, nk do
  redis.call('HSET', metaOf[j], 'off:' .. shardOf[j], string.format('%d', off[j]))
end
if pointerKey and pointer ~= '' then
  redis.call('SET', pointerKey, pointer)
end
return 'ok'

#!lua
-- queue_fail.lua: count failed attempts of a shard's messages and dead-letter the ones that reached
-- max_attempts, each atomically with its XACK (DESIGN §4, §6). Fenced by the shard lease, so a
-- consumer that lost its shard changes nothing.
--
-- KEYS: 1 the shard lease (<prefix>:{q}:g:<group>:lease:<n>), 2 the attempts hash
--       (<prefix>:{q}:g:<group>:attempts), 3 the shard stream (<prefix>:{q}:s:<n>),
--       4 the dead-letter stream (<prefix>:{q}:dlq)
-- ARGV: 1 lease token, 2 group, 3 max_attempts, 4 failed_at (Unix ms), 5 the shard number, then
--       groups of six: entry id, error, index, count, m, d. For an entry of layout 1 or 2 index is
--       '' (m and d are not used): its field in the attempts hash, "<shard>:<entry id>" (entry ids
--       repeat across shards), counts its attempts, and its dead letter copies its fields. For a
--       message of a layout-3 entry, index is its place in the entry and count the entry's
--       messages; the field holds "<index>=<attempts>" per message, comma-separated, and
--       "<index>=d" once the message is dead-lettered; its dead letter holds m (its layout-2
--       object) and d; the entry is acked only once every message in it is dead-lettered (else
--       its other messages are delivered again).
-- Reply: 'fenced', or an array with one integer per group: the attempts counted so far, negated
-- when the message was moved to the dead-letter stream (or 0, acked because its entry no longer
-- exists).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'fenced'
end
local group, maxAttempts, failedAt, shard = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]

-- deadLetter adds fields (a list) with the failure's to the dead-letter stream.
local function deadLetter(fields, err, n)
  local args = {'XADD', KEYS[4], '*'}
  for j = 1, #fields do
    args[#args + 1] = fields[j]
  end
  args[#args + 1] = 'group'
  args[#args + 1] = group
  args[#args + 1] = 'error'
  args[#args + 1] = err
  args[#args + 1] = 'attempts'
  args[#args + 1] = tostring(n)
  args[#args + 1] = 'failed_at'
  args[#args + 1] = failedAt
  redis.call(unpack(args))
end

local out = {}
for i = 6, #ARGV, 6 do
  local id, err, index, count = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local field = shard .. ':' .. id
  local entry = redis.call('XRANGE', KEYS[3], id, id)
  if #entry == 0 then
    -- trimmed or deleted while pending: nothing to retry
    redis.call('XACK', KEYS[3], group, id)
    redis.call('HDEL', KEYS[2], field)
    out[#out + 1] = 0
  elseif index == '' then
    local n = redis.call('HINCRBY', KEYS[2], field, 1)
    if n >= maxAttempts then
      deadLetter(entry[1][2], err, n)
      redis.call('XACK', KEYS[3], group, id)
      redis.call('HDEL', KEYS[2], field)
      out[#out + 1] = -n
    else
      out[#out + 1] = n
    end
  else
    -- the entry's per-message values, index -> attempts or 'd'
    local vals, order = {}, {}
    for k, v in string.gmatch(redis.call('HGET', KEYS[2], field) or '', '(%d+)=(%w+)') do
      vals[k] = v
      order[#order + 1] = k
    end
    local n = (tonumber(vals[index]) or 0) + 1
    if vals[index] == nil then
      order[#order + 1] = index
    end
    if n >= maxAttempts then
      deadLetter({'m', ARGV[i + 4], 'd', ARGV[i + 5]}, err, n)
      vals[index] = 'd'
      out[#out + 1] = -n
    else
      vals[index] = tostring(n)
      out[#out + 1] = n
    end
    local dead, parts = 0, {}
    for _, k in ipairs(order) do
      if vals[k] == 'd' then
        dead = dead + 1
      end
      parts[#parts + 1] = k .. '=' .. vals[k]
    end
    if dead >= count then
      redis.call('XACK', KEYS[3], group, id)
      redis.call('HDEL', KEYS[2], field)
    else
      redis.call('HSET', KEYS[2], field, table.concat(parts, ','))
    end
  end
end
return out

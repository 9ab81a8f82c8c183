#!lua
-- queue_fail.lua: count failed attempts of a shard's messages and dead-letter the ones that reached
-- max_attempts, each atomically with its XACK (DESIGN §4, §6). Fenced by the shard lease, so a
-- consumer that lost its shard changes nothing.
--
-- KEYS: 1 the shard lease (<prefix>:{q}:g:<group>:lease:<n>), 2 the attempts hash
--       (<prefix>:{q}:g:<group>:attempts), 3 the shard stream (<prefix>:{q}:s:<n>),
--       4 the dead-letter stream (<prefix>:{q}:dlq)
-- ARGV: 1 lease token, 2 group, 3 max_attempts, 4 failed_at (Unix ms), 5 the shard number, then
--       pairs: entry id, error. An entry's field in the attempts hash is "<shard>:<entry id>" (entry
--       ids repeat across shards).
-- Reply: 'fenced', or an array with one integer per pair: the attempts counted so far, negated when
-- the message was moved to the dead-letter stream (or acked because it no longer exists: 0).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'fenced'
end
local group, maxAttempts, failedAt, shard = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local out = {}
for i = 6, #ARGV, 2 do
  local id, err = ARGV[i], ARGV[i + 1]
  local field = shard .. ':' .. id
  local entry = redis.call('XRANGE', KEYS[3], id, id)
  if #entry == 0 then
    -- trimmed or deleted while pending: nothing to retry
    redis.call('XACK', KEYS[3], group, id)
    redis.call('HDEL', KEYS[2], field)
    out[#out + 1] = 0
  else
    local n = redis.call('HINCRBY', KEYS[2], field, 1)
    if n >= maxAttempts then
      local fields = entry[1][2]
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
      redis.call('XACK', KEYS[3], group, id)
      redis.call('HDEL', KEYS[2], field)
      out[#out + 1] = -n
    else
      out[#out + 1] = n
    end
  end
end
return out

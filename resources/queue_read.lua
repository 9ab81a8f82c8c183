#!lua
-- queue_read.lua: read a shard for its consumer group, fenced by the shard lease (DESIGN §6). A
-- replica that lost the shard reads nothing, so every entry it ever read was pending before the
-- next owner took the lease, and the next owner delivers it again from the pending entries:
-- no entry can reach the old owner after the new one has moved past it.
--
-- KEYS: 1 the shard lease (<prefix>:{q}:g:<group>:lease:<n>), 2 the shard stream (<prefix>:{q}:s:<n>)
-- ARGV: 1 lease token, 2 group, 3 consumer, 4 count, 5 id: '0' the consumer's pending entries,
--       '>' new ones
-- Reply: 'fenced' (the lease key does not hold the token: nothing read), or {last, entries} where
-- entries is XREADGROUP's list for the stream (an entry deleted while pending has no fields) and
-- last, when nothing new was read, the id of the stream's last entry ('0-0' when empty), from which
-- a blocking XREAD waits for the next one.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'fenced'
end
local res = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[2], ARGV[5])
if res and #res[1][2] > 0 then
  return {'', res[1][2]}
end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last > 0 then
  return {last[1][1], {}}
end
return {'0-0', {}}

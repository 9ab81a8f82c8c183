#!lua
-- queue_replay.lua: move dead letters back into their queue, each atomically with its removal from
-- the dead-letter stream (`pgrelay queue dlq --replay`). A replayed message gets its shard's next
-- offset and keeps its partition, id, tx, ts, h and d, written in the queue's layout version
-- (DESIGN §4) whichever version the dead letter was written in.
--
-- KEYS: 1 the queue's meta, 2 its dead-letter stream, then K shard streams
-- ARGV: 1 the shard count the caller computed shards with, 2 K, then K shard numbers,
--       then pairs: dead-letter entry id, stream index (1..K)
-- Reply: {replayed, missing} (missing: entries no longer in the dead-letter stream).
-- Errors: 'pgrelay_shards_mismatch <meta> <stored> <given>', 'pgrelay_bad_args <what>'.
local shards = redis.call('HGET', KEYS[1], 'shards')
local version = redis.call('HGET', KEYS[1], 'version') or '1'
if shards ~= ARGV[1] then
  return redis.error_reply('pgrelay_shards_mismatch ' .. KEYS[1] .. ' ' .. tostring(shards) .. ' ' .. ARGV[1])
end
local k = tonumber(ARGV[2])
if #KEYS ~= 2 + k or (#ARGV - 2 - k) % 2 ~= 0 then
  return redis.error_reply('pgrelay_bad_args key or argument count')
end
local replayed, missing = 0, 0
for i = 3 + k, #ARGV, 2 do
  local id, j = ARGV[i], tonumber(ARGV[i + 1])
  if not j or j < 1 or j > k then
    return redis.error_reply('pgrelay_bad_args stream index')
  end
  local entry = redis.call('XRANGE', KEYS[2], id, id)
  if #entry == 0 then
    missing = missing + 1
  else
    local f = {}
    local list = entry[1][2]
    for x = 1, #list, 2 do
      f[list[x]] = list[x + 1]
    end
    local n = ARGV[2 + j]
    local off = string.format('%d', redis.call('HINCRBY', KEYS[1], 'off:' .. n, 1))
    local tail = f.m and string.match(f.m, '^{"off":%d+(,.*})$')
    if version == '2' then
      if not tail then -- a layout-1 dead letter: its fields as the m object
        tail = ',"p":' .. cjson.encode(f.p or '') .. ',"id":' .. cjson.encode(f.id or '') ..
          ',"tx":' .. cjson.encode(f.tx or '') .. ',"ts":' .. string.format('%d', tonumber(f.ts) or 0)
        if f.h and f.h ~= '' then
          tail = tail .. ',"h":' .. f.h
        end
        tail = tail .. '}'
      end
      redis.call('XADD', KEYS[2 + j], '*', 'm', '{"off":' .. off .. tail, 'd', f.d or '')
    else
      if f.m then -- a layout-2 dead letter into a layout-1 queue
        local ok, m = pcall(cjson.decode, f.m)
        if ok and type(m) == 'table' then
          f.p, f.id, f.tx = m.p, m.id, m.tx
          f.ts = m.ts and string.format('%d', m.ts) or ''
          f.h = type(m.h) == 'table' and cjson.encode(m.h) or ''
        end
      end
      redis.call('XADD', KEYS[2 + j], '*', 'off', off, 'p', f.p or '', 'id', f.id or '',
        'tx', f.tx or '', 'ts', f.ts or '', 'h', f.h or '', 'd', f.d or '')
    end
    redis.call('XDEL', KEYS[2], id)
    replayed = replayed + 1
  end
end
return {replayed, missing}

#!lua
-- queue_replay.lua: move dead letters back into their queue, each atomically with its removal from
-- the dead-letter stream (`pgrelay queue dlq --replay`). A replayed message gets its shard's next
-- offset and keeps its partition, id, tx, ts, h and d, written in the queue's layout version
-- (DESIGN §4; in version 3 an entry of its own) whichever version the dead letter was written in
-- (a dead letter holds one message in version 1's or 2's fields).
--
-- KEYS: 1 the queue's meta, 2 its dead-letter stream, then K shard streams
-- ARGV: 1 the shard count the caller computed shards with, 2 K, then K shard numbers,
--       then pairs: dead-letter entry id, stream index (1..K)
-- Reply: {replayed, missing} (missing: entries no longer in the dead-letter stream).
-- Errors: 'pgrelay_shards_mismatch <meta> <stored> <given>', 'pgrelay_layout_version <meta> <version>'
-- (a layout this script does not write), 'pgrelay_bad_args <what>'.
local shards = redis.call('HGET', KEYS[1], 'shards')
local version = redis.call('HGET', KEYS[1], 'version') or '1'
if shards ~= ARGV[1] then
  return redis.error_reply('pgrelay_shards_mismatch ' .. KEYS[1] .. ' ' .. tostring(shards) .. ' ' .. ARGV[1])
end
if version ~= '1' and version ~= '2' and version ~= '3' then
  return redis.error_reply('pgrelay_layout_version ' .. KEYS[1] .. ' ' .. version)
end
local k = tonumber(ARGV[2])
if #KEYS ~= 2 + k or (#ARGV - 2 - k) % 2 ~= 0 then
  return redis.error_reply('pgrelay_bad_args key or argument count')
end

-- cont: whether b is a UTF-8 continuation byte.
local function cont(b) return b and b >= 0x80 and b <= 0xBF end

-- jstr is s as a JSON string written exactly as the queue writer writes one (Go's
-- convert.AppendString): '"', '\\' and control characters escaped, U+2028 and U+2029 as \u escapes, and each
-- byte that does not start a well-formed UTF-8 sequence as U+FFFD, so every client can decode it.
local function jstr(s)
  if not string.find(s, '[%z\1-\31"\\\127-\255]') then
    return '"' .. s .. '"'
  end
  local out, i, n = {'"'}, 1, #s
  while i <= n do
    local c = string.byte(s, i)
    if c < 0x80 then
      if c == 34 or c == 92 then out[#out + 1] = '\\' .. string.char(c)
      elseif c == 10 then out[#out + 1] = '\\n'
      elseif c == 13 then out[#out + 1] = '\\r'
      elseif c == 9 then out[#out + 1] = '\\t'
      elseif c < 0x20 or c == 0x7f then out[#out + 1] = string.format('\\u%04x', c)
      else out[#out + 1] = string.char(c) end
      i = i + 1
    else
      local c1, c2, c3 = string.byte(s, i + 1, i + 3)
      local w = 0 -- the width of the well-formed sequence at i (Unicode's table 3-7), 0: none
      if c >= 0xC2 and c <= 0xDF and cont(c1) then w = 2
      elseif c == 0xE0 and c1 and c1 >= 0xA0 and c1 <= 0xBF and cont(c2) then w = 3
      elseif ((c >= 0xE1 and c <= 0xEC) or c == 0xEE or c == 0xEF) and cont(c1) and cont(c2) then w = 3
      elseif c == 0xED and c1 and c1 >= 0x80 and c1 <= 0x9F and cont(c2) then w = 3
      elseif c == 0xF0 and c1 and c1 >= 0x90 and c1 <= 0xBF and cont(c2) and cont(c3) then w = 4
      elseif c >= 0xF1 and c <= 0xF3 and cont(c1) and cont(c2) and cont(c3) then w = 4
      elseif c == 0xF4 and c1 and c1 >= 0x80 and c1 <= 0x8F and cont(c2) and cont(c3) then w = 4
      end
      if w == 0 then
        out[#out + 1] = '\239\191\189'
        w = 1
      elseif c == 0xE2 and c1 == 0x80 and (c2 == 0xA8 or c2 == 0xA9) then
        out[#out + 1] = c2 == 0xA8 and '\\u2028' or '\\u2029'
      else
        out[#out + 1] = string.sub(s, i, i + w - 1)
      end
      i = i + w
    end
  end
  out[#out + 1] = '"'
  return table.concat(out)
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
    if version ~= '1' then
      if not tail then -- a layout-1 dead letter: its fields as the m object
        tail = ',"p":' .. jstr(f.p or '') .. ',"id":' .. jstr(f.id or '') ..
          ',"tx":' .. jstr(f.tx or '') .. ',"ts":' .. string.format('%d', tonumber(f.ts) or 0)
        if f.h and f.h ~= '' then
          tail = tail .. ',"h":' .. f.h
        end
        tail = tail .. '}'
      end
      local d = f.d or ''
      if version == '3' then -- an entry of this one message
        redis.call('XADD', KEYS[2 + j], '*', 'm', '[{"off":' .. off .. ',"len":' .. string.format('%d', #d) .. tail .. ']', 'd', d)
      else
        redis.call('XADD', KEYS[2 + j], '*', 'm', '{"off":' .. off .. tail, 'd', d)
      end
    else
      if f.m then -- a layout-2 dead letter into a layout-1 queue
        local ok, m = pcall(cjson.decode, f.m)
        if ok and type(m) == 'table' then
          f.p, f.id, f.tx = m.p, m.id, m.tx
          f.ts = m.ts and string.format('%d', m.ts) or ''
          -- h is the object's last member, as written: its bytes, not cjson's re-encoding (which
          -- reorders keys and rounds big numbers). No string holds ',"h":{' unescaped.
          f.h = type(m.h) == 'table' and string.match(f.m, ',"h":({.*})}$') or ''
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

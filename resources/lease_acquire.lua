-- lease_acquire.lua: take a lease if it is free, or keep it if this owner already holds it.
-- KEYS[1] lease key, KEYS[2] its fencing sequence (same hash tag)
-- ARGV[1] owner id (unique per process life), ARGV[2] TTL in milliseconds
-- Returns the token "<owner>|<n>" (n grows with every new holder: the fence), or false if another
-- owner holds the lease.
local cur = redis.call('GET', KEYS[1])
if cur then
  if string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return cur
  end
  return false
end
local n = redis.call('INCR', KEYS[2])
local tok = ARGV[1] .. '|' .. n
redis.call('SET', KEYS[1], tok, 'PX', ARGV[2])
return tok

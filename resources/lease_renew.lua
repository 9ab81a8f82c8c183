-- lease_renew.lua: extend a lease only if the caller still holds it.
-- KEYS[1] lease key; ARGV[1] token, ARGV[2] TTL in milliseconds. Returns 1 if renewed, 0 if lost.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0

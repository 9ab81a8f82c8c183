-- lease_release.lua: give a lease up at once, only if the caller still holds it.
-- KEYS[1] lease key; ARGV[1] token. Returns 1 if released, 0 if it was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0

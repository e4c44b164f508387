-- release: give a lease up only while the caller still holds it (compare-and-DEL).
--
-- KEYS[1] lease  string "<replica>:<fence>"
--
-- ARGV[1] token  the caller's lease token
--
-- Returns 1 when released, 0 when the lease expired or belongs to another token.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

-- renew: extend a lease only while the caller still holds it (compare-and-PEXPIRE).
--
-- KEYS[1] lease  string "<replica>:<fence>"
--
-- ARGV[1] token   the caller's lease token
-- ARGV[2] ttl_ms  the new time-to-live
--
-- Returns 1 when renewed, 0 when the lease expired or belongs to another token.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

-- acquire: take a free lease with a fresh fencing token.
--
-- KEYS[1] lease  string "<replica>:<fence>" with a PX time-to-live
-- KEYS[2] fence  integer counter, incremented once per successful acquisition
--
-- ARGV[1] replica id
-- ARGV[2] ttl_ms
--
-- Returns the new token, or nil when the lease is held (by anyone, this replica included:
-- a holder renews with its token instead). The counter only moves on success, so tokens
-- of successive holders strictly increase.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local token = ARGV[1] .. ':' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2])
return token

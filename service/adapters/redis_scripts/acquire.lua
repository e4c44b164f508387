-- acquire: take a free lease with a fresh fencing token.
--
-- KEYS[1] lease  string "<replica>:<fence>" with a PX time-to-live
-- KEYS[2] fence  integer counter, incremented once per successful acquisition
--
-- ARGV[1] replica id
-- ARGV[2] ttl_ms
-- ARGV[3] floor    the caller's wall clock in ms (scripts never read TIME)
--
-- Returns the new token, or nil when the lease is held (by anyone, this replica included:
-- a holder renews with its token instead). The counter only moves on success, so tokens
-- of successive holders strictly increase; and it is never below the floor, so a token
-- taken after a failover that lost the last increments still exceeds every token taken
-- before (the clocks of the takers agreeing within the failover's duration).

if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local fence = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if fence < floor then
  fence = floor
  redis.call('SET', KEYS[2], fence)
end
local token = ARGV[1] .. ':' .. string.format('%d', fence)
redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2])
return token

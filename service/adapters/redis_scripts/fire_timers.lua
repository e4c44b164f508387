-- fire_timers: move due timers of one shard into its ingress stream, fenced by the lease.
--
-- KEYS[1] lease    {P}:{s<N>}:lease    string "<replica>:<fence>"
-- KEYS[2] timers   {P}:{s<N>}:timers   zset rkey -> due ms
-- KEYS[3] ingress  {P}:{s<N>}:ingress  stream, fields t (rkey) and due (ms)
--
-- ARGV[1] token    the caller's lease token
-- ARGV[2] now_ms   the caller's clock (scripts never read TIME)
-- ARGV[3] limit    at most this many timers per call
--
-- Returns the number of timers fired; error "FENCED" when KEYS[1] does not hold ARGV[1].
-- Each fired timer is removed in the same step, so it reaches the ingress exactly once.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED shard lease not held by this token')
end

local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[3]))
for k = 1, #due, 2 do
  redis.call('ZREM', KEYS[2], due[k])
  redis.call('XADD', KEYS[3], '*', 't', due[k], 'due', due[k + 1])
end
return #due / 2
